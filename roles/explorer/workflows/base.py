"""The workflow interface a user implements, and the model handle a workflow talks to.

A workflow gets one :class:`schemas.data.Task` and a :class:`ModelHandle` and returns
experiences (tokens, the sampled tokens' logprobs, reward). It may be synchronous (``run``) or
asynchronous (``run_async``); the runner decides how to execute it (``concurrent_mode``), sets
the ids (task, group, run) and publishes the group. A workflow never talks to the bus.

Why a handle and not the engine: the handle applies the task's ``rollout_args`` as defaults,
turns engine samples into :class:`Experience` objects (with truncation flags and model
version), records history for step-wise workflows, and offers both sync and async calls (sync
calls from a worker thread hop onto the explorer's event loop, where the engine lives).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import numpy as np

from roles.explorer.engines.base import RolloutEngine, Sample
from schemas.data import Experience, Task


def sample_to_experience(s: Sample, **extra: Any) -> Experience:
    """One engine sample as an Experience (ids are filled in by the runner)."""
    r = len(s.tokens) - s.prompt_length
    return Experience(
        id=uuid.uuid4().hex,
        task_id="",
        group_id="",
        run_id="",
        tokens=np.asarray(s.tokens, dtype=np.int32),
        prompt_length=s.prompt_length,
        logprobs=np.asarray(s.logprobs, dtype=np.float32) if len(s.logprobs) == r else None,
        action_mask=np.ones(r, dtype=bool),
        model_version=s.model_version,
        prompt_truncated=s.prompt_truncated,
        response_truncated=s.response_truncated,
        prompt_text=s.prompt_text,
        response_text=s.response_text,
        info={"finish_reason": s.finish_reason or ""},
        **extra,
    )


class ModelHandle:
    """What a workflow sees of a rollout engine: ``chat``/``generate`` returning Experiences.

    ``achat``/``agenerate`` are the async forms; ``chat``/``generate`` block, and must be
    called from a worker thread (sync workflows always run in one), never from the event loop.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        loop: asyncio.AbstractEventLoop,
        defaults: dict[str, Any] | None = None,
        enable_history: bool = False,
        api: Any = None,
    ) -> None:
        self.engine = engine
        self.loop = loop
        self.defaults = {k: v for k, v in (defaults or {}).items() if k != "n"}
        self.enable_history = enable_history
        self.history: list[Experience] = []
        self.api = api  # the explorer's roles.explorer.api.ApiServer, when it runs one
        self._episode: str | None = None

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_version(self) -> int:
        return self.engine.model_version

    def _record(self, exps: list[Experience]) -> list[Experience]:
        if self.enable_history:
            self.history.extend(exps)
        return exps

    async def achat(self, messages: list[dict[str, Any]], n: int = 1, **kw: Any) -> list[Experience]:
        samples = await self.engine.chat(messages, n=n, **{**self.defaults, **kw})
        return self._record([sample_to_experience(s, messages=list(messages)) for s in samples])

    async def agenerate(self, prompt: str | list[int], n: int = 1, **kw: Any) -> list[Experience]:
        args = {**self.defaults, **kw}
        if isinstance(prompt, str):
            samples = await self.engine.generate(prompt=prompt, n=n, **args)
        else:
            samples = await self.engine.generate(list(prompt), n=n, **args)
        return self._record([sample_to_experience(s) for s in samples])

    def _blocking(self, coro: Any) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError(
                "ModelHandle.chat/generate block; an async workflow must use achat/agenerate"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def chat(self, messages: list[dict[str, Any]], n: int = 1, **kw: Any) -> list[Experience]:
        return self._blocking(self.achat(messages, n=n, **kw))

    def generate(self, prompt: str | list[int], n: int = 1, **kw: Any) -> list[Experience]:
        return self._blocking(self.agenerate(prompt, n=n, **kw))

    async def alogprobs(self, tokens: list[int]) -> list[float]:
        """The model's log-prob of each of ``tokens[1:]`` given the ones before it."""
        return await self.engine.score(list(tokens), 1)

    def logprobs(self, tokens: list[int]) -> list[float]:
        return self._blocking(self.alogprobs(tokens))

    def extract_history(self) -> list[Experience]:
        """Experiences recorded since the last call (``enable_history``), and clear them."""
        out, self.history = self.history, []
        return out

    # -- the OpenAI API (``explorer.rollout_model.enable_openai_api``) ---------------------

    def _on_loop(self, fn: Any) -> Any:
        """``fn()`` on the explorer's loop (the episode book is the loop's), from any thread."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return fn()

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result()

    def _episode_url(self) -> str:
        if self.api is None:
            raise RuntimeError(
                "get_openai_client: the explorer serves no OpenAI API; set "
                "explorer.rollout_model.enable_openai_api: true"
            )
        if self._episode is None:
            self._episode = self._on_loop(lambda: self.api.book.own(self, self.engine, self.defaults))
        return f"{self.api.url}/v1/episodes/{self._episode}"

    @property
    def served_model(self) -> str | None:
        """The name this handle's OpenAI API serves: what a request's ``model`` must say (None
        without an API)."""
        return self.api.model_name if self.api is not None else None

    def get_openai_client(self) -> Any:
        """An ``openai.OpenAI`` client on an episode of this task run: every completion it
        gets is recorded (prompt and response token ids, log-probs, model version) for
        :meth:`extract_experience_from_history`. For sync workflows (a worker thread)."""
        import openai

        return openai.OpenAI(base_url=self._episode_url(), api_key=self.api.cfg.api_key or "EMPTY")

    def get_openai_async_client(self) -> Any:
        """An ``openai.AsyncOpenAI`` client on the same episode (for async workflows)."""
        import openai

        return openai.AsyncOpenAI(base_url=self._episode_url(), api_key=self.api.cfg.api_key or "EMPTY")

    def extract_experience_from_history(self) -> list[Experience]:
        """Experiences recorded since the last call, and clear them: this handle's own calls
        (``enable_history``) then the OpenAI clients' calls (one per call, or merged with
        ``explorer.openai_api.enable_concatenated_multi_turn``). Trinity-RFT's name."""
        out = self.extract_history()
        if self._episode is not None:
            eid = self._episode
            out += self._on_loop(lambda: self.api.book.take(eid))
        return out

    def release(self) -> None:
        """Forget this handle's API episode (the runner calls it when the workflow ends)."""
        if self._episode is not None and self.api is not None:
            eid, self._episode = self._episode, None
            self._on_loop(lambda: self.api.book.release(eid))


