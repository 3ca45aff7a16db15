"""A ReAct-style agent in plain Python: only the ``openai`` package.

This is "your agent, unchanged": ``react`` takes any ``openai.OpenAI`` client, so it runs
against OpenAI, vLLM's server, or trinity's explorer (``self.model.get_openai_client()`` in a
workflow, or ``base_url=http://host:port/v1/episodes/<id>`` from outside). Each turn the model
either calls tools (each runs, its result goes back as a ``tool`` message) or answers; the
loop ends at an answer, when a tool says the episode is over, or after ``max_turns``.

Tools are plain Python functions taking keyword arguments and returning text. Arguments are
read with ``json.loads`` and checked against the function's parameters; nothing the model
writes is evaluated as code. A bad call, or a tool that raises, comes back to the model as an
``error: ...`` tool message (its mistake to learn from), never as an exception.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai


class EpisodeOver(Exception):
    """Raised by a tool to end the episode (e.g. a game won or lost); its text is the
    tool's result."""


@dataclass
class Trace:
    """What the agent did: the final answer (None: it never answered), the conversation and
    the counts an agent developer watches."""

    answer: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    over: str | None = None  # why a tool ended the episode
    context_exceeded: bool = False


def call_tool(fns: dict[str, Callable[..., str]], name: str, arguments: str) -> tuple[str, bool]:
    """``(result, ok)`` of one call; an unknown tool, bad arguments or a raising tool give an
    error text. :class:`EpisodeOver` propagates."""
    fn = fns.get(name)
    if fn is None:
        return f"error: unknown tool {name!r}", False
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "error: arguments are not JSON", False
    params = inspect.signature(fn).parameters
    if not isinstance(args, dict) or set(args) != set(params):
        return f"error: arguments must be exactly {sorted(params)}", False
    try:
        return str(fn(**args)), True
    except EpisodeOver:
        raise
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's observation
        return f"error: {e}", False


def react(client: openai.OpenAI, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
          fns: dict[str, Callable[..., str]], max_turns: int = 4, model: str | None = None,
          **sampling: Any) -> Trace:
    """Run the conversation ``messages`` for at most ``max_turns`` model turns."""
    model = model or client.models.list().data[0].id
    trace = Trace(messages=list(messages))
    for _ in range(max_turns):
        try:
            r = client.chat.completions.create(model=model, messages=trace.messages,
                                               **({"tools": tools} if tools else {}), **sampling)
        except openai.BadRequestError as e:
            if getattr(e, "code", None) == "context_length_exceeded":
                trace.context_exceeded = True  # the conversation outgrew the model
                return trace
            raise
        trace.turns += 1
        msg = r.choices[0].message
        trace.messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            trace.answer = (msg.content or "").strip()
            return trace
        for call in msg.tool_calls:
            trace.tool_calls += 1
            try:
                result, ok = call_tool(fns, call.function.name, call.function.arguments)
            except EpisodeOver as e:
                trace.over = str(e)
                trace.messages.append({"role": "tool", "tool_call_id": call.id, "content": str(e)})
                return trace
            trace.tool_errors += not ok
            trace.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return trace
