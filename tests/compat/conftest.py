"""The tiny model and the sums taskset of ``tests/run`` (the plugin run trains on them)."""

from tests.run.conftest import arith, tiny_model  # noqa: F401 - fixtures, shared
