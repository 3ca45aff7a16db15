"""Trinity-RFT's ``Task`` and ``Workflow``, and :class:`UpstreamWorkflow`, which runs a workflow
written for them inside our explorer's runner.

Upstream's runner builds a workflow as ``cls(task=Task, model=ModelWrapper,
auxiliary_models=[ModelWrapper])`` and calls ``run()`` (or ``await run_async()``); a
``can_repeat`` workflow is told ``set_repeat_times(n, run_id_base)`` first and makes all ``n``
rollouts in one call. :class:`UpstreamWorkflow` is one of our workflows doing exactly that
with our task, engine and auxiliary models, and hands the experiences back as ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roles.explorer.workflows.base import Workflow as OurWorkflow
from schemas.config import FormatConfig, GenerationConfig
from schemas.data import Experience as OurExperience
from schemas.data import Task as OurTask
from trinity.common.experience import Experience, to_ours
from trinity.common.models.model import ModelWrapper
from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.utils.log import get_logger
from trinity.utils.registry import where


@dataclass
class Task:
    """One task as upstream's workflows read it: the row (``raw_task``), the taskset's format,
    rollout, workflow and reward settings, and the reward class."""

    workflow: type | None = None
    repeat_times: int | None = None
    format_args: FormatConfig = field(default_factory=FormatConfig)
    rollout_args: GenerationConfig = field(default_factory=GenerationConfig)
    workflow_args: dict = field(default_factory=dict)
    reward_fn_args: dict = field(default_factory=dict)
    is_eval: bool = False
    reward_fn: type | None = None
    raw_task: dict | None = None
    batch_id: int | str = ""
    task_id: int | str = ""
    index: dict = field(default_factory=dict)

    def to_workflow(self, model: ModelWrapper, auxiliary_models: list[ModelWrapper] | None = None) -> Workflow:
        return self.workflow(task=self, model=model, auxiliary_models=auxiliary_models)  # type: ignore[misc]

    @property
    def task_desc(self) -> str | None:
        return (self.raw_task or {}).get(self.format_args.prompt_key)

    @property
    def truth(self) -> str | None:
        return (self.raw_task or {}).get(self.format_args.response_key)

    def to_dict(self) -> dict:
        return self.raw_task or {}


def from_our_task(task: OurTask, workflow: type, repeat_times: int) -> Task:
    """Our task as upstream's, ``repeat_times`` rollouts of it (``rollout_args.n`` too)."""
    fmt = {k: v for k, v in task.format.items() if k in FormatConfig.model_fields}
    gen = {k: v for k, v in task.rollout_args.items() if k in GenerationConfig.model_fields and k != "n"}
    return Task(workflow=workflow, repeat_times=repeat_times, format_args=FormatConfig(**fmt),
                rollout_args=GenerationConfig(**gen, n=repeat_times), workflow_args=dict(task.workflow_args),
                reward_fn_args=dict(task.reward_fn_args), is_eval=task.is_eval,
                reward_fn=REWARD_FUNCTIONS.get(task.reward_fn) if task.reward_fn else None,
                raw_task=dict(task.raw), task_id=task.task_id, index={"index": task.index, "taskset": task.taskset})


class Workflow:
    """Base of a workflow written for Trinity-RFT: ``run()`` (or ``run_async()`` with
    ``is_async = True``) returns the experiences. ``can_repeat``: one call makes
    ``self.repeat_times`` rollouts (``set_repeat_times``); else it is called once per rollout.
    ``can_reset``/``reset`` are accepted; a fresh workflow is built for every task here."""

    can_reset: bool = False
    can_repeat: bool = False
    is_async: bool = False

    def __init__(self, *, task: Task, model: ModelWrapper, auxiliary_models: list[ModelWrapper] | None = None) -> None:
        self.task = task
        self.model = model
        self.auxiliary_model_wrappers = auxiliary_models
        self._clients: list[Any] | None = None
        self.repeat_times = task.repeat_times or 1
        self.run_id_base = 0
        self.logger = get_logger(type(self).__module__)

    @property
    def auxiliary_models(self) -> list[Any] | None:
        """OpenAI clients of the auxiliary models (async ones for an async workflow), made on
        first use: an auxiliary model serves the API only with its ``enable_openai_api``."""
        if self._clients is None and self.auxiliary_model_wrappers:
            make = "get_openai_async_client" if self.is_async else "get_openai_client"
            self._clients = [getattr(m, make)() for m in self.auxiliary_model_wrappers]
        return self._clients

    @auxiliary_models.setter
    def auxiliary_models(self, clients: list[Any] | None) -> None:
        self._clients = clients

    @property
    def resettable(self) -> bool:
        return type(self).can_reset

    @property
    def repeatable(self) -> bool:
        return type(self).can_repeat

    @property
    def asynchronous(self) -> bool:
        return type(self).is_async

    @classmethod
    def as_our_workflow(cls, name: str) -> type[OurWorkflow]:
        """This class as one of our workflows: how a config naming it by import path
        (``default_workflow_type: my_pkg.module.MyWorkflow``) runs it."""
        return adapter(name, cls, f"workflow {name!r} ({where(cls)})")

    def reset(self, task: Task) -> None:
        raise NotImplementedError(f"{type(self).__name__}: can_reset is set, implement reset()")

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        raise NotImplementedError(f"{type(self).__name__}: can_repeat is set, implement set_repeat_times()")

    def run(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__}: implement run() (or run_async() with is_async = True)")

    async def run_async(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__}: implement run_async() (is_async = True)")


