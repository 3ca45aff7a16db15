"""A tiny model that calls a tool: the tiny Qwen2 taught, by teacher forcing, one two-turn
conversation in the Hermes/Qwen tool format (``storage.tiny.TOOL_CHAT_TEMPLATE``).

Why: a random-weight model never writes a well-formed ``<tool_call>``, and tests of tool
calling end to end need one that does, built offline in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the calculator example's tool (``examples/agents/workflows.py``), so the example agent
#: runs on this model in the tests
ADD_TOOL = {"type": "function", "function": {
    "name": "add",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
QUESTION = "3+4?"
CALL = {"name": "add", "arguments": {"a": 3, "b": 4}}


def conversation() -> list[dict[str, Any]]:
    """The taught conversation: a tool call, its result, the answer."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "add", "arguments": json.dumps(CALL["arguments"])}}
    return [{"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "7"},
            {"role": "assistant", "content": "7"}]


def _template_args(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def build_tool_model(out_dir: Path, steps: int = 150) -> Path:
    """The tiny model (seed 0) with the tool template, taught :func:`conversation`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from storage.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model

    path = build_tiny_model(out_dir, seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TOOL_CHAT_TEMPLATE
    msgs = _template_args(conversation())
    ids = list(tok.apply_chat_template(msgs, tools=[ADD_TOOL], tokenize=True, return_dict=True)["input_ids"])
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):  # assistant spans: between the prefix with and without it
        if m["role"] == "assistant":
            a = len(tok.apply_chat_template(msgs[:i], tools=[ADD_TOOL], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"])
            b = len(tok.apply_chat_template(msgs[:i + 1], tools=[ADD_TOOL], tokenize=True,
                                            return_dict=True)["input_ids"])
            mask[a:b] = [1] * (b - a)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.tensor([ids])
    labels = torch.tensor([[t if k else -100 for t, k in zip(ids, mask, strict=True)]])
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(input_ids=x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
