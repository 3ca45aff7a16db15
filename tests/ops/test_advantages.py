"""Advantage functions against float64 references written out plainly."""

import math
import statistics

import pytest
import torch

from ops.advantages import (
    AdvantageResult,
    asymre_advantage,
    clipb_advantage,
    gae_advantage,
    group_index,
    grpo_advantage,
    jsd_advantage,
    on_policy_distill_advantage,
    opmd_advantage,
    rec_advantage,
    reinforce_advantage,
    reinforceplusplus_advantage,
    remax_advantage,
    rloo_advantage,
)
from ops.registry import get, names
from tests.ops.helpers import assert_close

# Five sequences of length 3: task "a" has three rollouts, "b" one (a group of one), "c" one.
REWARDS = [1.0, 0.0, 0.5, 2.0, -1.0]
GROUPS = ["a", "a", "a", "b", "c"]
MASK = [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]]


def _inputs():
    return {
        "rewards": torch.tensor(REWARDS, dtype=torch.float64),
        "group_ids": GROUPS,
        "action_mask": torch.tensor(MASK),
    }


def _broadcast(scores):
    return [[s * m for m in row] for s, row in zip(scores, MASK, strict=True)]


def _assert_tokens(result: AdvantageResult, expected, atol=1e-9):
    assert isinstance(result, AdvantageResult)
    got = result.advantages.double()
    assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)
    assert torch.isfinite(result.returns).all()


def _groups():
    out = {}
    for r, g in zip(REWARDS, GROUPS, strict=True):
        out.setdefault(g, []).append(r)
    return out


def test_group_index_accepts_lists_and_tensors():
    assert group_index(["x", "y", "x"], 3).tolist() == [0, 1, 0]
    assert group_index(torch.tensor([7, 3, 7]), 3).tolist() == [1, 0, 1]
    assert group_index(None, 2).tolist() == [0, 0]
    with pytest.raises(ValueError):
        group_index(["x"], 2)


def test_grpo_matches_reference():
    groups = _groups()
    scores = []
    for r, g in zip(REWARDS, GROUPS, strict=True):
        rs = groups[g]
        if len(rs) < 2:
            scores.append(0.0)  # a group of one carries no comparison
        else:
            scores.append((r - statistics.mean(rs)) / (statistics.stdev(rs) + 1e-6))
    result = grpo_advantage(**_inputs())
    _assert_tokens(result, _broadcast(scores))
    assert result.keep.all()
    # hand check: group a = [1, 0, 0.5], mean 0.5, std 0.5 -> +1, -1, 0
    assert result.advantages[0, 0].item() == pytest.approx(1.0, abs=1e-5)
    assert result.advantages[1, 2].item() == pytest.approx(-1.0, abs=1e-5)