class UpstreamWorkflow(OurWorkflow):
    """One of our workflows running a Trinity-RFT workflow class (:attr:`upstream`); made per
    registered class by :func:`adapter`."""

    upstream: type[Workflow]
    owner: str = ""
    #: its row is the plugin's to read (raw_task), whatever columns it has
    reads_prompt = False

    def _build(self) -> Workflow:
        task = from_our_task(self.task, self.upstream, self.repeat_times)
        aux = [ModelWrapper(h) for h in self.auxiliary_models] or None
        wf = self.upstream(task=task, model=ModelWrapper(self.model), auxiliary_models=aux)
        if self.upstream.can_repeat:
            wf.set_repeat_times(self.repeat_times, 0)
        return wf

    def _ours(self, exps: Any, version: int) -> list[OurExperience]:
        if not isinstance(exps, (list, tuple)):
            raise TypeError(f"{self.owner}: run() returned {type(exps).__name__}, not a list of experiences")
        out = [to_ours(x, f"{self.owner}: experience {i}") for i, x in enumerate(exps)]
        tok = self.model.tokenizer
        for e in out:  # the guide's Experience(tokens=..., ...) keeps no text nor version: fill them in
            e.model_version = e.model_version or version  # the weights this task ran on
            if tok is not None and e.prompt_text is None:
                e.prompt_text = tok.decode(e.tokens[:e.prompt_length].tolist())
            if tok is not None and e.response_text is None:
                e.response_text = tok.decode(e.tokens[e.prompt_length:].tolist())
        return out

    def run(self) -> list[OurExperience]:
        version = self.model.model_version
        return self._ours(self._build().run(), version)

    async def run_async(self) -> list[OurExperience]:
        version = self.model.model_version
        return self._ours(await self._build().run_async(), version)


def adapter(name: str, cls: type[Workflow], owner: str) -> type[OurWorkflow]:
    """Our workflow class for ``cls``: sync or async and repeatable as it says."""
    return type(f"Upstream{cls.__name__}", (UpstreamWorkflow,), {
        "upstream": cls, "owner": owner, "is_async": bool(cls.is_async), "repeatable": bool(cls.can_repeat),
        "__doc__": f"{owner}, run through trinity's plugin API"})


# -- upstream's built-in single-turn workflows, for plugins that subclass them -----------------
# (the names a config gives, simple_workflow and the rest, run our own classes; these exist so
# that a user's subclass, which overrides reset/format_messages/run, finds the hooks it expects)


class BaseSimpleWorkflow(Workflow):
    """One prompt, ``repeat_times`` samples, each scored by the task's reward class: the hooks
    are upstream's (``reset`` reads the task, ``format_messages`` builds the chat,
    ``rollout_args`` the sampling arguments); the prompts and rewards are ours."""

    #: the reward (a registered name) when the taskset names none
    default_reward: str | None = None

    def __init__(self, *, task: Task, model: ModelWrapper, auxiliary_models: list[ModelWrapper] | None = None) -> None:
        self.reset(task)
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    def reset(self, task: Task) -> None:
        self.format_args = task.format_args
        self.system_prompt = task.format_args.system_prompt
        self.reply_prefix = task.format_args.reply_prefix
        self.workflow_args = task.workflow_args
        self.reward_fn_args = task.reward_fn_args
        self.raw_task = task.raw_task
        self.task_desc = task.task_desc
        self.truth = task.truth
        reward = task.reward_fn or (REWARD_FUNCTIONS.get(self.default_reward) if self.default_reward else None)
        if reward is None:
            raise ValueError(f"{type(self).__name__}: no reward function (set default_reward_fn_type)")
        self.reward_fn = reward(**self.reward_fn_args)

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        self.repeat_times = repeat_times
        self.task.rollout_args.n = repeat_times
        self.run_id_base = run_id_base

    @property
    def rollout_args(self) -> dict[str, Any]:
        return self.task.rollout_args.model_dump()

    def format_messages(self) -> list[dict[str, Any]]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": self.task_desc})
        if self.reply_prefix:
            messages.append({"role": "assistant", "content": self.reply_prefix})
        return messages

    def reward_kwargs(self, response: Experience) -> dict[str, Any]:
        """What the reward class is called with besides ``response`` and ``truth``."""
        return {}

    def score(self, responses: list[Experience]) -> list[Experience]:
        for i, r in enumerate(responses):
            scores = self.reward_fn(response=r.response_text, truth=self.truth, **self.reward_kwargs(r))
            r.metrics.update(scores)
            r.reward = sum(scores.values())
            r.eid.run = i + self.run_id_base
        return responses


class SimpleWorkflow(BaseSimpleWorkflow):
    can_reset = True
    can_repeat = True

    def run(self) -> list[Experience]:
        return self.score(self.model.chat(self.format_messages(), **self.rollout_args))


class AsyncSimpleWorkflow(BaseSimpleWorkflow):
    can_reset = True
    can_repeat = True
    is_async = True

    async def run_async(self) -> list[Experience]:
        return self.score(await self.model.chat_async(self.format_messages(), **self.rollout_args))


class MathWorkflow(SimpleWorkflow):
    """``math_reward`` and its ``<think>``/``<answer>`` system prompt by default."""

    default_reward = "math_reward"

    def reset(self, task: Task) -> None:
        super().reset(task)
        if task.reward_fn is None and self.system_prompt is None:
            from roles.explorer.workflows.math import THINK_SYSTEM_PROMPT

            self.system_prompt = THINK_SYSTEM_PROMPT


class AsyncMathWorkflow(AsyncSimpleWorkflow, MathWorkflow):
    pass
