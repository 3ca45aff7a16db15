"""The vLLM engine on a GPU (CUDA vLLM, the ``gpu`` extra). Skipped without a GPU. On a GPU
node: logprobs of the bf16/fp32 engine against a teacher-forced pass, a weight update into the
running engine, and generation tokens/s printed (record it in NOTES.md)."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from schemas.config import InferenceModelConfig
from tests.explorer.helpers import teacher_logprobs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


async def test_vllm_gpu_logprobs_update_and_throughput(tiny_model, hf_model) -> None:
    pytest.importorskip("vllm")
    from roles.explorer.engines.vllm import VLLMEngine

    cfg = InferenceModelConfig(model_path=str(tiny_model), dtype="float32", max_model_len=256,
                               max_response_tokens=128, seed=0, gpu_memory_utilization=0.3)
    eng = await VLLMEngine.create(cfg)
    try:
        msgs = [{"role": "user", "content": "3+4=?"}]
        for s in await eng.chat(msgs, n=4):
            ref = teacher_logprobs(hf_model, s.tokens, s.prompt_length)
            assert torch.allclose(ref, torch.tensor(s.logprobs), atol=1e-3)
        new = copy.deepcopy(hf_model)
        with torch.no_grad():
            for p in new.parameters():
                p.mul_(1.5)
        await eng.update_weights([(k, v) for k, v in new.state_dict().items() if k != "lm_head.weight"], 1)
        for s in await eng.chat(msgs, n=2):
            ref = teacher_logprobs(new, s.tokens, s.prompt_length)
            assert torch.allclose(ref, torch.tensor(s.logprobs), atol=1e-3)
        import asyncio

        t0 = time.perf_counter()
        outs = await asyncio.gather(*(eng.chat([{"role": "user", "content": f"{i % 10}+1=?"}], n=8,
                                               max_tokens=128, ignore_eos=True) for i in range(128)))
        dt = time.perf_counter() - t0
        tokens = sum(len(s.response_tokens) for o in outs for s in o)
        print(f"\nvLLM GPU generation: {tokens} tokens in {dt:.2f}s = {tokens / dt:.0f} tokens/s")
    finally:
        await eng.close()
