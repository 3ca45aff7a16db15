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

from roles.explorer.engines.base import EngineError, RolloutEngine, Sample
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


class AdapterView(RolloutEngine):
    """One run's adapter of a shared engine, behind the ordinary engine interface."""

    def __init__(self, engine: Any, slot: str) -> None:
        super().__init__()
        self.engine = engine
        self.slot = slot
        self.name = f"{engine.name}/{slot}"
        self.tokenizer = engine.tokenizer
        self.template_kwargs = engine.template_kwargs
        self._rx: Any = None

    @property
    def model_version(self) -> int:
        return self.engine.slot_versions[self.slot]

    @property
    def token_counts(self) -> list[int]:  # type: ignore[override]
        """The whole engine's counts: its batches mix the runs' rows."""
        return self.engine.token_counts

    @token_counts.setter
    def token_counts(self, value: list[int]) -> None:
        pass  # RolloutEngine.__init__ sets its own; the engine's are the ones that count

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

    async def init_weight_group(self, rdv: dict[str, Any], rank_offset: int, timeout: float) -> None:
        """This run's own broadcast group with its trainer (the other runs have theirs)."""
        from roles.synchronizer.weights import WeightReceiver
        from schemas.state import Rendezvous

        self._rx = WeightReceiver(Rendezvous.from_dict(rdv), rank_offset, timeout)
        await asyncio.to_thread(self._rx.connect)

    async def receive_weights(self) -> int:
        if self._rx is None:
            raise EngineError(f"{self.name}: receive_weights before init_weight_group")
        version, named = await asyncio.to_thread(self._rx.receive)
        await self.update_weights(named, version)
        return version

    async def close(self) -> None:
        """Nothing: the engine outlives each run (the sweep's host closes it)."""
        self._rx = None
