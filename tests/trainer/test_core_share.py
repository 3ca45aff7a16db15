"""The trainer takes an idle explorer's cores (roles/runtime/core_share.py): the explorer's
flag says when it works, the trainer's hooks set its torch threads before each layer's
forward and after each layer's gradients."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
import torch

from roles.runtime.core_share import (
    ExplorerWork,
    TrainerThreads,
    all_idle,
    explorer_flags,
    flag_dir,
    flag_prefix,
    follows_explorer,
)
from schemas.config import TrinityConfig

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def own_flag_dir(tmp_path, monkeypatch):
    """Each test's flags in its own folder: test processes running side by side must not see
    each other's explorers or trainers."""
    import roles.runtime.core_share as core_share

    monkeypatch.setattr(core_share, "flag_dir", lambda: tmp_path)


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex}"


def test_the_flag_says_busy_while_any_work_runs_and_is_gone_after(run_id):
    work = ExplorerWork(run_id)
    try:
        assert explorer_flags(run_id) == [work.path] and all_idle([work.path])
        with work.busy():
            with work.busy():  # a step's tasks overlap
                assert not all_idle([work.path])
            assert not all_idle([work.path])
        assert all_idle([work.path])
    finally:
        work.close()
    assert not work.path.exists() and explorer_flags(run_id) == []
    assert not all_idle([])  # no explorer said anything: the trainer keeps its share


def test_a_dead_explorers_flag_is_skipped(run_id):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = flag_dir() / f"{flag_prefix(run_id)}{int(dead.stdout)}"
    stale.write_bytes(b"1")  # killed while busy: it must not hold the trainer to its share forever
    try:
        assert explorer_flags(run_id) == []
    finally:
        stale.unlink()


def test_the_trainers_threads_follow_the_explorer_layer_by_layer(run_id, tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    threads = TrainerThreads([run_id], share=1, extra=1)
    assert threads.attach(model) == model.config.num_hidden_layers
    before = torch.get_num_threads()
    work = ExplorerWork(run_id)
    ids = torch.tensor([[1, 2, 3, 4]])
    try:
        torch.set_num_threads(1)
        model(input_ids=ids).logits.sum().backward()
        assert torch.get_num_threads() == 2  # idle explorer: its core too
        with work.busy():
            model(input_ids=ids)
            assert torch.get_num_threads() == 1  # working: back to the share
            torch.set_num_threads(2)
            model(input_ids=ids).logits.sum().backward()  # the gradient hooks give it back too
            assert torch.get_num_threads() == 1
    finally:
        work.close()
        torch.set_num_threads(before)
    assert threads.switches >= 2


def test_a_sweeps_trainer_takes_the_core_only_while_every_runs_explorer_idles(tiny_model):
    """A sweep's runs explore in one process (one engine): its trainer host follows all of
    their flags, and one run's rollouts keep every run's steps at the share."""
    from transformers import AutoModelForCausalLM

    runs = [f"test-{uuid.uuid4().hex}" for _ in range(3)]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    TrainerThreads(runs, share=1, extra=1).attach(model)
    works = [ExplorerWork(r) for r in runs]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with works[2].busy():
            model(input_ids=torch.tensor([[1, 2, 3]]))
            assert torch.get_num_threads() == 1  # the third run generates: every run keeps its share
        model(input_ids=torch.tensor([[1, 2, 3]]))
        assert torch.get_num_threads() == 2
    finally:
        for w in works:
            w.close()
        torch.set_num_threads(before)


def test_a_trainer_takes_no_extra_core_while_another_trainer_lives_on_the_machine(run_id, tiny_model, tmp_path):
    """Runs started apart side by side: each trainer's idle explorer does not free a core, the
    other runs use it; so while another following trainer process lives, none takes more."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    TrainerThreads([run_id], share=1, extra=1).attach(model)
    assert (tmp_path / f"trinity-trainer-{os.getpid()}").exists()  # this process says it trains
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (tmp_path / f"trinity-trainer-{other.pid}").touch()
    work = ExplorerWork(run_id)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        model(input_ids=torch.tensor([[1, 2, 3]]))
        assert torch.get_num_threads() == 1  # its explorer idles, but another trainer lives
    finally:
        other.kill()
        other.wait()
        work.close()
        torch.set_num_threads(before)
    fresh = TrainerThreads([run_id], share=1, extra=1)  # the other one is gone: this one may
    work = ExplorerWork(run_id)
    try:
        torch.set_num_threads(1)
        fresh.follow()
        assert torch.get_num_threads() == 2
    finally:
        work.close()
        torch.set_num_threads(before)


def test_only_a_cpu_run_with_explorer_and_trainer_together_follows(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert follows_explorer(TrinityConfig(mode="both"))
    assert not follows_explorer(TrinityConfig(mode="train"))
    assert not follows_explorer(TrinityConfig(mode="serve"))  # the API's callers decide when it works
    assert not follows_explorer(TrinityConfig(mode="both", cluster={"gpu_per_node": 1}))
    assert not follows_explorer(TrinityConfig(mode="both", cluster={"cpu_tuning": False}))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert not follows_explorer(TrinityConfig(mode="both"))
    assert os.environ["OMP_NUM_THREADS"] == "1"
