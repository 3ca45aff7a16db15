"""Policy losses: from log-probs and advantages to a scalar loss and named metrics.

Conventions
-----------
Every policy loss has the signature::

    fn(logprob, old_logprob, advantages, action_mask, *,
       ref_logprob=None, expert_mask=None, global_step=0,   # data some losses need
       **hyperparameters)                                     # policy_loss_fn_args
    -> (loss: scalar Tensor, metrics: dict[str, float])

- ``logprob``: log-probs of the sampled tokens under the policy being trained (``B x T``,
  carries the gradient); ``old_logprob``: the same under the policy that sampled them
  (no gradient); ``advantages``: ``B x T``; ``action_mask``: 1 where a token counts.
- ``ref_logprob`` (DPO's reference), ``expert_mask`` (``(B,)`` bool, rows that are expert
  demonstrations, for ``mix``/``mix_chord``) and ``global_step`` (CHORD's schedule) are shared
  data keywords: every loss accepts them and ignores those it does not use, so losses can be
  swapped by name.
- The ratio is ``exp(logprob - old_logprob)`` with the log-ratio clamped to [-20, 20] so one
  runaway token cannot overflow. ``loss_agg_mode`` picks how tokens are averaged
  (``ops.aggregation``).

Metrics (Trinity-RFT names): ``pg_loss`` and friends, ``pg_clipfrac`` (fraction of counted
tokens whose gradient the clip removed), ``ppo_kl`` (mean of ``old_logprob - logprob``, the
k1 estimate of KL(old || new)).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, get_args

import torch
import torch.nn.functional as F
from annotated_types import Gt, Interval
from torch import Tensor

from ops.aggregation import aggregate_loss, masked_mean, masked_sum
from ops.registry import register

Metrics = dict[str, float]

# The data arguments every policy loss accepts (the rest are hyperparameters).
POLICY_LOSS_DATA: tuple[str, ...] = (
    "logprob",
    "old_logprob",
    "advantages",
    "action_mask",
    "ref_logprob",
    "expert_mask",
    "global_step",
    "part_weights",
    "m2po_mask",
)

#: Policy losses whose parts (RL rows, expert rows) are each averaged over the whole
#: mini-batch's rows of that part: the trainer passes them ``part_weights`` per micro-batch.
PART_WEIGHTED: frozenset[str] = frozenset({"mix", "mix_chord"})
#: Policy losses that train on a token mask chosen once over the whole mini-batch, from the
#: current policy's log-probs before its update: the trainer passes it as ``m2po_mask``
#: (:func:`m2po_token_mask`; chosen per micro-batch it would depend on how rows were split).
MINI_BATCH_MASKED: frozenset[str] = frozenset({"m2po"})
#: M2PO's bound on the mean squared log-ratio (the paper's default).
M2_THRESHOLD = 0.04


def _f(x: Tensor) -> float:
    return float(x.detach())


def _log_ratio(logprob: Tensor, old_logprob: Tensor) -> Tensor:
    return (logprob - old_logprob.detach()).clamp(-20.0, 20.0)


def _clip_bounds(
    clip_range: float | None, clip_range_low: float | None, clip_range_high: float | None
) -> tuple[float, float]:
    low = clip_range if clip_range_low is None else clip_range_low
    high = clip_range if clip_range_high is None else clip_range_high
    if low is None or high is None:
        raise ValueError("set clip_range, or both clip_range_low and clip_range_high")
    return float(low), float(high)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid names: {', '.join(choices)}")


# --------------------------------------------------------------------- PPO family


@register("policy_loss_fn", "ppo")
def ppo_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    clip_range: float | None = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_ratio_c: Annotated[float, Gt(1.0)] | None = None,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347).

    ``l_t = max(-A r, -A clip(r, 1 - low, 1 + high))``: the policy gains nothing from moving
    the ratio past the trust region. ``clip_range_low``/``clip_range_high`` default to
    ``clip_range`` (DAPO's asymmetric "clip-higher" sets high > low). Dual clip
    (Ye et al. 2020, arXiv:1912.09729): with ``clip_ratio_c`` (> 1, e.g. 3) a negative-advantage
    token's loss is also capped at ``-A * clip_ratio_c``, so a huge ratio on a bad token cannot
    blow up the update.
    """
    low, high = _clip_bounds(clip_range, clip_range_low, clip_range_high)
    log_ratio = _log_ratio(logprob, old_logprob)
    ratio = log_ratio.exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    clipped = torch.maximum(loss1, loss2)
    tokens = clipped
    lower_frac = logprob.new_zeros(())
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
        loss3 = -advantages * clip_ratio_c
        negative = advantages < 0
        tokens = torch.where(negative, torch.minimum(clipped, loss3), clipped)
        lower_frac = masked_mean(((clipped > loss3) & negative).float(), action_mask)
    loss = aggregate_loss(tokens, action_mask, loss_agg_mode)
    metrics = {
        "pg_loss": _f(loss),
        "pg_clipfrac": _f(masked_mean((loss2 > loss1).float(), action_mask)),
        "pg_clipfrac_lower": _f(lower_frac),
        "ppo_kl": _f(masked_mean(-log_ratio, action_mask)),
    }
    return loss, metrics


