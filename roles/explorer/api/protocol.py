"""The OpenAI chat-completions protocol as trinity's server speaks it: requests parsed and
checked, responses and errors built in the shapes the official ``openai`` package parses.

Why pydantic models with ``extra="forbid"``: a field the server does not know is a request
the agent thinks does something it does not. Fields of the OpenAI API that the engines cannot
honour (penalties, logit bias, structured output, forced tool choice) are refused by name
rather than silently ignored. vLLM's sampling extras (``top_k``, ``min_tokens``,
``repetition_penalty``, ``return_tokens_as_token_ids``) are accepted, sent through the
client's ``extra_body``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

#: OpenAI request fields the server refuses with a reason (never ignores).
UNSUPPORTED = {
    "frequency_penalty": "use repetition_penalty (extra_body)",
    "presence_penalty": "use repetition_penalty (extra_body)",
    "logit_bias": "the engines do not bias logits",
    "response_format": "structured output needs constrained decoding, which the engines do not do",
    "functions": "deprecated: use tools",
    "function_call": "deprecated: use tool_choice",
    "parallel_tool_calls": "every call the model writes is returned",
    "audio": "text only",
    "modalities": "text only",
    "prediction": "not supported",
    "service_tier": "not supported",
    "reasoning_effort": "not supported",
    "web_search_options": "not supported",
}


_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


class ApiError(Exception):
    """An error answered as OpenAI's ``{"error": {...}}`` body with HTTP ``status``."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             409: "conflict_error", 413: "invalid_request_error", 503: "service_unavailable",
             500: "internal_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat message. The response-only fields an agent echoes back when it appends the
    assistant message it received (``refusal``, ``annotations``, ...) are accepted empty."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: None = None
    reasoning_content: str | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None

    def to_template(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        if isinstance(self.content, list):
            d["content"] = "".join(p.text for p in self.content)
        else:
            d["content"] = self.content if self.content is not None else ""
        for k in ("name", "tool_calls", "tool_call_id", "reasoning_content"):  # templates that know it use it
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatRequest(_Strict):
    """``POST .../chat/completions``."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    # vLLM's extras (the openai client's ``extra_body``)
    top_k: int | None = None
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)
    return_tokens_as_token_ids: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("at most 4 non-empty strings")
        return stops

    def sampling(self) -> dict[str, Any]:
        """The engine's sampling arguments (keys of ``engines.base.SAMPLING_KEYS``)."""
        s: dict[str, Any] = {}
        for k in ("temperature", "top_p", "seed", "top_k", "min_tokens", "repetition_penalty", "stop"):
            v = getattr(self, k)
            if v is not None:
                s[k] = v
        mt = self.max_completion_tokens or self.max_tokens
        if mt is not None:
            s["max_tokens"] = mt
        if self.logprobs and self.top_logprobs:
            s["top_logprobs"] = self.top_logprobs
        return s


class RewardRequest(_Strict):
    """``POST /v1/episodes/<id>/reward``."""

    reward: float
    info: dict[str, Any] = Field(default_factory=dict)

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float) -> float:
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError("must be a finite number")
        return v


def parse(model: type[BaseModel], body: Any) -> Any:
    """``body`` as ``model``, or a 400 :class:`ApiError` naming the first bad field."""
    if isinstance(body, dict):
        for k in body:
            if k in UNSUPPORTED and body[k] is not None and model is ChatRequest:
                raise ApiError(400, f"{k}: not supported by trinity's server ({UNSUPPORTED[k]})", k,
                               "unsupported_parameter")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        # pydantic names the union member it tried (``content.str``): not a field
        loc = ".".join(str(p) for p in err["loc"] if isinstance(p, int) or p.isidentifier()
                       and p not in _UNION_TAGS) or "body"
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise ApiError(400, f"{loc}: {msg}", loc, "invalid_value") from None


# -- responses ---------------------------------------------------------------------------------


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def logprob_entry(tok: Any, token_id: int, logprob: float, as_ids: bool) -> dict[str, Any]:
    text = f"token_id:{token_id}" if as_ids else tok.decode([token_id])
    return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8"))}


def choice_logprobs(tok: Any, ids: list[int], lps: list[float], tops: list[dict[int, float]] | None,
                    as_ids: bool) -> dict[str, Any]:
    """OpenAI's ``choice.logprobs``: one entry per generated token (and its top alternatives)."""
    content = []
    for i, (t, lp) in enumerate(zip(ids, lps, strict=False)):
        e = logprob_entry(tok, t, lp, as_ids)
        alts = tops[i] if tops and i < len(tops) else {}
        e["top_logprobs"] = [logprob_entry(tok, a, v, as_ids)
                             for a, v in sorted(alts.items(), key=lambda kv: -kv[1])]
        content.append(e)
    return {"content": content, "refusal": None}


def models_list(name: str) -> dict[str, Any]:
    return {"object": "list",
            "data": [{"id": name, "object": "model", "created": now(), "owned_by": "trinity"}]}
