"""A sweep of LoRA runs on one base model against the same runs started separately.

    python bench/sweep.py [--model quickstart|smollm2] [--lrs 3e-4,1e-3,3e-3,1e-2] [--seeds 0,1,2]

Both sides run the same runs (one per learning rate, ``examples/sweep/lora_grpo.yaml`` on the
quickstart's SFT warm-up, or SmolLM2-135M-Instruct on ``bench/vs_trl.py``'s sums and products):

* **sweep**: ``trinity sweep --set algorithm.optimizer.lr=<lrs>``: one trainer and one
  transformers engine for every run, a buffer and a synchronizer per run;
* **separate**: one ``trinity run`` per learning rate, all started at once (each its own
  trainer, engine, buffer, synchronizer and nats-server), which is what a sweep replaces.

Printed per seed and summed up over seeds: wall time from launch until every run is done,
peak memory of everything both sides started (the sum over their processes of the
proportional set size, PSS: a page that several processes map counts once, split between
them, so imported libraries are not counted once per process), and each run's held-out greedy
accuracy at its end. The sweep must cost less time and memory, and each run's accuracy must
match the separate run's within the spread over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import record  # noqa: E402  (bench/report.py, beside this script)

from bus.server import free_port  # noqa: E402

WORK = ROOT / ".bench" / "sweep"
CONFIG = ROOT / "examples" / "sweep" / "lora_grpo.yaml"


def pss_mb(roots: list[int]) -> float:
    """The summed PSS (MB) of ``roots`` and all their descendants, from /proc."""
    parent, pss = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            for line in (d / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss[int(d.name)] = int(line.split()[1]) / 1024
                    break
        except (OSError, ValueError, IndexError):
            continue
    total = 0.0
    for pid, mb in pss.items():
        a = pid
        while a not in roots and a in parent and a > 1:
            a = parent[a]
        if a in roots:
            total += mb
    return total


#: Seconds between memory samples: reading every process's smaps_rollup twice a second took
#: 35% of a core on SmolLM2's runs (2 cores: CPU the runs measured then did not get).
SAMPLE_S = 2.0


def launch(commands: list[list[str]]) -> tuple[float, float, list[int]]:
    """Run ``commands`` at once until all end: (seconds, peak summed PSS MB, exit codes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    t0 = time.time()
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
             for c in commands]
    peak = 0.0
    while any(p.poll() is None for p in procs):
        peak = max(peak, pss_mb([p.pid for p in procs]))
        time.sleep(SAMPLE_S)
    return time.time() - t0, peak, [p.returncode for p in procs]


