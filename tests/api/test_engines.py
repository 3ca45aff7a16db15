"""The API over the other engine types. vLLM: ``tests/explorer/test_vllm_engine.py`` (one
vLLM start per suite). External: trinity's API in front of an ``engine_type: external``
engine that is itself pointed at a second trinity API (over the transformers engine)."""

from __future__ import annotations

import openai
import pytest

from roles.explorer.api import ApiServer
from roles.explorer.engines.external import ExternalEngine
from schemas.config import ExternalModelConfig, InferenceModelConfig, OpenAIApiConfig

from .tool_model import ADD_TOOL, QUESTION


async def test_api_over_an_external_engine(engine, tool_model, monkeypatch):
    back = ApiServer(OpenAIApiConfig(port=0), [engine], "tiny", "run", None)
    await back.start()
    monkeypatch.setenv("TRINITY_TEST_BASE_URL", f"{back.url}/v1/episodes/back")
    ext = ExternalEngine(InferenceModelConfig(model_path=str(tool_model), engine_type="external"),
                         ExternalModelConfig(base_url_env="TRINITY_TEST_BASE_URL", model_name="tiny"))
    front = ApiServer(OpenAIApiConfig(port=0), [ext], "tiny", "run", None)
    await front.start()
    try:
        c = openai.AsyncOpenAI(base_url=f"{front.url}/v1/episodes/front", api_key="none", max_retries=0)
        r = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                            temperature=0, max_tokens=64)
        (served,) = back.book.open["back"].calls
        (seen,) = front.book.open["front"].calls
        assert r.choices[0].message.content == served.response_text
        assert seen.response_ids == served.response_ids  # re-tokenized from the text
        assert seen.logprobs == pytest.approx(served.logprobs, abs=1e-6)
        with pytest.raises(openai.BadRequestError, match="external engine"):
            await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                            tools=[ADD_TOOL])
    finally:
        await front.stop()
        await back.stop()
        await ext.close()
