"""CI proves the guessing-game agent example learns: its short version on two kernel levels (``tests/examples/learning.py``)."""

from __future__ import annotations

import pytest

from .learning import LEVELS, assert_learns

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("level", LEVELS)
def test_the_short_version_learns(tmp_path, level, nats_binary):
    assert_learns("guess", level, tmp_path)
