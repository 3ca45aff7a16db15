"""CI proves the README's examples learn: each example's short version (``examples/recipes.py``)
runs end to end with ``trinity run``, as a user runs it, on what torch picks here, the
calculator's also with torch/MKL/oneDNN held to AVX2 (a stand-in for another CPU; ``LEVELS``)
and must reach its floors. A recipe that stops learning fails here, and the calculator also
when it learns on one CPU only. The figures over
seeds are ``bench/example_figures.py``'s (``docs/examples.md``).

Every process has one OpenMP thread (``tests/conftest.py``: with the default of one per core,
the SFT stages' threads spin against the other worker's processes, and a run took twice the
time)."""

from __future__ import annotations

from bus.server import free_port
from examples.recipes import DROP, EXAMPLES, run

#: The kernel levels each short version runs on in CI: every example on the CPU's own; AVX2 for
#: the calculator, the example whose learning hung on the kernel level (at lr 3e-4 its SFT
#: copy never came with AVX2 kernels: docs/agents.md). The guess game's and the quickstart's
#: AVX2 runs (8.4 and 3.0 min in the suite) left CI on 2026-11-28: one worker ran the six runs
#: one after another for 46 min, the whole suite's length and over its 45-min budget; their
#: figures on both levels over 5 seeds are bench/example_figures.py's (docs/examples.md).
LEVELS = {"quickstart": ("native",), "calculator": ("native", "avx2"), "guess": ("native",)}
#: A hang guard, not a target: a run took 2-9 min in the suite (beside the other worker's tests)
TIMEOUT = 1500


def assert_learns(name: str, level: str, tmp_path) -> None:
    """The example's short version on ``level`` exits 0, warns of nothing and reaches its floors."""
    ex = EXAMPLES[name]
    out = run(ex, tmp_path, seed=0, level=level, short=True, timeout=TIMEOUT, nats_port=free_port())
    log = out.log.read_text(errors="replace")[-3000:]
    assert out.rc == 0, log
    assert not out.warnings, out.warnings
    low = {k: v for k, v in ex.floors.items() if out.figures.get(k, 0.0) < v}
    assert not low, f"below the floors {low}: {out.figures}\n{progress(out.log)}\n{log}"


def progress(log_path) -> str:
    """The explorer's line per rollout step and evaluation (rewards, failed tasks, lengths):
    what tells a run that stopped learning from one whose rollouts or evaluations failed."""
    lines = log_path.read_text(errors="replace").splitlines()
    return "\n".join(line[-400:] for line in lines if "explorer" in line and "reward_mean=" in line)


def assert_a_recipe_that_cannot_learn_fails_its_floors(tmp_path) -> None:
    """The quickstart with its warm-up switched off (SFT lr 0): the model never answers, every
    reward is 0, and the run summary warns that GRPO had no learning signal."""
    from dataclasses import replace

    ex = EXAMPLES["quickstart"]
    broken = replace(ex, short={**ex.short, "stages.0": DROP, "stages.1.algorithm.optimizer.lr": 0.0,
                                "stages.1.buffer.total_steps": 5, "buffer.total_steps": 3})
    out = run(broken, tmp_path, seed=0, level="native", short=True, timeout=TIMEOUT, nats_port=free_port())
    assert out.rc == 0, out.log.read_text(errors="replace")[-3000:]
    assert out.figures["grpo.test.start"] < ex.floors["grpo.test.start"]
    assert out.warnings and "grpo: no learning signal" in out.warnings[0]
