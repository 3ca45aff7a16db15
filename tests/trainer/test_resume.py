"""Buffer + trainer as real processes on a real nats-server: they train on published groups,
and a trainer SIGKILLed mid-run resumes from its checkpoint without training any experience
twice or skipping one (counted by experience id)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from storage.checkpoints import read_latest
from tests.helpers import wait_for

from .helpers import groups, publish, start_role, stop_roles, write_config

STEPS, BATCH, GROUP = 5, 8, 4  # 2 groups of 4 per step


def _steps(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sigkill_trainer_resumes_without_repeating_or_skipping(tmp_path, nats_cfg, run_id, tiny_model, lora):
    project, name = run_id.split(".", 1)
    adapter = {"lora_configs": [{"lora_rank": 4, "target_modules": ["q_proj", "v_proj"]}]} if lora else {}
    cfg = write_config(
        tmp_path / "cfg.yaml",
        project=project, name=name, mode="train", checkpoint_root_dir=str(tmp_path / "ckpt"),
        model={"model_path": str(tiny_model), **adapter},
        algorithm={"algorithm_type": "grpo", "repeat_times": GROUP,
                   "optimizer": {"lr": 1e-3, "lr_scheduler_type": "cosine", "lr_warmup_steps": 1}},
        buffer={"batch_size": BATCH // GROUP, "train_batch_size": BATCH, "total_steps": STEPS,
                "trainer_input": {"experience_buffer": {"name": "exp", "storage_type": "queue", "max_read_timeout": 3}}},
        trainer={"trainer_type": "pytorch", "save_interval": 3, "total_steps": STEPS, "save_hf_checkpoint": "last",
                 "max_token_len_per_gpu": 128},
        synchronizer={"sync_method": "checkpoint", "sync_interval": 1000},
        nats={"url": nats_cfg.url, "embedded": False},
    )
    job = tmp_path / "ckpt" / project / name
    steps_log = job / "trainer_steps.jsonl"
    all_groups = groups(run_id, 0, STEPS * BATCH // GROUP)
    buffer = start_role("buffer", cfg, tmp_path / "buffer.log")
    trainer = start_role("trainer", cfg, tmp_path / "trainer.log")
    try:
        # data for 4 steps only: the trainer checkpoints at 3, trains 4, then waits for step 5
        asyncio.run(publish(nats_cfg, run_id, all_groups[: 4 * BATCH // GROUP]))
        wait_for("4 train steps", lambda: len(_steps(steps_log)) >= 4, buffer, trainer, timeout=240)
        assert read_latest(job) == 3
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        before = _steps(steps_log)
        trainer = start_role("trainer", cfg, tmp_path / "trainer2.log")
        asyncio.run(publish(nats_cfg, run_id, all_groups[4 * BATCH // GROUP:]))
        trainer.wait(240)
        assert trainer.returncode == 0, (tmp_path / "trainer2.log").read_text()[-3000:]
    finally:
        stop_roles(trainer, buffer)
    entries = _steps(steps_log)
    pids = {e["pid"] for e in entries}
    assert len(pids) == 2, "the second trainer did not train"
    redone = [e for e in entries[len(before):] if e["step"] <= 4]
    assert [e["step"] for e in redone] == [4], "the restarted trainer must redo exactly step 4"
    first_four = {e["step"]: e["ids"] for e in before}
    assert redone[0]["ids"] == first_four[4], "step 4 after the restart used other experiences"
    final = {}
    for e in entries:
        final[e["step"]] = e["ids"]  # the last attempt of each step is the one the model has
    assert sorted(final) == list(range(1, STEPS + 1))
    trained = [i for s in sorted(final) for i in final[s]]
    published = [e.id for g in all_groups for e in g.experiences]
    assert len(trained) == len(set(trained)), "an experience was trained twice"
    assert sorted(trained) == sorted(published), "an experience was skipped"
    assert read_latest(job) == STEPS
    assert (job / f"global_step_{STEPS}" / "actor" / "huggingface" / "model.safetensors").exists()
    if lora:  # the restarted trainer loaded the adapter of step 3 (not a fresh one)
        assert (job / "global_step_3" / "actor" / "adapter_model.safetensors").exists()
        assert "resumed" in (tmp_path / "trainer2.log").read_text()
