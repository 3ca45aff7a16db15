"""The trainer role with two processes, as a user starts it: ``trinity trainer`` sees that
``cluster`` gives it two devices and becomes ``torchrun`` over two ranks of itself, or the
DeepSpeed launcher starts two (``deepspeed --num_gpus 2 --module roles.cli trainer``). Either
way (DeepSpeed ZeRO-2 on the CPU accelerator), with a real buffer on a real nats-server it
trains every published experience exactly once, checkpointing each rank's optimizer partition."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from storage.checkpoints import read_latest

from .helpers import groups, publish, start_role, stop_roles, write_config

pytest.importorskip("deepspeed")

STEPS, BATCH, GROUP = 3, 8, 4


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["trinity", "deepspeed"])
def test_trainer_role_runs_two_ranks(tmp_path, nats_cfg, run_id, tiny_model, launcher):
    from .test_deepspeed import EXT_DIR, _drop_stale_lock, _port

    _drop_stale_lock()
    project, name = run_id.split(".", 1)
    cfg = write_config(
        tmp_path / "cfg.yaml",
        project=project, name=name, mode="train", checkpoint_root_dir=str(tmp_path / "ckpt"),
        # trinity: on this CPU machine, two trainer processes; deepspeed: its launcher decides
        cluster={"gpu_per_node": 2 if launcher == "trinity" else 0},
        model={"model_path": str(tiny_model)},
        algorithm={"algorithm_type": "grpo", "repeat_times": GROUP, "optimizer": {"lr": 1e-3}},
        buffer={"batch_size": BATCH // GROUP, "train_batch_size": BATCH, "total_steps": STEPS,
                "trainer_input": {"experience_buffer": {"name": "exp", "storage_type": "queue", "max_read_timeout": 3}}},
        trainer={"trainer_type": "deepspeed", "deepspeed": {"zero_stage": 2}, "save_interval": 2,
                 "total_steps": STEPS, "save_hf_checkpoint": "last", "max_token_len_per_gpu": 64},
        synchronizer={"sync_method": "checkpoint", "sync_interval": 1000},
        nats={"url": nats_cfg.url, "embedded": False},
    )
    job = tmp_path / "ckpt" / project / name
    published = groups(run_id, 0, STEPS * BATCH // GROUP)
    buffer = start_role("buffer", cfg, tmp_path / "buffer.log")
    if launcher == "trinity":
        trainer = start_role("trainer", cfg, tmp_path / "trainer.log", TORCH_EXTENSIONS_DIR=EXT_DIR)
    else:
        trainer = start_role("trainer", cfg, tmp_path / "trainer.log", TORCH_EXTENSIONS_DIR=EXT_DIR,
                             launcher=[str(Path(sys.executable).with_name("deepspeed")), "--num_gpus", "2",
                                       "--master_port", str(_port()), "--module"])
    try:
        asyncio.run(publish(nats_cfg, run_id, published))
        trainer.wait(600)
        log = (tmp_path / "trainer.log").read_text()
        assert trainer.returncode == 0, log[-4000:]
        if launcher == "trinity" and "CUDA_VISIBLE_DEVICES" not in os.environ:
            # the device plan's share, taken by the role started alone and kept under torchrun
            assert log.count("trinity trainer: CUDA_VISIBLE_DEVICES='0,1'") == 2, log[-4000:]
    finally:
        stop_roles(trainer, buffer)
    entries = [json.loads(line) for line in (job / "trainer_steps.jsonl").read_text().splitlines()]
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    assert {e["world"] for e in entries} == {2}
    trained = [i for e in entries for i in e["ids"]]
    assert sorted(trained) == sorted(e.id for g in published for e in g.experiences)
    assert len(trained) == len(set(trained))
    assert read_latest(job) == STEPS
    actor = job / f"global_step_{STEPS}" / "actor"
    assert sorted(p.name for p in actor.glob("trainer_state*.pt")) == [
        "trainer_state_world_size_2_rank_0.pt", "trainer_state_world_size_2_rank_1.pt"]
    assert (actor / "huggingface" / "model.safetensors").exists()
    follower = Path(job / "log" / "trainer_rank1.log").read_text()
    assert "trainer_follower_started" in follower, follower[-2000:]
    assert os.path.exists(job / "log" / "trainer.log")
