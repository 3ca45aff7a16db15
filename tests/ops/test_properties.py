"""Property tests: every registered part stays finite on random masks, groups and rewards."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.registry import get, names

SETTINGS = settings(max_examples=15, deadline=None)


@st.composite
def batches(draw):
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 5))
    mask = draw(
        st.lists(st.lists(st.sampled_from([0, 1]), min_size=t, max_size=t), min_size=b, max_size=b)
    )
    # few distinct reward values so ties, flat groups and groups of one are common
    rewards = draw(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 3.0]), min_size=b, max_size=b))
    groups = draw(st.lists(st.integers(0, 2), min_size=b, max_size=b))
    logp = draw(st.lists(st.floats(-8.0, -0.01), min_size=b * t, max_size=b * t))
    shift = draw(st.lists(st.floats(-2.0, 2.0), min_size=b * t, max_size=b * t))
    expert = draw(st.lists(st.booleans(), min_size=b, max_size=b))
    logprob = torch.tensor(logp, dtype=torch.float32).reshape(b, t)
    return {
        "mask": torch.tensor(mask),
        "rewards": torch.tensor(rewards),
        "groups": groups,
        "logprob": logprob,
        "old": logprob + torch.tensor(shift).reshape(b, t),
        "expert": torch.tensor(expert),
    }


@SETTINGS
@given(batches())
def test_advantages_are_finite_and_masked(batch):
    b, t = batch["mask"].shape
    for name in names("advantage_fn"):
        result = get("advantage_fn", name)(
            action_mask=batch["mask"],
            rewards=batch["rewards"],
            group_ids=batch["groups"],
            values=torch.zeros(b, t),
            old_logprob=batch["old"],
            teacher_logprob=batch["logprob"],
            reward_baselines=torch.zeros(b),
            entropy=batch["logprob"].abs(),
        )
        assert torch.isfinite(result.advantages).all(), name
        assert torch.isfinite(result.returns).all(), name
        assert (result.advantages[batch["mask"] == 0] == 0).all(), name
        assert result.keep.shape == (b,)
        assert all(math.isfinite(v) for v in result.metrics.values()), name


@SETTINGS
@given(batches())
def test_policy_losses_are_finite_with_finite_gradients(batch):
    mask = batch["mask"]
    adv = get("advantage_fn", "grpo")(
        action_mask=mask, rewards=batch["rewards"], group_ids=batch["groups"]
    ).advantages
    rows = mask.shape[0] - mask.shape[0] % 2  # DPO needs pairs
    for name in names("policy_loss_fn"):
        n = rows if name == "dpo" else mask.shape[0]
        if n == 0:
            continue
        logprob = batch["logprob"][:n].clone().requires_grad_(True)
        loss, metrics = get("policy_loss_fn", name)(
            logprob,
            batch["old"][:n],
            adv[:n],
            mask[:n],
            ref_logprob=batch["old"][:n],
            expert_mask=batch["expert"][:n],
            global_step=3,
        )
        loss.backward()
        assert loss.dim() == 0 and torch.isfinite(loss), name
        assert torch.isfinite(logprob.grad).all(), name
        assert all(math.isfinite(v) for v in metrics.values()), name


@SETTINGS
@given(batches())
def test_kl_and_entropy_are_finite(batch):
    from ops.kl import kl_loss, kl_penalty

    mask = batch["mask"]
    for name in names("kl_fn"):
        loss, _ = kl_loss(batch["logprob"], batch["old"], mask, kl_fn=name)
        token, _ = kl_penalty(batch["rewards"], batch["logprob"], batch["old"], mask, kl_fn=name)
        assert torch.isfinite(loss) and torch.isfinite(token).all(), name
    entropy = -batch["logprob"]
    for name in names("entropy_loss_fn"):
        term, _ = get("entropy_loss_fn", name)(
            entropy, mask, expert_mask=batch["expert"], entropy_coef=0.01
        )
        assert torch.isfinite(term), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_part_runs_on_gpu_tensors():
    dev = torch.device("cuda")
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], device=dev)
    logprob = torch.full((4, 3), -1.0, device=dev, requires_grad=True)
    old = torch.full((4, 3), -1.1, device=dev)
    data = {
        "action_mask": mask,
        "rewards": torch.tensor([1.0, 0.0, 1.0, 2.0], device=dev),
        "group_ids": torch.tensor([0, 0, 1, 2], device=dev),
        "values": torch.zeros(4, 3, device=dev),
        "old_logprob": old,
        "teacher_logprob": old - 0.5,
        "reward_baselines": torch.zeros(4, device=dev),
    }
    for name in names("advantage_fn"):
        result = get("advantage_fn", name)(**data)
        assert result.advantages.device.type == "cuda", name
        assert result.keep.device.type == "cuda", name
    adv = torch.ones(4, 3, device=dev)
    extras = {"ref_logprob": old, "expert_mask": torch.tensor([0, 1, 0, 1], device=dev).bool()}
    for name in names("policy_loss_fn"):
        loss, _ = get("policy_loss_fn", name)(logprob, old, adv, mask, **extras)
        loss.backward()
        assert loss.device.type == "cuda" and torch.isfinite(logprob.grad).all(), name
