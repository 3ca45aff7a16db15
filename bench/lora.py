"""LoRA against full fine-tuning on a ~100M-parameter Qwen2, in the same run: bytes and seconds
of one weight sync (trainer process -> explorer process, as ``bench/weight_sync.py``), and the
trainer's peak memory over a few optimizer steps.

    python bench/lora.py [--params-m 100] [--rank 32] [--steps 3]

The adapter is ``model.lora_configs``' default (rank 32, ``all-linear``) built by
``storage.lora.wrap``; the trainer is trinity's ``TorchEngine``. Target (issue #24): the
adapter sync moves <= 5% of the full sync's bytes. Memory: each trainer runs in a process of
its own; printed are its resident set with the model built, and the peak above that while it
trains (gradients, optimizer state, activations), sampled every 5 ms.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from report import record  # noqa: E402  (bench/report.py, beside this script)

from bench.weight_sync import _peer  # noqa: E402
from bus.server import free_port  # noqa: E402
from schemas.state import Rendezvous  # noqa: E402


def build(params_m: float, rank: int, lora: bool, device: str = "cpu") -> torch.nn.Module:
    """A Qwen2 of about ``params_m`` M parameters (hidden 768, as weight_sync.py), with the
    adapter when ``lora``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from schemas.config import LoraConfig
    from storage.lora import wrap

    layers = max(1, round((params_m - 25) / 7.1))
    cfg = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
                      num_attention_heads=12, num_key_value_heads=12, tie_word_embeddings=True)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return wrap(model, LoraConfig(lora_rank=rank, lora_alpha=rank)) if lora else model


def sync_shapes(params_m: float, rank: int, lora: bool) -> list[tuple[str, tuple[int, ...]]]:
    """What a sync sends: every tensor, or the adapter's alone (storage.lora.adapter_tensors)."""
    from storage.lora import adapter_tensors

    model = build(params_m, rank, lora, device="meta")
    named = adapter_tensors(model) if lora else list(model.named_parameters())
    return [(n, tuple(t.shape)) for n, t in named]


def sync(shapes: list[tuple[str, tuple[int, ...]]], repeats: int) -> tuple[int, float]:
    """(bytes, best seconds) of a float32 sync of ``shapes`` between two processes (gloo)."""
    rdv = Rendezvous(0.0, "127.0.0.1", free_port(), 2, "gloo", "bench").to_dict()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, rdv, shapes, ["float32"], 0, repeats, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    while True:
        try:
            _, nbytes, seconds, _, _ = q.get(timeout=1)
            break
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError("a sync peer failed; its error is above") from None
    for p in procs:
        p.join(60)
    return nbytes, seconds


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _train(params_m: float, rank: int, lora: bool, steps: int, q: mp.Queue) -> None:
    """(peak resident bytes while training, above the process with its model built;
    trainable parameters) of a trainer making ``steps`` updates of 2 x 128 tokens (a micro-batch: activations small
    next to what full fine-tuning adds, gradients and optimizer state). The peak
    is sampled every 5 ms (the process's lifetime peak would be its model construction's)."""
    import threading

    from roles.trainer.engine import TorchEngine
    from schemas.config import OptimizerConfig

    torch.manual_seed(0)
    model = build(params_m, rank, lora)
    base = _rss()
    peak, done = [base], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    engine = TorchEngine(model, OptimizerConfig(lr=1e-4), total_steps=steps, grad_clip=1.0)
    ids = torch.randint(0, 32000, (2, 128))
    for _ in range(steps):
        logits = engine.forward_logits(ids, torch.ones_like(ids))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
    done.set()
    t.join()
    trainable = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
    q.put((max(peak[0], _rss()) - base, base, trainable))


def peak_memory(params_m: float, rank: int, lora: bool, steps: int) -> tuple[int, int, int]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_train, args=(params_m, rank, lora, steps, q))
    p.start()
    out = q.get(timeout=1800)
    p.join(60)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params-m", type=float, default=100.0)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="syncs: best of N")
    a = ap.parse_args(argv)
    rows = {}
    for lora in (False, True):
        nbytes, seconds = sync(sync_shapes(a.params_m, a.rank, lora), a.repeats)
        peak, base, trainable = peak_memory(a.params_m, a.rank, lora, a.steps)
        rows[lora] = (nbytes, seconds, peak, trainable, base)
    print(f"~{a.params_m:g}M-parameter Qwen2 (hidden 768), float32, gloo; LoRA rank {a.rank}, all-linear; "
          f"training: {a.steps} AdamW steps of 2 x 128 tokens")
    print(f"{'':6} {'trainable':>12} | {'sync MB':>9} {'sync s':>8} | {'process with model GB':>21} "
          f"{'+ training peak GB':>18}")
    for lora, (nbytes, seconds, peak, trainable, base) in rows.items():
        print(f"{'LoRA' if lora else 'full':6} {trainable:12,d} | {nbytes / 2**20:9.1f} {seconds:8.3f} | "
              f"{base / 2**30:21.2f} {peak / 2**30:18.2f}")
    share = rows[True][0] / rows[False][0]
    # what a LoRA sync can move at the least is the adapter itself: its share of the weights
    print(f"the adapter is {rows[True][3] / rows[False][3]:.2%} of the model's parameters "
          f"(rank x (in + out) per adapted in x out layer)")
    print(f"adapter sync: {share:.2%} of the full sync's bytes ({'PASS' if share <= 0.05 else 'FAIL'} <= 5%), "
          f"{rows[True][1] / rows[False][1]:.1%} of its time; training's memory above the model "
          f"{rows[True][2] / rows[False][2]:.2f}x full fine-tuning's")
    figures: dict[str, float] = {}
    for lora, (nbytes, seconds, peak, _, _) in rows.items():
        what = f"LoRA rank {a.rank}" if lora else "full"
        figures[f"{what}: sync MB ({a.params_m:g}M params)"] = round(nbytes / 2**20, 1)
        figures[f"{what}: sync s"] = round(seconds, 3)
        figures[f"{what}: training peak above the model, GB"] = round(peak / 2**30, 2)
    figures["adapter sync / full sync, bytes"] = round(share, 4)
    record("lora", figures, target="adapter sync <= 5% of the full sync's bytes", met=bool(share <= 0.05))
    return 0


if __name__ == "__main__":
    sys.exit(main())
