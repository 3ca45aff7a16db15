"""KL divergence between the policy and a reference model, as a reward penalty or a loss term.

Per-token estimators (Schulman, "Approximating KL divergence", 2020), with
``log r = ref_logprob - logprob`` on tokens sampled from the policy:

- ``k1``: ``-log r`` (unbiased, high variance, can be negative),
- ``k2``: ``(log r)^2 / 2`` (biased, low variance; its gradient is the true KL's),
- ``k3``: ``r - 1 - log r`` (unbiased and always >= 0),
- ``low_var_kl``: ``k3`` with ``log r`` clamped to [-20, 20] and the result to [-10, 10]
  (verl's guard against a single runaway token),
- ``abs``: ``|log r|``,
- ``corrected_k3``: ``k3`` times ``pi / pi_old`` clamped to [0, 2] (the loss term only),
- ``none``: 0.

Tensors are ``B x T`` log-probs of the sampled tokens; ``action_mask`` marks counted tokens.
``kl_fn`` arguments take a registered name (``register("kl_fn", name)`` adds one: a function
``(logprob, ref_logprob) -> per-token KL``).

Coefficient: fixed ``kl_coef``, or adaptive (Ziegler et al. 2019, arXiv:1909.08593) with
``adaptive=True, target_kl, horizon``. The functions here stay pure: they report the
coefficient for the next step as ``metrics["next_kl_coef"]`` and the caller keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ops.aggregation import aggregate_loss, masked_mean
from ops.registry import get, register

KLFn = Callable[[Tensor, Tensor], Tensor]


@register("kl_fn", "none")
def kl_none(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """No KL: zeros."""
    return torch.zeros_like(logprob)


@register("kl_fn", "k1")
def kl_k1(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """``log pi - log ref``."""
    return logprob - ref_logprob


@register("kl_fn", "k2")
def kl_k2(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """``(log pi - log ref)^2 / 2``."""
    return 0.5 * (logprob - ref_logprob).square()


@register("kl_fn", "k3")
def kl_k3(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """``exp(log ref - log pi) - 1 - (log ref - log pi)``."""
    log_r = ref_logprob - logprob
    return log_r.exp() - 1.0 - log_r


@register("kl_fn", "low_var_kl")
def kl_low_var(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """``k3`` with the log-ratio clamped to [-20, 20] and the result to [-10, 10]."""
    log_r = (ref_logprob - logprob).clamp(-20.0, 20.0)
    return (log_r.exp() - 1.0 - log_r).clamp(-10.0, 10.0)


@register("kl_fn", "abs")
def kl_abs(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """``|log pi - log ref|``."""
    return (logprob - ref_logprob).abs()


@register("kl_fn", "corrected_k3")
def kl_corrected_k3(logprob: Tensor, ref_logprob: Tensor, old_logprob: Tensor | None = None) -> Tensor:
    """``k3`` times the importance ratio ``pi / pi_old`` clamped to [0, 2] (Trinity-RFT's
    ``corrected_k3``): ``k3`` estimates KL(pi || ref) only on tokens sampled from ``pi``, and a
    stale rollout's tokens were sampled from ``pi_old``. The ratio keeps its gradient, as
    upstream's. Without ``old_logprob`` (the reward penalty, where ``pi`` is ``pi_old``): ``k3``."""
    k3 = kl_k3(logprob, ref_logprob)
    if old_logprob is None:
        return k3
    return (logprob - old_logprob).exp().clamp(0.0, 2.0) * k3


#: KL functions that also take the rollout policy's log-probs (``old_logprob``).
NEEDS_OLD: frozenset[str] = frozenset({"corrected_k3"})


def _kl_fn(kl_fn: str | KLFn) -> KLFn:
    return get("kl_fn", kl_fn) if isinstance(kl_fn, str) else kl_fn


def _is_none(kl_fn: str | KLFn) -> bool:
    return kl_fn == "none" or kl_fn is kl_none