@register("policy_loss_fn", "gspo")
def gspo_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    clip_range: float | None = None,
    clip_range_low: float | None = 3e-4,
    clip_range_high: float | None = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
) -> tuple[Tensor, Metrics]:
    """Group Sequence Policy Optimization, token form (Zheng et al. 2025, arXiv:2507.18071).

    The importance ratio is the sequence's length-normalised likelihood ratio
    ``s_i = exp(mean_t log(pi / pi_old))``, shared by all its tokens
    (``s_it = sg(s_i) * pi_t / sg(pi_t)``, equal in value, per-token gradient), then PPO's clip
    with the paper's tiny ranges (3e-4, 4e-4). Clipping whole sequences suits MoE models whose
    token ratios are noisy.
    """
    low, high = _clip_bounds(clip_range, clip_range_low, clip_range_high)
    log_ratio = _log_ratio(logprob, old_logprob)
    seq_log_ratio = masked_mean(log_ratio, action_mask, dim=-1)
    token_log_ratio = logprob - logprob.detach() + seq_log_ratio.detach().clamp(max=10.0)[:, None]
    ratio = token_log_ratio.exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    loss = aggregate_loss(torch.maximum(loss1, loss2), action_mask, loss_agg_mode)
    has_tokens = (action_mask.sum(dim=-1) > 0).to(logprob.dtype)
    metrics = {
        "pg_loss": _f(loss),
        "pg_clipfrac": _f(masked_mean((loss2 > loss1).float(), action_mask)),
        "ppo_kl": _f(masked_mean(-log_ratio, action_mask)),
        "ppo_kl_seq": _f(masked_mean(-seq_log_ratio, has_tokens)),
    }
    return loss, metrics


