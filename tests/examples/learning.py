"""CI proves the README's examples learn: each example's short version (``examples/recipes.py``)
runs end to end with ``trinity run``, as a user runs it, on what torch picks here, and must
reach its floors. A recipe that stops learning fails here; one that learns on one CPU only
shows in ``bench/example_figures.py``'s runs on both levels (``LEVELS``). The figures over
seeds are ``bench/example_figures.py``'s (``docs/examples.md``).

Every process has one OpenMP thread (``tests/conftest.py``: with the default of one per core,
the SFT stages' threads spin against the other worker's processes, and a run took twice the
time)."""

from __future__ import annotations

from bus.server import free_port
from examples.recipes import DROP, EXAMPLES, run

#: The kernel levels each short version runs on in CI: every example on the CPU's own. AVX2
#: runs were here for the example whose learning once hung on the kernel level (the
#: calculator: at lr 3e-4 its SFT copy never came with AVX2 kernels, docs/agents.md) and left
#: for CI's 45-min budget: the guess game's and the quickstart's on 2026-11-28 (one worker ran
#: six runs for 46 min), the calculator's on 2026-11-29 (11 min of the learning worker's 34,
#: the suite at 45.0 min in all, when its native run went from 8 RL steps, under the floor
#: in two of the last three suites, to 16). Every example's figures on both levels over 5
#: seeds are bench/example_figures.py's (docs/examples.md).
LEVELS = {"quickstart": ("native",), "calculator": ("native",), "guess": ("native",)}
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
    """The quickstart with its warm-up switched off (SFT lr 0) and one response token: the
    model never answers (every sum has two digits or more), every reward is 0, and the run
    summary warns that GRPO had no learning signal. (With four tokens a random model now and
    then samples a right sum by chance: seed 0 did on the transformers engine.)"""
    from dataclasses import replace

    ex = EXAMPLES["quickstart"]
    broken = replace(ex, short={**ex.short, "stages.0": DROP, "stages.1.algorithm.optimizer.lr": 0.0,
                                "stages.1.buffer.total_steps": 5, "buffer.total_steps": 3,
                                "model.max_response_tokens": 1, "model.min_response_tokens": 0})
    out = run(broken, tmp_path, seed=0, level="native", short=True, timeout=TIMEOUT, nats_port=free_port())
    assert out.rc == 0, out.log.read_text(errors="replace")[-3000:]
    assert out.figures["grpo.test.start"] < ex.floors["grpo.test.start"]
    assert out.warnings and "grpo: no learning signal" in out.warnings[0]
