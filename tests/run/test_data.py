"""Task selection and mixing through ``trinity run``: two tasksets mixed by weight, one of them
on the online curriculum (``difficulty_based``) fed by the buffer's ``pass_rate_calculator``,
and a SIGKILLed explorer that resumes exactly."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from bus.server import free_port
from roles.runtime.monitor import read_metrics
from storage.tiny import build_arithmetic_taskset
from tests.helpers import wait_for

from .helpers import (
    role_pid,
    run_to_end,
    running,
    steps_log,
    tiny_run_config,
    trained_exactly_once,
    trinity,
)

pytestmark = pytest.mark.slow

STEPS = 8
PLUGINS = {"TRINITY_PLUGIN_DIRS": str(Path(__file__).parent / "plugins")}


def _mixed_config(tmp_path: Path, model: Path, arith: Path, **changes: object) -> Path:
    """The tiny run with ``tasksets``: ``arith`` (24 rows, difficulty_based, weight 2) and
    ``more`` (12 other rows, its own reward function, weight 1): 2 + 1 tasks a step; the
    buffer's pipeline: pass rates, Data-Juicer's text length, reward shaped by it."""
    more = build_arithmetic_taskset(tmp_path / "more", n_train=12, n_eval=3, seed=7)
    path = tiny_run_config(tmp_path / "c.yaml", model=model, data=arith, port=free_port(), stages=False)
    cfg = yaml.safe_load(path.read_text())
    ei = cfg["buffer"]["explorer_input"]
    first = ei.pop("taskset")
    ei["tasksets"] = [
        first | {"weight": 2.0, "task_selector": {"selector_type": "difficulty_based", "seed": 1,
                                                  "kwargs": {"target_reward": 0.5, "tau": 0.5}}},
        # its tasks take 2 s: the kill below lands inside a step (the cursor holds its tasks)
        first | {"name": "more", "path": str(more), "weight": 1.0, "default_reward_fn_type": "math_reward",
                 "default_workflow_type": "slow_math_workflow", "workflow_args": {"delay": 2.0}},
    ]
    cfg["buffer"]["total_steps"] = STEPS
    cfg["data_processor"] = {"experience_pipeline": {"operators": [
        {"name": "pass_rate_calculator"},
        # real Data-Juicer in the buffer: every response's length, kept whatever it is ...
        {"name": "data_juicer", "args": {"operators": [{"text_length_filter": {"min_len": 0, "max_len": 10**6}}],
                                         "keep_filtered": True}},
        # ... added to its reward (the trainer's batches show it)
        {"name": "reward_shaping_mapper", "args": {"reward_shaping_configs": [
            {"stats_key": "text_len", "op_type": "ADD", "weight": 1.0}]}}]}}
    for dotted, value in changes.items():
        node = cfg
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_two_tasksets_mix_by_weight_learn_pass_rates_and_resume_after_sigkill(tmp_path, tiny_model, arith):
    """Each step trains 2 groups of ``arith`` and 1 of ``more`` (weights 2:1), every
    experience once, with per-taskset rollout metrics and rewards shaped by a Data-Juicer
    stat in the buffer; the explorer is SIGKILLed mid-run and
    its restart resumes the selector and the feedback stream exactly: every group's pass rate
    reaches the selector once (16 updates for 16 ``arith`` groups)."""
    cfg = _mixed_config(tmp_path, tiny_model, arith)
    job = tmp_path / "ckpt/t/r"
    log = tmp_path / "run.log"
    with running("run", "--config", str(cfg), log=log, env_extra=PLUGINS) as p:
        # the explorer loads the weights of train step 3 and starts step 4 at once (2 s long):
        # its tasks are in the cursor
        loaded = re.compile(r"explorer \|.*weights_loaded.*version=3\b")
        wait_for("explorer weights v3", lambda: loaded.search(log.read_text(errors="replace")), p, log=log)
        time.sleep(0.3)
        victim = role_pid("explorer", cfg)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert "explorer exited with -9; restart 1/" in text
    assert re.search(r"resuming .*offset=12 .*step=3 step_in_flight=True", text), text[-4000:]
    final = trained_exactly_once(job, STEPS, 12)
    for step, ids in final.items():
        assert Counter(i.split("/", 1)[0] for i in ids) == {"arith": 8, "more": 4}, (step, ids)
    rollouts = [r for r in read_metrics(job) if r["kind"] == "rollout"]
    assert sorted({r["step"] for r in rollouts}) == list(range(1, STEPS + 1))
    for r in rollouts:
        v = r["values"]
        assert (v["arith/tasks"], v["more/tasks"]) == (2.0, 1.0) and "arith/reward_mean" in v, v
    # rewards are at most 1 as the explorer scored them; the trainer's include the length
    assert max(r["values"]["reward_mean"] for r in rollouts) <= 1.0
    assert all(r["values"]["reward_mean"] > 2.0 for r in read_metrics(job) if r["kind"] == "train")
    selection = [r["values"] for r in read_metrics(job) if r["kind"] == "selection"]
    assert selection and selection[-1] == {"arith/drawn": 16.0, "arith/selector_updates": 16.0,
                                           "more/drawn": 8.0}, selection


def test_dynamic_sampling_fills_the_steps_dropped_groups(tmp_path, tiny_model, arith):
    """DAPO's dynamic sampling: ``drop_equal_reward_groups`` with ``fill`` drops the groups
    whose rewards are all equal (here every task with an even answer: ``split_reward``) and
    the explorer runs as many more tasks in the step, so every training step is full and
    on-policy (sync every step), without waiting out ``max_read_timeout``."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False, extra={
        "buffer.total_steps": 4, "buffer.total_epochs": 20,
        "buffer.explorer_input.default_reward_fn_type": "split_reward",
        "buffer.trainer_input.experience_buffer": {"name": "exp", "max_read_timeout": 600},
        "synchronizer.sync_offset": 0,
        "data_processor.experience_pipeline.operators": [
            {"name": "drop_equal_reward_groups", "args": {"fill": True, "max_fill_rounds": 12}}]})
    job = tmp_path / "ckpt/t/r"
    log = tmp_path / "run.log"
    p = trinity("run", "--config", str(cfg), log=log, env_extra=PLUGINS)
    p.wait(timeout=300)
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert re.search(r"\bfill .*more_tasks=\d+ .*step=1\b", text), text[-3000:]
    for step, ids in trained_exactly_once_groups(job).items():
        assert len(ids) == 12, (step, ids)  # 3 groups of 4, none of them all-equal
    tasks = [r["values"]["tasks"] for r in read_metrics(job) if r["kind"] == "rollout"]
    assert len(tasks) == 4 and max(tasks) > 3, tasks  # filled steps ran more than batch_size tasks


