"""The GPU memory estimate (``ops/memory.py``) against sums done by hand, and the settings
that shrink it doing so by the amounts their definitions say."""

from __future__ import annotations

import dataclasses

import pytest

from ops.memory import (
    GIB,
    ModelShape,
    TrainerSettings,
    engine_parts,
    micro_batch_tokens,
    shown,
    token_parts,
    total,
    trainer_parts,
)

pytestmark = pytest.mark.unit

M = ModelShape(params=1_000_000_000, hidden=2048, layers=16, vocab=32000, kv_width=512)


def test_a_bf16_zero2_rank_by_hand():
    parts = trainer_parts(M, TrainerSettings())
    want = {"weights": 2e9, "gradients": 2e9, "optimizer": 12e9,
            "activations": 4096 * 2048 * 34 + 4096 * 2048 * 2 * 16, "logits": 4096 * 32000 * 4 * 2}
    assert parts == pytest.approx({k: v / GIB for k, v in want.items()})


def test_zero_stages_split_what_their_definitions_split_over_the_ranks():
    four = TrainerSettings(ranks=4)
    one = trainer_parts(M, dataclasses.replace(four, zero_stage=0))
    z1 = trainer_parts(M, dataclasses.replace(four, zero_stage=1))
    z2 = trainer_parts(M, dataclasses.replace(four, zero_stage=2))
    z3 = trainer_parts(M, dataclasses.replace(four, zero_stage=3))
    assert z1["optimizer"] == pytest.approx(one["optimizer"] / 4) and z1["gradients"] == one["gradients"]
    assert z2["gradients"] == pytest.approx(one["gradients"] / 4) and z2["weights"] == one["weights"]
    assert z3["weights"] == pytest.approx(one["weights"] / 4)


def test_offload_checkpointing_lora_and_the_reference():
    base = TrainerSettings()
    assert trainer_parts(M, dataclasses.replace(base, offload_optimizer=True))["optimizer"] == 0
    assert trainer_parts(M, dataclasses.replace(base, zero_stage=3, offload_param=True))["weights"] == 0
    assert trainer_parts(M, dataclasses.replace(base, offload_param=True))["weights"] > 0  # ZeRO-3 only
    full = trainer_parts(M, dataclasses.replace(base, gradient_checkpointing=False))["activations"]
    assert full == pytest.approx(4096 * 2048 * 34 * 16 / GIB)
    lora = trainer_parts(M, dataclasses.replace(base, trainable=10_000_000, reference=True))
    assert lora["gradients"] == pytest.approx(2e7 / GIB) and lora["optimizer"] == pytest.approx(12e7 / GIB)
    assert "reference" not in lora  # the base model with the adapter off is the reference
    assert trainer_parts(M, dataclasses.replace(base, reference=True))["reference"] == pytest.approx(2e9 / GIB)
    fp32 = trainer_parts(M, dataclasses.replace(base, bf16=False))
    assert fp32["weights"] == pytest.approx(4e9 / GIB) and fp32["optimizer"] == pytest.approx(8e9 / GIB)


def test_an_engine_holds_its_weights_and_its_kv_cache():
    parts = engine_parts(M, 2, sequences=64, max_model_len=1024, tensor_parallel=2)
    assert parts == pytest.approx({"weights": 1e9 / GIB, "kv cache": 64 * 1024 * 16 * 512 * 2 / 2 / GIB})
    assert total(parts) == pytest.approx(sum(parts.values()))
    assert shown({"weights": 1.0, "gradients": 0.01}) == "1.0 GiB (weights 1.0)"


def test_the_micro_batch_token_budget_by_hand():
    """PyTorch's float32 trainer (bf16 off, no checkpointing): per token 68 x hidden bytes a
    layer and 8 x vocab of logits; the budget is the share of what is free after the
    gradients (4 bytes a parameter) and Adam's moments (8) the first update allocates."""
    s = TrainerSettings(zero_stage=0, bf16=False, gradient_checkpointing=False)
    per_token = 2048 * 34 * 2 * 16 + 32000 * 4 * 2
    assert sum(token_parts(M, s)) == per_token
    free = 40 * GIB
    want = int(0.5 * (free - 12e9 - 2 * 32000 * 2048 * 4) // per_token)  # and Adam's two embedding-size temporaries
    assert micro_batch_tokens(M, s, free, 0.5, least=512, most=10**6) == want
    assert micro_batch_tokens(M, s, free, 0.5, least=512, most=1000) == 1000
    # nothing left after the optimizer: still one whole sequence (the fit check warns of the rest)
    assert micro_batch_tokens(M, s, 8 * GIB, 0.5, least=512, most=10**6) == 512
