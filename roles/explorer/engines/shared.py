"""One rollout engine for several runs (a sweep): each run sees its own adapter of it.

Why views and not one engine per run: the runs of a LoRA sweep share the frozen base model,
so one engine holds it once and serves every run's adapter (``HFEngine.add_adapter``); rows
of different runs even generate in one batch. Each run's explorer gets an
:class:`AdapterView`: the ordinary engine interface, with requests routed through its
adapter, its own model version, and weight syncs that replace its adapter alone (the
synchronizer's broadcast sends the trainer's adapter, ``storage.lora.adapter_sync``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from roles.explorer.engines.base import EngineError, ReceivesInProcess, Sample
from schemas.config import InferenceModelConfig, LoraConfig


async def create_shared(cfg: InferenceModelConfig, slots: dict[str, LoraConfig],
                        gpus: list[tuple[int, ...]] | None = None) -> tuple[list[Any], dict[str, list[AdapterView]]]:
    """``cfg.engine_num`` engines serving one adapter per slot (run), and each slot's views
    of them. Only the transformers engine serves several adapters so far: vLLM's LoRA
    requests could (``max_loras``), but that path is not built, and says so."""
    if cfg.engine_type != "transformers":
        raise EngineError(f"explorer.rollout_model.engine_type: {cfg.engine_type!r} cannot be shared by a "
                          "sweep's runs yet; use transformers (a shared vLLM engine is not built)")
    from roles.explorer.engines.hf import HFEngine

    engines = []
    for i in range(cfg.engine_num):
        e = await asyncio.to_thread(HFEngine, cfg, f"hf-{i}", None, tuple(gpus[i]) if gpus else None)
        for slot, lc in slots.items():
            await asyncio.to_thread(e.add_adapter, slot, lc)
        engines.append(e)
    return engines, {slot: [AdapterView(e, slot) for e in engines] for slot in slots}


class AdapterView(ReceivesInProcess):
    """One run's adapter of a shared engine, behind the ordinary engine interface."""

    def __init__(self, engine: Any, slot: str) -> None:
        super().__init__()
        self.engine = engine
        self.slot = slot
        self.name = f"{engine.name}/{slot}"
        self.tokenizer = engine.tokenizer
        self.template_kwargs = engine.template_kwargs
        #: the whole engine's counts (the same list): its batches mix the runs' rows
        self.token_counts = engine.token_counts

    @property
    def model_version(self) -> int:
        return self.engine.slot_versions[self.slot]

    async def generate(self, prompt_ids: list[int] | None = None, *, prompt: str | None = None, n: int = 1,
                       truncate: bool = True, **sampling: Any) -> list[Sample]:
        return await self.engine.generate(prompt_ids, prompt=prompt, n=n, truncate=truncate,
                                          adapter=self.slot, **sampling)

    async def score(self, tokens: list[int], prompt_length: int) -> list[float]:
        return await self.engine.score(tokens, prompt_length, adapter=self.slot)

    async def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """The run's adapter, under the trainer's names (``...lora_A.default.weight``)."""
        from storage.lora import slot_tensor_name

        full = [k for k, _ in named_tensors if ".lora_" not in k]
        if full:
            raise EngineError(f"{self.name}: a shared engine takes each run's adapter alone, got base "
                              f"weights {full[:3]} (synchronizer.sync_method must be nccl)")
        await self.engine.update_adapter(
            self.slot, [(slot_tensor_name(k, self.slot), t) for k, t in named_tensors], version)

    async def load_checkpoint(self, path: str, version: int) -> None:
        raise EngineError(f"{self.name}: a shared engine loads adapters, not checkpoints of merged "
                          f"weights ({path}); synchronizer.sync_method must be nccl")

    async def close(self) -> None:
        """Nothing: the engine outlives each run (the sweep's host closes it)."""
        self._rx = None
