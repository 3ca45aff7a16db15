"""The micro-batches the trainer sizes itself: do they stay within the memory they were sized for?

    python bench/micro_batch_memory.py [--model smollm2|tiny] [--response 8,64] [--threads 2]

When ``trainer.max_token_len_per_gpu`` is unset, the trainer sizes a micro-batch to a share
of its device's free memory, at :func:`ops.memory.token_parts`' bytes a token
(``roles/trainer/budget.py``). This bench trains GRPO steps of 8 prompts x 8 samples on the
real model (SmolLM2-135M-Instruct, float32 on the CPU, as the PyTorch trainer runs here) and,
per response length and per budget (one step in a fresh process each), prints: the budget (tokens, and the bytes the estimate
gives them), the micro-batches a step made, the step time, and the measured peak of the
trainer process's resident memory above its level before the step (``VmHWM`` after a reset
of it, ``/proc/self/clear_refs``), against the estimate of what the step allocates: the
largest micro-batch's tokens, the gradients (freed after every update) and Adam's
temporaries. Adam's state, allocated once, comes from a warm-up step on two short rows
before.

Budgets: the one derived here (the default a user gets), and two forced smaller ones (a
quarter and a sixteenth of its tokens), so the estimate is checked where it decides the
split. Target: measured peak <= the estimate (a bound, not a profile), at every budget.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import record  # noqa: E402  (bench/report.py, beside this script)

PROMPTS, SAMPLES = 8, 8


def rss_bytes(field: str) -> int:
    return int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0]) * 1024


def batch(tokenizer, response: int, step: int) -> list:
    """``PROMPTS`` groups of ``SAMPLES`` rows: the chat-templated question and ``response``
    random tokens each, rewards 0/1 within each group (group-normalised advantages)."""
    from schemas.data import Experience

    rng = np.random.default_rng(step)
    out = []
    for g in range(PROMPTS):
        q = [{"role": "user", "content": f"What is {g + 3} + {step + 4}? Answer with the number only."}]
        text = tokenizer.apply_chat_template(q, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for i in range(SAMPLES):
            resp = rng.integers(100, 40000, response, dtype=np.int32)
            adv = (1.0 if i % 2 else -1.0)
            out.append(Experience(
                id=f"s{step}/g{g}/{i}", task_id=f"t{g}", group_id=f"s{step}/g{g}", run_id="bench.mbm",
                tokens=np.concatenate([np.asarray(prompt, dtype=np.int32), resp]), prompt_length=len(prompt),
                logprobs=-rng.random(response, dtype=np.float32) - 3.0, action_mask=np.ones(response, dtype=bool),
                reward=float(i % 2), advantages=np.full(response, adv, dtype=np.float32)))
    return out


def measure(model: Path, response: int, fraction: float, threads: int) -> dict:
    """One GRPO step at the derived budget scaled by ``fraction``, in a fresh process (see
    :func:`_measure`): a process that ran a larger step before keeps that memory mapped
    (glibc), and its next step's growth would read as nothing."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_measure, (model, response, fraction, threads))


def _measure(model: Path, response: int, fraction: float, threads: int) -> dict:
    """A warm-up step on two short rows first (it allocates the gradients and Adam's state,
    which the budget counts apart), then the measured step: its time, micro-batches, and
    resident memory's peak above the level before it."""
    import torch

    from roles.trainer import budget
    from roles.trainer.main import Trainer
    from schemas.loader import load_config

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="trinity-mbm-") as tmp:
        cfg = load_config(None, [
            "mode=train", "project=bench", "name=mbm", f"checkpoint_root_dir={tmp}", f"model.model_path={model}",
            f"model.max_model_len={64 + response}", "algorithm.algorithm_type=grpo", f"algorithm.repeat_times={SAMPLES}",
            "algorithm.kl_loss_fn=none", "trainer.trainer_type=pytorch", "trainer.save_hf_checkpoint=never",
        ], environ={}, dotenv_file=None).config
        trainer = Trainer(cfg)  # sizes its micro-batches (roles/trainer/budget.py)
        tokens = max(int(trainer.runner.max_token_len * fraction), cfg.model.max_model_len)
        trainer.runner.max_token_len = tokens
        b = budget.derive(cfg, torch.device("cpu"))
        warm = batch(trainer.tokenizer, 1, 0)[:2]
        trainer.train(warm, 1)
        exps = batch(trainer.tokenizer, response, 2)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = rss_bytes("VmRSS")
        t = time.perf_counter()
        metrics = trainer.train(exps, 2)
        seconds, peak = time.perf_counter() - t, rss_bytes("VmHWM") - before
    lengths = [len(e.tokens) for e in exps]
    longest_mb = min(tokens, len(lengths) * max(lengths))  # padded tokens of the largest micro-batch
    return {"tokens": tokens, "estimate": b.per_token * longest_mb + b.per_step, "per_token": b.per_token,
            "micro_batches": metrics["micro_batches"], "seconds": seconds, "peak": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--response", default="8,64", help="response tokens per sample, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.model == "smollm2":
        from storage.smollm2 import smollm2_dir

        model = smollm2_dir()
    else:
        from storage.tiny import build_tiny_model

        model = build_tiny_model(Path(tempfile.mkdtemp(prefix="trinity-tiny-")) / "model", seed=0)
    figures: dict[str, float] = {}
    ok = True
    print(f"{a.model}: GRPO steps of {PROMPTS} prompts x {SAMPLES} samples, PyTorch trainer, float32, "
          f"{a.threads} threads; peak = the step's resident memory above its start (one step, fresh process)")
    print(f"{'response':>8} {'budget':>22} {'tokens':>7} {'mbs':>4} {'step s':>7} {'estimate MB':>12} "
          f"{'peak MB':>8} {'peak/est':>8}")
    for response in (int(x) for x in a.response.split(",")):
        for name, fraction in (("derived (default)", 1.0), ("1/4 of it", 0.25), ("1/16 of it", 1 / 16)):
            r = measure(model, response, fraction, a.threads)
            ratio = r["peak"] / r["estimate"]
            ok &= ratio <= 1.0
            print(f"{response:8d} {name:>22} {r['tokens']:7d} {r['micro_batches']:4.0f} {r['seconds']:7.2f} "
                  f"{r['estimate'] / 2**20:12.0f} {r['peak'] / 2**20:8.0f} {ratio:8.2f}", flush=True)
            key = f"{a.model}, response {response}, {name}"
            figures[f"{key}: micro-batches"] = r["micro_batches"]
            figures[f"{key}: step, s"] = round(r["seconds"], 2)
            figures[f"{key}: peak / estimate"] = round(ratio, 2)
            figures[f"{key}: peak, MB"] = round(r["peak"] / 2**20)
    print(f"target: peak <= the estimate at every budget: {'PASS' if ok else 'FAIL'}")
    record("micro_batch_memory", figures, target="a self-sized micro-batch's measured peak memory <= its estimate",
           met=ok)


if __name__ == "__main__":
    main()
