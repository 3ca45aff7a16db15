"""What each README example must learn, and how to run it on a seed and a CPU kernel level.

Shared by ``bench/example_figures.py`` (every example over seeds and kernel levels, its figures into
``docs/examples.md``) and ``tests/examples/learning.py`` (CI runs each example's short
version on the CPU's own kernels, and asserts it learned). Why kernel levels: which SIMD
kernels torch runs changes float rounding, and a recipe that learns on one trajectory only may
learn on one CPU only; holding the kernels to AVX2 on an AVX-512 machine is a cheap stand-in
for another CPU (the bench's figures cover both levels).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

#: Environment of each kernel level. ``native``: what torch picks on this CPU. ``avx2`` and
#: ``default`` (ATen's scalar kernels) also hold MKL and oneDNN, which run the matmuls.
KERNEL_LEVELS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


#: A short version's value that removes the item (a stage, an eval taskset) instead.
DROP = "<drop>"


@dataclass(frozen=True)
class Example:
    """One README example: its folder under ``examples/``, config, plugin folders, the
    overrides that make its short version, and the accuracies that version must reach."""

    name: str
    folder: str
    config: str
    plugins: tuple[str, ...] = ()
    short: dict[str, Any] = field(default_factory=dict)
    """Dotted path (list items by index: ``stages.1.buffer.total_steps``) -> value."""
    floors: dict[str, float] = field(default_factory=dict)
    """Figure (``<stage>.<taskset>.<start|end>``) -> the least accuracy the short version reaches."""


EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in (
        Example(
            "quickstart", "quickstart", "quickstart.yaml",
            # half the RL steps; the random model's evaluation (0%) left out. The SFT stage ends
            # at ~61% (the sums without a carry), so an end above 80% is GRPO's carry. GRPO in
            # mode colocate: on a CPU machine the same processes as mode both, with the weights
            # through shared memory as there (the colocated quickstart CI trains, issue #52)
            short={"stages.0": DROP, "buffer.total_steps": 30, "explorer.eval_interval": 30,
                   "stages.2.mode": "colocate"},
            floors={"grpo.test.start": 0.5, "grpo.test.end": 0.8},
        ),
        Example(
            "calculator", "agent_calculator", "calculator.yaml", plugins=("examples/agents",),
            # no random-model evaluation (0%, nothing to prove) nor the no-tool one; an SFT
            # stage just long enough to leave its plateau (100-150 steps here), 16 RL steps with
            # the lr warmed up over 3. Why 16 and the warmup: 8 steps from the SFT model's 39%
            # ended anywhere from 36.5% to 78.5% (a fresh Adam's first steps move every weight
            # by the full lr, and at 3e-4 they often threw the policy off; the warmup moved 8
            # steps' ends to 46.5-71.0%, still under the floor once in six, 2026-11-29); the
            # full recipe's 40 steps recover either way (docs/examples.md). 16 steps, by hand:
            # 39.0% -> 94.0%, sampled reward 0.30 -> 0.66 (7.9 min)
            short={"stages.0": DROP, "stages.1.buffer.total_steps": 200, "buffer.total_steps": 16,
                   "stages.2.algorithm.optimizer.lr_warmup_steps": 3,
                   "explorer.eval_interval": 16, "buffer.explorer_input.eval_tasksets.1": DROP},
            floors={"grpo.test.start": 0.1, "grpo.test.end": 0.5},
        ),
        Example(
            "guess", "agent_guess", "guess.yaml", plugins=("examples/agents",),
            # the full warm-up and 10 RL steps. The floors: the warm-up learned the game (random
            # model: 0%), and RL kept it (not RL's gain: greedy after 10 steps was 7, 5, 5, 4 and
            # 6 of 7 in five runs, too close to the teacher's 3 to be a floor; the full runs show
            # the gain). Half the warm-up (150 steps, its loss is flat from ~80) passed twice,
            # then collapsed in the suite: greedy 3/7 -> 0/7, sampled 42.9% -> 8.9% in 10 steps
            short={"stages.0": DROP, "buffer.total_steps": 10, "explorer.eval_interval": 10},
            floors={"grpo.test_sampled.start": 0.3, "grpo.test.end": 3 / 7},
        ),
    )
}


def _set(doc: Any, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc.setdefault(p, {})
    last: Any = int(parts[-1]) if isinstance(doc, list) else parts[-1]
    if value == DROP:
        del doc[last]
    else:
        doc[last] = value


def build(example: Example, work: Path, seed: int, short: bool = False) -> Path:
    """Prepare the example's assets with ``seed`` under ``work/_build`` (the README's
    ``prepare.py``, as a user runs it) and write its config there, pointed at them; returns
    the config's path."""
    src = ROOT / "examples" / example.folder
    build_dir = work / "_build"
    subprocess.run([sys.executable, str(src / "prepare.py"), "--out", str(build_dir), "--seed", str(seed)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    text = (src / example.config).read_text().replace(f"examples/{example.folder}/_build", str(build_dir))
    doc = yaml.safe_load(text)
    doc.setdefault("explorer", {}).setdefault("rollout_model", {})["seed"] = seed
    # later items first: dropping stages.0 must not shift what stages.1 names
    for k, v in sorted(example.short.items() if short else (), key=lambda kv: kv[0], reverse=True):
        _set(doc, k, v)
    out = work / example.config
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@dataclass
class Outcome:
    """One run: its exit code, figures (see :func:`figures`), warnings of the summary
    (``WARNING ...`` lines: no learning signal) and wall time."""

    rc: int
    figures: dict[str, float]
    warnings: list[str]
    seconds: float
    log: Path


def run(example: Example, work: Path, seed: int, level: str, short: bool = False,
        timeout: float = 3600, nats_port: int | None = None) -> Outcome:
    """Build and ``trinity run`` the example on kernel level ``level``; everything it writes
    stays under ``work``."""
    if level not in KERNEL_LEVELS:
        raise ValueError(f"kernel level {level!r}: not one of {', '.join(KERNEL_LEVELS)}")
    work.mkdir(parents=True, exist_ok=True)
    cfg = build(example, work, seed, short)
    env = {**os.environ, **KERNEL_LEVELS[level], "TRINITY_CHECKPOINT_ROOT_DIR": str(work / "checkpoints")}
    if example.plugins:
        env["TRINITY_PLUGIN_DIRS"] = os.pathsep.join(str(ROOT / p) for p in example.plugins)
    cmd = [str(Path(sys.executable).parent / "trinity"), "run", "--config", str(cfg)]
    if nats_port is not None:
        cmd += ["--set", f"nats.url=nats://127.0.0.1:{nats_port}"]
    log = work / "run.log"
    t0 = time.time()
    with open(log, "wb") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
    from roles.runtime.monitor import no_signal, read_metrics

    jobs = sorted(p.parent.parent for p in (work / "checkpoints").glob("**/monitor/metrics.jsonl"))
    warnings = [w for job in jobs for w in no_signal(job.name, read_metrics(job))]
    return Outcome(rc, figures(work / "checkpoints"), warnings, time.time() - t0, log)


def figures(checkpoints: Path) -> dict[str, float]:
    """``<stage>.<taskset>.start`` (the stage's first evaluation) and ``.end`` (its final
    one) -> accuracy, from every stage's ``monitor/metrics.jsonl`` under ``checkpoints``."""
    from roles.runtime.monitor import eval_points, read_metrics

    out: dict[str, float] = {}
    for path in sorted(checkpoints.glob("**/monitor/metrics.jsonl")):
        job = path.parent.parent
        evals = [r for r in read_metrics(job) if r["kind"] == "eval"]
        for when, r in eval_points(evals):
            out[f"{job.name}.{r['taskset']}.{when}"] = r["values"]["accuracy"]
    return out
