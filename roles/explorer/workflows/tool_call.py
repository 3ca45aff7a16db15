"""Trinity-RFT's ``tool_call_workflow`` (after NVlabs' Tool-N1, arXiv:2505.00024): one reply that
thinks, then calls tools, scored 1 when its calls are exactly the reference's.

Faithful to upstream's (``customized_toolcall_workflows.py``):

* **the row** (ToolACE's layout): ``tools`` (a JSON list of function schemas), ``raw_system``,
  ``conversations`` (``from``: human/user, gpt/assistant, observation/tool, function_call;
  ``value``) and ``answer`` (the reference calls, JSON);
* **the prompt**: the row's system text followed by upstream's tool prompt listing the tools,
  then the conversation;
* **the reward**, Tool-N1's rule: 1 when the reply has exactly one ``<think>`` and one
  ``</think>``, the thinking ends before the last ``<tool_call>...</tool_call>``, that block is
  a JSON list (or one object) of ``{"name", "arguments"}`` calls, and those calls equal the
  reference's as a multiset (arguments compared as sorted JSON; no calls when none are
  expected counts); otherwise 0. A row without ``answer`` scores 0, logged, as upstream.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from roles.explorer.workflows.math import SimpleWorkflow

TOOL_PROMPT = """# Tool

<tools>
{tools}
</tools>

In each action step, you MUST:
1. Think about the reasoning process in the mind and enclosed your reasoning within <think> </think> XML tags.
2. Then, provide a json object with function names and arguments within <tool_call></tool_call> XML tags. i.e., <tool_call>[{{"name": <function-name>, "arguments": <args-json-object>}}, {{"name": <function-name2>, "arguments": <args-json-object2>}}, ...]</tool_call>
3. Make sure both the reasoning and the tool call steps are included together in one single reply.
A complete reply example is: <think>To address the query, I need to send the email to Bob and then buy the banana through walmart. </think> <tool_call> [{{"name": "email", "arguments": {{"receiver": "Bob", "content": "I will bug banana through walmart"}}}}, {{"name": "walmart", "arguments": {{"input": "banana"}}}}]</tool_call>. Please make sure the type of the arguments is correct.
"""

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "observation": "tool", "tool": "tool"}


def tool_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a ToolACE row (upstream's ``construct_prompt``)."""
    tools = "\n".join(json.dumps({"type": "function", "function": t}) for t in json.loads(row["tools"]))
    messages = [{"role": "system", "content": row["raw_system"] + TOOL_PROMPT.format(tools=tools)}]
    for turn in row["conversations"]:
        if turn["from"] == "function_call":
            messages.append({"role": "assistant", "content": json.dumps(turn["value"])})
        elif turn["from"] in ROLES:
            messages.append({"role": ROLES[turn["from"]], "content": turn["value"]})
    return messages


def _calls(block: Any) -> list[Any] | None:
    """The reply's calls as a list, or None when its last ``<tool_call>`` block is no JSON."""
    if isinstance(block, str):
        try:
            block = json.loads(block)
        except json.JSONDecodeError:
            return None
    return [block] if isinstance(block, dict) else block


def tool_call_score(reply: str, answer: str) -> float:
    """Tool-N1's reward for ``reply`` against the reference calls ``answer`` (JSON)."""
    want = json.loads(answer)
    want = json.loads(want) if isinstance(want, str) else want
    blocks = re.findall(r"<tool_call>(.*?)</tool_call>", reply, flags=re.DOTALL)
    try:
        got = _calls(json.loads(blocks[-1].strip())) if blocks else None
    except json.JSONDecodeError:
        got = None
    if got is None or reply.count("<think>") != 1 or reply.count("</think>") != 1:
        return 0.0
    start = reply.find("<tool_call>")
    if start != -1 and reply.find("</think>") > start:
        return 0.0
    if not isinstance(got, list) or not all(isinstance(c, dict) and {"name", "arguments"} <= c.keys() for c in got):
        return 0.0
    if not got or not want:
        return float(len(got) == len(want))
    try:
        same = (Counter((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in got)
                == Counter((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in want))
    except (TypeError, KeyError):
        return 0.0
    return float(same)


class ToolCallWorkflow(SimpleWorkflow):
    """One sampled reply per rollout to a ToolACE row, scored by :func:`tool_call_score`."""

    reward_required = False
    reads_prompt = False  # the row's tools, system text and conversation make the prompt

    def messages(self) -> list[dict[str, Any]]:
        try:
            return tool_messages(self.task.raw)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"task {self.task.task_id}: tool_call_workflow reads ToolACE rows (tools as "
                             f"JSON, raw_system, conversations): {e!r}") from e

    def reward(self, response: str, prompt: str | None = None,
               response_length: int | None = None) -> dict[str, float]:
        answer = self.task.raw.get("answer")
        if answer is None:
            self.logger.error("task %s: the row has no 'answer': reward 0", self.task.task_id)
            return {"accuracy": 0.0}
        return {"accuracy": tool_call_score(response, answer)}
