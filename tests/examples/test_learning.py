"""CI proves the README's examples learn (the checks: ``tests/examples/learning.py``): each
example's short version on the CPU's own kernel level (``learning.LEVELS`` says why no
example runs on AVX2 here any more).

One file, so one pytest worker runs them one after the other (``--dist loadfile``) while the
others run the rest of the suite. Tried 2026-11-27: one file per example, started first on both
workers, made the suite slower (45.1 min against 40.0, 83 CPU-min against 71): two runs side by
side contend, and each took 30-40% longer (the calculator's AVX2 run 674 s against 513). The
recipe that cannot learn is ``test_unlearnable.py``'s: another worker runs it."""

from __future__ import annotations

import pytest

from examples.recipes import EXAMPLES

from .learning import LEVELS, assert_learns

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("name", "level"), [(name, level) for name in EXAMPLES for level in LEVELS[name]],
                         ids=lambda v: v)
def test_the_short_version_learns(tmp_path, name, level, nats_binary):
    assert_learns(name, level, tmp_path)
