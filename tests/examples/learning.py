"""CI proves the README's examples learn: each example's short version (``examples/recipes.py``)
runs end to end with ``trinity run``, as a user runs it, on two CPU kernel levels (what torch
picks here, and torch/MKL/oneDNN held to AVX2: a stand-in for another CPU) and must reach its
floors. A recipe that stops learning, or learns on one CPU only, fails here. The figures over
seeds are ``bench/example_figures.py``'s (``docs/examples.md``).

Every process has one OpenMP thread (``tests/conftest.py``: with the default of one per core,
the SFT stages' threads spin against the other worker's processes, and a run took twice the
time)."""

from __future__ import annotations

from bus.server import free_port
from examples.recipes import DROP, EXAMPLES, run

#: The kernel levels each short version runs on.
LEVELS = ("native", "avx2")
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
    assert not low, f"below the floors {low}: {out.figures}\n{log}"


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
