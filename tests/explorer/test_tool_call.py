"""tool_call_workflow: upstream's ToolACE prompt and Tool-N1's reward, case by case."""

from __future__ import annotations

import json

import pytest

from roles.explorer.workflows.registry import get_workflow
from roles.explorer.workflows.tool_call import TOOL_PROMPT, tool_call_score, tool_messages
from schemas.data import Task

ANSWER = json.dumps([{"name": "weather", "arguments": {"city": "Paris", "days": 2}}])
ROW = {"tools": json.dumps([{"name": "weather", "parameters": {}}]), "raw_system": "You help.",
       "conversations": [{"from": "human", "value": "Weather in Paris?"},
                         {"from": "function_call", "value": {"name": "x"}},
                         {"from": "observation", "value": "ok"}],
       "answer": ANSWER}


def test_the_prompt_is_upstreams() -> None:
    msgs = tool_messages(ROW)
    tools = json.dumps({"type": "function", "function": {"name": "weather", "parameters": {}}})
    assert msgs[0] == {"role": "system", "content": "You help." + TOOL_PROMPT.format(tools=tools)}
    assert msgs[1:] == [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": '{"name": "x"}'}, {"role": "tool", "content": "ok"}]


@pytest.mark.parametrize("reply,score", [
    ('<think>a</think><tool_call>[{"name": "weather", "arguments": {"days": 2, "city": "Paris"}}]</tool_call>', 1.0),
    ('<think>a</think><tool_call>{"name": "weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>', 1.0),
    ('<think>a</think><tool_call>[{"name": "weather", "arguments": {"city": "Rome", "days": 2}}]</tool_call>', 0.0),
    ('<tool_call>[{"name": "weather", "arguments": {"city": "Paris", "days": 2}}]</tool_call>', 0.0),  # no think
    ('<tool_call>[]</tool_call><think>a</think>', 0.0),  # thinking after the call
    ('<think>a</think><think>b</think><tool_call>[]</tool_call>', 0.0),  # two thinks
    ('<think>a</think><tool_call>[{"name": "weather"}]</tool_call>', 0.0),  # no arguments
    ('<think>a</think><tool_call>not json</tool_call>', 0.0),
    ('<think>a</think> no call', 0.0),
])
def test_tool_n1s_reward(reply, score) -> None:
    assert tool_call_score(reply, ANSWER) == score


def test_no_call_expected_and_none_made_counts() -> None:
    assert tool_call_score("<think>a</think><tool_call>[]</tool_call>", "[]") == 1.0
    assert tool_call_score('<think>a</think><tool_call>[{"name": "w", "arguments": {}}]</tool_call>', "[]") == 0.0


def test_upstreams_example_spelling_and_its_reward() -> None:
    task = Task(task_id="t/0", raw=ROW, workflow="toolcall_workflow")
    wf = get_workflow("toolcall_workflow")(task=task, model=None)
    assert wf.messages() == tool_messages(ROW)
    assert wf.reward('<think>a</think><tool_call>' + ANSWER + '</tool_call>') == {"accuracy": 1.0}
    with pytest.raises(ValueError, match="tool_call_workflow reads ToolACE rows"):
        get_workflow("tool_call_workflow")(task=Task(task_id="t/1", raw={"prompt": "x"}, workflow="w"),
                                           model=None).messages()
