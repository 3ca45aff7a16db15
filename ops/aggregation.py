"""Masked reductions and loss aggregation.

Conventions for all of ``ops``: token tensors are ``batch x response_length``; ``mask`` (the
``action_mask``) is 1 where a token counts and 0 on padding or on tokens the policy did not
produce (tool output, prompts of later turns). Reductions never divide by zero: an empty mask
gives 0, not NaN, and the zero has a finite gradient (the denominator is made safe *before*
dividing, so ``torch.where`` never hides a NaN branch).

Loss aggregation modes (verl / Trinity-RFT names):

- ``token-mean``: sum over all counted tokens / number of counted tokens. Every token weighs
  the same, so long answers weigh more (DAPO's recommendation).
- ``seq-mean-token-mean``: mean over tokens within each sequence, then mean over sequences
  (the original GRPO objective; every sequence weighs the same).
- ``seq-mean-token-sum``: sum over tokens within each sequence, then mean over sequences.
- ``seq-mean-token-sum-norm``: sum over all counted tokens / a constant (default: the response
  length ``T``), Dr. GRPO's length-unbiased form (arXiv:2503.20783).

Sequence means run over sequences that have at least one counted token; a batch with none
gives 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def _safe(count: Tensor) -> Tensor:
    """``count`` with zeros replaced by ones, so ``x / _safe(count)`` is 0 when ``x`` is 0."""
    return torch.where(count > 0, count, torch.ones_like(count))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is set (over ``dim``, or everything).

    Masked-out entries are *selected away*, not multiplied by 0, so an inf or NaN on a padding
    token cannot leak into the sum.
    """
    mask = mask.to(values.dtype)
    prod = torch.where(mask != 0, values * mask, torch.zeros_like(values))
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` where ``mask`` is set; 0 where nothing is set."""
    mask = mask.to(values.dtype)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / _safe(count)


def masked_var(values: Tensor, mask: Tensor) -> Tensor:
    """Unbiased (Bessel-corrected) variance over all masked entries; 0 with fewer than two."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_mean(values, mask)
    sq = masked_sum((values - mean) ** 2, mask)
    return torch.where(count > 1, sq / _safe(count - 1), torch.zeros_like(sq))


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(values - mean) / sqrt(var + eps)`` with statistics over the masked entries.

    Masked-out entries are returned as 0. All-equal values whiten to 0 (not NaN).
    """
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def aggregate_loss(
    values: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    normalizer: float | None = None,
) -> Tensor:
    """Reduce per-token ``values`` (``B x T``) to a scalar loss with ``mode`` (see module doc).

    ``normalizer`` is only used by ``seq-mean-token-sum-norm`` (default ``T``).
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return masked_mean(values, mask)
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        if mode == "seq-mean-token-mean":
            per_seq = masked_mean(values, mask, dim=-1)
        else:
            per_seq = masked_sum(values, mask, dim=-1)
        has_tokens = (mask.sum(dim=-1) > 0).to(values.dtype)
        return masked_sum(per_seq, has_tokens) / _safe(has_tokens.sum())
    if mode == "seq-mean-token-sum-norm":
        norm = float(mask.shape[-1]) if normalizer is None else float(normalizer)
        total = masked_sum(values, mask)
        return total / norm if norm > 0 else total * 0.0
    raise ValueError(f"unknown loss_agg_mode {mode!r}; valid names: {', '.join(LOSS_AGG_MODES)}")
