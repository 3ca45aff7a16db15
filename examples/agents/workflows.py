"""Trinity workflows around the plain agent of ``react.py``: the calculator and the guessing
game of ``examples/agent_calculator`` and ``examples/agent_guess``.

Load them with ``TRINITY_PLUGIN_DIRS=examples/agents``. Each workflow gets an OpenAI client on
an episode of its task run (``self.model.get_openai_client()``), runs the agent unchanged, and
turns the episode's recorded calls into experiences (``extract_experience_from_history()``):
one per episode with ``explorer.openai_api.enable_concatenated_multi_turn`` (the
calculator), one per model turn without (the game, trained step-wise). Every experience of an
episode gets the episode's reward.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from react import EpisodeOver, Trace, react  # noqa: E402

from roles.explorer.workflows.base import Workflow  # noqa: E402
from roles.explorer.workflows.registry import register_workflow  # noqa: E402
from schemas.data import Experience  # noqa: E402

ADD_TOOL = {"type": "function", "function": {
    "name": "add",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
GUESS_TOOL = {"type": "function", "function": {
    "name": "guess", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}


def add(a: int, b: int) -> str:
    """The calculator tool: integer addition."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
        raise ValueError("a and b must be integers")
    if max(abs(a), abs(b)) > 10**9:
        raise ValueError("numbers too large")
    return str(a + b)


def score(exps: list[Experience], trace: Trace, reward: float, **info: Any) -> list[Experience]:
    """Give every experience of the episode its reward and what the agent did."""
    for e in exps:
        e.reward = reward
        e.info.update(accuracy=reward, agent_turns=trace.turns, agent_tool_errors=trace.tool_errors, **info)
        if trace.context_exceeded:  # the agent stopped: its next prompt passed max_model_len
            e.info["truncated"] = "next prompt past max_model_len"
            e.response_truncated = True
    return exps


@register_workflow("calculator_agent")
class CalculatorAgent(Workflow):
    """``question`` -> the agent, with the ``add`` tool unless ``workflow_args.tools`` is
    false; reward 1 when its final answer is ``answer``."""

    repeatable = False

    def run(self) -> list[Experience]:
        tools = [ADD_TOOL] if self.args.get("tools", True) else []
        trace = react(self.model.get_openai_client(),
                      [{"role": "user", "content": self.task.raw["question"]}], tools, {"add": add},
                      max_turns=int(self.args.get("max_turns", 3)))
        right = trace.answer == str(self.task.raw["answer"]).strip()
        return score(self.model.extract_experience_from_history(), trace, float(right))


@register_workflow("guess_agent")
class GuessAgent(Workflow):
    """Guess ``secret`` in ``1..high`` with the ``guess`` tool, told "higher" or "lower" and
    the range still possible after each miss ("higher: 5-7"); reward 1 when found within
    ``max_turns`` guesses (``workflow_args``)."""

    repeatable = False

    def run(self) -> list[Experience]:
        secret, high = int(self.task.raw["secret"]), int(self.args.get("high", 7))

        lo, hi = 1, high

        def guess(n: int) -> str:
            nonlocal lo, hi
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= high:
                raise ValueError(f"n must be an integer in 1..{high}")
            if n == secret:
                raise EpisodeOver("correct")
            if secret > n:
                lo = max(lo, n + 1)
                return f"higher: {lo}-{hi}"
            hi = min(hi, n - 1)
            return f"lower: {lo}-{hi}"

        trace = react(self.model.get_openai_client(),
                      [{"role": "user", "content": self.task.raw["question"]}], [GUESS_TOOL],
                      {"guess": guess}, max_turns=int(self.args.get("max_turns", 3)))
        won = trace.over == "correct"
        return score(self.model.extract_experience_from_history(), trace, float(won))
