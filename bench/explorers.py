"""Rollout throughput of one explorer process vs two on the same run, in the same run of this
script.

    python bench/explorers.py [--tasks 512] [--batch 8] [--max-tokens 96] [--threads 1]

A rollout-bound run (``mode: explore``: no trainer, so every step samples the same model and
the reward distributions must agree): the tiny model on the transformers engine, ``--tasks``
arithmetic tasks x 4 samples of ``--max-tokens`` tokens, ``--batch`` tasks a step, each
explorer taking at most half a step at a time (``runner_per_model``) and ``--threads`` torch
threads. First ``trinity run`` alone; then ``trinity run`` plus one ``trinity explorer`` on the
same config, started once the first explorer leads. Printed: tasks/s over the steps both
explorers took part in (from the step lines' times), mean and spread of the step reward, and
the ratio. On a machine with as many cores as explorers x threads the ratio is what a second
explorer adds; on 2 cores with ``--threads 2`` it shows the CPU being shared.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from report import record  # noqa: E402  (bench/report.py, beside this script)

STEP = re.compile(r"(\d{4}-\d\d-\d\dT[\d:.]+) \[info\s*\] step=(\d+) .*?reward_mean=([-\d.e]+)")


def config(work: Path, model: Path, data: Path, name: str, port: int, a: argparse.Namespace) -> Path:
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer", "system_prompt": ""}
    cfg = {
        "project": "bench", "name": name, "mode": "explore", "checkpoint_root_dir": str(work / "ckpt"),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "model": {"model_path": str(model), "max_model_len": 192, "max_response_tokens": a.max_tokens},
        "buffer": {"batch_size": a.batch, "total_epochs": 1, "explorer_input": {
            "taskset": {"name": "arith", "path": str(data), "split": "train", "format": fmt,
                        "rollout_args": {"temperature": 1.0}},
            "default_workflow_type": "math_workflow", "default_reward_fn_type": "accuracy_reward"}},
        "explorer": {"eval_on_startup": False, "runner_per_model": max(1, a.batch // 2),
                     "rollout_model": {"engine_type": "transformers", "dtype": "float32", "seed": 0,
                                       "ignore_eos": True}},
        "synchronizer": {"sync_method": "checkpoint"},
        "monitor": {"monitor_type": "none"},
        "nats": {"url": f"nats://127.0.0.1:{port}", "embedded": True},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def trinity(*args: str, log: Path, threads: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen([sys.executable, "-m", "roles.cli", *args], cwd=ROOT, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def steps(log: Path) -> list[tuple[float, int, float]]:
    """(time, step, reward_mean) of every explorer step line."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = STEP.search(line)
        if m and "eval" not in line:
            out.append((datetime.fromisoformat(m.group(1)).timestamp(), int(m.group(2)), float(m.group(3))))
    return out


def measure(work: Path, model: Path, data: Path, a: argparse.Namespace, explorers: int) -> dict[str, float]:
    from bus.server import free_port

    name = f"x{explorers}"
    cfg = config(work, model, data, name, free_port(), a)
    log = work / f"{name}.log"
    run = trinity("run", "--config", str(cfg), log=log, threads=a.threads)
    joined_at = 0.0
    helper = None
    try:
        if explorers == 2:
            while not steps(log):  # the first explorer leads and has taken a step
                if run.poll() is not None:
                    raise SystemExit(log.read_text()[-3000:])
                time.sleep(0.2)
            hlog = work / f"{name}-helper.log"
            helper = trinity("explorer", "--config", str(cfg), "--set", "nats.embedded=false", log=hlog,
                             threads=a.threads)
            while "explorer_joins_run" not in hlog.read_text(errors="replace"):
                if helper.poll() is not None:
                    raise SystemExit(hlog.read_text()[-3000:])
                time.sleep(0.2)
            joined_at = time.time()
        run.wait(timeout=1800)
        if helper is not None:
            helper.wait(timeout=120)
    finally:
        for p in (run, helper):
            if p is not None and p.poll() is None:
                p.kill()
    if run.returncode != 0:
        raise SystemExit(log.read_text()[-3000:])
    got = steps(log)
    # the steps that ended after the second explorer had joined (all but the first alone),
    # timed from the end of the step before them
    first = next((i for i, st in enumerate(got) if i >= 1 and st[0] > joined_at + 2.0), None)
    if first is None or first == len(got) - 1:
        raise SystemExit(f"the run ended before the second explorer took part: use more --tasks ({log})")
    tasks_per_s = (len(got) - first) * a.batch / (got[-1][0] - got[first - 1][0])
    counted = got[first:]
    rewards = [r for _, _, r in got]
    return {"tasks_per_s": tasks_per_s, "steps": len(counted), "reward": statistics.mean(rewards),
            "reward_sd": statistics.stdev(rewards) / len(rewards) ** 0.5}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per explorer process")
    a = ap.parse_args()
    from storage.tiny import build_arithmetic_taskset, build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench-explorers-"))
    model = build_tiny_model(work / "model")
    data = build_arithmetic_taskset(work / "data", n_train=a.tasks, n_eval=4)
    one = measure(work, model, data, a, 1)
    two = measure(work, model, data, a, 2)
    print(f"{a.tasks} tasks x 4 samples x {a.max_tokens} tokens, {a.batch} tasks a step, "
          f"{a.threads} torch thread(s) per explorer, {os.cpu_count()} CPUs")
    for label, r in (("1 explorer", one), ("2 explorers", two)):
        print(f"  {label:<12} {r['tasks_per_s']:6.2f} tasks/s over {r['steps']:.0f} steps   "
              f"step reward {r['reward']:.3f} +- {r['reward_sd']:.3f} (mean +- s.e.)")
    print(f"2 / 1 explorer throughput: {two['tasks_per_s'] / one['tasks_per_s']:.2f}x")
    record("explorers", {
        f"1 explorer, tasks/s ({a.tasks} tasks x 4 samples x {a.max_tokens} tokens)": round(one["tasks_per_s"], 2),
        "2 explorers, tasks/s": round(two["tasks_per_s"], 2),
        "2 / 1 explorer throughput": round(two["tasks_per_s"] / one["tasks_per_s"], 2),
        "1 explorer, step reward": round(one["reward"], 3),
        "2 explorers, step reward": round(two["reward"], 3),
    })


if __name__ == "__main__":
    main()
