"""CI proves the quickstart learns: its short version on two kernel levels (``tests/examples/learning.py``)."""

from __future__ import annotations

import pytest

from .learning import LEVELS, assert_a_recipe_that_cannot_learn_fails_its_floors, assert_learns

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("level", LEVELS)
def test_the_short_version_learns(tmp_path, level, nats_binary):
    assert_learns("quickstart", level, tmp_path)


def test_a_recipe_that_cannot_learn_fails_its_floors_and_says_why(tmp_path, nats_binary):
    assert_a_recipe_that_cannot_learn_fails_its_floors(tmp_path)
