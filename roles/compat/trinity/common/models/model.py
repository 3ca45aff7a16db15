"""Trinity-RFT's ``ModelWrapper``: what a plugin workflow calls, over our
:class:`roles.explorer.workflows.base.ModelHandle` (the same engine, history and OpenAI API
episode our own workflows use). Results are upstream's :class:`Experience` objects."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from roles.explorer.workflows.base import ModelHandle
from trinity.common.experience import Experience, from_ours


def _sampling(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Upstream passes its whole ``GenerationConfig`` (``**asdict(rollout_args)``): a None there
    means "the model's default", which here is leaving the argument out."""
    return {k: v for k, v in kwargs.items() if v is not None and k != "lora_request"}


def _only_t1(temperature: float | None) -> None:
    if temperature not in (None, 1.0):
        raise ValueError(f"ModelWrapper.logprobs: temperature {temperature}: only 1.0 is supported here")


class ModelWrapper:
    """The rollout (or an auxiliary) model, as upstream's workflows call it."""

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle

    # -- generation (sync forms block: they run in the runner's worker thread) -------------

    def chat(self, messages: list[dict], **kwargs: Any) -> list[Experience]:
        return [from_ours(e) for e in self.handle.chat(messages, **_sampling(kwargs))]

    async def chat_async(self, messages: list[dict], **kwargs: Any) -> list[Experience]:
        return [from_ours(e) for e in await self.handle.achat(messages, **_sampling(kwargs))]

    def generate(self, prompts: list[str], **kwargs: Any) -> list[Experience]:
        """Every prompt's completions, in order (upstream's takes a list of prompts)."""
        return [from_ours(e) for p in prompts for e in self.handle.generate(p, **_sampling(kwargs))]

    async def generate_async(self, prompts: list[str], **kwargs: Any) -> list[Experience]:
        done = await asyncio.gather(*(self.handle.agenerate(p, **_sampling(kwargs)) for p in prompts))
        return [from_ours(e) for exps in done for e in exps]

    async def logprobs_async(self, tokens: list[int], temperature: float | None = None) -> torch.Tensor:
        """Log-probs of ``tokens[1:]`` under the model (the first token has none)."""
        _only_t1(temperature)
        return torch.tensor(await self.handle.alogprobs(tokens), dtype=torch.float32)

    def logprobs(self, tokens: list[int], temperature: float | None = None) -> torch.Tensor:
        _only_t1(temperature)
        return torch.tensor(self.handle.logprobs(tokens), dtype=torch.float32)

    # -- the OpenAI API and history ---------------------------------------------------------

    def get_openai_client(self) -> Any:
        return self._named(self.handle.get_openai_client())

    def get_openai_async_client(self) -> Any:
        return self._named(self.handle.get_openai_async_client())

    def _named(self, client: Any) -> Any:
        """``client.model_path``: what to pass as ``model=``, the name the API serves
        (upstream's clients carry it, and its workflows send it)."""
        client.model_path = self.handle.served_model or self.model_path
        return client

    def extract_experience_from_history(self, clear_history: bool = True) -> list[Experience]:
        if not clear_history:
            raise ValueError("extract_experience_from_history(clear_history=False) is not supported here: "
                             "the history is handed over once")
        return [from_ours(e) for e in self.handle.extract_experience_from_history()]

    # -- what the model is ------------------------------------------------------------------

    @property
    def model_version(self) -> int:
        return self.handle.model_version

    @property
    def tokenizer(self) -> Any:
        return self.handle.tokenizer

    @property
    def model_path(self) -> str:
        return str(getattr(self.handle.tokenizer, "name_or_path", "") or "")

    @property
    def model_name(self) -> str | None:
        return self.model_path or None
