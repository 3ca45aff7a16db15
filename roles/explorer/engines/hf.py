"""Hugging Face transformers engine: the light fallback (no vLLM needed, starts in seconds).

Why it exists: vLLM takes 30 s to minutes to start on a shared CPU and is a large install; the
transformers engine gives the same interface for quick experiments, ``trinity debug`` and
machines without vLLM. Logprobs are ``log_softmax`` of the *raw* logits (``output_logits``),
not of ``out.scores`` (those are temperature/top-k processed), so they equal a teacher-forced
forward pass, as vLLM's default ``raw_logprobs`` do.

Generation runs one ``model.generate`` at a time, in a worker thread so the event loop keeps
serving the bus. Requests that arrive while one runs wait, and then run *together*: every
waiting request with the same sampling settings joins one left-padded batch (the ``n``
samples of each are rows of it), up to :data:`MAX_BATCH_ROWS` rows. A GRPO step's 16 tasks x 8
samples are then one call instead of 16 (measured on the quickstart: 217 -> 50-80 ms a step).
A request with a ``seed`` runs alone: the seed is the global torch RNG's.

Before each batch the engine waits while requests are still arriving (:data:`GATHER_S` without
a new one, at most :data:`GATHER_MAX_S`). Why: requests that come over HTTP (the OpenAI API)
arrive spread over a few milliseconds, and without the wait the first few started a batch of
their own while the rest waited a whole ``generate`` for the next one (32 agents measured as
batches of 4 + 28; a batch of 4 costs ~3/4 of one of 32).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import glob
import inspect
import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from roles.explorer.engines.base import (
    EngineError,
    Limits,
    ReceivesInProcess,
    Sample,
    check_sampling,
    rope_overrides,
)
from roles.runtime.cpu_tuning import cpu_dtype
from schemas.config import InferenceModelConfig, LoraConfig
from storage.hf_config import override_rope
from storage.shared_weights import copy_tensors

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The most rows (requests x their ``n``) one ``generate`` call batches.
MAX_BATCH_ROWS = 256
#: A batch starts once no request arrived for this long (seconds) ...
GATHER_S = 0.002
#: ... or this long after the batcher started waiting, whichever comes first.
GATHER_MAX_S = 0.02
#: peft's name for "no adapter" in a mixed adapter batch (a shared engine's base rows).
BASE = "__base__"
#: One row's result: response tokens, their log-probs, finish reason, top log-probs or None.
Row = tuple[list[int], list[float], str, list[dict[int, float]] | None]


@dataclass
class _Request:
    ids: list[int]
    n: int
    max_new: int
    sampling: dict[str, Any]
    done: asyncio.Future[tuple[list[Row], int]]
    adapter: str | None = None  # a sweep run's adapter in a shared engine (engines/shared.py)

    def key(self) -> Any:
        """Requests with the same key can share one ``generate`` call."""
        if self.sampling.get("seed") is not None:
            return id(self)
        s = {k: v for k, v in self.sampling.items() if k != "max_tokens"}
        return repr(sorted((k, str(v)) for k, v in s.items()))


class HFEngine(ReceivesInProcess):
    """A transformers ``AutoModelForCausalLM`` behind the rollout engine interface."""

    def __init__(self, cfg: InferenceModelConfig, name: str = "hf-0", lora: LoraConfig | None = None,
                 gpus: tuple[int, ...] | None = None, colocated: bool = False) -> None:
        """``colocated``: a trainer steps on the same GPU (``mode: colocate``), so the memory
        each batch's generation took goes back to the device after it."""
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if not cfg.model_path:
            raise EngineError("explorer.rollout_model.model_path: not set (nor model.model_path)")
        self.name = name
        self.cfg = cfg
        self.limits = Limits.from_config(cfg)
        # CPU: bfloat16 only where the CPU has it natively, and the trainer then computes in it too
        dtype = _DTYPES.get(cfg.dtype if torch.cuda.is_available() else cpu_dtype(cfg.dtype), torch.float32)
        # its GPU of the device plan (a position in this process's CUDA_VISIBLE_DEVICES)
        self.device = f"cuda:{gpus[0] if gpus else 0}" if torch.cuda.is_available() else "cpu"
        self.release = colocated and self.device != "cpu"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
            config = override_rope(AutoConfig.from_pretrained(cfg.model_path), **rope_overrides(cfg))
            self.model = AutoModelForCausalLM.from_pretrained(
                cfg.model_path, config=config, dtype=dtype).to(self.device).eval()
        except OSError as e:
            raise EngineError(f"model_path {cfg.model_path!r}: cannot load: {e}") from e
        if lora is not None:  # the trainer's adapter, so that a sync moves only its tensors
            from storage.lora import wrap

            self.model = wrap(self.model, lora).eval()
        self.use_template_settings(cfg)
        torch.manual_seed(cfg.seed)
        self._locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        #: per event loop (see _lock): the requests waiting for a batch, and the task running them
        self._waiting: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._batchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # generation runs on a thread of its own, never in asyncio's shared default pool:
        # workflow threads waiting for this engine's answers may fill that one
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        #: a shared engine's adapters (one per sweep run) and the version each has loaded
        self.slot_versions: dict[str, int] = {}

    def add_adapter(self, slot: str, lc: LoraConfig) -> None:
        """Serve one more run's adapter, as ``slot`` (a sweep's shared engine): requests that
        name it generate through it, rows of different adapters in one batch (peft's mixed
        adapter batches), and :meth:`update_adapter` replaces its tensors alone."""
        from storage.lora import add_slot

        self.model = add_slot(self.model, slot, lc).eval()
        self.slot_versions[slot] = 0

    async def update_adapter(self, slot: str, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Load adapter ``slot``'s new tensors (named as the engine's model names them). Holds
        the generation lock only for the copy: the other runs' generation waits at most the
        batch in flight plus this one adapter's load."""
        self._require_slot(slot)
        async with self._lock:
            self._copy_in(named_tensors, "update_adapter")
            self.slot_versions[slot] = version

    def _require_slot(self, slot: str) -> None:
        if slot not in self.slot_versions:
            raise EngineError(f"{self.name}: no adapter {slot!r} (serving {sorted(self.slot_versions)})")

    @property
    def _lock(self) -> asyncio.Lock:
        """One lock per event loop: the engine may outlive a loop (tests, ``trinity debug``),
        and an asyncio lock left held by a task of a closed loop must not block the next one."""
        return self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())

    async def generate(
        self, prompt_ids: list[int] | None = None, *, prompt: str | None = None, n: int = 1,
        truncate: bool = True, adapter: str | None = None, **sampling: Any,
    ) -> list[Sample]:
        """``adapter``: generate through that run's adapter (:meth:`add_adapter`)."""
        check_sampling(sampling)
        if adapter is not None:
            self._require_slot(adapter)
        if prompt_ids is None:
            if prompt is None:
                raise EngineError("generate: give prompt_ids or prompt")
            prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        ids, truncated = self.limits.fit_prompt(list(prompt_ids)) if truncate else (list(prompt_ids), False)
        max_new = self.limits.max_new_tokens(len(ids), sampling.get("max_tokens"))
        loop = asyncio.get_running_loop()
        req = _Request(ids, n, max_new, sampling, loop.create_future(), adapter)
        self._waiting.setdefault(loop, []).append(req)
        if loop not in self._batchers or self._batchers[loop].done():
            self._batchers[loop] = loop.create_task(self._run_batches(loop))
        out, version = await req.done
        return [
            Sample(
                tokens=ids + resp, prompt_length=len(ids), logprobs=lps,
                response_text=self.tokenizer.decode(resp, skip_special_tokens=True),
                prompt_truncated=truncated, response_truncated=reason == "length",
                finish_reason=reason, model_version=version, top_logprobs=tops,
            )
            for resp, lps, reason, tops in out
        ]

    async def _run_batches(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the waiting requests, those of one sampling key at a time, until none wait."""
        waiting = self._waiting[loop]
        while waiting:
            await _gather(waiting)
            key, rows, batch = waiting[0].key(), 0, []
            for r in list(waiting):
                if r.key() == key and (not batch or rows + r.n <= MAX_BATCH_ROWS):
                    batch.append(r)
                    rows += r.n
                    waiting.remove(r)
            batch = [r for r in batch if not r.done.cancelled()]
            if not batch:
                continue
            try:
                async with self._lock:
                    versions = [self.slot_versions[r.adapter] if r.adapter else self._version for r in batch]
                    out = await loop.run_in_executor(self._thread, self._generate_batch, batch)
            except Exception as e:  # noqa: BLE001 - the requests get the engine's error
                for r in batch:
                    if not r.done.done():
                        r.done.set_exception(e)
                continue
            for r, rows_out, version in zip(batch, out, versions, strict=True):
                if not r.done.done():
                    r.done.set_result((rows_out, version))

    def _generate_batch(self, batch: list[_Request]) -> list[list[Row]]:
        """One ``generate`` over every row of ``batch`` (left-padded); each request's rows,
        cut at its own ``max_tokens``."""
        limits = [r.max_new for r in batch for _ in range(r.n)]
        adapters = [r.adapter or BASE for r in batch] if self.slot_versions else None
        rows = self._generate([r.ids for r in batch], [r.n for r in batch], max(limits), batch[0].sampling,
                              limits, adapters)
        if self.release:
            torch.cuda.empty_cache()
        out, i = [], 0
        for r in batch:
            out.append(rows[i:i + r.n])
            i += r.n
        return out

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], repeats: list[int], max_new: int, s: dict[str, Any],
                  limits: list[int], adapters: list[str] | None = None) -> list[Row]:
        """Sample ``repeats[i]`` completions of ``prompts[i]`` (left-padded into one batch of
        rows, a prompt's rows next to each other); row ``j`` keeps at most ``limits[j]`` tokens.
        ``adapters[i]``: prompt ``i``'s adapter (a shared engine)."""
        temperature = float(s.get("temperature", 1.0))
        top_k = int(s.get("top_k", -1) or -1)
        eos = self.tokenizer.eos_token_id
        kw: dict[str, Any] = dict(
            max_new_tokens=max_new,
            min_new_tokens=int(s.get("min_tokens", self.limits.min_response_tokens) or 0),
            do_sample=temperature > 0,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos,
            eos_token_id=None if s.get("ignore_eos") else eos,
            repetition_penalty=float(s.get("repetition_penalty", self.cfg.repetition_penalty or 1.0)),
        )
        if temperature > 0:
            kw.update(temperature=temperature, top_p=float(s.get("top_p", 1.0)),
                      top_k=top_k if top_k > 0 else None)
        stops = s.get("stop")
        if adapters is not None:
            kw["adapter_names"] = [a for a, k in zip(adapters, repeats, strict=True) for _ in range(k)]
        if stops:  # stop early; the exact cut is made below (_stop_at)
            kw.update(stop_strings=[stops] if isinstance(stops, str) else list(stops), tokenizer=self.tokenizer)
        if s.get("seed") is not None:
            torch.manual_seed(int(s["seed"]))
        width = max(len(p) for p in prompts)
        inp = torch.full((len(prompts), width), kw["pad_token_id"], dtype=torch.long)
        mask = torch.zeros_like(inp)
        for j, p in enumerate(prompts):
            inp[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        rows = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(repeats))
        if width > 1 and len(rows) > len(prompts):  # some prompt has several rows: prefill it once
            kw["past_key_values"] = self._prefill(inp[:, :-1], mask[:, :-1], rows, adapters)
        inp, mask = inp[rows], mask[rows]
        prompts = [prompts[i] for i in rows.tolist()]
        out = self.model.generate(inp.to(self.device), attention_mask=mask.to(self.device), **kw)
        gen = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # (n, steps, vocab), raw
        all_lp = torch.log_softmax(logits, dim=-1)
        lp = all_lp.gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        k = int(s.get("top_logprobs") or 0)
        top = all_lp.topk(k, dim=-1) if k > 0 else None
        results = []
        for row in range(len(prompts)):
            toks = gen[row].tolist()[: limits[row]]
            reason = "length"
            if kw["eos_token_id"] is not None and eos in toks:
                toks = toks[: toks.index(eos) + 1]
                reason = "stop"
            cut = _stop_at(self.tokenizer, toks, s.get("stop"))
            if cut is not None:
                toks, reason = toks[:cut], "stop"
            tops = None
            if top is not None:
                tops = [dict(zip(top.indices[row, j].tolist(), top.values[row, j].tolist(), strict=True))
                        for j in range(len(toks))]
            results.append((toks, lp[row, : len(toks)].tolist(), reason, tops))
        # the batch computes width + steps positions per row, or width - 1 of them once per
        # prompt and the rest per row (prefilled); the rest of a row is padding (left of a
        # short prompt, after an early end)
        once = width - 1 if "past_key_values" in kw else 0
        self.token_counts[0] += len(repeats) * once + len(prompts) * (width - once + gen.shape[1])
        self.token_counts[1] += sum(len(p) for p in prompts) + sum(len(r[0]) for r in results)
        return results

    def _prefill(self, inp: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
                 adapters: list[str] | None) -> Any:
        """The key/value cache of each (left-padded) prompt, computed once and repeated to its
        ``rows``: ``generate`` then runs only the prompts' last token per row. Why: a group's
        ``n`` samples share their prompt, and prefilling it ``n`` times was most of a short
        response's generation (the trainer's prompt-once forward, in generation). Positions
        follow the mask as ``generate`` numbers them, so each row sees what it would without."""
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        kw: dict[str, Any] = {"adapter_names": adapters} if adapters is not None else {}
        if self._keeps_logits:
            kw["logits_to_keep"] = 1  # the logits are not used: skip the vocabulary projection
        out = self.model(input_ids=inp.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=pos.to(self.device), use_cache=True, **kw)
        cache = out.past_key_values
        cache.reorder_cache(rows.to(self.device))
        return cache

    @functools.cached_property
    def _keeps_logits(self) -> bool:
        """Whether the model's ``forward`` takes ``logits_to_keep`` (transformers' own do; a
        custom model's may not)."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return "logits_to_keep" in inspect.signature(base.forward).parameters

    async def score(self, tokens: list[int], prompt_length: int, adapter: str | None = None) -> list[float]:
        if not 0 < prompt_length < len(tokens):
            raise EngineError(f"{self.name}: score: prompt_length {prompt_length} of {len(tokens)} tokens")
        async with self._lock:
            return await asyncio.get_running_loop().run_in_executor(
                self._thread, self._score, tokens, prompt_length, adapter)

    @torch.no_grad()
    def _score(self, tokens: list[int], prompt_length: int, adapter: str | None = None) -> list[float]:
        inp = torch.tensor([tokens], device=self.device)
        kw = {"adapter_names": [adapter or BASE]} if self.slot_versions else {}
        logits = self.model(input_ids=inp, attention_mask=torch.ones_like(inp), **kw).logits[0, prompt_length - 1:-1]
        lp = torch.log_softmax(logits.float(), dim=-1)
        return lp.gather(-1, inp[0, prompt_length:].unsqueeze(-1)).squeeze(-1).tolist()

    async def update_weights(
        self, named_tensors: list[tuple[str, torch.Tensor]], version: int
    ) -> None:
        async with self._lock:
            self._copy_in(named_tensors, "update_weights")
            self._version = version

    def _copy_in(self, named_tensors: list[tuple[str, torch.Tensor]], what: str) -> None:
        """Copy named tensors into the model's own, after checking every name and shape."""
        state = dict(named_tensors)
        own = self.model.state_dict()
        unknown = sorted(k for k in state if k not in own)
        if unknown:
            raise EngineError(f"{self.name}: {what}: unknown tensor names {unknown[:5]}")
        for k, t in state.items():
            if own[k].shape != t.shape:
                raise EngineError(
                    f"{self.name}: {what}: {k} has shape {tuple(t.shape)}, "
                    f"the model's is {tuple(own[k].shape)}"
                )
        copy_tensors((own[k], t) for k, t in state.items())

    async def load_checkpoint(self, path: str, version: int) -> None:
        from safetensors.torch import load_file

        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise EngineError(f"{self.name}: load_checkpoint: no *.safetensors in {path}")
        named: list[tuple[str, torch.Tensor]] = []
        for f in files:  # off the event loop: a big checkpoint reads for seconds
            named.extend((await asyncio.to_thread(load_file, f)).items())
        await self.update_weights(named, version)

    async def close(self) -> None:
        self.model = None
        self._thread.shutdown(wait=False)


async def _gather(waiting: list[_Request]) -> None:
    """Return once ``waiting`` stopped growing for :data:`GATHER_S` of an idle event loop, or
    after :data:`GATHER_MAX_S`. A sleep that overran means the loop was busy (typically with the
    last batch's callers, about to ask again): that does not count as quiet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GATHER_MAX_S
    while loop.time() < deadline:
        seen, t0 = len(waiting), loop.time()
        await asyncio.sleep(GATHER_S)
        if len(waiting) == seen and loop.time() - t0 < 2 * GATHER_S:
            return


def _stop_at(tok: Any, toks: list[int], stop: str | list[str] | None) -> int | None:
    """Tokens to keep when a stop string appears in the decoded response: up to and including
    the token that completes the first stop string (vLLM keeps that token too; the API leaves
    the string out of the text). None when no stop string appears."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not stops:
        return None
    for j in range(len(toks)):
        text = tok.decode(toks[: j + 1], skip_special_tokens=True)
        if any(x in text for x in stops):
            return j + 1
    return None
