"""Advantage functions: from rewards (and values or teacher log-probs) to per-token advantages.

Conventions
-----------
Every advantage function takes the same keyword-only *data* arguments, so one can be swapped
for another by name without changing the caller:

- ``action_mask`` (``B x T``, required): 1 where a response token counts.
- ``rewards``: ``(B,)`` one scalar per sequence, or ``(B, T)`` token-level rewards. Outcome
  methods sum a token-level tensor to a scalar; token methods (GAE, REINFORCE++, ReMax) place
  a scalar on the last counted token of its sequence.
- ``group_ids``: which task each sequence answers: a ``(B,)`` tensor or a list of hashables
  (strings). Sequences with the same id form one group (the GRPO group). ``None`` means the
  whole batch is one group.
- ``values`` (critic, ``B x T``), ``old_logprob`` (the sampler's log-probs, ``B x T``),
  ``teacher_logprob`` (``B x T``), ``reward_baselines`` (``(B,)``, ReMax's greedy reward).
- ``entropy`` (``B x T``): the current policy's entropy at each response token (CLIP-B; the
  trainer computes it, and ``old_logprob`` as the current policy's, for those that ask).
- ``episode_ids``: which episode (rollout) of its group each sequence is a turn of, for
  step-wise agents that give one sequence per turn (``step_wise_grpo``); ``None``: every
  sequence is its own episode.

Functions ignore the data they do not use and raise ``ValueError`` when data they need is
missing. Everything after the data keywords is a hyperparameter (``advantage_fn_args``).

Each returns an :class:`AdvantageResult`: ``advantages`` and ``returns`` (``B x T``, zero on
masked tokens), ``keep`` (``(B,)`` bool; ``False`` for sequences a filter such as GRPO's
``std_threshold`` drops), ``metrics``, and ``action_mask`` when the function also drops
*tokens* from the loss (CLIP-B: the trainer trains on that mask instead).

Undefined cases give zeros, never NaN: a group of one sequence has no peer to compare with, so
group-baseline methods give it advantage 0 (Trinity-RFT instead uses baseline 0, i.e. the raw
reward); all-equal rewards give 0; an empty mask gives 0. Statistics are computed in float64.
No gradient flows through an advantage.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from ops.aggregation import masked_mean, masked_whiten
from ops.registry import register

# Which advantage functions need a group of several rollouts of the same task (the minimum
# repeat_times is 2 for them) and which need the whole training batch at once (so they run
# in the trainer rather than in the buffer as each group arrives).
# Functions not listed in either set are assumed to need the whole batch.
GROUP_ADVANTAGE_FNS: frozenset[str] = frozenset({"grpo", "rloo", "opmd", "asymre", "rec", "step_wise_grpo",
                                                  "grpo_verl", "opmd_verl", "asymre_verl", "gigpo"})
SEQUENCE_ADVANTAGE_FNS: frozenset[str] = frozenset(
    {"reinforce", "remax", "on_policy_distill", "jsd"}
)
BATCH_ADVANTAGE_FNS: frozenset[str] = frozenset({"ppo", "reinforceplusplus"})
# Which need a teacher's log-probs of the sampled tokens (``Experience.teacher_logprobs``: the
# explorer scores every rollout with ``explorer.auxiliary_models[0]``).
TEACHER_ADVANTAGE_FNS: frozenset[str] = frozenset({"on_policy_distill", "jsd"})

# The data keywords every advantage function accepts (the rest are hyperparameters).
ADVANTAGE_DATA: tuple[str, ...] = (
    "action_mask",
    "rewards",
    "group_ids",
    "values",
    "old_logprob",
    "teacher_logprob",
    "reward_baselines",
    "episode_ids",
    "entropy",
    "infos",
)

# Which need the current policy's per-token entropy (the trainer computes it for them).
ENTROPY_ADVANTAGE_FNS: frozenset[str] = frozenset({"clipb"})
# Which read each experience's ``info`` (GiGPO: its step, step reward and anchor state): the
# caller passes ``infos`` to these only, so a user's function written before it need not take it.
INFO_ADVANTAGE_FNS: frozenset[str] = frozenset({"gigpo"})

GroupIds = Tensor | Sequence[Hashable] | None


@dataclass(frozen=True)
class AdvantageResult:
    """Output of an advantage function (see module docstring)."""

    advantages: Tensor
    returns: Tensor
    keep: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    action_mask: Tensor | None = None


# ----------------------------------------------------------------------------- helpers


def _require(name: str, value: Tensor | None, fn: str) -> Tensor:
    if value is None:
        raise ValueError(f"advantage_fn {fn!r} needs `{name}`")
    return value


def _float_dtype(*tensors: Tensor | None) -> torch.dtype:
    """Output dtype: that of the first floating-point input, else float32."""
    for t in tensors:
        if t is not None and t.is_floating_point():
            return t.dtype
    return torch.float32


def _mask(action_mask: Tensor) -> Tensor:
    if action_mask.dim() != 2:
        raise ValueError(f"action_mask must be B x T, got shape {tuple(action_mask.shape)}")
    return action_mask.detach().to(torch.float64)


def _scalar_rewards(rewards: Tensor, batch: int) -> Tensor:
    """``(B,)`` float64 rewards; a ``B x T`` token-level tensor is summed over tokens."""
    r = rewards.detach().to(torch.float64)
    if r.dim() == 2:
        r = r.sum(dim=-1)
    if r.shape != (batch,):
        raise ValueError(
            f"rewards must be (B,) or (B, T) with B={batch}, got {tuple(rewards.shape)}"
        )
    return r


def _token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """``B x T`` float64 rewards; a ``(B,)`` scalar goes on the last counted token."""
    r = rewards.detach().to(torch.float64)
    if r.dim() == 2:
        if r.shape != mask.shape:
            raise ValueError(f"token rewards {tuple(r.shape)} != mask {tuple(mask.shape)}")
        return r
    if r.shape != (mask.shape[0],):
        raise ValueError(f"rewards must be (B,) or (B, T), got {tuple(rewards.shape)}")
    positions = torch.arange(mask.shape[1], dtype=torch.float64, device=mask.device)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1.0)).amax(dim=-1)
    out = torch.zeros_like(mask)
    has = last >= 0
    out[has, last[has].long()] = r[has]
    return out


def group_index(group_ids: GroupIds, batch: int) -> Tensor:
    """Map group ids (tensor or list of hashables) to ``0..G-1`` (a ``(B,)`` long tensor)."""
    if group_ids is None:
        return torch.zeros(batch, dtype=torch.long)
    if isinstance(group_ids, Tensor):
        if group_ids.shape != (batch,):
            raise ValueError(f"group_ids must be ({batch},), got {tuple(group_ids.shape)}")
        return torch.unique(group_ids, return_inverse=True)[1].long()
    ids = list(group_ids)
    if len(ids) != batch:
        raise ValueError(f"group_ids has {len(ids)} entries for a batch of {batch}")
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(g, len(index)) for g in ids], dtype=torch.long)


@dataclass(frozen=True)
class _GroupStats:
    index: Tensor  # (B,) group of each sequence
    count: Tensor  # (B,) size of its group
    mean: Tensor  # (B,) group mean
    std: Tensor  # (B,) unbiased group std (0 for a group of one)
    n_groups: int


def _group_stats(r: Tensor, group_ids: GroupIds) -> _GroupStats:
    idx = group_index(group_ids, r.shape[0]).to(r.device)
    n = int(idx.max()) + 1 if idx.numel() else 0
    zeros = torch.zeros(n, dtype=torch.float64, device=r.device)
    count = zeros.clone().index_add_(0, idx, torch.ones_like(r))
    total = zeros.clone().index_add_(0, idx, r)
    mean = total / torch.where(count > 0, count, torch.ones_like(count))
    sq = zeros.clone().index_add_(0, idx, (r - mean[idx]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return _GroupStats(idx, count[idx], mean[idx], std[idx], n)


def _all_kept(mask: Tensor) -> Tensor:
    return torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)


def _result(
    scores: Tensor,
    mask: Tensor,
    dtype: torch.dtype,
    metrics: dict[str, float],
    keep: Tensor | None = None,
) -> AdvantageResult:
    """Broadcast per-sequence ``scores`` over the mask; returns equal advantages."""
    adv = (scores.unsqueeze(-1) * mask).to(dtype)
    if keep is None:
        keep = _all_kept(mask)
    return AdvantageResult(adv, adv.clone(), keep, metrics)


def _group_metrics(r: Tensor, stats: _GroupStats) -> dict[str, float]:
    if r.numel() == 0:
        return {"reward_mean": 0.0, "reward_std": 0.0}
    return {"reward_mean": float(r.mean()), "reward_std": float(stats.std.mean())}


# ----------------------------------------------------------------------- critic-based


@register("advantage_fn", "ppo")
@torch.no_grad()
def gae_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> AdvantageResult:
    """PPO's generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma V_{t+1} - V_t``; ``A_t = delta_t + gamma lam A_{t+1}``;
    ``returns = A + V`` (the critic's target). Masked tokens are skipped: the recursion passes
    through them, so in multi-turn data the value after an observation is the next action
    token's. Advantages are then whitened over the batch (verl's default).
    """
    mask = _mask(action_mask)
    r = _token_rewards(_require("rewards", rewards, "ppo"), mask)
    v = _require("values", values, "ppo").detach().to(torch.float64)
    batch, length = mask.shape
    next_value = torch.zeros(batch, dtype=torch.float64, device=mask.device)
    last_gae = torch.zeros_like(next_value)
    adv = torch.zeros_like(mask)
    for t in reversed(range(length)):
        m = mask[:, t] > 0
        delta = r[:, t] + gamma * next_value - v[:, t]
        gae = delta + gamma * lam * last_gae
        next_value = torch.where(m, v[:, t], next_value)
        last_gae = torch.where(m, gae, last_gae)
        adv[:, t] = torch.where(m, gae, torch.zeros_like(gae))
    returns = (adv + v) * mask
    if whiten:
        adv = masked_whiten(adv, mask)
    dtype = _float_dtype(rewards, values)
    metrics = {"returns_mean": float(masked_mean(returns, mask))}
    keep = _all_kept(mask)
    return AdvantageResult(adv.to(dtype), returns.to(dtype), keep, metrics)


# ------------------------------------------------------------------- group baselines


@register("advantage_fn", "grpo")
@torch.no_grad()
def grpo_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    epsilon: float = 1e-6,
    std_normalize: bool = True,
    std_cal_level: Literal["group", "batch"] = "group",
    std_threshold: float | None = None,
) -> AdvantageResult:
    """GRPO's group-relative advantage (Shao et al. 2024, arXiv:2402.03300).

    ``A_i = (r_i - mean_group) / (std + epsilon)`` with the unbiased std of the group
    (``std_cal_level="group"``) or of the whole batch (``"batch"``: mean per group, std over
    the batch, arXiv:2508.08221). ``std_normalize=False`` keeps only the mean subtraction
    (Dr. GRPO, arXiv:2503.20783). ``std_threshold``: groups whose reward std is at or below it
    carry no signal and are dropped (``keep=False``, advantage 0), as DAPO's dynamic sampling.
    """
    if std_cal_level not in ("group", "batch"):
        raise ValueError(f"std_cal_level must be 'group' or 'batch', got {std_cal_level!r}")
    mask = _mask(action_mask)
    r = _scalar_rewards(_require("rewards", rewards, "grpo"), mask.shape[0])
    stats = _group_stats(r, group_ids)
    if std_cal_level == "batch":
        batch_std = r.std() if r.numel() > 1 else r.new_zeros(())
        std = batch_std.expand_as(r)
    else:
        std = stats.std
    scores = r - stats.mean
    if std_normalize:
        scores = scores / (std + epsilon)
    multi = stats.count > 1
    keep = torch.ones_like(multi)
    if std_threshold is not None:
        keep = multi & (stats.std > std_threshold)
    scores = torch.where(multi & keep, scores, torch.zeros_like(scores))
    metrics = _group_metrics(r, stats)
    metrics["filtered_count"] = float((~keep).sum())
    return _result(scores, mask, _float_dtype(rewards), metrics, keep)


@register("advantage_fn", "step_wise_grpo")
@torch.no_grad()
def step_wise_grpo_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    epsilon: float = 1e-6,
    std_normalize: bool = True,
    std_cal_level: Literal["group", "batch"] = "group",
    std_threshold: float | None = None,
    enable_step_norm: bool = False,
) -> AdvantageResult:
    """GRPO over *episodes* for step-wise agents (Trinity-RFT's ``step_wise_grpo``): a turn is
    one sequence, an episode several; the episodes of a task are the group.

    Each episode's return is the reward of its first turn (the whole episode's return both
    when the final reward is propagated to every turn and when each turn carries its
    reward-to-go); ``A_e = (R_e - mean_group(R)) / (std + epsilon)`` over the group's
    *episodes*, so an episode with more turns does not weigh more in the baseline; every turn
    of the episode gets ``A_e`` on its counted tokens. As upstream's: ``std`` is the group's
    (``std_cal_level="group"``) or that of every episode's return in the batch (``"batch"``);
    a group whose returns' std is at or below ``std_threshold`` is dropped (``keep=False``);
    ``enable_step_norm`` divides ``A_e`` by the episode's number of turns.
    """
    if std_cal_level not in ("group", "batch"):
        raise ValueError(f"std_cal_level must be 'group' or 'batch', got {std_cal_level!r}")
    mask = _mask(action_mask)
    b = mask.shape[0]
    r = _scalar_rewards(_require("rewards", rewards, "step_wise_grpo"), b)
    ep = group_index(episode_ids, b) if episode_ids is not None else torch.arange(b)
    grp = group_index(group_ids, b)
    # one row per (group, episode): its first turn's reward and its group
    key = grp.to(torch.float64) * (int(ep.max()) + 1 if b else 1) + ep.to(torch.float64)
    uniq, inverse = torch.unique(key, return_inverse=True)
    first = torch.full((uniq.numel(),), b, dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(b), reduce="amin")
    ep_r, ep_g = r[first], grp[first]
    stats = _group_stats(ep_r, ep_g)
    std = (ep_r.std() if ep_r.numel() > 1 else ep_r.new_zeros(())).expand_as(ep_r) \
        if std_cal_level == "batch" else stats.std
    scores = ep_r - stats.mean
    if std_normalize:  # all-equal returns give 0, never 0/0
        denom = std + epsilon
        scores = torch.where(denom > 0, scores / denom.clamp(min=1e-30), torch.zeros_like(scores))
    keep = torch.ones_like(stats.count, dtype=torch.bool)
    if std_threshold is not None:  # as GRPO's: no signal in the group
        keep = (stats.count > 1) & (stats.std > std_threshold)
    scores = torch.where((stats.count > 1) & keep, scores, torch.zeros_like(scores))
    if enable_step_norm:
        scores = scores / torch.bincount(inverse, minlength=uniq.numel()).to(scores.dtype)
    metrics = _group_metrics(ep_r, stats)
    metrics["episodes"] = float(uniq.numel())
    metrics["filtered_count"] = float((~keep[inverse]).sum())
    return _result(scores[inverse], mask, _float_dtype(rewards), metrics, keep[inverse])


def _gigpo_scores(values: list[float], fnorm: str, epsilon: float) -> tuple[list[float], float, float]:
    """GiGPO's normalisation, as upstream's: minus the mean (over one value: 0), divided by the
    (sample) std plus ``epsilon`` with ``fnorm="std"``, else by 1 plus ``epsilon``; with the
    mean and the divisor (the metrics)."""
    t = torch.tensor(values, dtype=torch.float64)
    if len(values) == 1:
        mean, denom = t.new_zeros(()), t.new_ones(())
    else:
        mean, denom = t.mean(), (t.std() if fnorm == "std" else t.new_ones(()))
    return ((t - mean) / (denom + epsilon)).tolist(), float(mean), float(denom)


@register("advantage_fn", "gigpo")
@torch.no_grad()
def gigpo_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    infos: Sequence[dict] | None = None,
    omega: float = 1.0,
    gamma: float = 1.0,
    fnorm: Literal["std", "none"] = "none",
    epsilon: float = 1e-6,
    step_reward_key: str = "step_reward",
    env_state_hash_key: str = "env_state_hash",
) -> AdvantageResult:
    """GiGPO (group-in-group policy optimisation, Feng et al. 2025, arXiv:2505.10978), as
    Trinity-RFT's main branch computes it: ``A = A^E(episode) + omega * A^S(step)``, no critic.

    A sequence is one step (turn) of an episode (``episode_ids``; none: each sequence is an
    episode of one step), ordered by ``info["step"]`` (else its place in the batch). A step's
    reward is ``info[step_reward_key]`` when any step of its episode has one (missing: 0), else
    0 but the last step's, which is the sequence's reward. ``A^E``: each episode's return (the
    sum of its step rewards) normalised over its group's episodes (:func:`_gigpo_scores`; one
    episode keeps its return). ``A^S``: the steps taken from the same anchor state
    (``info[env_state_hash_key]``) are compared by their discounted return-to-go (``gamma``),
    normalised the same way, when there are two or more; 0 otherwise. Called per group (the
    buffer's), so anchor states are compared within a task's rollouts, as the paper groups
    them; upstream buckets the hash across its whole batch.
    """
    if fnorm not in ("std", "none"):
        raise ValueError(f"fnorm must be 'std' or 'none', got {fnorm!r}")
    mask = _mask(action_mask)
    b = mask.shape[0]
    r = _scalar_rewards(_require("rewards", rewards, "gigpo"), b).tolist()
    info = list(infos) if infos is not None else [{} for _ in range(b)]
    grp = group_index(group_ids, b).tolist()
    ep = group_index(episode_ids, b).tolist() if episode_ids is not None else list(range(b))
    episodes: dict[tuple[int, int], list[int]] = {}
    for i in range(b):
        episodes.setdefault((grp[i], ep[i]), []).append(i)
    returns_to_go, a_e = [0.0] * b, [0.0] * b
    by_group: dict[int, list[tuple[list[int], float]]] = {}
    for (g, _), rows in episodes.items():
        rows.sort(key=lambda i: (int(info[i].get("step", i)), i))
        if any(step_reward_key in info[i] for i in rows):
            step_r = [float(info[i].get(step_reward_key, 0.0)) for i in rows]
        else:
            step_r = [0.0] * (len(rows) - 1) + [float(r[rows[-1]])]
        running = 0.0
        for i, x in zip(reversed(rows), reversed(step_r), strict=True):
            running = x + gamma * running
            returns_to_go[i] = running
        by_group.setdefault(g, []).append((rows, sum(step_r)))
    means, denoms = [], []
    for eps in by_group.values():
        scores_e, mean, denom = _gigpo_scores([ret for _, ret in eps], fnorm, epsilon)
        means.append(mean)
        denoms.append(denom)
        for (rows, _), score in zip(eps, scores_e, strict=True):
            for i in rows:
                a_e[i] = score
    anchors: dict[Hashable, list[int]] = {}
    for i in range(b):
        state = info[i].get(env_state_hash_key)
        if state is not None:
            anchors.setdefault(str(state), []).append(i)
    a_s = [0.0] * b
    for rows in anchors.values():
        if len(rows) > 1:
            for i, score in zip(rows, _gigpo_scores([returns_to_go[i] for i in rows], fnorm, epsilon)[0], strict=True):
                a_s[i] = score
    scores = torch.tensor([e + omega * s for e, s in zip(a_e, a_s, strict=True)], dtype=torch.float64)
    hits = sum(len(rows) > 1 for rows in anchors.values())
    metrics = {
        "gigpo/episode_reward_mean": sum(means) / max(len(means), 1),
        "gigpo/episode_reward_std": sum(denoms) / max(len(denoms), 1),
        "gigpo/anchor_groups_total": float(len(anchors)),
        "gigpo/anchor_groups_size_gt1": float(hits),
        "gigpo/anchor_group_hit_ratio": hits / len(anchors) if anchors else 0.0,
        "gigpo/mean_abs_A_E": sum(abs(x) for x in a_e) / max(b, 1),
        "gigpo/mean_abs_A_S": sum(abs(x) for x in a_s) / max(b, 1),
    }
    return _result(scores, mask, _float_dtype(rewards), metrics)


@register("advantage_fn", "rloo")
@torch.no_grad()
def rloo_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
) -> AdvantageResult:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740).

    ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_group)``: each rollout's
    baseline is the mean of its peers, which keeps the estimator unbiased.
    """
    mask = _mask(action_mask)
    r = _scalar_rewards(_require("rewards", rewards, "rloo"), mask.shape[0])
    stats = _group_stats(r, group_ids)
    n = stats.count
    scores = torch.where(n > 1, (r - stats.mean) * n / (n - 1).clamp(min=1), torch.zeros_like(r))
    return _result(scores, mask, _float_dtype(rewards), _group_metrics(r, stats))


@register("advantage_fn", "opmd")
@torch.no_grad()
def opmd_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    opmd_baseline: Literal["mean", "logavgexp"] = "mean",
    tau: float = 1.0,
) -> AdvantageResult:
    """Online policy mirror descent baseline (Trinity-RFT's OPMD, arXiv:2509.24203).

    ``A_i = r_i - b`` with ``b`` the group mean (``opmd_baseline="mean"``) or the soft maximum
    ``tau * log(mean_j exp(r_j / tau))`` (``"logavgexp"``), the value of the KL-regularised
    optimal policy at temperature ``tau``.
    """
    if opmd_baseline not in ("mean", "logavgexp"):
        raise ValueError(f"opmd_baseline must be 'mean' or 'logavgexp', got {opmd_baseline!r}")
    mask = _mask(action_mask)
    r = _scalar_rewards(_require("rewards", rewards, "opmd"), mask.shape[0])
    stats = _group_stats(r, group_ids)
    if opmd_baseline == "mean":
        baseline = stats.mean
    else:
        # log-mean-exp per group, stabilised by subtracting the group max.
        idx = stats.index
        n = stats.n_groups
        z = r / tau
        gmax = torch.full((n,), -math.inf, dtype=torch.float64, device=r.device).scatter_reduce(
            0, idx, z, reduce="amax"
        )
        sums = torch.zeros_like(gmax).index_add_(0, idx, (z - gmax[idx]).exp())
        baseline = tau * (gmax[idx] + sums[idx].log() - stats.count.log())
    scores = torch.where(stats.count > 1, r - baseline, torch.zeros_like(r))
    metrics = _group_metrics(r, stats)
    metrics["group_baseline"] = float(baseline.mean()) if r.numel() else 0.0
    return _result(scores, mask, _float_dtype(rewards), metrics)


