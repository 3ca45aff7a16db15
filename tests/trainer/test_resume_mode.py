"""``trainer.resume_mode`` on the real Trainer (PyTorch engine, tiny model, no bus): where a
run starts (the job's latest checkpoint, the model, another ``global_step_N`` folder), and a
trainer restarted within its session going on from its own checkpoint whatever the mode."""

from __future__ import annotations

import pytest
import torch

from ops.algorithms import resolve
from storage import checkpoints as ck
from tests.explorer.helpers import load

from .helpers import groups, write_config

FIRST, SECOND = "100.5", "200.25"  # TRINITY_SESSION_START of two sessions of trinity run


def _cfg(tmp_path, name, tiny_model, continue_from_checkpoint=True, **trainer):
    return load(write_config(
        tmp_path / f"{name}.yaml", project="t", name=name, checkpoint_root_dir=str(tmp_path / "ckpt"),
        continue_from_checkpoint=continue_from_checkpoint,
        model={"model_path": str(tiny_model), "max_model_len": 64},
        algorithm={"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 1e-2}, "kl_loss_fn": "none"},
        trainer={"trainer_type": "pytorch", "save_hf_checkpoint": "never", **trainer},
        buffer={"batch_size": 2, "total_steps": 4},
    ))


def _batch() -> list:
    from roles.buffer.pipeline import group_advantages

    return [e for g in groups("t.a", 0, 2, size=4) for e in group_advantages(g, resolve("grpo")).experiences]


def _weights(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.engine.model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_resume_mode_chooses_where_the_trainer_starts(tmp_path, tiny_model, monkeypatch):
    from roles.trainer.main import Trainer

    monkeypatch.setenv("TRINITY_SESSION_START", FIRST)
    first = Trainer(_cfg(tmp_path, "a", tiny_model))
    model = _weights(first)
    first.train(_batch(), 1)
    first.save(final=False)
    trained = _weights(first)
    assert not _same(model, trained)
    job_a = tmp_path / "ckpt" / "t" / "a"
    assert ck.read_meta(job_a, "trainer")["session"] == float(FIRST)

    # trinity run restarted the trainer in the same session: it goes on, whatever the mode
    for trainer in ({"resume_mode": "disable"},
                    {"resume_mode": "resume_path", "resume_from_path": str(tmp_path / "nowhere" / "global_step_9")}):
        again = Trainer(_cfg(tmp_path, "a", tiny_model, **trainer))
        assert again.step == 1 and _same(_weights(again), trained), trainer

    monkeypatch.setenv("TRINITY_SESSION_START", SECOND)  # a new run of the same job
    auto = Trainer(_cfg(tmp_path, "a", tiny_model))
    assert (auto.step, auto.consumed) == (1, 8) and _same(_weights(auto), trained)
    fresh = Trainer(_cfg(tmp_path, "a", tiny_model, resume_mode="disable"))
    assert (fresh.step, fresh.consumed) == (0, 0) and _same(_weights(fresh), model)
    # continue_from_checkpoint: false makes auto start from the model (as before resume_mode)
    off = Trainer(_cfg(tmp_path, "a", tiny_model, continue_from_checkpoint=False))
    assert off.step == 0 and _same(_weights(off), model)

    # another job starts from job a's step 1: weights, step, consumed and optimizer state
    other = Trainer(_cfg(tmp_path, "b", tiny_model, resume_mode="resume_path",
                         resume_from_path=str(ck.step_dir(job_a, 1))))
    assert (other.step, other.consumed) == (1, 8) and _same(_weights(other), trained)
    assert other.engine.optimizer.state_dict()["state"][0]["step"] == 1
    assert ck.read_latest(tmp_path / "ckpt" / "t" / "b") is None  # nothing written to job b yet