class Workflow:
    """Base of every workflow. Subclasses implement ``run`` (sync) or ``run_async`` (async,
    set ``is_async = True``).

    ``repeatable = True`` means the workflow produces ``self.repeat_times`` rollouts in one
    call (e.g. by asking the engine for ``n`` samples), which is the fast path; otherwise the
    runner calls it ``repeat_times`` times with ``repeat_times = 1``.
    """

    is_async: bool = False
    repeatable: bool = True
    #: Whether a task row must carry the prompt column (``format.prompt_key``): False for an
    #: environment workflow that writes its own prompt from the row's other columns.
    reads_prompt: bool = True
    #: How many ``explorer.auxiliary_models`` it talks to (a judge: 1); checked before start.
    auxiliary_required: int = 0

    def __init__(
        self,
        task: Task,
        model: ModelHandle,
        auxiliary_models: list[ModelHandle] | None = None,
    ) -> None:
        self.task = task
        self.model = model
        self.auxiliary_models = auxiliary_models or []
        self.repeat_times = task.repeat_times
        self.args = dict(task.workflow_args)
        # a stdlib logger, unlike ours (structlog): upstream's workflows call it with %-style
        # arguments (``self.logger.info("... %s", x)``); its lines land in the same role log
        self.logger = logging.getLogger(f"trinity.workflow.{type(self).__name__}")
        problems = self.check_args(self.args)
        if problems:  # a row's own workflow_args, or a workflow the config check did not see
            raise ValueError(f"task {task.task_id}: workflow_args.{problems[0]}")

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> list[str]:
        """What is wrong with ``workflow_args`` for this workflow, one line per setting
        (``name: why``). The config check calls it before start, so a wrong setting is refused
        there rather than failing every task; none by default."""
        return []

    @property
    def rollout_args(self) -> dict[str, Any]:
        return {k: v for k, v in self.task.rollout_args.items() if k != "n"}

    def run(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__}: implement run() or run_async()")

    async def run_async(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__}: implement run_async() (is_async=True)")
