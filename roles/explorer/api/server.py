"""The explorer's OpenAI-compatible HTTP server (aiohttp, on the explorer's event loop).

Routes (``<eid>``: an episode id the agent picks, see ``episodes.py``):

* ``POST /v1/episodes/<eid>/chat/completions``, ``GET /v1/episodes/<eid>/models``: an agent
  only needs ``base_url=http://host:port/v1/episodes/<eid>``;
* ``POST /v1/episodes/<eid>/reward`` ``{"reward": float, "info": {...}}``: closes the episode;
  answers 200 only once its group is stored on the bus;
* ``POST /v1/chat/completions``, ``GET /v1/models``: a fresh episode per request, named in the
  ``X-Trinity-Episode`` response header (reward it there, or it expires).

Why the server sits in the explorer and not in front of it: the explorer owns the engines,
their weight versions and the bus publisher, so a recorded call has the exact prompt ids the
template rendered, the sampled ids and log-probs, and the version that produced them.

Limits, on purpose: the API path never truncates a prompt (only ``max_model_len`` applies, as
in Trinity-RFT: a longer prompt is a 400 ``context_length_exceeded``); ``tool_choice`` is
``auto`` or ``none`` (forcing a call needs constrained decoding). ``stream: true`` answers
with server-sent events in the OpenAI chunk format, sent once the completion is done (a
rollout needs every token's log-prob and the finish reason), so the first chunk arrives when
the last token is sampled.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from aiohttp import web

from roles.explorer.api.episodes import Call, EpisodeBook
from roles.explorer.api.gate import WeightGate
from roles.explorer.api.protocol import (
    ApiError,
    ChatRequest,
    RewardRequest,
    choice_logprobs,
    completion_id,
    models_list,
    now,
    parse,
)
from roles.explorer.api.reasoning import split_reasoning
from roles.explorer.api.tools import ToolError, check_tools, parse_tool_calls, template_messages
from roles.explorer.engines.base import EngineError, RolloutEngine, Sample
from schemas.config import OpenAIApiConfig
from schemas.data import ExperienceGroup

log = structlog.get_logger(__name__)

#: Publishes a closed episode's group and waits until it is stored; True if the bus already
#: had that group id (an episode id used twice in one run).
Publish = Callable[[ExperienceGroup], Awaitable[bool]]
MAX_BODY = 32 * 1024 * 1024
EXPIRE_EVERY = 5.0


@dataclass
class ApiStats:
    requests: int = 0
    errors: int = 0
    completions: int = 0
    episodes_closed: int = 0
    episodes_expired: int = 0
    calls_expired: int = 0


class ApiServer:
    """The API over ``engines``; ``publish`` sends closed episodes (None: rewards refused)."""

    def __init__(self, cfg: OpenAIApiConfig, engines: list[RolloutEngine], model_name: str,
                 run_id: str, publish: Publish | None, gate: WeightGate | None = None,
                 record: bool = True) -> None:
        self.cfg, self.engines, self.model_name, self.run_id = cfg, engines, model_name, run_id
        self.publish = publish
        #: keep each call in its episode (False: an auxiliary model's server; its answers are
        #: no policy's samples, nothing of them is trained on)
        self.record = record
        self.gate = gate or WeightGate()
        self.book = EpisodeBook(cfg.episode_timeout, cfg.enable_concatenated_multi_turn)
        self.stats = ApiStats()
        self.url = ""
        self._busy = [0] * len(engines)
        self._renders_tools: dict[int, bool] = {}  # id(engine) -> its template shows tools
        self._runner: web.AppRunner | None = None
        self._expiry: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen; returns the base URL (``http://host:port``)."""
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors, self._auth])
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/episodes/{eid}/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/episodes/{eid}/chat/completions", self.chat)
        app.router.add_post("/v1/episodes/{eid}/reward", self.reward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            raise EngineError(f"explorer.openai_api: cannot listen on {self.cfg.host}:{self.cfg.port}: "
                              f"{e.strerror or e} (set explorer.openai_api.port, 0 = any free port)") from e
        port = self._runner.addresses[0][1]
        host = self.cfg.host if self.cfg.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        self.url = f"http://{host}:{port}"
        self._expiry = asyncio.create_task(self._expire_loop())
        log.info("openai_api_listening", url=f"{self.url}/v1", model=self.model_name)
        return self.url

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(EXPIRE_EVERY, self.cfg.episode_timeout))
            for ep in self.book.expire():
                self.stats.episodes_expired += 1
                self.stats.calls_expired += len(ep.calls)
                log.warning("episode_expired", episode=ep.id, calls=len(ep.calls),
                            why=f"no reward within {self.cfg.episode_timeout:g}s: dropped, not trained")

    # -- middlewares ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.stats.requests += 1
        try:
            return await handler(request)
        except ApiError as e:
            self.stats.errors += 1
            if e.status >= 500:
                log.error("api_error", method=request.method, path=request.path, error=e.message)
            return web.json_response(e.body(), status=e.status, dumps=_dumps)
        except web.HTTPException as e:  # aiohttp's own: unknown route, body too large, ...
            self.stats.errors += 1
            err = ApiError(e.status, f"{request.method} {request.path}: {e.reason}")
            return web.json_response(err.body(), status=e.status, dumps=_dumps)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = self.cfg.api_key
        if key:
            got = request.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {key}".encode()):
                raise ApiError(401, "missing or wrong API key (Authorization: Bearer ...)", None,
                               "invalid_api_key")
        return await handler(request)

    # -- handlers ------------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(models_list(self.model_name), dumps=_dumps)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req: ChatRequest = parse(ChatRequest, await _body(request))
        eid = request.match_info.get("eid") or self.book.new_id()
        self._check(req)
        ep = self.book.get(eid)
        engine = ep.engine or self._least_busy()
        messages, tools = self._prompt(req)
        sampling = {**ep.defaults, **req.sampling()}
        if engine.remote_chat:
            if tools:
                raise ApiError(400, "tools: not supported through an external engine (it parses "
                                    "tool calls itself)", "tools", "unsupported_parameter")
            ids: list[int] = []
        else:
            if tools and not self._template_renders_tools(engine):
                raise ApiError(400, "tools: the model's chat template does not render tools, so "
                                    "the model would never see them; set "
                                    "explorer.rollout_model.chat_template to one that does",
                               "tools", "unsupported_parameter")
            ids = _render(engine, messages, tools)
            sampling["max_tokens"] = self._max_tokens(engine, len(ids), sampling.get("max_tokens"))
        i = self.engines.index(engine) if engine in self.engines else 0
        self._busy[i] += 1
        ep.in_flight += 1
        try:
            async with self.gate.request():
                if engine.remote_chat:
                    samples = await engine.chat(messages, n=req.n, **sampling)
                else:
                    samples = await engine.generate(ids, n=req.n, truncate=False, **sampling)
        except EngineError as e:
            raise ApiError(500, f"engine {engine.name}: {e}") from e
        finally:
            self._busy[i] -= 1
            ep.in_flight -= 1
            ep.touched = time.monotonic()
        self.stats.completions += 1
        choices = []
        for k, s in enumerate(samples):
            choice, n_calls, malformed = self._choice(k, s, req, engine, bool(tools))
            choices.append(choice)
            if self.record:
                ep.calls.append(Call(list(s.tokens[:s.prompt_length]), list(s.response_tokens),
                                     list(s.logprobs), s.model_version, s.finish_reason or "stop",
                                     messages, s.response_text, n_calls, malformed))
        if not self.record and ep.owner is None:
            self.book.release(eid)
        headers = {"X-Trinity-Episode": eid,
                   "X-Trinity-Model-Version": str(min(s.model_version for s in samples))}
        prompt_len = samples[0].prompt_length if samples else len(ids)
        completion = sum(len(s.response_tokens) for s in samples)
        usage = {"prompt_tokens": prompt_len, "completion_tokens": completion,
                 "total_tokens": prompt_len + completion}
        cid = completion_id()
        if req.stream:
            return await self._stream(request, cid, choices, samples, usage, req, engine, headers)
        body = {"id": cid, "object": "chat.completion", "created": now(),
                "model": self.model_name, "choices": choices, "usage": usage}
        return web.json_response(body, headers=headers, dumps=_dumps)

    async def reward(self, request: web.Request) -> web.Response:
        eid = request.match_info["eid"]
        req: RewardRequest = parse(RewardRequest, await _body(request))
        if self.publish is None:
            raise ApiError(409, "this explorer does not train on API episodes (it runs a taskset "
                                "whose workflows own their episodes); use mode serve", None,
                           "rewards_not_accepted")
        group = self.book.group(eid, req.reward, req.info, self.run_id)
        try:
            group.validate()
        except ValueError as e:
            raise ApiError(400, f"episode {eid}: {e}", "info", "invalid_episode") from e
        try:
            duplicate = await self.publish(group)
        except Exception as e:  # the bus is down for longer than the publisher rides out
            raise ApiError(503, f"episode {eid}: not stored ({type(e).__name__}: {e}); it stays "
                                "open: post the reward again", None, "bus_unavailable") from e
        self.book.closed_by(eid)
        if duplicate:
            raise ApiError(409, f"episode {eid}: this id was already rewarded earlier in this "
                                "run (its first group is the one kept)", "episode_id",
                           "episode_closed")
        self.stats.episodes_closed += 1
        log.info("episode_closed", episode=eid, experiences=len(group.experiences), reward=req.reward)
        return web.json_response({"episode_id": eid, "group_id": group.group_id,
                                  "experiences": len(group.experiences), "stored": True},
                                 dumps=_dumps)

    # -- pieces --------------------------------------------------------------------------------

    def _check(self, req: ChatRequest) -> None:
        if req.n > self.cfg.max_n:
            raise ApiError(400, f"n: {req.n} is above explorer.openai_api.max_n={self.cfg.max_n}",
                           "n", "invalid_value")
        if req.model is not None and req.model not in (self.model_name, os.path.basename(self.model_name)):
            raise ApiError(404, f"model {req.model!r} does not exist; this server serves "
                                f"{self.model_name!r} (GET /v1/models)", "model", "model_not_found")
        tc = req.tool_choice
        if tc is not None and tc not in ("auto", "none"):
            raise ApiError(400, "tool_choice: only 'auto' and 'none' (forcing a call needs "
                                "constrained decoding, which the engines do not do)",
                           "tool_choice", "unsupported_value")
        if tc is not None and not req.tools:
            raise ApiError(400, "tool_choice: given without tools", "tool_choice", "invalid_value")

    def _prompt(self, req: ChatRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        try:
            tools = check_tools(req.tools) if req.tools else None
            messages = template_messages([m.to_template() for m in req.messages])
        except ToolError as e:
            raise ApiError(400, str(e), e.param, "invalid_value") from None
        return messages, (tools if req.tool_choice != "none" else None)

    def _max_tokens(self, engine: RolloutEngine, prompt_len: int, requested: int | None) -> int | None:
        cap = self.cfg.max_tokens_per_request
        if requested is not None and cap is not None and requested > cap:
            raise ApiError(400, f"max_tokens: {requested} is above "
                                f"explorer.openai_api.max_tokens_per_request={cap}", "max_tokens",
                           "invalid_value")
        limits = getattr(engine, "limits", None)
        max_len = limits.max_model_len if limits is not None else None
        if max_len is None:
            return requested if requested is not None else cap
        room = max_len - prompt_len
        if room < 1:
            raise ApiError(400, f"the prompt is {prompt_len} tokens; max_model_len is {max_len}, "
                                "which leaves no room to generate", "messages",
                           "context_length_exceeded")
        n = min(requested or room, room)
        return min(n, cap) if cap is not None else n

    def _template_renders_tools(self, engine: RolloutEngine) -> bool:
        """Does the template put ``tools`` in the prompt? (Checked once per engine: a
        template without tools support drops them silently.)"""
        known = self._renders_tools.get(id(engine))
        if known is None:
            probe = [{"role": "user", "content": "x"}]
            tool = {"type": "function", "function": {"name": "probe_tool", "parameters": {"type": "object"}}}
            try:
                known = _render(engine, probe, [tool]) != _render(engine, probe, None)
            except ApiError:
                known = False
            self._renders_tools[id(engine)] = known
        return known

    def _least_busy(self) -> RolloutEngine:
        return self.engines[min(range(len(self.engines)), key=self._busy.__getitem__)]

    def _choice(self, k: int, s: Sample, req: ChatRequest, engine: RolloutEngine,
                tools: bool) -> tuple[dict[str, Any], int, int]:
        """The response's choice, its tool calls and whether a call was malformed (counted
        per episode: an agent developer watches both)."""
        reasoning, text = split_reasoning(_strip_stop(s.response_text, req.stop), self.cfg.reasoning_parser)
        content, calls = parse_tool_calls(text, self.cfg.tool_call_parser) if tools else (text, [])
        malformed = int(tools and not calls and "<tool_call>" in text)
        msg: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        reason = s.finish_reason or "stop"
        if calls:
            msg["tool_calls"] = [c.to_openai() for c in calls]
            reason = "tool_calls" if reason == "stop" else reason
        out: dict[str, Any] = {"index": k, "message": msg, "finish_reason": reason, "logprobs": None}
        if req.logprobs:
            out["logprobs"] = choice_logprobs(engine.tokenizer, s.response_tokens, s.logprobs,
                                              s.top_logprobs, req.return_tokens_as_token_ids)
        return out, len(calls), malformed

    async def _stream(self, request: web.Request, cid: str, choices: list[dict[str, Any]],
                      samples: list[Sample], usage: dict[str, int], req: ChatRequest,
                      engine: RolloutEngine, headers: dict[str, str]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        base = {"id": cid, "object": "chat.completion.chunk", "created": now(), "model": self.model_name}

        async def send(choice: dict[str, Any] | None, **extra: Any) -> None:
            chunk = {**base, "choices": [choice] if choice else [], **extra}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")

        for c, s in zip(choices, samples, strict=True):
            k, msg = c["index"], c["message"]
            await send({"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None})
            if "reasoning_content" in msg:  # not a prefix of the tokens' text: one chunk each
                await send({"index": k, "delta": {"reasoning_content": msg["reasoning_content"]},
                            "finish_reason": None})
            if "tool_calls" in msg or "reasoning_content" in msg:
                if msg["content"]:
                    await send({"index": k, "delta": {"content": msg["content"]}, "finish_reason": None})
                for j, tc in enumerate(msg.get("tool_calls", [])):
                    await send({"index": k, "delta": {"tool_calls": [{"index": j, **tc}]},
                                "finish_reason": None})
            else:
                lps = (c["logprobs"] or {}).get("content") or []
                for j, piece in enumerate(_pieces(engine.tokenizer, s.response_tokens, msg["content"] or "")):
                    if piece or j < len(lps):
                        lp = {"content": [lps[j]], "refusal": None} if j < len(lps) else None
                        await send({"index": k, "delta": {"content": piece}, "logprobs": lp,
                                    "finish_reason": None})
            await send({"index": k, "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]})
        if req.stream_options is not None and req.stream_options.include_usage:
            await send(None, usage=usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


# -- helpers -------------------------------------------------------------------------------------


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", None, "invalid_json") from None


def _render(engine: RolloutEngine, messages: list[dict[str, Any]],
            tools: list[dict[str, Any]] | None) -> list[int]:
    """The prompt ids the model's chat template renders (with ``tools`` when given)."""
    try:
        return engine.apply_chat_template(messages, **({"tools": tools} if tools else {}))
    except Exception as e:  # jinja raises for messages its template refuses (role order, ...)
        raise ApiError(400, f"messages: the model's chat template refused them: "
                            f"{type(e).__name__}: {e}", "messages", "template_error") from None


def _strip_stop(text: str, stops: list[str] | None) -> str:
    """Text up to the first stop string (OpenAI leaves the stop string out of the content)."""
    for s in stops or []:
        i = text.find(s)
        if i >= 0:
            text = text[:i]
    return text


def _pieces(tok: Any, ids: list[int], content: str) -> list[str]:
    """The content split at token boundaries (each piece what that token added to the
    decoded text), so a stream has one chunk per token; the pieces join to ``content``."""
    pieces, prev = [], ""
    for j in range(len(ids)):
        text = tok.decode(ids[: j + 1], skip_special_tokens=True)
        if not content.startswith(text):  # stop string cut, or a partial multi-byte char
            text = content if len(text) >= len(content) else prev
        pieces.append(text[len(prev):])
        prev = text
    if prev != content:
        pieces.append(content[len(prev):])
    return pieces