@register("policy_loss_fn", "cispo")
def cispo_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    clip_range_low: float = 1.0,
    clip_range_high: float = 0.28,
    enable_mask_clip: bool = False,
    mask_clip_range_low: float = 1.0,
    mask_clip_range_high: float = 0.28,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Clipped IS-weight policy optimisation (MiniMax-M1, arXiv:2506.13585).

    ``l_t = -sg(clip(r, 1 - low, 1 + high)) * A * log pi``: the importance weight is clipped
    and detached, but every token keeps its gradient (PPO drops clipped tokens entirely, which
    loses rare reflective tokens). Optional PPO-style token mask (``enable_mask_clip``) zeroes
    tokens with ``r > 1 + mask_high, A > 0`` or ``r < 1 - mask_low, A < 0``.
    """
    log_ratio = _log_ratio(logprob, old_logprob)
    ratio = log_ratio.exp().detach()
    weight = ratio.clamp(1.0 - clip_range_low, 1.0 + clip_range_high)
    keep = torch.ones_like(ratio)
    if enable_mask_clip:
        drop = ((ratio > 1.0 + mask_clip_range_high) & (advantages > 0)) | (
            (ratio < 1.0 - mask_clip_range_low) & (advantages < 0)
        )
        keep = (~drop).to(ratio.dtype)
    tokens = -advantages * weight * keep * logprob
    loss = aggregate_loss(tokens, action_mask, loss_agg_mode)
    metrics = {
        "cispo_loss": _f(loss),
        "ppo_kl": _f(masked_mean(-log_ratio, action_mask)),
        "masked_frac": _f(masked_mean(keep, action_mask)),
    }
    return loss, metrics


@register("policy_loss_fn", "sapo")
def sapo_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347).

    Replaces the hard clip with a soft gate: ``l_t = -A f(r)``, ``f(r) = 4/tau sigmoid(tau
    (r - 1))``, ``tau = tau_pos`` if ``A > 0`` else ``tau_neg``. The gradient weight
    ``f'(r) r = 4 sigma (1 - sigma) r`` is 1 on-policy and decays smoothly as the ratio drifts,
    faster for negative advantages (``tau_neg > tau_pos``). This follows the paper's objective,
    with the gradient through ``r`` (Trinity-RFT detaches the gate instead).
    """
    log_ratio = _log_ratio(logprob, old_logprob)
    ratio = log_ratio.exp()
    tau = torch.where(
        advantages > 0,
        torch.full_like(ratio, tau_pos),
        torch.full_like(ratio, tau_neg),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = aggregate_loss(-advantages * gate, action_mask, loss_agg_mode)
    sig = torch.sigmoid(tau * (ratio - 1.0)).detach()
    metrics = {
        "sapo_loss": _f(loss),
        "ppo_kl": _f(masked_mean(-log_ratio, action_mask)),
        "avg_soft_gate": _f(masked_mean(4.0 * sig * (1.0 - sig), action_mask)),
        "avg_ratio": _f(masked_mean(ratio, action_mask)),
        "pos_adv_frac": _f(masked_mean((advantages > 0).float(), action_mask)),
    }
    return loss, metrics


def m2po_token_mask(log_ratio: Tensor, action_mask: Tensor, advantages: Tensor,
                    m2_threshold: float = M2_THRESHOLD) -> tuple[Tensor, Metrics]:
    """M2PO's token mask (Algorithm 1 of "M2PO", ICLR 2026, openreview IIgl5MWelz).

    Only tokens in PPO's active quadrants are constrained (``A > 0`` and ``r > 1``, or
    ``A < 0`` and ``r < 1``: where a clip would bite); among them the ones with the largest
    second moment ``log(r)^2`` leave the loss until the mean second moment of those left is at
    most ``m2_threshold``. Every other token stays. Sorting once is the paper's loop of
    "drop the largest until the mean fits": the kept set is the longest prefix of the
    ascending order whose running mean fits. Metrics: ``m2po/m2_before`` and ``m2_after``
    (the constrained tokens' mean second moment), ``masked_fraction`` and
    ``trust_region_fraction`` (of the counted tokens)."""
    if not math.isfinite(m2_threshold) or m2_threshold < 0:
        raise ValueError(f"m2_threshold must be finite and non-negative, got {m2_threshold}")
    valid = action_mask.bool()
    lr, adv = log_ratio.detach().float(), advantages.detach()
    if bool((~torch.isfinite(lr[valid])).any()):
        raise ValueError("m2po: a non-finite log-ratio among the counted tokens")
    active = valid & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))
    index = torch.nonzero(active.reshape(-1)).squeeze(-1)
    m2 = lr.square().reshape(-1)[index]
    before = float(m2.mean()) if m2.numel() else 0.0
    keep = torch.ones_like(m2, dtype=torch.bool)
    if m2.numel() and before > m2_threshold:
        ordered, order = torch.sort(m2, stable=True)
        running = torch.cumsum(ordered, 0) / torch.arange(1, m2.numel() + 1, dtype=ordered.dtype)
        keep[order[int((running <= m2_threshold).sum()):]] = False
    mask = valid.clone().reshape(-1)
    mask[index[~keep]] = False
    n = max(int(valid.sum()), 1)
    return mask.view_as(valid), {
        "m2po/m2_before": before,
        "m2po/m2_after": float(m2[keep].mean()) if bool(keep.any()) else 0.0,
        "m2po/masked_fraction": int((~keep).sum()) / n,
        "m2po/trust_region_fraction": m2.numel() / n,
    }


