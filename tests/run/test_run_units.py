"""The pure parts of ``trinity run`` and the stage walk: which roles a config needs, how a
stage chains to the previous one's weights, the checks before start, the fresh-run name,
the monitor files and the end-of-run summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from roles.launch.run import fresh_name, preflight, summary
from roles.launch.stages import chain, roles_needed
from roles.runtime.monitor import Monitor, read_metrics
from schemas.config import TrinityConfig
from schemas.data import Metric
from schemas.loader import ConfigError


def _cfg(tmp_path: Path, **kw) -> TrinityConfig:
    """A config as the loader makes it (derived values filled in)."""
    import yaml

    from schemas.loader import load_config

    base = {"project": "p", "name": "n", "checkpoint_root_dir": str(tmp_path / "ckpt"),
            "model": {"model_path": str(tmp_path)}}
    base.update(kw)
    f = tmp_path / f"c{len(list(tmp_path.glob('c*.yaml')))}.yaml"
    f.write_text(yaml.safe_dump(base))
    return load_config(str(f), [], environ={}, dotenv_file=None).config


def test_roles_needed_follow_the_modes_of_all_stages(tmp_path):
    assert roles_needed([_cfg(tmp_path, mode="bench")]) == ["explorer"]
    assert roles_needed([_cfg(tmp_path, mode="train")]) == ["buffer", "trainer"]
    assert roles_needed([_cfg(tmp_path, mode="train"), _cfg(tmp_path, mode="both")]) == [
        "buffer", "synchronizer", "trainer", "explorer"]


def test_chain_starts_a_stage_from_the_previous_stage_final_hf_folder(tmp_path):
    sft = _cfg(tmp_path, name="n/sft", mode="train")
    grpo = _cfg(tmp_path, name="n/grpo", mode="both")
    with pytest.raises(FileNotFoundError, match="n/sft"):
        chain(grpo, sft)  # nothing trained yet: say which stage left no checkpoint
    for step in (2, 4):
        hf = Path(sft.checkpoint_job_dir) / f"global_step_{step}/actor/huggingface"
        hf.mkdir(parents=True)
        (hf / "model.safetensors").write_bytes(b"x")
    chained = chain(grpo, sft)
    assert chained.model.model_path.endswith("global_step_4/actor/huggingface")
    # the rollout engine and the critic load the same weights as the trainer
    assert chained.explorer.rollout_model.model_path == chained.model.model_path
    assert chained.model.critic_model_path == chained.model.model_path
    assert grpo.model.model_path == str(tmp_path)  # the stage's own config is not modified
    bench = _cfg(tmp_path, name="n/base", mode="bench")
    assert chain(sft, bench).model.model_path == bench.model.model_path  # no trainer: pass on


def test_preflight_names_every_missing_file(tmp_path):
    cfg = _cfg(tmp_path, mode="both", buffer={"explorer_input": {
        "taskset": {"name": "t", "path": str(tmp_path / "no_train")},
        "eval_tasksets": [{"name": "e", "path": str(tmp_path / "no_eval")}]}})
    with pytest.raises(ConfigError) as e:
        preflight([cfg])
    msg = str(e.value)
    assert "buffer.explorer_input.taskset.path" in msg and "no_train" in msg
    assert "eval_tasksets[0].path" in msg and "no_eval" in msg


def test_fresh_name_only_when_the_job_exists_and_resume_is_off(tmp_path):
    cfg = _cfg(tmp_path, continue_from_checkpoint=False)
    assert fresh_name(cfg) is None
    Path(cfg.checkpoint_job_dir).mkdir(parents=True)
    assert fresh_name(cfg).startswith("n_")
    assert fresh_name(_cfg(tmp_path, continue_from_checkpoint=True)) is None


def test_monitor_writes_jsonl_and_tensorboard_and_the_summary_reads_it(tmp_path):
    cfg = _cfg(tmp_path, name="n/grpo")
    mon = Monitor(cfg, "explorer")
    mon.log(Metric(role="explorer", step=0, kind="eval", taskset="test",
                   values={"accuracy": 0.25, "model_version": 0.0, "final": 0.0}))
    mon.log(Metric(role="explorer", step=5, kind="eval", taskset="test",
                   values={"accuracy": 0.75, "model_version": 5.0, "final": 1.0}))
    mon.close()
    job = Path(cfg.checkpoint_job_dir)
    recs = read_metrics(job)
    assert [r["values"]["accuracy"] for r in recs] == [0.25, 0.75]
    assert json.loads((job / "monitor/metrics.jsonl").read_text().splitlines()[0])["kind"] == "eval"
    assert list((job / "monitor/tensorboard/explorer").glob("events.out.tfevents.*"))
    lines = summary([cfg])
    assert "start step 0" in lines[1] and "25.0%" in lines[1]
    assert "end   step 5" in lines[2] and "weights v5" in lines[2] and "75.0%" in lines[2]


def test_the_summary_flags_a_stage_whose_groups_never_differed(tmp_path):
    """No learning signal: every step's groups had equal rewards, so the summary says so and
    why; one step with a group that differed is enough to stay quiet."""
    cfg = _cfg(tmp_path, name="n/grpo")
    mon = Monitor(cfg, "explorer")
    for step in (1, 2, 3):
        mon.log(Metric(role="explorer", step=step, kind="rollout",
                       values={"reward_mean": 0.0, "groups_with_signal": 0.0}))
    mon.close()
    lines = summary([cfg])
    assert len(lines) == 1 and "WARNING grpo: no learning signal: in all 3 steps" in lines[0]
    mon = Monitor(cfg, "explorer")
    mon.log(Metric(role="explorer", step=4, kind="rollout", values={"reward_mean": 0.1, "groups_with_signal": 0.25}))
    mon.close()
    assert summary([cfg]) == []


def test_groups_with_signal_counts_groups_whose_episode_rewards_differ():
    from roles.explorer.eval import groups_with_signal
    from roles.explorer.runner import TaskResult
    from schemas.data import Experience, ExperienceGroup

    def group(gid: str, rewards: list[float]) -> ExperienceGroup:
        exps = [Experience(id=f"{gid}/{i}", task_id=gid, group_id=gid, run_id="r", tokens=np.arange(4, dtype=np.int32),
                           prompt_length=2, reward=r) for i, r in enumerate(rewards)]
        return ExperienceGroup(group_id=gid, task_id=gid, run_id="r", experiences=exps)

    same, mixed = group("a", [1.0, 1.0]), group("b", [0.0, 1.0])
    assert groups_with_signal([TaskResult(task=None, group=same), TaskResult(task=None, group=mixed)]) == 0.5
    assert groups_with_signal([TaskResult(task=None, group=group("c", [1.0]))]) is None


async def test_exit_markers_count_only_this_sessions_done(nats_cfg, run_id):
    """``unfinished``: None until the stage is done and some role process has started; then the
    processes not done since ``since``: a previous session's "done" does not count (a re-run of a
    finished experiment must wait for its slow starters, not leave before they connect)."""
    import time

    import bus
    from roles.launch.stages import unfinished
    from schemas import keys
    from schemas.state import ExitMarker, StageDone

    nc = await bus.connect(nats_cfg, name="test")
    try:
        state = await bus.RunState.open(bus.jetstream(nc, nats_cfg), run_id)
        before = time.time()
        await state.put(keys.EXIT_PREFIX + "buffer", ExitMarker("done", before - 3600, 1))
        assert await unfinished(state, before, "both") is None  # the stage is not done
        await state.put(keys.RUN_DONE, StageDone("explorer", time.time()))
        assert await unfinished(state, before, "both") == ["buffer"]  # an old session's marker
        await state.put(keys.EXIT_PREFIX + "buffer", ExitMarker("running", time.time(), 1))
        await state.put(keys.EXIT_PREFIX + "explorer", ExitMarker("done", time.time(), 1))
        assert await unfinished(state, before, "both") == ["buffer"]
        await state.put(keys.EXIT_PREFIX + "buffer", ExitMarker("done", time.time(), 1))
        assert await unfinished(state, before, "both") == []
    finally:
        await bus.disconnect(nc)


def test_the_summary_lists_a_stages_dead_letters_and_their_first_reasons(tmp_path):
    """``trinity run`` reads each stage's dead-letter count and first reasons
    (``bus.dead_letters``) and the summary lists them after the accuracy: a run whose
    experience went to the dead-letter stream never ends on an accuracy alone."""
    cfg = _cfg(tmp_path, name="n/grpo")
    reason = "ValueError: ExperienceGroup.experiences[0].info['llm_quality_scor']: missing"
    lines = summary([cfg], {cfg.run_id: (7, [reason])})
    assert lines == ["WARNING grpo: 7 message(s) dead-lettered (trinity inspect --stream dlq --tail N shows "
                     "them); first reasons:", f"    {reason}"]
    assert summary([cfg], {cfg.run_id: (0, [])}) == summary([cfg]) == []
