"""Trinity-RFT's loss helpers, as its algorithm guide calls them: ours (``ops.aggregation``)."""

from __future__ import annotations

from torch import Tensor

from ops.aggregation import aggregate_loss as _aggregate
from ops.aggregation import masked_mean, masked_sum, masked_whiten

__all__ = ["aggregate_loss", "masked_loss", "masked_mean", "masked_sum", "masked_whiten"]


def aggregate_loss(values: Tensor, mask: Tensor, loss_agg_mode: str = "token-mean",
                   normalizer: float | None = None) -> Tensor:
    """Per-token ``values`` to one loss, as ``loss_agg_mode`` averages them."""
    return _aggregate(values, mask, loss_agg_mode, normalizer)


def masked_loss(values: Tensor, mask: Tensor, loss_agg_mode: str = "token-mean",
                normalizer: float | None = None) -> Tensor:
    """The older name of :func:`aggregate_loss`."""
    return _aggregate(values, mask, loss_agg_mode, normalizer)