@register("policy_loss_fn", "m2po")
def m2po_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    m2po_mask: Tensor | None = None,
    m2_threshold: Annotated[float, Interval(ge=0.0, lt=math.inf)] = M2_THRESHOLD,
    log_ratio_clip: Annotated[float, Interval(gt=0.0, lt=math.inf)] = 20.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """M2PO (second-moment trust policy optimisation, ICLR 2026): ``l_t = -A r`` unclipped, on
    the tokens ``m2po_mask`` keeps (:func:`m2po_token_mask`), averaged over *every* counted token
    (the paper's footnote 2: a masked token still counts in the denominator).

    Why no clip: stale rollouts (an explorer steps ahead) make many ratios leave PPO's band, and
    clipping drops all of them; M2PO drops only the few outliers that carry the second moment.
    ``m2po_mask``: the trainer passes the mask chosen over the whole mini-batch; None chooses it
    over the rows given here. The log-ratio is clamped to ``log_ratio_clip`` in value only
    (the gradient stays that of the unclamped ratio), as upstream's. Upstream requires the
    rollout engine's log-probs as the old ones (``algorithm.bypass_old_logprobs: true``; the
    config check refuses ``false``) and ``loss_agg_mode: token-mean``."""
    if loss_agg_mode != "token-mean":
        raise ValueError(f"m2po needs loss_agg_mode token-mean (the paper's denominator), got {loss_agg_mode!r}")
    if not math.isfinite(log_ratio_clip) or log_ratio_clip <= 0:
        raise ValueError(f"log_ratio_clip must be finite and positive, got {log_ratio_clip}")
    log_ratio = logprob - old_logprob.detach()
    metrics: Metrics = {}
    if m2po_mask is None:
        m2po_mask, metrics = m2po_token_mask(log_ratio, action_mask, advantages, m2_threshold)
    stable = log_ratio + (log_ratio.clamp(-log_ratio_clip, log_ratio_clip) - log_ratio).detach()
    ratio = stable.exp()
    tokens = torch.where(m2po_mask.bool(), -advantages * ratio, torch.zeros_like(ratio))
    loss = aggregate_loss(tokens, action_mask, loss_agg_mode)
    return loss, {"pg_loss": _f(loss), "ppo_kl": _f(masked_mean(-stable, action_mask)),
                  "ratio_mean": _f(masked_mean(ratio, action_mask)), **metrics}


@register("policy_loss_fn", "importance_sampling")
def importance_sampling_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Unclipped importance-sampled policy gradient: ``l_t = -A r``.

    The plain off-policy surrogate; on-policy distillation uses it when no trust region is
    wanted.
    """
    log_ratio = _log_ratio(logprob, old_logprob)
    loss = aggregate_loss(-advantages * log_ratio.exp(), action_mask, loss_agg_mode)
    return loss, {"pg_loss": _f(loss), "ppo_kl": _f(masked_mean(-log_ratio, action_mask))}


# --------------------------------------------------------------- REINFORCE family


@register("policy_loss_fn", "topr")
def topr_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    advantage_threshold: float = 0.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Tapered off-policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286).

    ``l_t = -sg(alpha) A log pi`` with ``alpha = clip(r, 0, 1)`` when ``A <= threshold`` and 1
    otherwise: positive examples are learned like SFT, negative ones with a truncated
    importance weight, which keeps off-policy REINFORCE from pushing probabilities to zero.
    """
    log_ratio = _log_ratio(logprob, old_logprob)
    ratio = log_ratio.exp().detach()
    alpha = torch.where(advantages <= advantage_threshold, ratio.clamp(0.0, 1.0), 1.0)
    loss = aggregate_loss(-alpha * advantages * logprob, action_mask, loss_agg_mode)
    metrics = {
        "topr_loss": _f(loss),
        "avg_alpha": _f(masked_mean(alpha, action_mask)),
        "avg_ratio": _f(masked_mean(ratio, action_mask)),
    }
    return loss, metrics


