"""Entropy bonus.

Each entropy loss function takes per-token ``entropy`` (``B x T``, see
``ops.logits.entropy_from_logits``) and ``action_mask`` and returns ``(term, metrics)``
where ``term = -entropy_coef * aggregate(entropy)`` is *added* to the loss: a positive
``entropy_coef`` rewards a flatter next-token distribution and so keeps exploration alive
(Williams & Peng 1991; Mnih et al. 2016). ``metrics["entropy"]`` is the aggregated entropy.
"""

from __future__ import annotations

from torch import Tensor

from ops.aggregation import aggregate_loss
from ops.registry import register

# The data arguments every entropy loss accepts (the rest are hyperparameters).
ENTROPY_DATA: tuple[str, ...] = ("entropy", "action_mask", "expert_mask")


@register("entropy_loss_fn", "default")
def default_entropy_loss(
    entropy: Tensor,
    action_mask: Tensor,
    *,
    expert_mask: Tensor | None = None,
    entropy_coef: float = 0.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """``-entropy_coef * aggregate(entropy)`` over all counted tokens."""
    value = aggregate_loss(entropy, action_mask, loss_agg_mode)
    return -entropy_coef * value, {"entropy": float(value.detach())}


@register("entropy_loss_fn", "mix")
def mix_entropy_loss(
    entropy: Tensor,
    action_mask: Tensor,
    *,
    expert_mask: Tensor | None = None,
    entropy_coef: float = 0.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """Like ``default`` but only over the policy's own rollouts (rows where ``expert_mask`` is
    False): the entropy of expert demonstrations says nothing about the policy's exploration.
    """
    if expert_mask is None:
        raise ValueError("entropy_loss_fn 'mix' needs `expert_mask`")
    usual = ~expert_mask.bool()
    value = aggregate_loss(entropy[usual], action_mask[usual], loss_agg_mode)
    return -entropy_coef * value, {"entropy": float(value.detach())}


@register("entropy_loss_fn", "none")
def no_entropy_loss(
    entropy: Tensor,
    action_mask: Tensor,
    *,
    expert_mask: Tensor | None = None,
    entropy_coef: float = 0.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """No entropy term: 0."""
    return entropy.new_zeros(()), {}