def trained_exactly_once_groups(job: Path) -> dict[int, list[str]]:
    """Each step's trained experience ids: steps 1..4, no experience twice."""
    from .helpers import final_ids

    final = final_ids(steps_log(job))
    assert sorted(final) == [1, 2, 3, 4], sorted(final)
    ids = [i for v in final.values() for i in v]
    assert len(ids) == len(set(ids))
    return final


def test_bad_mixing_and_selection_fail_before_start_naming_the_field(tmp_path, tiny_model, arith):
    """A weight of 0 for every taskset, an unknown selector, a curriculum without the operator
    that feeds it, an unknown selector kwarg and a shaping entry without its stats key all fail
    before any process starts, naming the field."""
    cases = {
        "buffer.explorer_input.tasksets[].weight: 0 for every taskset at step 0":
            {"buffer.explorer_input.tasksets": None},
        "buffer.explorer_input.tasksets[0].task_selector.selector_type: got 'easiest_first'":
            {"buffer.explorer_input.tasksets.0.task_selector.selector_type": "easiest_first"},
        "buffer.explorer_input.tasksets[0].task_selector.selector_type: difficulty_based learns from pass rates":
            {"data_processor.experience_pipeline.operators": []},
        "task_selector.kwargs: unknown temprature":
            {"buffer.explorer_input.tasksets.0.task_selector.kwargs": {"temprature": 1}},
        "reward_shaping_configs[0].stats_key: missing": {"data_processor.experience_pipeline.operators": [
            {"name": "pass_rate_calculator"},
            {"name": "reward_shaping_mapper", "args": {"reward_shaping_configs": [{"op_type": "ADD"}]}}]},
    }
    for i, (needle, change) in enumerate(cases.items()):
        sub = tmp_path / str(i)
        sub.mkdir()
        cfg = _mixed_config(sub, tiny_model, arith)
        raw = yaml.safe_load(cfg.read_text())
        if "buffer.explorer_input.tasksets" in change:  # every weight 0
            for ts in raw["buffer"]["explorer_input"]["tasksets"]:
                ts["weight"] = 0.0
        else:
            for dotted, value in change.items():
                node = raw
                *parents, last = dotted.split(".")
                for p in parents:
                    node = node[int(p)] if isinstance(node, list) else node[p]
                node[last] = value
        cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
        rc, out = run_to_end(cfg, sub / "run.log", timeout=120)
        assert rc == 2 and needle in out, (needle, out[-3000:])
        assert not (sub / "ckpt").exists(), "a process started before the config was checked"
