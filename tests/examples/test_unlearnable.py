"""A recipe that cannot learn fails its floors and the run says why (the check:
``tests/examples/learning.py``). A file of its own so that a worker other than the one running
``test_learning.py`` (the suite's longest file) takes it."""

from __future__ import annotations

import pytest

from .learning import assert_a_recipe_that_cannot_learn_fails_its_floors

pytestmark = pytest.mark.slow


def test_a_recipe_that_cannot_learn_fails_its_floors_and_says_why(tmp_path, nats_binary):
    assert_a_recipe_that_cannot_learn_fails_its_floors(tmp_path)