@register("advantage_fn", "asymre")
@torch.no_grad()
def asymre_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    baseline_shift: float = -0.1,
) -> AdvantageResult:
    """Asymmetric REINFORCE (Arnal et al. 2025, arXiv:2506.20520).

    ``A_i = r_i - (mean_group + baseline_shift)``. A baseline below the mean (negative shift)
    weights positive samples more than negative ones, which keeps off-policy REINFORCE stable.
    """
    mask = _mask(action_mask)
    r = _scalar_rewards(_require("rewards", rewards, "asymre"), mask.shape[0])
    stats = _group_stats(r, group_ids)
    baseline = stats.mean + baseline_shift
    scores = torch.where(stats.count > 1, r - baseline, torch.zeros_like(r))
    return _result(scores, mask, _float_dtype(rewards), _group_metrics(r, stats))


@register("advantage_fn", "rec")
@torch.no_grad()
def rec_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    epsilon: float = 1e-6,
    std_normalize: bool = False,
) -> AdvantageResult:
    """Group-relative REINFORCE advantage of the REC family (arXiv:2509.24203).

    ``A_i = r_i - mean_group``, optionally divided by ``std + epsilon`` like GRPO.
    """
    mask = _mask(action_mask)
    r = _scalar_rewards(_require("rewards", rewards, "rec"), mask.shape[0])
    stats = _group_stats(r, group_ids)
    scores = r - stats.mean
    if std_normalize:
        scores = scores / (stats.std + epsilon)
    scores = torch.where(stats.count > 1, scores, torch.zeros_like(scores))
    return _result(scores, mask, _float_dtype(rewards), _group_metrics(r, stats))


