"""ops/mismatch.py: the engine/trainer log-prob gap, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ops.mismatch import mismatch_metrics, mismatch_sums

pytestmark = pytest.mark.unit


def test_the_gap_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    engine = torch.tensor([[-1.2, -2.0, -2.5], [-0.5, -9.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])  # the -9.0 is padding: not read
    d = [-0.2, 0.0, 0.5, 0.0]  # engine - trainer where the mask holds
    m = mismatch_metrics(mismatch_sums(trainer, engine, mask))
    assert m["rollout/logprob_diff_tokens"] == 4
    assert m["rollout/logprob_diff_mean"] == pytest.approx(sum(abs(x) for x in d) / 4)
    # k3 = r - 1 - log r with r = trainer / engine probability = exp(-d): never negative
    assert m["rollout/kl"] == pytest.approx(sum(math.exp(-x) - 1 + x for x in d) / 4)
    assert m["rollout/kl"] > 0


def test_sums_add_up_over_parts_and_nothing_measured_says_so():
    a, b = torch.zeros(2, 2), torch.full((2, 2), 0.3)
    whole = mismatch_sums(a, b, torch.ones(2, 2, dtype=torch.bool))
    halves = [mismatch_sums(a[i:i + 1], b[i:i + 1], torch.ones(1, 2, dtype=torch.bool)) for i in (0, 1)]
    assert {k: halves[0][k] + halves[1][k] for k in whole} == pytest.approx(whole)
    assert mismatch_metrics(mismatch_sums(a, b, torch.zeros(2, 2, dtype=torch.bool))) == {"rollout/logprob_diff_tokens": 0.0}
    assert mismatch_metrics({}) == {}
