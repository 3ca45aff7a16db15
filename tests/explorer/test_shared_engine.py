"""A sweep's shared rollout engine: one base model, one adapter per run. Each run's view
generates through its own adapter (exactly as an engine of its own with that adapter would),
rows of several runs share a batch, and a run's sync replaces its adapter alone."""

from __future__ import annotations

import asyncio

import pytest
import torch

from roles.explorer.engines.base import EngineError
from schemas.config import InferenceModelConfig, LoraConfig

LC = LoraConfig(lora_rank=4, lora_alpha=8, target_modules="all-linear")
PROMPTS = [[5, 9, 13, 2], [7, 3, 11]]


def _cfg(tiny_model, engine_type="transformers"):
    return InferenceModelConfig(model_path=str(tiny_model), engine_type=engine_type, max_model_len=64,
                                max_response_tokens=6, dtype="float32", seed=0)


def _trained_adapter(tiny_model, seed):
    """A trainer's adapter (names ``...lora_A.default.weight``), moved off its start."""
    from transformers import AutoModelForCausalLM

    from storage.lora import adapter_tensors, wrap

    torch.manual_seed(seed)
    model = wrap(AutoModelForCausalLM.from_pretrained(tiny_model), LC)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.5)
    return [(n, t.clone()) for n, t in adapter_tensors(model)]


async def _greedy(engine, prompts=PROMPTS):
    outs = await asyncio.gather(*(engine.generate(p, temperature=0.0) for p in prompts))
    return [(o[0].response_tokens, o[0].logprobs, o[0].model_version) for o in outs]


def test_each_view_generates_through_its_own_adapter(tiny_model):
    from roles.explorer.engines.hf import HFEngine
    from roles.explorer.engines.shared import create_shared

    async def main():
        engines, views = await create_shared(_cfg(tiny_model), {"run0": LC, "run1": LC, "run2": LC})
        a, b = _trained_adapter(tiny_model, 1), _trained_adapter(tiny_model, 2)
        await views["run0"][0].update_weights(a, 3)
        await views["run1"][0].update_weights(b, 5)
        # the three runs' requests at once: one batch of rows through three adapters
        got = await asyncio.gather(*(_greedy(views[s][0]) for s in ("run0", "run1", "run2")))
        alone = []
        for named, version in ((a, 3), (b, 5), (None, 0)):  # an engine of its own per run
            own = HFEngine(_cfg(tiny_model), lora=LC)
            if named is not None:
                await own.update_weights(named, version)
            alone.append(await _greedy(own))
        for g, want in zip(got, alone, strict=True):
            assert [x[0] for x in g] == [x[0] for x in want]
            for (_, lg, vg), (_, lw, vw) in zip(g, want, strict=True):
                torch.testing.assert_close(torch.tensor(lg), torch.tensor(lw), atol=1e-4, rtol=1e-4)
                assert vg == vw
        assert got[0] != got[1], "two different adapters generated the same"
        assert [v.model_version for v in (views["run0"][0], views["run1"][0], views["run2"][0])] == [3, 5, 0]
        for e in engines:
            await e.close()

    asyncio.run(main())


def test_a_view_takes_its_adapter_alone(tiny_model):
    from roles.explorer.engines.shared import create_shared

    async def main():
        _, views = await create_shared(_cfg(tiny_model), {"run0": LC, "run1": LC})
        v = views["run0"][0]
        with pytest.raises(EngineError, match="adapter alone"):
            await v.update_weights([("model.embed_tokens.weight", torch.zeros(3))], 1)
        with pytest.raises(EngineError, match="sync_method must be nccl"):
            await v.load_checkpoint("/nowhere", 1)
        bad = [(n.replace(".default.", ".nope."), t) for n, t in _trained_adapter(tiny_model, 1)]
        with pytest.raises(EngineError, match="unknown tensor names"):
            await v.update_weights(bad, 1)
        assert v.model_version == 0 and views["run1"][0].model_version == 0

    asyncio.run(main())


def test_only_the_transformers_engine_is_shared_so_far(tiny_model):
    from roles.explorer.engines.shared import create_shared

    with pytest.raises(EngineError, match="explorer.rollout_model.engine_type"):
        asyncio.run(create_shared(_cfg(tiny_model, "vllm"), {"run0": LC}))
