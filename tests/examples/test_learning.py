"""CI proves the README's examples learn: each example's short version (``examples/recipes.py``)
runs end to end with ``trinity run``, as a user runs it, on two CPU kernel levels (what torch
picks here, and torch/MKL/oneDNN held to AVX2: a stand-in for another CPU) and must reach its
floors. A recipe that stops learning, or learns on one CPU only, fails here. The figures over
seeds are ``bench/example_figures.py``'s (``docs/examples.md``).

The runs go one after the other, on one pytest worker, while the other worker runs the rest
of the suite; every process has one OpenMP thread (``tests/conftest.py``: with the default of
one per core, the SFT stages' threads spin against the other worker's processes, and a run took
twice the time). Two runs side by side (one core and one torch thread each, tried 2026-11-26)
saved nothing: the guessing game's pair took 13 min against 11 one after the other, the
calculator's AVX2 run 9.3 min against 6.0 alone."""

from __future__ import annotations

import pytest

from bus.server import free_port
from examples.recipes import DROP, EXAMPLES, run

#: one worker runs them one after the other (``--dist loadfile`` in pyproject.toml: keep them
#: in this one file): two at once only contend
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("level", ["native", "avx2"])
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_the_short_version_learns(tmp_path, name, level, nats_binary):
    ex = EXAMPLES[name]
    out = run(ex, tmp_path, seed=0, level=level, short=True, timeout=900, nats_port=free_port())
    log = out.log.read_text(errors="replace")[-3000:]
    assert out.rc == 0, log
    assert not out.warnings, out.warnings
    low = {k: v for k, v in ex.floors.items() if out.figures.get(k, 0.0) < v}
    assert not low, f"below the floors {low}: {out.figures}\n{log}"


def test_a_recipe_that_cannot_learn_fails_its_floors_and_says_why(tmp_path, nats_binary):
    """The quickstart with its warm-up switched off (SFT lr 0): the model never answers, every
    reward is 0, and the run summary warns that GRPO had no learning signal."""
    from dataclasses import replace

    ex = EXAMPLES["quickstart"]
    broken = replace(ex, short={**ex.short, "stages.0": DROP, "stages.1.algorithm.optimizer.lr": 0.0,
                                "stages.1.buffer.total_steps": 5, "buffer.total_steps": 3})
    out = run(broken, tmp_path, seed=0, level="native", short=True, timeout=900, nats_port=free_port())
    assert out.rc == 0, out.log.read_text(errors="replace")[-3000:]
    assert out.figures["grpo.test.start"] < ex.floors["grpo.test.start"]
    assert out.warnings and "grpo: no learning signal" in out.warnings[0]
