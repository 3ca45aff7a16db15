from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.tiny import build_arithmetic_taskset

    return build_arithmetic_taskset(tmp_path_factory.mktemp("arith"), n_train=6, n_eval=3, seed=0)


@pytest.fixture(scope="session")
def hf_model(tiny_model: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