# --------------------------------------------------------------- no learned baseline


@register("advantage_fn", "reinforce")
@torch.no_grad()
def reinforce_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
) -> AdvantageResult:
    """Plain REINFORCE (Williams 1992): the advantage is the sequence reward itself.

    TOPR uses it: its loss treats positive and negative rewards differently, so no baseline.
    """
    mask = _mask(action_mask)
    r = _scalar_rewards(_require("rewards", rewards, "reinforce"), mask.shape[0])
    metrics = {"reward_mean": float(r.mean()) if r.numel() else 0.0}
    return _result(r, mask, _float_dtype(rewards), metrics)


def _discounted_returns(r: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + gamma G_{t+1}`` over counted tokens; masked tokens are transparent."""
    running = torch.zeros(mask.shape[0], dtype=torch.float64, device=mask.device)
    out = torch.zeros_like(mask)
    for t in reversed(range(mask.shape[1])):
        m = mask[:, t] > 0
        running = torch.where(m, r[:, t] + gamma * running, running)
        out[:, t] = torch.where(m, running, torch.zeros_like(running))
    return out


@register("advantage_fn", "reinforceplusplus")
@torch.no_grad()
def reinforceplusplus_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    gamma: float = 1.0,
) -> AdvantageResult:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262).

    Token returns ``G_t = sum_{s>=t} gamma^{s-t} r_s`` (token-level rewards, e.g. after a KL
    penalty), then whitened over the whole batch: the batch statistics replace a critic.
    """
    mask = _mask(action_mask)
    r = _token_rewards(_require("rewards", rewards, "reinforceplusplus"), mask)
    returns = _discounted_returns(r, mask, gamma)
    adv = masked_whiten(returns, mask)
    dtype = _float_dtype(rewards)
    keep = _all_kept(mask)
    metrics = {"returns_mean": float(masked_mean(returns, mask))}
    return AdvantageResult(adv.to(dtype), returns.to(dtype), keep, metrics)


@register("advantage_fn", "remax")
@torch.no_grad()
def remax_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
) -> AdvantageResult:
    """ReMax (Li et al. 2023, arXiv:2310.10505): the baseline is the greedy response's reward.

    ``A_t = G_t - b`` with ``G_t`` the undiscounted return from token ``t`` and ``b`` the
    reward of the greedy decode of the same prompt (``reward_baselines``).
    """
    mask = _mask(action_mask)
    r = _token_rewards(_require("rewards", rewards, "remax"), mask)
    b = _require("reward_baselines", reward_baselines, "remax").detach().to(torch.float64)
    returns = _discounted_returns(r, mask, 1.0)
    adv = (returns - b.reshape(-1, 1)) * mask
    dtype = _float_dtype(rewards)
    keep = _all_kept(mask)
    metrics = {"baseline_mean": float(b.mean()) if b.numel() else 0.0}
    return AdvantageResult(adv.to(dtype), returns.to(dtype), keep, metrics)


