"""External OpenAI-compatible server (``engine_type: external``): evaluation and benchmarks.

The URL and key come from the environment variables named by ``model.external_model``
(``base_url_env`` / ``api_key_env``), never from the config file. Such servers report tokens
as strings, so token ids are re-derived with the model's tokenizer when ``model_path`` is set
(or read from ``token_id:N`` strings when the server returns them, as vLLM's
``return_tokens_as_token_ids`` does); weights cannot be updated.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from roles.explorer.engines.base import EngineError, RolloutEngine, Sample, check_sampling
from schemas.config import ExternalModelConfig, InferenceModelConfig


class ExternalEngine(RolloutEngine):
    """Chat completions against an OpenAI-compatible API."""

    remote_chat = True

    def __init__(self, cfg: InferenceModelConfig, ext: ExternalModelConfig, name: str = "external-0",
                 *, base_url: str | None = None, api_key: str | None = None, token_ids: bool = False) -> None:
        """``base_url``/``api_key`` given: that server rather than the environment's (``trinity
        debug``'s inference model); ``token_ids``: the server is ours (or vLLM's), which returns
        the sampled token ids when asked (``return_tokens_as_token_ids``): exact tokens."""
        super().__init__()
        import openai

        base_url = base_url or os.environ.get(ext.base_url_env)
        if not base_url:
            raise EngineError(
                f"engine_type external: environment variable {ext.base_url_env} "
                "(model.external_model.base_url_env) is not set"
            )
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or os.environ.get(ext.api_key_env) or "EMPTY")
        self.token_ids = token_ids
        self.model_name = ext.model_name or cfg.model_path or "default"
        self.cfg = cfg
        self.name = name
        self.tokenizer = None
        if cfg.model_path and os.path.isdir(cfg.model_path):
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
            self.use_template_settings(cfg)  # the ids it re-derives follow the server's template

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if self.tokenizer else []

    async def chat(self, messages: list[dict[str, Any]], n: int = 1, **s: Any) -> list[Sample]:
        check_sampling(s)
        kw: dict[str, Any] = dict(model=self.model_name, messages=messages, n=n, logprobs=True)
        for k in ("temperature", "top_p", "max_tokens", "seed", "stop"):
            if s.get(k) is not None:
                kw[k] = s[k]
        if self.token_ids:
            kw["extra_body"] = {"return_tokens_as_token_ids": True}
        try:
            resp = await self.client.chat.completions.create(**kw)
        except Exception as e:
            raise EngineError(f"{self.name}: request to {self.client.base_url} failed: {e}") from e
        prompt = self.apply_chat_template(messages) if self.tokenizer else []
        out = []
        for ch in resp.choices:
            text = ch.message.content or ""
            content = (ch.logprobs.content or []) if ch.logprobs else []
            lps = [float(c.logprob) for c in content]
            if content and all(c.token.startswith("token_id:") for c in content):
                toks = [int(c.token.split(":", 1)[1]) for c in content]
            else:
                toks = self._ids(text)
            out.append(Sample(
                tokens=prompt + toks, prompt_length=len(prompt),
                logprobs=lps if len(lps) == len(toks) else [], response_text=text,
                response_truncated=ch.finish_reason == "length", finish_reason=ch.finish_reason,
            ))
        return out

    async def generate(self, prompt_ids: list[int] | None = None, *, prompt: str | None = None,
                       n: int = 1, truncate: bool = True, **s: Any) -> list[Sample]:
        if self.token_ids:  # a chat message is not the same prompt: say so rather than differ
            raise EngineError(f"{self.name}: the inference model at {self.client.base_url} serves chat "
                              "completions only; a workflow that calls generate() needs its own engine "
                              "(stop trinity debug --module inference_model)")
        if prompt is None:
            if prompt_ids is None or self.tokenizer is None:
                raise EngineError(f"{self.name}: generate needs a text prompt (no tokenizer)")
            prompt = self.tokenizer.decode(prompt_ids)
        return await self.chat([{"role": "user", "content": prompt}], n=n, **s)

    async def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        raise EngineError(f"{self.name}: an external server's weights cannot be updated")

    async def load_checkpoint(self, path: str, version: int) -> None:
        raise EngineError(f"{self.name}: an external server's weights cannot be updated")

    async def close(self) -> None:
        await self.client.close()
