"""Trinity-RFT's ``sciworld_workflow``: an agent runs a ScienceWorld experiment (AllenAI's
text simulator, a Java program the ``scienceworld`` package ships), one conversation per episode.

Faithful to upstream's (``trinity/common/workflows/envs/sciworld``):

* **the task**: the row's prompt column (upstream's data: ``task_desc``) holds JSON with
  ``task_name``, ``var_num`` and ``jar_path`` (its ``get_sciworld_data.py``); the simulator
  loads that variation in its ``easy`` simplification with a 100-step limit. A ``jar_path``
  that is empty or not a file means the package's own jar.
* **what the model sees**: upstream's system prompt (think in ``<think>``, act in
  ``<action>``), then ``Observation:`` and the simulator's text, the first one after the task
  description.
* **what it must answer**: the text inside ``<action>...</action>``; anything else is the empty
  action (the simulator answers "No known action matches that input.").
* **the end and the reward**: the simulator's ``done`` or 30 moves (``workflow_args.max_env_steps``
  is ours); the reward is the best running score the episode reached, over 100.
* **repeats**: ``repeat_times`` episodes one after another on one simulator (a JVM each
  start), as upstream does.

Needs ``pip install scienceworld`` (or this project's ``[envs]`` extra) and a Java runtime
(Debian: ``apt-get install default-jre-headless``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Any

from roles.explorer.workflows.multi_turn import MultiTurnWorkflow
from schemas.data import Experience

SYSTEM_PROMPT = """
You are an agent, your job is to do some scientific experiment in a virtual text-based environment.

## Notes:
At each step, you should first think then perform action to fulfill the instruction. You should ALWAYS wrap your thinking with the <think> </think> tag and wrap your action with the <action> </action> tag.
You should ALWAYS take one action each step.
DO NOT try to interact with the user at anytime. Finish the task by yourself.

## Action Format:
Below are the available commands you can use:
    open OBJ: open a container
    close OBJ: close a container
    activate OBJ: activate a device
    deactivate OBJ: deactivate a device
    connect OBJ to OBJ: connect electrical components
    disconnect OBJ: disconnect electrical components
    use OBJ [on OBJ]: use a device/item
    look around: describe the current room
    examine OBJ: describe an object in detail
    look at OBJ: describe a container's contents
    read OBJ: read a note or book
    move OBJ to OBJ: move an object to a container
    pick up OBJ: move an object to the inventory
    pour OBJ into OBJ: pour a liquid into a container
    mix OBJ: chemically mix a container
    teleport to LOC: teleport to a specific room
    focus on OBJ: signal intent on a task object
    wait: task no action for 10 steps
    wait1: task no action for a step

For example your output should be like this:
<think> Now I will check the bedroom ... </think><action>teleport to bedroom</action>
"""


def parse_action(response: str) -> str:
    """The text of the response's first ``<action>...</action>``, stripped; "" when there is none."""
    head, sep, rest = response.partition("<action>")
    return rest.split("</action>")[0].strip() if sep else ""


class SciWorldWorkflow(MultiTurnWorkflow):
    """``repeat_times`` episodes of the row's ScienceWorld task (see the module's docstring)."""

    is_async = True
    repeatable = True  # one simulator plays every repeat, as upstream's does

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        try:
            import scienceworld  # noqa: F401
        except ImportError as e:
            raise ImportError("sciworld_workflow needs the scienceworld package: pip install scienceworld "
                              "(or this project's [envs] extra), and a Java runtime") from e
        if shutil.which("java") is None:
            raise RuntimeError("sciworld_workflow: no java on PATH; the simulator is a Java program "
                               "(Debian: apt-get install default-jre-headless)")
        key = self.task.format.get("prompt_key", "prompt")
        try:
            self.config = json.loads(self.task.raw[key])
            self.config["task_name"], int(self.config["var_num"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"task {self.task.task_id}: column {key!r} (format.prompt_key) must be JSON with "
                             f"task_name and var_num, as upstream's get_sciworld_data.py writes: {e}") from e
        self.max_env_steps = int(self.args.get("max_env_steps", 30))

    def start(self) -> Any:
        """The simulator with the row's task loaded (blocking: a JVM starts)."""
        from scienceworld import ScienceWorldEnv

        jar = self.config.get("jar_path") or None
        env = ScienceWorldEnv("", jar if jar and os.path.isfile(jar) else None, envStepLimit=100)
        env.load(self.config["task_name"], int(self.config["var_num"]), "easy", generateGoldPath=True)
        return env

    async def episode(self, env: Any, golden_rounds: int) -> Experience:
        observation, _ = await asyncio.to_thread(env.reset)
        observation = f"Task Description: {env.get_task_description()}\n{observation}"
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
        calls, best, score, done = [], 0.0, 0.0, False
        for _ in range(self.max_env_steps):
            messages.append({"role": "user", "content": "Observation: \n" + observation})
            [reply] = await self.model.achat(messages, n=1)
            calls.append(reply)
            messages.append({"role": "assistant", "content": reply.response_text or ""})
            observation, reward, done, _ = await asyncio.to_thread(env.step, parse_action(reply.response_text or ""))
            score += reward
            best = max(score, best)
            if done:
                break
        return self.conversation_experience(
            messages, reward=best / 100.0, turn_experiences=calls,
            info={"env_rounds": len(calls) - 1, "env_done": int(done), "golden_rounds": golden_rounds})

    async def run_async(self) -> list[Experience]:
        env = await asyncio.to_thread(self.start)
        try:
            golden = len(env.get_gold_action_sequence())
            return [await self.episode(env, golden) for _ in range(self.repeat_times)]
        finally:
            await asyncio.to_thread(env.close)
