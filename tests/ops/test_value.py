"""The critic's clipped value loss (ops.value)."""

from __future__ import annotations

import pytest
import torch

from ops.value import value_loss


def test_unclipped_is_half_mse_over_counted_tokens():
    v = torch.tensor([[1.0, 2.0, 9.0]])
    r = torch.tensor([[0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = value_loss(v, v, r, mask, cliprange_value=None)
    assert loss.item() == pytest.approx(0.5 * (1 + 4) / 2)
    assert m["vf_clipfrac"] == 0.0 and m["vpred_mean"] == pytest.approx(1.5)


def test_clip_takes_the_worse_error_and_stops_the_gradient_past_the_range():
    old = torch.zeros(1, 2)
    r = torch.tensor([[1.0, -1.0]])
    # token 0 moved past the clip towards its target: the clipped error (0.5 away) is larger,
    # so the loss uses it and gives no gradient; token 1 moved within the range
    v = torch.tensor([[0.9, -0.2]], requires_grad=True)
    loss, m = value_loss(v, old, r, torch.ones(1, 2), cliprange_value=0.5)
    assert loss.item() == pytest.approx(0.5 * ((0.5 - 1.0) ** 2 + (-0.2 + 1.0) ** 2) / 2)
    assert m["vf_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    assert v.grad[0, 0] == 0.0 and v.grad[0, 1] != 0.0


def test_bad_cliprange_is_named():
    with pytest.raises(ValueError, match="cliprange_value"):
        value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cliprange_value=0)
