"""A sweep's shared trainer: each run's trainer is an ordinary one whose model shares the base
weights' tensors with the others'; training one run moves its adapter alone (not the base,
not another run's adapter, not another run's optimizer)."""

from __future__ import annotations

import pytest
import torch

from .test_lora import LORA
from .test_updates import _batch, _cfg


def _pair(tmp_path, tiny_model, lrs=(3e-3, 1e-2)):
    from roles.trainer.main import Trainer
    from roles.trainer.shared import SharedBase

    base = SharedBase()
    runs = [Trainer(_cfg(tmp_path / f"r{i}", tiny_model, model=LORA, algorithm={"optimizer": {"lr": lr}}), base)
            for i, lr in enumerate(lrs)]
    return base, runs


def _base_tensors(model):
    return {n: p for n, p in model.named_parameters() if ".lora_" not in n}


@pytest.mark.slow
def test_runs_share_the_base_tensors_and_train_their_own_adapter(tmp_path, tiny_model):
    base, (a, b) = _pair(tmp_path, tiny_model)
    ta, tb = _base_tensors(a.engine.model), _base_tensors(b.engine.model)
    assert ta and ta.keys() == tb.keys()
    assert all(ta[n].data_ptr() == tb[n].data_ptr() for n in ta), "the base is held twice"
    frozen = {n: p.detach().clone() for n, p in ta.items()}
    b_adapter = {n: p.detach().clone() for n, p in b.engine.model.named_parameters() if p.requires_grad}
    a.train(_batch(), 1)
    assert all(torch.equal(p, frozen[n]) for n, p in ta.items()), "training a run moved the shared base"
    assert all(torch.equal(p, b_adapter[n]) for n, p in b.engine.model.named_parameters() if p.requires_grad)
    moved = [n for n, p in a.engine.model.named_parameters() if p.requires_grad and ".lora_B." in n
             and p.abs().sum() > 0]
    assert moved, "run a's adapter did not learn"
    # each run has its own optimizer over its own adapter
    pa = {id(p) for g in a.engine.optimizer.param_groups for p in g["params"]}
    pb = {id(p) for g in b.engine.optimizer.param_groups for p in g["params"]}
    assert pa and pb and not pa & pb


@pytest.mark.slow
def test_a_shared_run_trains_as_a_run_of_its_own(tmp_path, tiny_model):
    # same seed, same batch: the run in a sweep and a run alone take the same step
    from roles.trainer.main import Trainer

    torch.manual_seed(0)
    _, (a, _) = _pair(tmp_path / "s", tiny_model)
    torch.manual_seed(0)
    alone = Trainer(_cfg(tmp_path / "alone", tiny_model, model=LORA, algorithm={"optimizer": {"lr": 3e-3}}))
    ma, mb = a.train(_batch(), 1), alone.train(_batch(), 1)
    assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-5)
    sa = dict(a.engine.model.named_parameters())
    for n, p in alone.engine.model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(sa[n], p)


def test_a_run_of_another_base_model_is_refused(tmp_path, tiny_model):
    from roles.trainer.shared import SharedBase

    base = SharedBase()
    base.model_for(_cfg(tmp_path, tiny_model), lambda p: torch.nn.Linear(2, 2))
    other = _cfg(tmp_path, tiny_model)
    other.model.model_path = str(tmp_path / "another")
    with pytest.raises(ValueError, match="model.model_path"):
        base.model_for(other, lambda p: torch.nn.Linear(2, 2))


def test_a_trainer_that_is_not_pytorchs_cannot_share_and_is_named(tmp_path, tiny_model):
    from roles.trainer.main import not_shareable

    why = not_shareable(_cfg(tmp_path / "ds", tiny_model, trainer={"trainer_type": "deepspeed"}))
    assert why and "trainer.trainer_type" in why and "pytorch" in why
    assert not_shareable(_cfg(tmp_path / "pt", tiny_model)) is None
