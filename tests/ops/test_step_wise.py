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


def test_gigpo_by_hand():
    """Two episodes of one task, two steps each, from the same start state x. A: x -> y, reward 1
    at its end; B: x -> z, reward 0. A^E: returns 1 and 0, minus their mean: +-0.5. A^S: the
    two steps from x are compared by their return-to-go (1 and 0): +-0.5; y and z are met once:
    0. So A's steps get 1.0 and 0.5, B's -1.0 and -0.5 (omega 1, fnorm none)."""
    gigpo = get("advantage_fn", "gigpo")
    mask = torch.ones(4, 2)
    infos = [{"step": 0, "env_state_hash": "x"}, {"step": 1, "env_state_hash": "y"},
             {"step": 1, "env_state_hash": "z"}, {"step": 0, "env_state_hash": "x"}]  # B's turns out of order
    res = gigpo(action_mask=mask, rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]), group_ids=["g"] * 4,
                episode_ids=["a", "a", "b", "b"], infos=infos)
    assert res.advantages[:, 0].tolist() == pytest.approx([1.0, 0.5, -0.5, -1.0], rel=1e-5)
    assert res.metrics["gigpo/anchor_groups_total"] == 3 and res.metrics["gigpo/anchor_groups_size_gt1"] == 1
    # fnorm std: the episodes' returns 1 and 0 have sample std 0.7071, so A^E is +-0.7071
    res = gigpo(action_mask=mask, rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]), group_ids=["g"] * 4,
                episode_ids=["a", "a", "b", "b"], infos=infos, fnorm="std", omega=0.0)
    assert res.advantages[:, 0].tolist() == pytest.approx([0.70710678, 0.70710678, -0.70710678, -0.70710678], rel=1e-5)
    # step rewards and gamma: A's steps earn 0.2 and 1.0, so its return is 1.2 and its first
    # step's return-to-go 0.2 + 0.5 * 1.0 = 0.7 against B's 0: A^S = +-0.35
    infos[0]["step_reward"], infos[1]["step_reward"] = 0.2, 1.0
    res = gigpo(action_mask=mask, rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]), group_ids=["g"] * 4,
                episode_ids=["a", "a", "b", "b"], infos=infos, gamma=0.5)
    assert res.advantages[:, 0].tolist() == pytest.approx([0.6 + 0.35, 0.6, -0.6, -0.6 - 0.35], rel=1e-5)
    # one episode alone keeps its return; without episodes or infos every sequence is one step
    one = gigpo(action_mask=torch.ones(1, 1), rewards=torch.tensor([2.0]), group_ids=["g"])
    assert one.advantages.item() == pytest.approx(2.0, rel=1e-5)
    flat = gigpo(action_mask=torch.ones(2, 1), rewards=torch.tensor([1.0, 0.0]), group_ids=["g", "g"])
    assert flat.advantages[:, 0].tolist() == pytest.approx([0.5, -0.5], rel=1e-5)
    with pytest.raises(ValueError, match="fnorm"):
        gigpo(action_mask=mask, rewards=torch.zeros(4), fnorm="max")
