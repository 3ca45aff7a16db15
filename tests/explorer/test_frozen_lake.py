"""frozen_lake_workflow: upstream's lakes, rules, observation text, action parsing and
episode end, on the real transformers engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from roles.explorer.workflows.base import ModelHandle
from roles.explorer.workflows.frozen_lake import (
    INVALID_HINT,
    SYSTEM_PROMPT,
    FrozenLakeWorkflow,
    parse_action,
    random_lake,
    reaches_goal,
)
from roles.explorer.workflows.registry import get_workflow
from schemas.config import InferenceModelConfig
from schemas.data import Task


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    from roles.explorer.engines.hf import HFEngine

    return HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                         dtype="float32", max_model_len=4096, seed=0))


#: Stop strings that end a random model's reply within a few characters (it writes no EOS).
SHORT = {"stop": list("abcdefghijklmnopqrstuvwxyz0123456789")}


def workflow(engine, raw=None, rollout=None, **args) -> FrozenLakeWorkflow:
    task = Task(task_id="lake/0", raw=raw or {"size": 3, "p": 0.8, "seed": 7}, workflow="frozen_lake_workflow",
                workflow_args=args, rollout_args=rollout or {"max_tokens": 64})
    return get_workflow("frozen_lake_workflow")(task=task, model=ModelHandle(engine, asyncio.get_running_loop()))


def test_the_model_answers_in_the_last_code_block() -> None:
    assert parse_action("I go ```Up```") == 4
    assert parse_action("```left``` no, ```DOWN```") == 2  # the last block
    assert parse_action("``` Right ```") == 3
    assert parse_action("```3```") == 3 and parse_action("```5```") == 0
    assert parse_action("Up") == 0 and parse_action("```jump```") == 0


def test_lakes_are_upstreams_draws_and_always_winnable() -> None:
    from gymnasium.utils import seeding

    # upstream draws from gymnasium's seeding.np_random(seed): the same generator as numpy's
    assert np.array_equal(seeding.np_random(123)[0].random(8), np.random.default_rng(123).random(8))
    for seed in range(50):
        lake = random_lake(size=4, p=0.7, seed=seed, max_steps=8)
        assert lake == random_lake(size=4, p=0.7, seed=seed, max_steps=8)
        cells = "".join(lake)
        assert len(lake) == 4 and cells.count("S") == 1 and cells.count("G") == 1
        assert reaches_goal([list(r) for r in lake], 8)
    # G is found as a neighbour of a cell reached within max_steps
    row = [list("SFG"), list("HHH"), list("HHH")]
    assert reaches_goal(row, 1) and not reaches_goal(row, 0)
    assert not reaches_goal([list("SHG"), list("HHH"), list("HHH")], 10)


async def test_the_observation_and_the_rules_are_upstreams(engine) -> None:
    wf = workflow(engine, desc=["SFF", "FHF", "FFG"])
    wf.env.reset(seed=0)
    assert wf.observation() == " P \t _ \t _ \t\n _ \t O \t _ \t\n _ \t _ \t G \t"
    assert wf.move(0) == (0.0, False) and wf.move(1) == (0.0, False)  # nothing / left into the wall
    assert wf.move(3) == (0.0, False)  # right
    assert wf.observation().startswith(" _ \t P \t")
    assert wf.move(2) == (0.0, True)  # down, into the hole
    wf.env.reset(seed=0)
    for action in (3, 3, 2):  # right, right, down
        assert wf.move(action) == (0.0, False)
    assert wf.move(2) == (1.0, True)


async def test_an_episode_is_one_conversation_with_upstreams_prompts(engine) -> None:
    """The random tiny model writes no action: every turn is 'no move', the hint follows, and
    the episode ends after agent_max_steps turns with reward 0."""
    wf = workflow(engine, rollout={"max_tokens": 2000, **SHORT}, desc=["SF", "FG"], agent_max_steps=3)
    [e] = await wf.run_async()
    e.validate()
    users = [m["content"] for m in e.messages if m["role"] == "user"]
    assert e.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert len(users) == 3 and [m["role"] for m in e.messages[1:]] == ["user", "assistant"] * 3
    assert users[0] == ("Current Observation (0): \n P \t _ \t\n _ \t G \t\nYou have not achieved the goal, "
                        "P has not reached G yet. Please give the next action.\n"
                        "The maximum number of steps remaining is 3.")
    assert INVALID_HINT not in users[0] and INVALID_HINT in users[1]
    assert e.reward == 0.0 and e.info["env_steps"] == 3 and e.info["env_done"] == 0
    assert e.action_mask.any() and not e.action_mask.all()  # only the model's turns train


async def test_the_response_budget_ends_the_episode_truncated(engine) -> None:
    wf = workflow(engine, rollout={"max_tokens": 6}, desc=["SF", "FG"], agent_max_steps=5, system_prompt="lake")
    [e] = await wf.run_async()
    assert e.messages[0]["content"] == "lake"
    assert e.response_truncated and e.info["env_steps"] == 1  # the next observation alone passes 6 tokens


async def test_the_context_window_ends_the_episode_truncated_too(tiny_model: Path) -> None:
    """max_tokens is the episode's budget; when the conversation fills max_model_len first,
    the episode ends truncated (upstream's engine would fail the request, and the task with it)."""
    from roles.explorer.engines.hf import HFEngine

    small = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                          dtype="float32", max_model_len=700, seed=0))
    wf = workflow(small, rollout={"max_tokens": 4096}, desc=["SF", "FG"], agent_max_steps=8, system_prompt="lake")
    [e] = await wf.run_async()
    assert e.response_truncated and len(e.tokens) <= 700


def test_the_seed_row_makes_the_map(engine) -> None:
    async def lake():
        return workflow(engine, raw={"size": 4, "p": 0.7, "seed": 11}).desc

    assert asyncio.run(lake()) == random_lake(4, 0.7, 11, 8)


def test_its_rows_need_no_prompt_column(tmp_path) -> None:
    """Upstream's FrozenLake data is seed/size/p: the workflow writes the prompt."""
    from roles.explorer.workflows.registry import reads_prompt
    from schemas.config import TasksetConfig
    from storage.datafiles import TasksetError
    from storage.tasksets import check_taskset

    (tmp_path / "train.jsonl").write_text('{"seed": 1, "size": 3, "p": 0.8}\n')
    ts = TasksetConfig(name="lakes", path=str(tmp_path), split="train")
    assert not reads_prompt("frozen_lake_workflow") and reads_prompt("math_workflow")
    assert check_taskset(ts, prompt=reads_prompt("frozen_lake_workflow")).count == 1
    with pytest.raises(TasksetError, match=r"missing key 'prompt' \(format.prompt_key\)"):
        check_taskset(ts, prompt=reads_prompt("math_workflow"))
