"""The critic's loss: PPO's clipped value loss.

Why clip: the value targets (GAE returns) move with every batch; clipping the new prediction
to ``old +- cliprange_value`` keeps one noisy batch from dragging the critic far from what it
predicted when the advantages were computed (Schulman et al. 2017; veRL's ``cliprange_value``,
default 0.5). The loss takes the worse (larger) of the clipped and unclipped squared errors,
so clipping can only make the update more cautious.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ops.aggregation import aggregate_loss, masked_mean


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    action_mask: Tensor,
    *,
    cliprange_value: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` aggregated over counted
    tokens (``B x T`` inputs). ``cliprange_value=None`` turns clipping off. Returns the loss and
    metrics ``vf_loss``, ``vf_clipfrac`` (share of tokens where the clipped error was larger),
    ``vpred_mean``."""
    mask = action_mask.to(values.dtype)
    returns = returns.to(values.dtype)
    err = (values - returns) ** 2
    if cliprange_value is None:
        tokens = err
        clipfrac = values.new_zeros(())
    else:
        if cliprange_value <= 0:
            raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}")
        old = old_values.to(values.dtype)
        clipped = old + (values - old).clamp(-cliprange_value, cliprange_value)
        err_clipped = (clipped - returns) ** 2
        tokens = torch.maximum(err, err_clipped)
        clipfrac = masked_mean((err_clipped > err).to(values.dtype), mask)
    loss = 0.5 * aggregate_loss(tokens, mask, loss_agg_mode)
    metrics = {
        "vf_loss": float(loss.detach()),
        "vf_clipfrac": float(clipfrac),
        "vpred_mean": float(masked_mean(values.detach(), mask)),
    }
    return loss, metrics
