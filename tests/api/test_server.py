"""The explorer's OpenAI API against the official ``openai`` client: completions, tools,
episodes, streaming, log-probs, and every kind of bad input answered with OpenAI's error body
while the server goes on serving."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import openai
import pytest

from roles.explorer.api.episodes import Call, calls_to_experiences
from roles.explorer.api.tools import check_tools, parse_tool_calls
from roles.explorer.workflows.base import ModelHandle

from .tool_model import ADD_TOOL, QUESTION

USER = [{"role": "user", "content": QUESTION}]


def client(server, episode: str | None = "e1", **kw) -> openai.AsyncOpenAI:
    base = f"{server.url}/v1/episodes/{episode}" if episode else f"{server.url}/v1"
    return openai.AsyncOpenAI(base_url=base, api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


async def post(server, path: str, body=None, content: bytes | None = None, **kw) -> httpx.Response:
    async with httpx.AsyncClient() as h:
        if content is not None:
            return await h.post(server.url + path, content=content, **kw)
        return await h.post(server.url + path, json=body, **kw)


async def test_models_and_a_completion(api):
    server = await api()
    c = client(server)
    models = await c.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    raw = await c.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_tokens=8)
    r = raw.parse()
    assert raw.headers["x-trinity-episode"] == "e1"
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == len(server.book.open["e1"].calls[0].response_ids)
    assert r.usage.prompt_tokens == len(server.book.open["e1"].calls[0].prompt_ids)


async def test_tool_call_is_parsed_and_the_tool_result_turn_is_rendered(api, engine):
    server = await api(enable_concatenated_multi_turn=True)
    c = client(server, "tools-1")
    r = await c.chat.completions.create(model="tiny", messages=USER, tools=[ADD_TOOL], temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    call = ch.message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 3, "b": 4}
    msgs = USER + [ch.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "7"}]
    r2 = await c.chat.completions.create(model="tiny", messages=msgs, tools=[ADD_TOOL], temperature=0)
    assert r2.choices[0].message.content == "7" and r2.choices[0].finish_reason == "stop"
    first, second = server.book.open["tools-1"].calls
    ok = await post(server, "/v1/episodes/tools-1/reward", {"reward": 1.0, "info": {"k": "v"}})
    assert ok.status_code == 200, ok.text
    (group,) = server.published
    # concatenated: the second prompt extends the first prompt + response, so one experience
    (exp,) = group.experiences
    assert exp.reward == 1.0 and exp.info["k"] == "v" and exp.info["calls"] == 2
    tok = engine.tokenizer
    resp = exp.tokens[exp.prompt_length:]
    model_text = tok.decode(resp[exp.action_mask], skip_special_tokens=False)
    assert model_text == '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call></s>7</s>'
    assert resp[exp.action_mask].tolist() == first.response_ids + second.response_ids
    # masked out: exactly what the template added between the turns (the tool result)
    between = second.prompt_ids[len(first.tokens):]
    assert resp[~exp.action_mask].tolist() == between
    assert "t:<tool_response>7</tool_response>" in tok.decode(between)
    assert np.all(exp.logprobs[~exp.action_mask] == 0) and np.all(exp.logprobs[exp.action_mask] < 0)


async def test_concatenation_follows_the_prompts_not_the_calls(engine):
    """A call whose prompt does not extend the previous call starts a new experience."""
    tok = engine.tokenizer
    a = Call([1, 2], [3, 4], [-0.1, -0.2], 0, "stop")
    b = Call([1, 2, 3, 4, 5], [6], [-0.3], 1, "stop")  # extends a: merged, 5 masked out
    c = Call([1, 9], [7], [-0.4], 1, "length")  # rewritten history: new experience
    e1, e2 = calls_to_experiences([a, b, c], concatenate=True)
    assert e1.tokens.tolist() == [1, 2, 3, 4, 5, 6] and e1.prompt_length == 2
    assert e1.action_mask.tolist() == [True, True, False, True]
    assert e1.logprobs.tolist() == pytest.approx([-0.1, -0.2, 0.0, -0.3])
    assert e1.model_version == 0 and e2.tokens.tolist() == [1, 9, 7] and e2.response_truncated
    assert len(calls_to_experiences([a, b, c], concatenate=False)) == 3
    assert tok is not None


async def test_api_tokens_and_logprobs_equal_model_handle_chat(api, engine):
    server = await api()
    c = client(server, "same")
    r = await c.chat.completions.create(model="tiny", messages=USER, seed=7, temperature=1.0,
                                        max_tokens=12, logprobs=True, top_logprobs=3)
    call = server.book.open["same"].calls[0]
    handle = ModelHandle(engine, asyncio.get_running_loop())
    (exp,) = await handle.achat(USER, seed=7, temperature=1.0, max_tokens=12)
    assert call.prompt_ids + call.response_ids == exp.tokens.tolist()
    assert call.logprobs == pytest.approx(exp.logprobs.tolist(), abs=1e-6)
    lp = r.choices[0].logprobs.content
    assert [x.logprob for x in lp] == pytest.approx(call.logprobs, abs=1e-6)
    for x in lp:  # the sampled token is among or below its top 3 alternatives
        assert len(x.top_logprobs) == 3 and x.top_logprobs[0].logprob >= x.logprob - 1e-6


async def test_streaming_gives_the_same_completion(api):
    server = await api()
    c = client(server, "stream")
    full = await c.chat.completions.create(model="tiny", messages=USER, seed=3, max_tokens=10)
    chunks = []
    stream = await c.chat.completions.create(model="tiny", messages=USER, seed=3, max_tokens=10,
                                             stream=True, stream_options={"include_usage": True})
    async for ch in stream:
        chunks.append(ch)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    tools = await c.chat.completions.create(model="tiny", messages=USER, tools=[ADD_TOOL],
                                            temperature=0, stream=True)
    deltas = [ch.choices[0].delta async for ch in tools]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls[0].function.name == "add"


def test_reasoning_is_split_from_the_answer_as_vllms_parsers_do():
    from roles.explorer.api.reasoning import split_reasoning

    assert split_reasoning("<think>a\nb</think>\n\nthe answer", "deepseek_r1") == ("a\nb", "the answer")
    assert split_reasoning("a</think>x", "qwen3") == ("a", "x")  # the template opened <think>
    assert split_reasoning("still thinking", "deepseek_r1") == ("still thinking", "")
    assert split_reasoning("just an answer", "qwen3") == (None, "just an answer")
    assert split_reasoning("<think>a</think>b", None) == (None, "<think>a</think>b")


async def test_a_reasoning_parser_returns_the_thinking_as_reasoning_content(api):
    """Through the openai client: deepseek_r1 counts a completion without </think> as reasoning,
    streamed or not; qwen3 as content; an agent may echo reasoning_content back."""
    ask = dict(model="tiny", messages=USER, temperature=0, max_tokens=8)
    text = (await client(await api(), "r0").chat.completions.create(**ask)).choices[0].message.content
    assert text and "</think>" not in text
    ds = client(await api(reasoning_parser="deepseek_r1"), "r1")
    msg = (await ds.chat.completions.create(**ask)).choices[0].message
    assert msg.reasoning_content == text and msg.content == ""
    deltas = [ch.choices[0].delta async for ch in await ds.chat.completions.create(**ask, stream=True) if ch.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == text
    again = USER + [msg.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    await ds.chat.completions.create(**{**ask, "messages": again})
    qwen = (await client(await api(reasoning_parser="qwen3"), "r2").chat.completions.create(**ask)).choices[0].message
    assert qwen.content == text and getattr(qwen, "reasoning_content", None) is None


async def test_plain_routes_open_an_episode_per_request(api):
    server = await api()
    c = client(server, None)
    raw = await c.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_tokens=4)
    eid = raw.headers["x-trinity-episode"]
    ok = await post(server, f"/v1/episodes/{eid}/reward", {"reward": 0.5})
    assert ok.status_code == 200 and server.published[0].group_id == eid


@pytest.mark.parametrize("case, status, param", [
    ("invalid json", 400, None),
    ("unknown field", 400, "temprature"),
    ("n above bound", 400, "n"),
    ("bad tool schema", 400, "tools[0].function.parameters"),
    ("tool not a function", 400, "tools[0]"),
    ("prompt too long", 400, "messages"),
    ("unsupported parameter", 400, "frequency_penalty"),
    ("forced tool choice", 400, "tool_choice"),
    ("wrong model", 404, "model"),
    ("bad episode id", 400, "episode_id"),
    ("image content", 400, "messages.0.content"),
])
async def test_bad_requests_get_openai_errors_and_the_server_goes_on(api, case, status, param):
    server = await api(max_n=2)
    body = {"model": "tiny", "messages": USER, "max_tokens": 4}
    path = "/v1/episodes/bad/chat/completions"
    content = None
    if case == "invalid json":
        content = b'{"model": "tiny", "messages": ['
    elif case == "unknown field":
        body["temprature"] = 0.5
    elif case == "n above bound":
        body["n"] = 3
    elif case == "bad tool schema":
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]
    elif case == "tool not a function":
        body["tools"] = [{"type": "code_interpreter"}]
    elif case == "prompt too long":
        body["messages"] = [{"role": "user", "content": "1" * 600}]
    elif case == "unsupported parameter":
        body["frequency_penalty"] = 0.5
    elif case == "forced tool choice":
        body.update(tools=[ADD_TOOL], tool_choice="required")
    elif case == "wrong model":
        body["model"] = "gpt-4o"
    elif case == "bad episode id":
        path = "/v1/episodes/no spaces!/chat/completions"
    elif case == "image content":
        body["messages"] = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    r = await post(server, path, body, content=content)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param:
        assert err["param"] == param, err
    if case == "prompt too long":
        assert err["code"] == "context_length_exceeded"
    ok = await client(server, "good").chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert ok.choices[0].message.role == "assistant"


async def test_the_openai_client_raises_its_own_error_classes(api):
    server = await api()
    c = client(server, "err")
    with pytest.raises(openai.BadRequestError, match="n: 99"):
        await c.chat.completions.create(model="tiny", messages=USER, n=99)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await c.chat.completions.create(model="other", messages=USER)


async def test_rewards_close_episodes_once(api):
    server = await api()
    assert (await post(server, "/v1/episodes/never/reward", {"reward": 1.0})).status_code == 404
    await client(server, "r1").chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    bad = await post(server, "/v1/episodes/r1/reward", {"reward": "high"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reward"
    nan = await post(server, "/v1/episodes/r1/reward", content=b'{"reward": NaN}')
    assert nan.status_code == 400
    assert (await post(server, "/v1/episodes/r1/reward", {"reward": 1.0})).status_code == 200
    again = await post(server, "/v1/episodes/r1/reward", {"reward": 1.0})
    assert again.status_code == 409 and again.json()["error"]["code"] == "episode_closed"
    with pytest.raises(openai.ConflictError, match="already closed"):
        await client(server, "r1").chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert len(server.published) == 1


async def test_a_failed_publish_keeps_the_episode(api):
    server = await api()
    await client(server, "keep").chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    server.published.fail = True
    r = await post(server, "/v1/episodes/keep/reward", {"reward": 1.0})
    assert r.status_code == 503 and "post the reward again" in r.json()["error"]["message"]
    server.published.fail = False
    assert (await post(server, "/v1/episodes/keep/reward", {"reward": 1.0})).status_code == 200
    assert [g.group_id for g in server.published] == ["keep"]


async def test_idle_episodes_expire_and_are_counted(api):
    server = await api(episode_timeout=0.3)
    await client(server, "idle").chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    for _ in range(50):
        if server.stats.episodes_expired:
            break
        await asyncio.sleep(0.1)
    assert server.stats.episodes_expired == 1 and server.stats.calls_expired == 1
    assert (await post(server, "/v1/episodes/idle/reward", {"reward": 1.0})).status_code == 404
    assert server.published == []


async def test_api_key(api):
    server = await api(api_key="s3cret")
    with pytest.raises(openai.AuthenticationError):
        await client(server, "k", api_key="wrong").models.list()
    assert (await post(server, "/v1/episodes/k/reward", {"reward": 1})).status_code == 401
    models = await client(server, "k", api_key="s3cret").models.list()
    assert models.data[0].id == "tiny"


async def test_a_template_without_tools_refuses_them(tiny_model):
    from roles.explorer.api import ApiServer
    from schemas.config import OpenAIApiConfig

    from .conftest import make_engine

    server = ApiServer(OpenAIApiConfig(port=0), [make_engine(tiny_model)], "tiny", "run", None)
    await server.start()
    try:
        with pytest.raises(openai.BadRequestError, match="does not render tools"):
            await client(server, "t").chat.completions.create(model="tiny", messages=USER, tools=[ADD_TOOL])
        r = await post(server, "/v1/episodes/t/reward", {"reward": 1.0})
        assert r.status_code == 409 and "mode serve" in r.json()["error"]["message"]
    finally:
        await server.stop()


def test_tool_call_parsing():
    text = 'ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "ok" and calls[0].name == "add" and json.loads(calls[0].arguments) == {"a": 1}
    for bad in ['<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',  # broken JSON
                '<tool_call>{"arguments": {}}</tool_call>',  # no name
                '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
                '<tool_call>{"name": "f"',  # never closed
                '<tool_call>__import__("os").system("x")</tool_call>']:  # never evaluated
        assert parse_tool_calls(bad, "hermes") == (bad, [])
    assert parse_tool_calls(text, "none") == (text, [])
    with pytest.raises(ValueError, match=r"tools\[0\].function.name"):
        check_tools([{"type": "function", "function": {"name": "has space"}}])
