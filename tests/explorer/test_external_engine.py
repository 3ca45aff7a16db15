"""``engine_type: external`` against a real HTTP server speaking the OpenAI chat-completions
protocol (aiohttp, in this process's event loop), through the real ``openai`` client.

The server answers from the tiny model with greedy decoding and the tokens' true log-probs,
as vLLM's server does; ``token_ids=True`` makes it send ``token_id:N`` strings (vLLM's
``--return-tokens-as-token-ids``), otherwise plain token text. What is checked is the client
side: prompt ids from the chat template, response ids, log-probs aligned with them, the
truncation flag, and errors that name the variable or the URL."""

from __future__ import annotations

import pytest
import torch
from aiohttp import web

from bus.server import free_port
from roles.explorer.engines.base import EngineError
from roles.explorer.engines.external import ExternalEngine
from schemas.config import ExternalModelConfig, InferenceModelConfig
from tests.explorer.helpers import teacher_logprobs


def _server(model, tok, token_ids: bool) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if body["model"] != "tiny":
            return web.json_response({"error": {"message": f"model {body['model']} not found"}}, status=404)
        prompt = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
        ids = torch.tensor([list(prompt)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=body["max_tokens"], do_sample=False,
                                 attention_mask=torch.ones_like(ids), pad_token_id=tok.pad_token_id)
        resp = out[0, ids.shape[1]:].tolist()
        finish = "stop" if resp and resp[-1] == tok.eos_token_id else "length"
        lps = teacher_logprobs(model, out[0].tolist(), ids.shape[1]).tolist()
        content = [{"token": f"token_id:{t}" if token_ids else tok.decode([t]), "logprob": lp,
                    "bytes": None, "top_logprobs": []} for t, lp in zip(resp, lps, strict=True)]
        choice = {"message": {"role": "assistant", "content": tok.decode(resp, skip_special_tokens=True)},
                  "logprobs": {"content": content}, "finish_reason": finish}
        return web.json_response({
            "id": "c1", "object": "chat.completion", "created": 0, "model": "tiny",
            "choices": [dict(choice, index=i) for i in range(body.get("n", 1))],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(resp),
                      "total_tokens": len(prompt) + len(resp)},
        })

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
async def served(hf_model, tiny_model, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    runners = []

    async def start(token_ids: bool) -> str:
        runner = web.AppRunner(_server(hf_model, tok, token_ids))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for r in runners:
        await r.cleanup()


@pytest.mark.parametrize("token_ids", [True, False])
async def test_external_engine_returns_ids_and_aligned_logprobs(served, tiny_model, hf_model, monkeypatch, token_ids):
    monkeypatch.setenv("TEST_EXT_URL", await served(token_ids))
    cfg = InferenceModelConfig(model_path=str(tiny_model), engine_type="external")
    engine = ExternalEngine(cfg, ExternalModelConfig(base_url_env="TEST_EXT_URL", model_name="tiny"))
    try:
        msgs = [{"role": "user", "content": "12+3=?"}]
        samples = await engine.chat(msgs, n=2, max_tokens=6, temperature=0.0)
    finally:
        await engine.close()
    assert len(samples) == 2
    prompt = engine.apply_chat_template(msgs)
    for s in samples:
        assert s.tokens[: s.prompt_length] == prompt
        assert s.response_truncated == (s.finish_reason == "length")
        if token_ids:  # ids straight from the server: log-probs line up with them
            assert len(s.response_tokens) > 0
            want = teacher_logprobs(hf_model, s.tokens, s.prompt_length)
            assert torch.allclose(torch.tensor(s.logprobs), want, atol=1e-4)
        else:  # ids re-derived from the text; log-probs kept only when the counts agree
            assert s.response_tokens == engine.tokenizer.encode(s.response_text, add_special_tokens=False)
            assert s.logprobs == [] or len(s.logprobs) == len(s.response_tokens)


async def test_external_engine_errors_name_the_variable_and_the_url(served, tiny_model, monkeypatch):
    cfg = InferenceModelConfig(model_path=str(tiny_model), engine_type="external")
    monkeypatch.delenv("TEST_EXT_MISSING", raising=False)
    with pytest.raises(EngineError, match="TEST_EXT_MISSING"):
        ExternalEngine(cfg, ExternalModelConfig(base_url_env="TEST_EXT_MISSING"))
    url = await served(True)
    monkeypatch.setenv("TEST_EXT_URL", url)
    engine = ExternalEngine(cfg, ExternalModelConfig(base_url_env="TEST_EXT_URL", model_name="nope"))
    try:
        with pytest.raises(EngineError, match="127.0.0.1"):
            await engine.chat([{"role": "user", "content": "1+1=?"}], max_tokens=2)
        with pytest.raises(EngineError, match="cannot be updated"):
            await engine.update_weights([], 1)
    finally:
        await engine.close()