def adaptive_kl_coef(
    kl_coef: float, current_kl: float, target_kl: float, horizon: float, n_steps: int
) -> float:
    """Ziegler et al.'s proportional controller.

    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``;
    ``kl_coef <- kl_coef * (1 + e * n_steps / horizon)``: the coefficient grows when the policy
    drifts past the target and shrinks when it stays closer.
    """
    if target_kl <= 0 or horizon <= 0:
        raise ValueError("adaptive KL needs target_kl > 0 and horizon > 0")
    error = min(max(current_kl / target_kl - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * n_steps / horizon)


def _check_adaptive(adaptive: bool, target_kl: float | None, horizon: float | None) -> None:
    if adaptive and (target_kl is None or horizon is None):
        raise ValueError("adaptive KL needs `target_kl` and `horizon`")


def _coef_metrics(
    kl_coef: float,
    current_kl: float,
    n_steps: int,
    adaptive: bool,
    target_kl: float | None,
    horizon: float | None,
) -> dict[str, float]:
    next_coef = kl_coef
    if adaptive:
        assert target_kl is not None and horizon is not None
        next_coef = adaptive_kl_coef(kl_coef, current_kl, target_kl, horizon, n_steps)
    return {"kl": current_kl, "kl_coef": kl_coef, "next_kl_coef": next_coef}


def kl_penalty(
    rewards: Tensor,
    logprob: Tensor,
    ref_logprob: Tensor,
    action_mask: Tensor,
    *,
    kl_fn: str | KLFn = "k1",
    kl_coef: float = 0.001,
    adaptive: bool = False,
    target_kl: float | None = None,
    horizon: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """KL as a reward penalty (InstructGPT): ``token_rewards - kl_coef * KL_t`` on counted tokens.

    ``rewards`` is ``(B,)`` (placed on each sequence's last counted token) or ``B x T``.
    Returns token-level rewards and metrics ``kl`` (mean over sequences of the per-token mean),
    ``kl_coef`` (used) and ``next_kl_coef``.
    """
    _check_adaptive(adaptive, target_kl, horizon)
    mask = action_mask.to(logprob.dtype)
    if rewards.dim() == 1:
        token_rewards = torch.zeros_like(logprob)
        positions = torch.arange(mask.shape[-1], device=mask.device)
        last = torch.where(mask > 0, positions, -1).amax(dim=-1)
        has = last >= 0
        token_rewards[has, last[has]] = rewards[has].to(logprob.dtype)
    else:
        token_rewards = rewards.to(logprob.dtype)
    if _is_none(kl_fn):
        return token_rewards, {}
    kl = _kl_fn(kl_fn)(logprob, ref_logprob) * mask
    per_seq = masked_mean(kl, mask, dim=-1)
    current = float(per_seq.mean()) if per_seq.numel() else 0.0
    metrics = _coef_metrics(kl_coef, current, mask.shape[0], adaptive, target_kl, horizon)
    return token_rewards - kl_coef * kl, metrics


def kl_loss(
    logprob: Tensor,
    ref_logprob: Tensor,
    action_mask: Tensor,
    *,
    kl_fn: str | KLFn = "k2",
    kl_coef: float = 0.001,
    loss_agg_mode: str = "token-mean",
    adaptive: bool = False,
    target_kl: float | None = None,
    horizon: float | None = None,
    old_logprob: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """KL as a loss term (GRPO): ``kl_coef * aggregate(KL_t)``, to add to the policy loss.
    ``old_logprob`` (the rollout policy's) goes to the functions of :data:`NEEDS_OLD`.

    Metrics: ``kl_loss`` (the aggregated KL before the coefficient), ``kl_coef``,
    ``next_kl_coef``.
    """
    _check_adaptive(adaptive, target_kl, horizon)
    if _is_none(kl_fn):
        return logprob.new_zeros(()), {}
    extra = {"old_logprob": old_logprob} if kl_fn in NEEDS_OLD else {}
    kl = _kl_fn(kl_fn)(logprob, ref_logprob, **extra)
    value = aggregate_loss(kl, action_mask, loss_agg_mode)
    current = float(value.detach())
    metrics = _coef_metrics(kl_coef, current, logprob.shape[0], adaptive, target_kl, horizon)
    metrics["kl_loss"] = metrics.pop("kl")
    return kl_coef * value, metrics
