"""Step-wise GRPO: the advantage is computed over the group's *episodes* and broadcast to
every turn, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch

from ops import get


def test_step_wise_grpo_by_hand():
    # group "a": episodes 0 (2 turns, return 1.0), 1 (1 turn, 0.0), 2 (3 turns, 0.5);
    # group "b": episodes 0 and 1, both return 1.0 (no signal)
    groups = ["a", "a", "a", "a", "a", "a", "b", "b"]
    episodes = [0, 0, 1, 2, 2, 2, 0, 1]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0])
    mask = torch.ones(8, 3, dtype=torch.bool)
    mask[2, 2] = False
    res = get("advantage_fn", "step_wise_grpo")(action_mask=mask, rewards=rewards,
                                                 group_ids=groups, episode_ids=episodes, epsilon=0.0)
    # group a's returns 1, 0, 0.5: mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    want = torch.tensor([1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert res.advantages[:, 0] == pytest.approx(want.tolist(), abs=1e-6)
    assert torch.all(res.advantages[2, 2] == 0)  # masked token
    assert res.metrics["episodes"] == 5
    # per-turn GRPO would weigh episode 2's three turns three times: a different baseline
    naive = get("advantage_fn", "grpo")(action_mask=mask, rewards=rewards, group_ids=groups)
    assert naive.advantages[0, 0] != pytest.approx(1.0, abs=1e-3)


def test_step_wise_grpo_reward_to_go_uses_the_first_turn():
    # per-step rewards 0.3 then 0.2 -> rewards-to-go 0.5, 0.2; the other episode returns 0.1
    res = get("advantage_fn", "step_wise_grpo")(
        action_mask=torch.ones(3, 2, dtype=torch.bool), rewards=torch.tensor([0.5, 0.2, 0.1]),
        group_ids=["g"] * 3, episode_ids=[0, 0, 1], epsilon=0.0)
    # returns 0.5 and 0.1: mean 0.3, std sqrt(0.08) = 0.2828
    a = 0.2 / 0.08 ** 0.5
    assert res.advantages[:, 0].tolist() == pytest.approx([a, a, -a], abs=1e-5)


def test_without_episode_ids_every_sequence_is_an_episode():
    mask = torch.ones(4, 1, dtype=torch.bool)
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    sw = get("advantage_fn", "step_wise_grpo")(action_mask=mask, rewards=r, group_ids=["g"] * 4)
    g = get("advantage_fn", "grpo")(action_mask=mask, rewards=r, group_ids=["g"] * 4)
    assert torch.allclose(sw.advantages, g.advantages, atol=1e-6)


def test_step_wise_grpo_upstreams_std_level_threshold_and_step_norm_by_hand():
    """The group of the first test: returns 1, 0, 0.5 (a) and 1, 1 (b)."""
    groups = ["a", "a", "a", "a", "a", "a", "b", "b"]
    episodes = [0, 0, 1, 2, 2, 2, 0, 1]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0])
    mask = torch.ones(8, 1, dtype=torch.bool)
    fn = get("advantage_fn", "step_wise_grpo")

    def adv(**kw):
        res = fn(action_mask=mask, rewards=rewards, group_ids=groups, episode_ids=episodes, epsilon=0.0, **kw)
        return res.advantages[:, 0].tolist(), res.keep.tolist()

    # batch: std over the five returns 1, 0, 0.5, 1, 1 (mean 0.7): sqrt((0.09+0.49+0.04+0.09+0.09)/4)
    s = (0.8 / 4) ** 0.5
    a, _ = adv(std_cal_level="batch")
    assert a == pytest.approx([0.5 / s, 0.5 / s, -0.5 / s, 0.0, 0.0, 0.0, 0.0, 0.0], abs=1e-6)
    # threshold 0: group b (std 0) is dropped, a kept
    a, keep = adv(std_threshold=0.0)
    assert keep == [True] * 6 + [False] * 2 and a[:3] == pytest.approx([1.0, 1.0, -1.0])
    # step norm: episode 0 has two turns, 1 one, 2 three
    a, _ = adv(enable_step_norm=True)
    assert a == pytest.approx([0.5, 0.5, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="std_cal_level"):
        adv(std_cal_level="task")
