"""PPO's critic and the KL penalty in the reward, on the tiny model in-process: the real
Trainer (PyTorch engine, value model, reference model, checkpoints), no bus."""

from __future__ import annotations

import pytest
import torch

from tests.explorer.helpers import load

from .helpers import groups, write_config


def _config(tmp_path, tiny_model, **algorithm):
    return load(write_config(
        tmp_path / "ppo.yaml", project="t", name="ppo", checkpoint_root_dir=str(tmp_path / "ckpt"),
        model={"model_path": str(tiny_model), "max_model_len": 64},
        algorithm={"algorithm_type": "ppo", "repeat_times": 1, "optimizer": {"lr": 1e-3}, **algorithm},
        critic={"optim": {"lr": 1e-2}, "cliprange_value": 10.0},
        trainer={"trainer_type": "pytorch", "critic_warmup": 2, "save_hf_checkpoint": "never"},
        buffer={"batch_size": 8, "total_steps": 8},
    ))


def _batch(step: int) -> list:
    return [e for g in groups("t.ppo", step * 2, 2, size=4) for e in g.experiences]


def _actor(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.engine.model.parameters()]


@pytest.mark.slow
def test_ppo_critic_warms_up_learns_values_and_resumes(tmp_path, tiny_model):
    from roles.trainer.main import Trainer

    cfg = _config(tmp_path, tiny_model)
    tr = Trainer(cfg)
    assert tr.spec.use_critic and tr.spec.compute_advantage_in_trainer and tr.runner.critic is not None
    before = _actor(tr)
    fixed = _batch(0)
    losses = []
    for step in (1, 2):  # critic warmup: the critic learns, the actor does not move
        m = tr.train(fixed, step)
        assert m["critic_warmup"] == 1.0 and "loss" not in m
        losses.append(m["critic/vf_loss"])
    assert all(torch.equal(a, b) for a, b in zip(before, _actor(tr), strict=True))
    for step in (3, 4, 5):
        m = tr.train(fixed, step)
        assert "loss" in m and "critic_warmup" not in m
        losses.append(m["critic/vf_loss"])
    assert not all(torch.equal(a, b) for a, b in zip(before, _actor(tr), strict=True))
    # same batch every step: the value loss goes down as the critic fits the returns
    assert losses[-1] < losses[0] * 0.7, losses
    tr.save(final=False)

    # a restarted trainer continues from the checkpoint with the same critic and optimizer
    again = Trainer(cfg)
    assert again.step == 5
    for (n, a), b in zip(tr.runner.critic.model.state_dict().items(),
                         again.runner.critic.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    m1 = tr.train(_batch(1), 6)
    m2 = again.train(_batch(1), 6)
    assert m1["critic/vf_loss"] == pytest.approx(m2["critic/vf_loss"], rel=1e-5)


@pytest.mark.slow
def test_kl_penalty_moves_the_reward_and_adapts_its_coefficient(tmp_path, tiny_model):
    from roles.trainer.main import Trainer

    cfg = _config(tmp_path, tiny_model, advantage_fn="reinforceplusplus", kl_loss_fn="none",
                  kl_penalty_fn="k1",
                  kl_penalty_fn_args={"kl_coef": 0.1, "adaptive": True, "target_kl": 0.01, "horizon": 100})
    tr = Trainer(cfg)
    assert tr.spec.use_reference and not tr.spec.use_critic and tr.spec.compute_advantage_in_trainer
    # the helper's log-probs are not the tiny model's: the sampler differs from the reference
    coefs = []
    for step in range(1, 4):
        m = tr.train(_batch(step), step)
        assert m["kl_penalty/kl"] != 0.0
        coefs.append(m["kl_penalty/kl_coef"])
    assert coefs[0] == pytest.approx(0.1) and coefs[1] != coefs[0]  # adaptive: moved towards target
    tr.save(final=False)
    assert Trainer(cfg).runner.kl_coef == pytest.approx(tr.runner.kl_coef)


def test_kl_penalty_makes_group_advantages_wait_for_the_trainer():
    from ops.algorithms import resolve

    assert not resolve("grpo").compute_advantage_in_trainer
    assert resolve("grpo", kl_penalty_fn="k2").compute_advantage_in_trainer


def test_veRL_critic_section_loads_with_warnings_for_its_veRL_only_keys(tmp_path, tiny_model):
    import argparse

    from roles.runtime.config import load as load_settings

    path = write_config(tmp_path / "c.yaml", model={"model_path": str(tiny_model)},
                        critic={"strategy": "fsdp", "optim": {"lr": 3e-6, "total_training_steps": -1},
                                "ppo_micro_batch_size_per_gpu": 8, "cliprange_value": 0.2})
    loaded = load_settings(argparse.Namespace(config=str(path), overrides=[], dotenv=str(path) + ".x"), quiet=True)
    assert loaded.config.critic.optim.lr == 3e-6 and loaded.config.critic.cliprange_value == 0.2
    joined = "\n".join(loaded.warnings)
    assert "critic.strategy is ignored" in joined and "critic.ppo_micro_batch_size_per_gpu" in joined
