"""sciworld_workflow: upstream's prompts, action parsing and reward on AllenAI's simulator (the
scienceworld package's jar, on a Java runtime), with the real transformers engine."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from roles.explorer.workflows.base import ModelHandle
from roles.explorer.workflows.registry import get_workflow
from roles.explorer.workflows.sciworld import SYSTEM_PROMPT, parse_action
from schemas.config import InferenceModelConfig
from schemas.data import Task

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("java") is None, reason="no Java runtime (scripts/install.sh installs one)")]


def test_the_action_is_inside_the_action_tags() -> None:
    assert parse_action("<think>hm</think><action> look around </action>") == "look around"
    assert parse_action("<action>open door</action><action>x</action>") == "open door"
    assert parse_action("look around") == ""


async def test_episodes_on_the_simulator(tiny_model: Path) -> None:
    """The random model's replies are no action: the simulator says so, nothing is scored, and
    each of the repeats is one conversation that starts with the task's description."""
    from roles.explorer.engines.hf import HFEngine

    engine = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                           dtype="float32", max_model_len=4096, seed=0))
    row = {"task_desc": json.dumps({"task_name": "boil", "var_num": 0, "jar_path": "/no/such.jar"}), "targe": ""}
    task = Task(task_id="sw/0", raw=row, workflow="sciworld_workflow", repeat_times=2,
                format={"prompt_key": "task_desc"}, workflow_args={"max_env_steps": 2},
                rollout_args={"max_tokens": 8})
    wf = get_workflow("sciworld_workflow")(task=task, model=ModelHandle(engine, asyncio.get_running_loop()))
    exps = await wf.run_async()
    assert len(exps) == 2
    for e in exps:
        e.validate()
        users = [m["content"] for m in e.messages if m["role"] == "user"]
        assert e.messages[0]["content"] == SYSTEM_PROMPT and len(users) == 2
        assert users[0].startswith("Observation: \nTask Description: Your task is to boil water.")
        assert users[1] == "Observation: \nNo known action matches that input."
        assert e.reward == 0.0 and e.info["env_rounds"] == 1 and e.info["golden_rounds"] > 0


def test_a_row_that_is_not_upstreams_json_is_named(tiny_model: Path) -> None:
    task = Task(task_id="sw/1", raw={"task_desc": "boil water"}, workflow="sciworld_workflow",
                format={"prompt_key": "task_desc"})
    with pytest.raises(ValueError, match=r"column 'task_desc' \(format.prompt_key\) must be JSON with task_name"):
        get_workflow("sciworld_workflow")(task=task, model=None)