@register("policy_loss_fn", "sppo")
def sppo_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    epsilon: float = 0.3,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """sPPO, PPO on the log of the ratio (Vaswani et al. 2021, arXiv:2108.05828).

    ``l_t = -A log r`` for tokens with ``r`` in ``[1/(1+eps), 1+eps]`` and 0 outside (a
    symmetric trust region in log space).
    """
    log_ratio = _log_ratio(logprob, old_logprob)
    ratio = log_ratio.exp().detach()
    in_range = ((ratio >= 1.0 / (1.0 + epsilon)) & (ratio <= 1.0 + epsilon)).to(logprob.dtype)
    loss = aggregate_loss(-advantages * log_ratio * in_range, action_mask, loss_agg_mode)
    metrics = {
        "pg_loss": _f(loss),
        "pg_clipfrac": _f(masked_mean(1.0 - in_range, action_mask)),
    }
    return loss, metrics


RecClipMode = Literal["none", "one-side", "two-side", "ring", "gspo-one-side"]
RecWeight = Literal["none", "importance_sampling", "truncated_importance_sampling", "gspo_importance_sampling",
                    "advantage"]
RecRegularizer = Literal["none", "k2", "forward-kl"]
REC_CLIP_MODES, REC_WEIGHTS, REC_REGULARIZERS = get_args(RecClipMode), get_args(RecWeight), get_args(RecRegularizer)