def final_accuracy(job: Path) -> float:
    evals = [r for r in (json.loads(x) for x in (job / "monitor" / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "eval"]
    return evals[-1]["values"]["accuracy"]


def base_config(model: str, steps: int | None) -> tuple[Path, list[str]]:
    """The config the runs share and the ``--set`` values every run gets."""
    if model == "quickstart":
        subprocess.run([sys.executable, str(ROOT / "examples" / "sweep" / "prepare.py")], check=True, cwd=ROOT)
        sets = [] if steps is None else [f"buffer.total_steps={steps}"]
        return CONFIG, sets
    import vs_trl

    data, smol = vs_trl.smollm2_assets()
    sizes = dict(vs_trl.SMOL, steps=steps or vs_trl.SMOL["steps"])
    cfg = vs_trl.trinity_config(data, smol, sizes["steps"], "transformers", "smol_lora", lora=True, sizes=sizes)
    lora = json.dumps({"lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear"})
    return cfg, [f"model.lora_configs=[{lora}]", "project=sweep", "explorer.eval_interval=0"]


def one_seed(model: str, lrs: list[str], seed: int, steps: int | None) -> dict:
    cfg, sets = base_config(model, steps)
    sets = [*sets, f"explorer.rollout_model.seed={seed}", "continue_from_checkpoint=false"]
    trinity = [sys.executable, "-m", "roles.cli"]
    out: dict = {"seed": seed}
    root = WORK / model / f"seed{seed}"
    shutil.rmtree(root, ignore_errors=True)  # a run of an earlier bench must not be read as this one's
    name = "lora_grpo" if model == "quickstart" else "smol_lora"
    project = "sweep"
    # the sweep
    s_root = root / "sweep"
    cmd = [*trinity, "sweep", "--config", str(cfg), "--set", f"algorithm.optimizer.lr={','.join(lrs)}",
           "--set", f"checkpoint_root_dir={s_root}", "--set", f"nats.url=nats://127.0.0.1:{free_port()}"]
    for s in sets:
        cmd += ["--set", s]
    secs, peak, codes = launch([cmd])
    if codes != [0]:
        raise SystemExit(f"the sweep failed (exit {codes[0]}): {' '.join(cmd)}")
    out["sweep"] = {"seconds": secs, "peak_pss_mb": peak,
                    "accuracy": {lr: final_accuracy(_only_job(s_root / project, f"{name}-lr{lr}")) for lr in lrs}}
    # the same runs, separately and at once
    p_root = root / "separate"
    cmds = []
    for lr in lrs:
        c = [*trinity, "run", "--config", str(cfg), "--set", f"algorithm.optimizer.lr={lr}",
             "--set", f"name={name}-lr{lr}", "--set", f"checkpoint_root_dir={p_root}",
             "--set", f"nats.url=nats://127.0.0.1:{free_port()}",
             "--set", f"nats.store_dir={p_root / 'nats' / lr}"]  # each run its own server and store
        for s in sets:
            c += ["--set", s]
        cmds.append(c)
    secs, peak, codes = launch(cmds)
    if any(codes):
        raise SystemExit(f"a separate run failed (exit codes {codes})")
    out["separate"] = {"seconds": secs, "peak_pss_mb": peak,
                       "accuracy": {lr: final_accuracy(_only_job(p_root / project, f"{name}-lr{lr}")) for lr in lrs}}
    return out


def _only_job(project_dir: Path, name: str) -> Path:
    """The job folder of ``name`` (``continue_from_checkpoint: false`` may have stamped it)."""
    found = sorted(project_dir.glob(f"{name}*"), key=lambda p: p.stat().st_mtime)
    found = [p for p in found if (p / "monitor" / "metrics.jsonl").exists()]
    if not found:
        raise SystemExit(f"no job folder {project_dir / name}")
    return found[-1]


def spread(xs: list[float], scale: float = 1.0, fmt: str = ".1f", unit: str = "") -> str:
    """``median<unit> (min-max<unit>)``: how the docs quote a figure over seeds."""
    m = statistics.median(xs) * scale
    return f"{m:{fmt}}{unit} ({min(xs) * scale:{fmt}}-{max(xs) * scale:{fmt}}{unit})"


def adapter_stall(model: str, rank: int = 16, runs: int = 4, repeats: int = 5) -> dict[str, float]:
    """How long one run's weight sync holds a shared engine (``HFEngine.update_adapter``: the
    generation lock is held for the copy alone) against one generation batch of a step (the
    other runs wait at most for the batch in flight plus this). In this process, the engine
    that ``trinity sweep-host --role explorer`` builds."""
    import asyncio

    import torch

    from roles.explorer.engines.shared import create_shared
    from schemas.config import InferenceModelConfig, LoraConfig
    from storage.lora import adapter_tensors, wrap

    if model == "quickstart":
        path, prompts, width, new = ROOT / "examples" / "sweep" / "_build" / "warm", 16, 8, 4
    else:
        import vs_trl

        path, prompts, width, new = vs_trl.smollm2_assets()[1], vs_trl.SMOL["prompts"], 46, vs_trl.SMOL["completion"]
    lc = LoraConfig(lora_rank=rank, lora_alpha=2 * rank, target_modules="all-linear")
    cfg = InferenceModelConfig(model_path=str(path), engine_type="transformers", dtype="float32",
                               max_model_len=width + new + 8, max_response_tokens=new, seed=0)

    async def measure() -> dict[str, float]:
        engines, views = await create_shared(cfg, {f"run{i}": lc for i in range(runs)})
        from transformers import AutoModelForCausalLM

        named = adapter_tensors(wrap(AutoModelForCausalLM.from_pretrained(path), lc))
        loads = []
        for v in range(repeats):
            t0 = time.perf_counter()
            await views["run0"][0].update_weights(named, v + 1)
            loads.append(time.perf_counter() - t0)
        ids = list(range(5, 5 + width))
        batches = []
        for _ in range(2):
            t0 = time.perf_counter()
            await asyncio.gather(*(views[f"run{i % runs}"][0].generate(ids, n=8, temperature=1.0, ignore_eos=True)
                                   for i in range(prompts)))
            batches.append(time.perf_counter() - t0)
        await engines[0].close()
        return {"adapter_mb": sum(t.numel() * t.element_size() for _, t in named) / 2**20,
                "adapter_load_ms": 1000 * statistics.median(loads), "batch_ms": 1000 * min(batches)}

    torch.set_num_threads(2)
    return asyncio.run(measure())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["quickstart", "smollm2"], default="quickstart")
    ap.add_argument("--lrs", default=None, help="the swept learning rates (default: 3e-4,1e-3,3e-3,1e-2 on the "
                                                 "quickstart; 5e-5,1e-4,2e-4,5e-4 on SmolLM2)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the config's)")
    ap.add_argument("--stall", action="store_true",
                    help="only measure how long one run's sync holds the shared engine, against a batch")
    a = ap.parse_args()
    if a.stall:
        st = adapter_stall(a.model)
        print(f"{a.model}: one run's adapter ({st['adapter_mb']:.1f} MB) loads into the shared engine in "
              f"{st['adapter_load_ms']:.1f} ms (the generation lock is held that long); one step's batch "
              f"generates in {st['batch_ms']:.0f} ms")
        record(f"sweep_stall_{a.model}", {k: round(v, 2) for k, v in st.items()})
        return
    lrs = (a.lrs or ("3e-4,1e-3,3e-3,1e-2" if a.model == "quickstart" else "5e-5,1e-4,2e-4,5e-4")).split(",")
    rows = []
    for seed in (int(s) for s in a.seeds.split(",")):
        r = one_seed(a.model, lrs, seed, a.steps)
        rows.append(r)
        print(f"seed {seed}: sweep {r['sweep']['seconds']:.0f} s, {r['sweep']['peak_pss_mb']:.0f} MB; "
              f"separate {r['separate']['seconds']:.0f} s, {r['separate']['peak_pss_mb']:.0f} MB", flush=True)
        for lr in lrs:
            print(f"  lr {lr}: accuracy sweep {100 * r['sweep']['accuracy'][lr]:.1f}%, "
                  f"separate {100 * r['separate']['accuracy'][lr]:.1f}%", flush=True)
    print(f"\n{len(lrs)} LoRA runs ({a.model}), {len(rows)} seed(s), median (range):")
    figures: dict[str, float | str] = {}
    for side in ("sweep", "separate"):
        t = [r[side]["seconds"] for r in rows]
        m = [r[side]["peak_pss_mb"] for r in rows]
        print(f"  {side:<9} wall {spread(t)} s   peak memory {spread(m, fmt='.0f')} MB (PSS)")
        figures[f"{side}_wall_s"] = round(statistics.median(t), 1)
        figures[f"{side}_wall_s_range"] = f"{min(t):.1f}-{max(t):.1f}"
        figures[f"{side}_peak_mb"] = round(statistics.median(m))
        figures[f"{side}_peak_mb_range"] = f"{min(m):.0f}-{max(m):.0f}"
    time_ratio = statistics.median(r["sweep"]["seconds"] / r["separate"]["seconds"] for r in rows)
    mem_ratio = statistics.median(r["sweep"]["peak_pss_mb"] / r["separate"]["peak_pss_mb"] for r in rows)
    print(f"  sweep / separate: wall {time_ratio:.2f}x, peak memory {mem_ratio:.2f}x")
    figures.update(wall_ratio=round(time_ratio, 3), memory_ratio=round(mem_ratio, 3))
    within = True
    for lr in lrs:
        sw = [r["sweep"]["accuracy"][lr] for r in rows]
        se = [r["separate"]["accuracy"][lr] for r in rows]
        # within the seed spread: the sweep's median lies inside the separate runs' range
        # (widened to the sweep's own range when a single seed leaves no range)
        ok = min(se) - 1e-9 <= statistics.median(sw) <= max(se) + 1e-9 or min(sw) <= statistics.median(se) <= max(sw)
        within &= ok
        print(f"  lr {lr:<6} accuracy sweep {spread(sw, 100, unit='%')}, separate {spread(se, 100, unit='%')}"
              f"{'' if ok else '  <- outside the seed spread'}")
        figures[f"accuracy_sweep_lr{lr}"] = spread(sw, 100, unit="%")
        figures[f"accuracy_separate_lr{lr}"] = spread(se, 100, unit="%")
    met = time_ratio < 1 and mem_ratio < 1 and within
    record(f"sweep_{a.model}", figures, met=met,
           target="the sweep takes less wall time and memory than the same runs separately, "
                  "with each run's accuracy within the separate runs' seed spread")


if __name__ == "__main__":
    main()
