from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("compat_model") / "m")


@pytest.fixture(scope="session")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.tiny import build_arithmetic_taskset

    return build_arithmetic_taskset(tmp_path_factory.mktemp("compat_data"), n_train=12, n_eval=3)