@register("policy_loss_fn", "rec")
def rec_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    epsilon_low_prime: float = 0.6,
    epsilon_high_prime: float = 2.0,
    clip_mode: RecClipMode = "none",
    weight: RecWeight = "none",
    regularizer: RecRegularizer = "none",
    regularizer_coef: float = 0.0,
    temp: float = 1.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Group-relative REINFORCE with clipping as regularisation (REC, arXiv:2509.24203).

    ``l_t = -w_t A log pi * in_range_t (+ regulariser)``, with the ratio ``r`` detached:

    - ``clip_mode`` chooses ``in_range``: ``none``; ``two-side`` (``1-eps_low <= r <=
      1+eps_high``); ``one-side`` (upper bound for ``A >= 0``, lower for ``A <= 0``);
      ``ring`` (two-side, plus ``r <= 1-eps_low'`` for ``A >= 0`` and ``r >= 1+eps_high'``
      for ``A <= 0``: far-off tokens that move the right way are kept); ``gspo-one-side``
      (one-side on the sequence ratio, aggregation forced to ``seq-mean-token-mean``).
    - ``weight``: ``none``; ``importance_sampling`` (``r``); ``truncated_importance_sampling``
      (``clip(r, 1-eps_low', 1+eps_high')``); ``gspo_importance_sampling`` (sequence ratio);
      ``advantage`` (``exp(A / temp)``).
    - ``regularizer``: ``k2`` adds ``coef (log pi - log pi_old)^2``; ``forward-kl`` adds
      ``-coef log pi``.
    """
    _check_choice("clip_mode", clip_mode, REC_CLIP_MODES)
    _check_choice("weight", weight, REC_WEIGHTS)
    _check_choice("regularizer", regularizer, REC_REGULARIZERS)
    log_ratio = _log_ratio(logprob, old_logprob)
    ratio = log_ratio.exp().detach()
    seq_ratio = masked_mean(log_ratio, action_mask, dim=-1).detach().clamp(max=10.0).exp()[:, None]
    pos, neg = advantages >= 0, advantages <= 0
    two_side = (ratio >= 1.0 - epsilon_low) & (ratio <= 1.0 + epsilon_high)
    if clip_mode == "two-side":
        in_range = two_side
    elif clip_mode == "one-side":
        in_range = (pos & (ratio <= 1.0 + epsilon_high)) | (neg & (ratio >= 1.0 - epsilon_low))
    elif clip_mode == "gspo-one-side":
        in_range = (pos & (seq_ratio <= 1.0 + epsilon_high)) | (
            neg & (seq_ratio >= 1.0 - epsilon_low)
        )
        loss_agg_mode = "seq-mean-token-mean"
    elif clip_mode == "ring":
        in_range = (
            two_side
            | (pos & (ratio <= 1.0 - epsilon_low_prime))
            | (neg & (ratio >= 1.0 + epsilon_high_prime))
        )
    else:
        in_range = torch.ones_like(ratio, dtype=torch.bool)

    if weight == "importance_sampling":
        weighted = advantages * ratio
    elif weight == "truncated_importance_sampling":
        weighted = advantages * ratio.clamp(1.0 - epsilon_low_prime, 1.0 + epsilon_high_prime)
    elif weight == "gspo_importance_sampling":
        weighted = advantages * seq_ratio
    elif weight == "advantage":
        weighted = advantages * torch.exp(advantages / temp)
    else:
        weighted = advantages

    tokens = -weighted * logprob * in_range.to(logprob.dtype)
    if regularizer == "k2":
        tokens = tokens + regularizer_coef * (logprob - old_logprob.detach()).square()
    elif regularizer == "forward-kl":
        tokens = tokens - regularizer_coef * logprob
    loss = aggregate_loss(tokens, action_mask, loss_agg_mode)
    metrics = {
        "pg_loss": _f(loss),
        "pg_clipfrac": _f(masked_mean((~in_range).float(), action_mask)),
    }
    return loss, metrics


@register("policy_loss_fn", "opmd")
def opmd_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    tau: float = 1.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Online policy mirror descent surrogate (Trinity-RFT, arXiv:2509.24203).

    ``l = aggregate(-A log pi) / (1 + tau)``: REINFORCE scaled by the mirror-descent step
    ``1 / (1 + tau)``, where ``tau`` is the KL-regularisation strength toward the sampler.
    """
    loss = aggregate_loss(-advantages * logprob, action_mask, loss_agg_mode) / (1.0 + tau)
    return loss, {"opmd_loss": _f(loss)}


# ------------------------------------------------------------- supervised / preference


def _sft_tokens(logprob: Tensor, phi: bool) -> Tensor:
    """``-log pi``, optionally weighted by ``sg(p (1 - p))`` (CHORD's phi)."""
    if not phi:
        return -logprob
    p = logprob.detach().exp()
    return -logprob * p * (1.0 - p)