# ---------------------------------------------------------------------- distillation


@register("advantage_fn", "on_policy_distill")
@torch.no_grad()
def on_policy_distill_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    kl_coef: float = 1.0,
) -> AdvantageResult:
    """On-policy distillation (Agarwal et al. 2023, arXiv:2306.13649; Thinking Machines 2025).

    ``A_t = kl_coef * (log p_teacher(y_t) - log p_student(y_t))``: the negative per-token
    reverse KL on the student's own samples, so policy-gradient ascent pulls the student
    toward the teacher where it sampled.
    """
    mask = _mask(action_mask)
    student = _require("old_logprob", old_logprob, "on_policy_distill").detach().double()
    teacher = _require("teacher_logprob", teacher_logprob, "on_policy_distill").detach().double()
    adv = kl_coef * (teacher - student) * mask
    kl_seq = ((student - teacher) * mask).sum(dim=-1)
    dtype = _float_dtype(old_logprob, teacher_logprob)
    keep = _all_kept(mask)
    metrics = {"kl_mean": float(kl_seq.mean()) if kl_seq.numel() else 0.0}
    return AdvantageResult(adv.to(dtype), adv.to(dtype).clone(), keep, metrics)


@register("advantage_fn", "jsd")
@torch.no_grad()
def jsd_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    kl_coef: float = 1.0,
    lambda_coef: float = 0.5,
) -> AdvantageResult:
    """Generalised Jensen-Shannon distillation advantage (GKD, arXiv:2306.13649).

    On the sampled token, with ``p_t`` the teacher's and ``p_s`` the student's probability and
    ``m = lambda p_t + (1 - lambda) p_s`` (computed in log space),
    ``JSD_t = lambda p_t log(p_t / m) + (1 - lambda) p_s log(p_s / m)`` and
    ``A_t = -kl_coef * JSD_t``. ``lambda`` of 0 or 1 makes both distributions the mixture,
    so the divergence (and advantage) is 0.
    """
    mask = _mask(action_mask)
    ls = _require("old_logprob", old_logprob, "jsd").detach().double()
    lt = _require("teacher_logprob", teacher_logprob, "jsd").detach().double()
    beta = float(lambda_coef)
    if beta <= 0.0 or beta >= 1.0:
        jsd = torch.zeros_like(ls)
    else:
        log_m = torch.logsumexp(
            torch.stack([lt + math.log(beta), ls + math.log(1.0 - beta)]), dim=0
        )
        jsd = beta * lt.exp() * (lt - log_m) + (1.0 - beta) * ls.exp() * (ls - log_m)
    adv = -kl_coef * jsd * mask
    dtype = _float_dtype(old_logprob, teacher_logprob)
    keep = _all_kept(mask)
    jsd_seq = (jsd * mask).sum(dim=-1)
    metrics = {"jsd_mean": float(jsd_seq.mean()) if jsd_seq.numel() else 0.0}
    return AdvantageResult(adv.to(dtype), adv.to(dtype).clone(), keep, metrics)


