"""Tool definitions in, tool calls out: the two ends of function calling.

Why here and not in the engine: an engine only turns token ids into token ids. Tools reach the
model through its own chat template (transformers' ``apply_chat_template(tools=...)``), and
the model answers in text; the server reads tool calls out of that text with the parser named
by ``explorer.openai_api.tool_call_parser``, as vLLM's ``--tool-call-parser`` does.

``hermes`` is the convention of Hermes and Qwen2.5/Qwen3 templates: each call is
``<tool_call>{"name": "...", "arguments": {...}}</tool_call>``. A block that is not valid JSON,
or has no string ``name`` or a non-object ``arguments``, makes the whole reply plain text: a
malformed call is the model's mistake to be trained on, never a server error. Nothing in a
request or a completion is evaluated as code; arguments are parsed with ``json.loads`` only.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolError(ValueError):
    """A ``tools`` entry or a message's tool call is not what the OpenAI API allows."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ToolCall:
    """One parsed call; ``arguments`` is the JSON text, as the OpenAI API returns it."""

    name: str
    arguments: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def check_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tools`` when each is ``{"type": "function", "function": {"name", "description"?,
    "parameters"?}}`` with ``parameters`` a valid JSON Schema; else :class:`ToolError` naming
    the entry."""
    names = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ToolError(f"{where}: expected {{'type': 'function', 'function': {{...}}}}", where)
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise ToolError(f"{where}.function.name: 1-64 letters, digits, '_', '.', '-'", f"{where}.function.name")
        if name in names:
            raise ToolError(f"{where}.function.name: {name!r} is defined twice", f"{where}.function.name")
        names.add(name)
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolError(f"{where}.function: unknown field(s) {unknown}", f"{where}.function")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"{where}.function.parameters: must be a JSON Schema object", f"{where}.function.parameters")
        try:
            validator_for(params).check_schema(params)
        except SchemaError as e:
            path = "".join(f"[{p!r}]" for p in e.path)
            raise ToolError(f"{where}.function.parameters{path}: not a valid JSON Schema: {e.message}",
                            f"{where}.function.parameters") from None
    return tools


def parse_tool_calls(text: str, parser: str) -> tuple[str | None, list[ToolCall]]:
    """``(content, tool_calls)`` read from a completion's text. No calls (or parser
    ``none``, or any malformed block): ``(text, [])``."""
    if parser == "none" or "<tool_call>" not in text:
        return text, []
    blocks = _HERMES.findall(text)
    if len(blocks) != text.count("<tool_call>"):  # one never closed (cut by max_tokens?)
        return text, []
    calls = []
    for block in blocks:
        try:
            obj = json.loads(block)
        except ValueError:
            return text, []
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
                and isinstance(obj.get("arguments", {}), dict)):
            return text, []
        calls.append(ToolCall(obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
    content = _HERMES.sub("", text).strip()
    return content or None, calls


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: a tool call's ``arguments`` JSON text becomes
    a dict (Qwen/Hermes templates render it with ``tojson``), text-part lists become text."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p.get("text", "") for p in m["content"])
        if m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = dict(c.get("function") or {})
                args = fn.get("arguments", "{}")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args or "{}")
                    except ValueError:
                        raise ToolError(
                            f"messages[{i}].tool_calls[{j}].function.arguments: not JSON",
                            f"messages[{i}].tool_calls[{j}].function.arguments") from None
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out