@register("policy_loss_fn", "sft")
def sft_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Supervised fine-tuning: negative log-likelihood of the given tokens."""
    loss = aggregate_loss(-logprob, action_mask, loss_agg_mode)
    return loss, {"sft_loss": _f(loss)}


@register("policy_loss_fn", "sft_is")
def sft_is_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """SFT with each token weighted by the policy's own ``sg(p)`` (Trinity-RFT's ``sft_is``,
    from CHORD): ``l_t = -sg(p_t) log p_t``, the importance weight of a demonstration token
    under the policy, so tokens the policy finds unlikely pull less."""
    loss = aggregate_loss(-logprob * logprob.detach().exp(), action_mask, loss_agg_mode)
    return loss, {"sft_is_loss": _f(loss)}


@register("policy_loss_fn", "sft_phi")
def sft_phi_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    loss_agg_mode: str = "token-mean",
    cutoff_prob: Annotated[float, Interval(gt=0.0, le=1.0)] = 1.0,
) -> tuple[Tensor, Metrics]:
    """SFT weighted by CHORD's ``phi = sg(p (1 - p))`` (Trinity-RFT's ``sft_phi``): tokens the
    policy is already sure of, or finds hopeless, pull least. With ``cutoff_prob`` < 1 a token
    whose probability is above it gets no gradient (``log p`` clamped at ``log cutoff_prob``;
    ``phi`` is the unclamped one's), as upstream's."""
    if not 0.0 < cutoff_prob <= 1.0:
        raise ValueError(f"cutoff_prob must be in (0, 1], got {cutoff_prob}")
    p = logprob.detach().exp()
    clamped = logprob.clamp(max=math.log(cutoff_prob)) if cutoff_prob < 1.0 else logprob
    loss = aggregate_loss(-clamped * p * (1.0 - p), action_mask, loss_agg_mode)
    return loss, {"sft_phi_loss": _f(loss)}


@register("policy_loss_fn", "dpo")
def dpo_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Metrics]:
    """Direct preference optimisation (Rafailov et al. 2023, arXiv:2305.18290).

    Rows come in pairs: even rows chosen, odd rows rejected. With sequence log-ratios
    ``h = sum_t log pi - sum_t log ref``, ``z = beta (h_chosen - h_rejected)`` and
    ``l = -(1 - ls) log sigmoid(z) - ls log sigmoid(-z)`` (``ls = label_smoothing``, the
    conservative DPO of Mitchell 2023), averaged over pairs. The reference is ``ref_logprob``,
    or ``old_logprob`` when that is not given (Trinity-RFT passes the reference there).
    """
    if logprob.shape[0] % 2:
        raise ValueError(f"dpo needs (chosen, rejected) row pairs, got {logprob.shape[0]} rows")
    ref = (old_logprob if ref_logprob is None else ref_logprob).detach()
    mask = action_mask.to(logprob.dtype)
    h = masked_sum(logprob, mask, dim=-1) - masked_sum(ref, mask, dim=-1)
    chosen, rejected = h[0::2], h[1::2]
    z = beta * (chosen - rejected)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    loss = losses.mean() if losses.numel() else logprob.new_zeros(())
    n = max(losses.numel(), 1)
    metrics = {
        "dpo_loss": _f(loss),
        "chosen_reward": _f(beta * chosen.sum() / n),
        "rejected_reward": _f(beta * rejected.sum() / n),
        "accuracy_mean": _f((chosen > rejected).float().sum() / n),
    }
    return loss, metrics


# ----------------------------------------------------------------- SFT + RL mixing


def chord_mu_schedule(
    global_step: int, mu_warmup_steps: int, mu_decay_steps: int, mu_peak: float, mu_valley: float
) -> float:
    """CHORD's SFT weight ``mu``: linear warm-up to ``mu_peak``, cosine decay to ``mu_valley``.

    Early on the expert data teaches the format; later the policy's own rollouts dominate.
    """
    if global_step < mu_warmup_steps:
        return global_step / mu_warmup_steps * mu_peak
    if global_step >= mu_warmup_steps + mu_decay_steps:
        return mu_valley
    progress = (global_step - mu_warmup_steps) / mu_decay_steps
    return mu_valley + (mu_peak - mu_valley) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _mix(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    expert_mask: Tensor | None,
    mu: float,
    phi: bool,
    ppo_args: dict[str, float | None],
    loss_agg_mode: str,
    sft_loss_agg_mode: str | None,
    part_weights: tuple[float, float] | None,
) -> tuple[Tensor, Metrics]:
    if expert_mask is None:
        raise ValueError("mix policy losses need `expert_mask` (B,) marking expert rows")
    expert = expert_mask.bool()
    usual = ~expert
    rl_loss = logprob.new_zeros(())
    sft = logprob.new_zeros(())
    metrics: Metrics = {}
    if bool(usual.any()):
        rl_loss, rl_metrics = ppo_policy_loss(
            logprob[usual],
            old_logprob[usual],
            advantages[usual],
            action_mask[usual],
            loss_agg_mode=loss_agg_mode,
            **ppo_args,  # type: ignore[arg-type]
        )
        metrics.update({f"usual/{k}": v for k, v in rl_metrics.items()})
    if bool(expert.any()):
        tokens = _sft_tokens(logprob[expert], phi)
        sft = aggregate_loss(tokens, action_mask[expert], sft_loss_agg_mode or loss_agg_mode)
        metrics["expert/sft_loss"] = _f(sft)
    usual_weight, expert_weight = part_weights if part_weights is not None else (1.0, 1.0)
    loss = (1.0 - mu) * rl_loss * usual_weight + mu * sft * expert_weight
    metrics.update({"loss": _f(loss), "mu": float(mu)})
    return loss, metrics


@register("policy_loss_fn", "mix")
def mix_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    part_weights: tuple[float, float] | None = None,
    mu: float = 0.1,
    clip_range: float | None = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    loss_agg_mode: str = "token-mean",
    sft_loss_agg_mode: str | None = None,
    grpo_loss_agg_mode: str | None = None,
) -> tuple[Tensor, Metrics]:
    """SFT + RL in one batch: ``(1 - mu) PPO(rollout rows) + mu SFT(expert rows)``.

    Each part is averaged over its own rows (``grpo_loss_agg_mode`` / ``sft_loss_agg_mode``,
    else ``loss_agg_mode``). Over micro-batches, each part is the mean over the *mini-batch's*
    rows of that part, however they fall into micro-batches: the trainer passes
    ``part_weights`` = (this micro-batch's share of the mini-batch's rollout rows, of its
    expert rows) / the share it weighs the micro-batch by. Trinity-RFT gets the same from
    ``train_batch_size_usual``/``_expert`` and micro-batch sizes written in the config.
    """
    ppo_args = {
        "clip_range": clip_range,
        "clip_range_low": clip_range_low,
        "clip_range_high": clip_range_high,
    }
    return _mix(
        logprob, old_logprob, advantages, action_mask, expert_mask, mu, False, ppo_args,
        grpo_loss_agg_mode or loss_agg_mode, sft_loss_agg_mode, part_weights,
    )  # fmt: skip


@register("policy_loss_fn", "mix_chord")
def mix_chord_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    ref_logprob: Tensor | None = None,
    expert_mask: Tensor | None = None,
    global_step: int = 0,
    part_weights: tuple[float, float] | None = None,
    mu_warmup_steps: int = 0,
    mu_decay_steps: int = 0,
    mu_peak: float = 0.1,
    mu_valley: float = 0.1,
    enable_phi_function: bool = True,
    clip_range: float | None = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    loss_agg_mode: str = "token-mean",
    sft_loss_agg_mode: str | None = None,
    grpo_loss_agg_mode: str | None = None,
) -> tuple[Tensor, Metrics]:
    """CHORD (Zhang et al. 2025, arXiv:2508.11408): ``mix`` with a scheduled ``mu`` and
    token weighting of the SFT part.

    ``mu = chord_mu_schedule(global_step, ...)``; with ``enable_phi_function`` each expert
    token's NLL is weighted by ``sg(p (1 - p))``, which fades out tokens the policy already
    knows (p near 1) and ones far from it (p near 0), so expert data shapes without
    overwriting the policy.
    """
    mu = chord_mu_schedule(global_step, mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley)
    ppo_args = {
        "clip_range": clip_range,
        "clip_range_low": clip_range_low,
        "clip_range_high": clip_range_high,
    }
    return _mix(
        logprob, old_logprob, advantages, action_mask, expert_mask, mu, enable_phi_function,
        ppo_args, grpo_loss_agg_mode or loss_agg_mode, sft_loss_agg_mode, part_weights,
    )  # fmt: skip