# Trinity-RFT's deprecated ``*_verl`` names (its entropy examples still write ``grpo_verl``): the
# same advantages, which its trainer computed over the whole batch, one task's group at a time;
# here a group at a time in the buffer, as the names without the suffix.
for _alias, _fn in (("grpo_verl", grpo_advantage), ("opmd_verl", opmd_advantage), ("asymre_verl", asymre_advantage)):
    register("advantage_fn", _alias)(_fn)


# ------------------------------------------------------------------ entropy-clipped (CLIP-B)


@register("advantage_fn", "clipb")
@torch.no_grad()
def clipb_advantage(
    *,
    action_mask: Tensor,
    rewards: Tensor | None = None,
    group_ids: GroupIds = None,
    values: Tensor | None = None,
    old_logprob: Tensor | None = None,
    teacher_logprob: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    episode_ids: GroupIds = None,
    entropy: Tensor | None = None,
    epsilon: float = 1e-6,
    mu: float = 2.5,
) -> AdvantageResult:
    """CLIP-B (arXiv:2602.03392, Trinity-RFT's ``clipb``): GRPO's advantage, then a token filter
    against entropy collapse.

    The advantage is GRPO's ``(r - mean) / (std + epsilon)`` (unbiased std; a group of one keeps
    its raw reward, as upstream's). Each counted token gets ``S = p (H + log p)`` from the
    current policy's log-prob ``log p`` of it and entropy ``H`` at it: how far sampling that
    token moves the entropy down. With ``E[S]`` and ``std[S]`` over every counted token of the
    batch, a token with a *negative* advantage whose ``S - E[S] < -mu std[S]`` leaves the loss
    (``action_mask``): pushing down a confident token the policy would otherwise sharpen away
    from raises entropy. Positive and zero advantages keep every token; ``std[S] < 1e-12``
    keeps all.
    """
    mask = _mask(action_mask)
    lp = _require("old_logprob", old_logprob, "clipb").to(torch.float64)
    h = _require("entropy", entropy, "clipb").to(torch.float64)
    r = _scalar_rewards(_require("rewards", rewards, "clipb"), mask.shape[0])
    stats = _group_stats(r, group_ids)
    single = stats.count <= 1
    scores = torch.where(single, r, (r - stats.mean) / (stats.std + epsilon))
    adv = scores.unsqueeze(-1) * mask
    m = mask.to(torch.float64)
    n = m.sum().clamp(min=1.0)
    s_tok = lp.exp() * (h + lp)
    mean_s = (s_tok * m).sum() / n
    std_s = (((s_tok - mean_s) ** 2 * m).sum() / n).sqrt()
    if float(std_s) < 1e-12:
        kept = mask.bool()
    else:
        kept = mask.bool() & ~((adv < 0) & (s_tok - mean_s < -mu * std_s))
    counted = m.sum().clamp(min=1.0)
    metrics = _group_metrics(r, stats)
    metrics.update({
        "frac_clipped": float(1.0 - kept.sum() / counted),
        "frac_clipped_neg": float(((adv < 0) & mask.bool() & ~kept).sum() / ((adv < 0) & mask.bool()).sum().clamp(min=1)),
        "ES": float(mean_s), "varS": float(std_s**2),
    })
    dtype = _float_dtype(rewards)
    out = (adv * kept).to(dtype)
    return AdvantageResult(out, out.clone(), _all_kept(mask), metrics, kept.to(action_mask.dtype))
