"""Trinity-RFT's ``PolicyLossFn`` and the adapter that makes a registered one of ours.

Upstream calls a loss class with the tensors its ``__call__`` names (``logprob``,
``old_logprob``, ``action_mask``, ``advantages``, ``ref_logprob``...), built once with the
config's ``policy_loss_fn_args`` over its ``default_args()``; it returns ``(loss, metrics)``,
which is our policy losses' convention too (``ops.policy_losses``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor

from trinity.algorithm.advantage_fn import construct, with_settings


class PolicyLossFn:
    """Base of a loss class: ``__call__(logprob, <the tensors it names>) -> (loss, metrics)``."""

    loss_agg_mode: str = "token-mean"

    def __init__(self, backend: str = "verl", **kwargs: Any) -> None:
        self.backend = backend

    def __call__(self, logprob: Tensor, **kwargs: Any) -> tuple[Tensor, dict]:
        raise NotImplementedError(f"{type(self).__name__}: implement __call__")

    @classmethod
    def default_args(cls) -> dict:
        return {}


#: the tensors our trainer has for a loss, by upstream's names
DATA = ("old_logprob", "advantages", "action_mask", "ref_logprob", "expert_mask")


def as_our_policy_loss(name: str, cls: type, owner: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """The loss class as one of our policy losses: given the tensors its ``__call__`` names."""
    wants = inspect.signature(cls.__call__).parameters
    missing = [k for k, p in wants.items() if k not in ("self", "logprob", *DATA) and p.default is p.empty
               and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if missing:
        raise TypeError(f"{owner}: __call__ needs {missing}, which this trainer does not have "
                        f"(it has logprob, {', '.join(DATA)})")

    def loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, action_mask: Tensor, *,
             ref_logprob: Tensor | None = None, expert_mask: Tensor | None = None, global_step: int = 0,
             part_weights: Any = None, m2po_mask: Any = None, **args: Any) -> tuple[Tensor, dict[str, float]]:
        data = {"old_logprob": old_logprob, "advantages": advantages, "action_mask": action_mask,
                "ref_logprob": ref_logprob, "expert_mask": expert_mask}
        value, metrics = construct(cls, args)(logprob=logprob, **{k: v for k, v in data.items() if k in wants})
        return value, {k: float(v) for k, v in metrics.items()}

    loss.__name__ = name
    loss.__doc__ = f"{owner} (a Trinity-RFT policy loss class)"
    return with_settings(loss, cls)