def test_grpo_without_std_and_batch_std():
    no_std = grpo_advantage(**_inputs(), std_normalize=False)
    _assert_tokens(no_std, _broadcast([0.5, -0.5, 0.0, 0.0, 0.0]))
    batch_std = statistics.stdev(REWARDS)
    batch = grpo_advantage(**_inputs(), std_cal_level="batch", epsilon=0.0)
    _assert_tokens(batch, _broadcast([0.5 / batch_std, -0.5 / batch_std, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="std_cal_level"):
        grpo_advantage(**_inputs(), std_cal_level="token")


def test_grpo_std_threshold_drops_flat_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    mask = torch.ones(4, 2)
    result = grpo_advantage(
        rewards=rewards, group_ids=[0, 0, 1, 1], action_mask=mask, std_threshold=0.0
    )
    assert result.keep.tolist() == [False, False, True, True]
    assert (result.advantages[:2] == 0).all()
    assert result.metrics["filtered_count"] == 2.0


def test_all_equal_rewards_give_zero_for_every_group_method():
    inputs = {
        "rewards": torch.full((4,), 0.1, dtype=torch.float64),
        "group_ids": [0, 0, 0, 0],
        "action_mask": torch.ones(4, 3),
    }
    for fn in (grpo_advantage, rloo_advantage, opmd_advantage, rec_advantage):
        result = fn(**inputs)
        assert torch.allclose(
            result.advantages.double(), torch.zeros(4, 3, dtype=torch.float64), atol=1e-9
        ), fn
    logavg = opmd_advantage(**inputs, opmd_baseline="logavgexp")
    assert torch.allclose(logavg.advantages, torch.zeros(4, 3, dtype=torch.float64), atol=1e-9)
    # AsymRE's shifted baseline is the only one that is not zero on equal rewards.
    asym = asymre_advantage(**inputs)
    assert torch.allclose(asym.advantages, torch.full((4, 3), 0.1, dtype=torch.float64))


def test_rloo_matches_leave_one_out_reference():
    groups = _groups()
    scores = []
    for i, (r, g) in enumerate(zip(REWARDS, GROUPS, strict=True)):
        peers = [REWARDS[j] for j in range(len(REWARDS)) if GROUPS[j] == g and j != i]
        scores.append(r - sum(peers) / len(peers) if peers else 0.0)
    assert groups["a"] == [1.0, 0.0, 0.5]
    _assert_tokens(rloo_advantage(**_inputs()), _broadcast(scores))
    # hand check: 1 - (0 + 0.5)/2 = 0.75
    assert scores[0] == 0.75


def test_opmd_mean_and_logavgexp():
    _assert_tokens(opmd_advantage(**_inputs()), _broadcast([0.5, -0.5, 0.0, 0.0, 0.0]))
    tau = 0.5
    a = [1.0, 0.0, 0.5]
    baseline = tau * math.log(sum(math.exp(r / tau) for r in a) / len(a))
    expected = [1.0 - baseline, 0.0 - baseline, 0.5 - baseline, 0.0, 0.0]
    _assert_tokens(
        opmd_advantage(**_inputs(), opmd_baseline="logavgexp", tau=tau), _broadcast(expected)
    )
    with pytest.raises(ValueError, match="opmd_baseline"):
        opmd_advantage(**_inputs(), opmd_baseline="max")


def test_asymre_shifts_the_baseline():
    expected = [1.0 - (0.5 - 0.1), 0.0 - 0.4, 0.5 - 0.4, 0.0, 0.0]
    _assert_tokens(asymre_advantage(**_inputs()), _broadcast(expected))
    _assert_tokens(
        asymre_advantage(**_inputs(), baseline_shift=0.25), _broadcast([0.25, -0.75, -0.25, 0, 0])
    )


def test_rec_optionally_divides_by_std():
    _assert_tokens(rec_advantage(**_inputs()), _broadcast([0.5, -0.5, 0.0, 0.0, 0.0]))
    std = rec_advantage(**_inputs(), std_normalize=True, epsilon=0.0)
    _assert_tokens(std, _broadcast([1.0, -1.0, 0.0, 0.0, 0.0]))


def test_reinforce_is_the_raw_reward():
    _assert_tokens(reinforce_advantage(**_inputs()), _broadcast(REWARDS))


def test_token_level_rewards_are_summed_for_outcome_methods():
    token = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    result = grpo_advantage(
        rewards=token, group_ids=[0, 0], action_mask=torch.ones(2, 3), std_normalize=False
    )
    assert result.advantages[:, 0].tolist() == pytest.approx([0.5, -0.5])


def _gae_reference(rewards, values, mask, gamma, lam):
    """Plain recursion over the counted tokens of each row (masked tokens skipped)."""
    out = []
    for r_row, v_row, m_row in zip(rewards, values, mask, strict=True):
        idx = [t for t, m in enumerate(m_row) if m]
        adv = [0.0] * len(m_row)
        last, next_v = 0.0, 0.0
        for t in reversed(idx):
            delta = r_row[t] + gamma * next_v - v_row[t]
            last = delta + gamma * lam * last
            adv[t] = last
            next_v = v_row[t]
        out.append(adv)
    return out


def test_gae_matches_reference_with_gaps_and_padding():
    rewards = [[0.0, 0.5, 0.0, 1.0], [0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    values = [[0.3, 0.2, 9.0, 0.4], [0.1, -0.2, 0.5, 7.0], [1.0, 1.0, 1.0, 1.0]]
    # row 0 has an observation token (t=2) in the middle; row 1 is padded; row 2 is empty.
    mask = [[1, 1, 0, 1], [1, 1, 1, 0], [0, 0, 0, 0]]
    gamma, lam = 0.9, 0.8
    raw = _gae_reference(rewards, values, mask, gamma, lam)
    result = gae_advantage(
        rewards=torch.tensor(rewards, dtype=torch.float64),
        values=torch.tensor(values, dtype=torch.float64),
        action_mask=torch.tensor(mask),
        gamma=gamma,
        lam=lam,
        whiten=False,
    )
    _assert_tokens(result, raw)
    returns = [
        [(a + v) * m for a, v, m in zip(ar, vr, mr, strict=True)]
        for ar, vr, mr in zip(raw, values, mask, strict=True)
    ]
    assert_close(result.returns, torch.tensor(returns, dtype=torch.float64))
    # hand check, row 1 (gamma = lam = 1 would be reward-to-go minus value): last token
    assert raw[1][2] == pytest.approx(2.0 - 0.5)

    whitened = gae_advantage(
        rewards=torch.tensor(rewards, dtype=torch.float64),
        values=torch.tensor(values, dtype=torch.float64),
        action_mask=torch.tensor(mask),
        gamma=gamma,
        lam=lam,
    )
    flat = [a for ar, mr in zip(raw, mask, strict=True) for a, m in zip(ar, mr, strict=True) if m]
    mean, std = statistics.mean(flat), statistics.stdev(flat)
    expected = [
        [(a - mean) / math.sqrt(std**2 + 1e-8) * m for a, m in zip(ar, mr, strict=True)]
        for ar, mr in zip(raw, mask, strict=True)
    ]
    _assert_tokens(whitened, expected)


def test_gae_scalar_reward_goes_on_last_counted_token():
    mask = torch.tensor([[1, 1, 0]])
    values = torch.zeros(1, 3, dtype=torch.float64)
    result = gae_advantage(
        rewards=torch.tensor([3.0], dtype=torch.float64),
        values=values,
        action_mask=mask,
        whiten=False,
    )
    assert result.advantages.tolist() == [[3.0, 3.0, 0.0]]
    with pytest.raises(ValueError, match="values"):
        gae_advantage(rewards=torch.tensor([1.0]), action_mask=mask)


def test_reinforceplusplus_discounted_then_whitened():
    gamma = 0.5
    rewards = [[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]
    mask = [[1, 1, 1], [1, 0, 0]]
    returns = [[0.5, 1.0, 0.0], [2.0, 0.0, 0.0]]  # G_t = r_t + gamma G_{t+1}, by hand
    flat = [0.5, 1.0, 0.0, 2.0]
    mean, std = statistics.mean(flat), statistics.stdev(flat)
    expected = [
        [(g - mean) / math.sqrt(std**2 + 1e-8) * m for g, m in zip(gr, mr, strict=True)]
        for gr, mr in zip(returns, mask, strict=True)
    ]
    result = reinforceplusplus_advantage(
        rewards=torch.tensor(rewards, dtype=torch.float64),
        action_mask=torch.tensor(mask),
        gamma=gamma,
    )
    _assert_tokens(result, expected)
    assert_close(result.returns, torch.tensor(returns, dtype=torch.float64))


def test_remax_subtracts_greedy_baseline():
    result = remax_advantage(
        rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
        reward_baselines=torch.tensor([0.25, 0.5], dtype=torch.float64),
        action_mask=torch.tensor([[1, 1, 0], [1, 0, 0]]),
    )
    _assert_tokens(result, [[0.75, 0.75, 0.0], [-0.5, 0.0, 0.0]])
    with pytest.raises(ValueError, match="reward_baselines"):
        remax_advantage(rewards=torch.tensor([1.0]), action_mask=torch.ones(1, 1))


def test_on_policy_distill_is_teacher_minus_student():
    student = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    teacher = torch.tensor([[-0.5, -3.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    result = on_policy_distill_advantage(
        old_logprob=student, teacher_logprob=teacher, action_mask=mask, kl_coef=2.0
    )
    _assert_tokens(result, [[1.0, -2.0, 0.0]])
    assert result.metrics["kl_mean"] == pytest.approx(-0.5 + 1.0)
    with pytest.raises(ValueError, match="teacher_logprob"):
        on_policy_distill_advantage(old_logprob=student, action_mask=mask)


def test_jsd_matches_reference():
    ls, lt, lam = [-1.0, -0.2, -3.0], [-0.5, -2.0, -3.0], 0.3
    expected = []
    for s, t in zip(ls, lt, strict=True):
        ps, pt = math.exp(s), math.exp(t)
        m = lam * pt + (1 - lam) * ps
        jsd = lam * pt * math.log(pt / m) + (1 - lam) * ps * math.log(ps / m)
        expected.append(-1.5 * jsd)
    result = jsd_advantage(
        old_logprob=torch.tensor([ls], dtype=torch.float64),
        teacher_logprob=torch.tensor([lt], dtype=torch.float64),
        action_mask=torch.tensor([[1, 1, 1]]),
        kl_coef=1.5,
        lambda_coef=lam,
    )
    _assert_tokens(result, [expected])
    assert expected[2] == pytest.approx(0.0)  # identical distributions: no divergence
    for edge in (0.0, 1.0):
        zero = jsd_advantage(
            old_logprob=torch.tensor([ls]),
            teacher_logprob=torch.tensor([lt]),
            action_mask=torch.ones(1, 3),
            lambda_coef=edge,
        )
        assert (zero.advantages == 0).all()


@pytest.mark.parametrize("name", names("advantage_fn"))
def test_every_advantage_fn_is_finite_on_degenerate_batches(name):
    fn = get("advantage_fn", name)
    batch = {
        "rewards": torch.tensor([1.0, 1.0, 0.0]),
        "group_ids": [0, 0, 1],  # a flat group and a group of one
        "action_mask": torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]]),  # padding, empty row
        "values": torch.zeros(3, 3),
        "old_logprob": torch.full((3, 3), -1.0),
        "teacher_logprob": torch.full((3, 3), -2.0),
        "reward_baselines": torch.zeros(3),
        "entropy": torch.full((3, 3), 0.5),
    }
    result = fn(**batch)
    for t in (result.advantages, result.returns):
        assert torch.isfinite(t).all()
        assert (t[1] == 0).all()  # nothing where the mask is empty
        assert t.dtype == torch.float32
    assert all(math.isfinite(v) for v in result.metrics.values())
    empty = fn(**{**batch, "action_mask": torch.zeros(3, 3)})
    assert (empty.advantages == 0).all()


@pytest.mark.parametrize("name", ["grpo", "rloo", "opmd", "asymre", "rec", "reinforce"])
def test_empty_batch(name):
    fn = get("advantage_fn", name)
    result = fn(rewards=torch.zeros(0), group_ids=[], action_mask=torch.zeros(0, 4))
    assert result.advantages.shape == (0, 4)


def test_clipb_drops_negative_advantage_tokens_whose_entropy_signal_is_far_below_the_mean():
    """By hand (arXiv:2602.03392's S = p (H + log p), upstream's thresholds): two rollouts of
    one task, rewards 1 and 0, so advantages +-0.5 / (0.7071 + eps) (unbiased std 0.7071); two
    tokens each. With mu between the losing rollout's two tokens' distances below the mean of
    S (in population stds), its farther token leaves the loss; the winner's never do."""
    lp = torch.tensor([[-0.1, -2.0], [-0.05, -1.5]])
    h = torch.tensor([[0.2, 1.5], [3.0, 0.1]])
    mask = torch.ones(2, 2)
    s = [[math.exp(a) * (b + a) for a, b in zip(ra, rh, strict=True)] for ra, rh in zip(lp.tolist(), h.tolist(), strict=True)]
    flat = [x for row in s for x in row]
    mean = sum(flat) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / 4)
    z = [(mean - x) / std for x in s[1]]  # how far below the mean, in stds
    assert z[1] > z[0]
    mu = (z[0] + z[1]) / 2
    res = clipb_advantage(action_mask=mask, rewards=torch.tensor([1.0, 0.0]), group_ids=["t", "t"],
                          old_logprob=lp, entropy=h, mu=mu)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert res.action_mask.bool().tolist() == [[True, True], [True, False]]
    assert res.advantages.tolist() == [pytest.approx([a, a]), pytest.approx([-a, 0.0])]
    assert res.metrics["frac_clipped"] == pytest.approx(0.25)
    assert res.metrics["ES"] == pytest.approx(mean) and res.metrics["varS"] == pytest.approx(std**2)
    # a wide mu keeps every token; a group of one keeps its raw reward (upstream: mean 0, std 1)
    assert clipb_advantage(action_mask=mask, rewards=torch.tensor([1.0, 0.0]), group_ids=["t", "t"],
                           old_logprob=lp, entropy=h, mu=100.0).action_mask.all()
    one = clipb_advantage(action_mask=mask[:1], rewards=torch.tensor([0.5]), group_ids=["t"],
                          old_logprob=lp[:1], entropy=h[:1])
    assert one.advantages[0].tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="needs `entropy`"):
        clipb_advantage(action_mask=mask, rewards=torch.tensor([1.0, 0.0]), old_logprob=lp)
