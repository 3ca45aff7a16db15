"""Runners: run tasks' workflows on the engines, with timeouts and retries, into groups.

A :class:`RunnerPool` owns ``runner_per_model`` runner slots per engine. A task with
``repeat_times`` R is split into sub-tasks of at most ``max_repeat_times_per_runner`` rollouts;
each sub-task runs on a free runner. A workflow that raises or exceeds ``max_timeout`` is
retried up to ``max_retry_times`` times and then recorded as failed with its error and task
id: the explorer never dies of a workflow. A task becomes one :class:`ExperienceGroup` only
when *all* its sub-tasks succeeded (no half groups).

``concurrent_mode`` decides how a non-repeatable workflow's R rollouts run inside one runner:
``sequential`` one after another, ``asynchronous`` as concurrent coroutines,
``multi-threading`` in threads. Sync workflows always run in a worker thread (so their
blocking model calls can hop onto this event loop). A hung *sync* workflow cannot be killed:
its thread is abandoned after the timeout and the task retried.

``dynamic_timeout`` (experimental in Trinity-RFT too) shortens the timeout to ``ratio`` times
the mean time of the sub-tasks that succeeded, once ``warmup_min_steps`` steps were seen:
one stuck rollout then costs a few typical task times instead of ``max_timeout``.
``runner_state_report_interval`` logs the pool every that many seconds (busy runners, the
longest-running tasks, successes and failures) for watching a slow run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from roles.explorer.engines.base import RolloutEngine
from roles.explorer.workflows.base import ModelHandle, Workflow
from roles.explorer.workflows.registry import get_workflow
from roles.runtime.core_share import ExplorerWork
from schemas.config import ExplorerConfig
from schemas.data import Experience, ExperienceGroup, Task, group_id

log = structlog.get_logger(__name__)
#: Most sync workflows running at once (threads are started as needed, so a high bound
#: costs nothing until used; a hung workflow's abandoned thread holds one).
WORKFLOW_THREADS = 512


@dataclass
class TaskResult:
    """What became of one task: a group, or the error after the last retry."""

    task: Task
    group: ExperienceGroup | None = None
    error: str | None = None
    attempts: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.group is not None


def dynamic_timeout(max_timeout: float, success_seconds: list[float], ratio: float) -> float:
    """``min(max_timeout, ratio * mean(success_seconds))``; ``max_timeout`` before any success."""
    if not success_seconds:
        return max_timeout
    return min(max_timeout, ratio * sum(success_seconds) / len(success_seconds))


@dataclass
class _Part:
    task: Task
    repeat: int
    offset: int
    experiences: list[Experience] = field(default_factory=list)


class RunnerPool:
    """Runner slots over a list of engines (round-robin, least busy first)."""

    def __init__(
        self,
        engines: list[RolloutEngine],
        cfg: ExplorerConfig,
        run_id: str,
        auxiliary: list[list[RolloutEngine]] | None = None,
        api: Any = None,
        teacher: bool = False,
    ) -> None:
        if not engines:
            raise ValueError("RunnerPool: no engines")
        self.engines = engines
        self.api = api  # the explorer's OpenAI API server (ModelHandle.get_openai_client)
        self.cfg = cfg
        self.run_id = run_id
        #: each auxiliary model's engines; a workflow gets one handle per model (round robin)
        self.auxiliary = auxiliary or []
        self.aux_apis: list[Any] = []  # their OpenAI API servers, when the explorer runs one
        self._aux_turn = itertools.count()
        #: score every training rollout with auxiliary model 0 (``Experience.teacher_logprobs``)
        self.teacher = teacher
        if teacher and not self.auxiliary:
            raise ValueError("explorer.auxiliary_models: the algorithm needs a teacher (auxiliary model 0)")
        self._slots: asyncio.Queue[RolloutEngine] = asyncio.Queue()
        for _ in range(cfg.runner_per_model):
            for e in engines:
                self._slots.put_nowait(e)
        for k, v in cfg.env_vars.items():
            os.environ[k] = str(v)
        self.timeout = float(cfg.max_timeout)
        self.failed = 0
        self.succeeded = 0
        self.steps_seen = 0  # the explorer counts its steps here (dynamic timeout warm-up)
        self._success_seconds: list[float] = []
        self._running: dict[int, tuple[str, float]] = {}  # id(part) -> (task id, start)
        # Sync workflows get threads of their own: in asyncio's default pool (cpu + 4
        # threads) they would cap concurrency at a handful of rollouts and take the threads
        # an engine needs to answer them (a deadlock). Threads start only when used.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=WORKFLOW_THREADS, thread_name_prefix="workflow")
        #: says when this process works, for a trainer that takes its cores while it idles
        self.work: ExplorerWork | None = None

    def current_timeout(self) -> float:
        """The timeout of the next workflow call (``max_timeout`` unless dynamic)."""
        dt = self.cfg.dynamic_timeout
        if not dt.enable or self.steps_seen < dt.warmup_min_steps:
            return self.timeout
        return dynamic_timeout(self.timeout, self._success_seconds[-1000:], dt.ratio)

    def state(self) -> dict[str, Any]:
        """Busy runners, the longest-running tasks, successes and failures (one log line)."""
        now = time.monotonic()
        running = sorted(((now - t0, tid) for tid, t0 in self._running.values()), reverse=True)
        return {"busy": f"{len(running)}/{self.size}", "succeeded": self.succeeded, "failed": self.failed,
                "timeout_s": round(self.current_timeout()),
                "longest": ", ".join(f"{tid} {age:.0f}s" for age, tid in running[:3]) or None}

    async def report_state(self, interval: float) -> None:
        """Log :meth:`state` every ``interval`` seconds (runs until cancelled)."""
        while True:
            await asyncio.sleep(interval)
            log.info("runners", **self.state())

    @property
    def size(self) -> int:
        return self.cfg.runner_per_model * len(self.engines)

    def _aux_engine(self, i: int) -> RolloutEngine:
        engines = self.auxiliary[i]
        return engines[next(self._aux_turn) % len(engines)]

    async def score_with_teacher(self, exps: list[Experience]) -> None:
        """Fill each experience's ``teacher_logprobs``: auxiliary model 0's log-probs of the
        tokens the policy sampled (on-policy distillation)."""

        async def one(e: Experience) -> None:
            lp = await self._aux_engine(0).score(np.asarray(e.tokens).tolist(), e.prompt_length)
            e.teacher_logprobs = np.asarray(lp, dtype=np.float32)

        await asyncio.gather(*(one(e) for e in exps if e.teacher_logprobs is None))

    # -- one workflow call -------------------------------------------------------------

    async def _call(self, engine: RolloutEngine, task: Task, repeat: int) -> list[Experience]:
        loop = asyncio.get_running_loop()
        cls = get_workflow(task.workflow)

        def make(r: int) -> Workflow:
            handle = ModelHandle(engine, loop, task.rollout_args, api=self.api,
                                 enable_history=self.cfg.rollout_model.enable_history)
            aux = [ModelHandle(self._aux_engine(i), loop, api=self.aux_apis[i] if self.aux_apis else None)
                   for i in range(len(self.auxiliary))]
            wf = cls(task=task, model=handle, auxiliary_models=aux)
            wf.repeat_times = r
            return wf

        def episode(exps: list[Experience], k: int) -> list[Experience]:
            """One rollout's experiences are turns of episode ``k`` (step-wise agents)."""
            for e in exps:
                e.episode = k
            return exps

        async def one(r: int, k: int = 0) -> list[Experience]:
            wf = make(r)
            try:
                if wf.is_async:
                    exps = list(await wf.run_async())
                else:
                    exps = list(await loop.run_in_executor(self._threads, wf.run))
            finally:
                wf.model.release()
            return episode(exps, k) if r == 1 else exps

        if cls.repeatable or repeat == 1:
            return await one(repeat)
        mode = self.cfg.concurrent_mode
        if mode == "sequential":
            out: list[Experience] = []
            for k in range(repeat):
                out.extend(await one(1, k))
            return out
        if mode == "asynchronous":
            parts = await asyncio.gather(*(one(1, k) for k in range(repeat)))
        else:  # multi-threading: run each rollout's whole workflow in its own thread

            def threaded(k: int) -> list[Experience]:
                wf = make(1)
                try:
                    if wf.is_async:
                        exps = list(asyncio.run_coroutine_threadsafe(wf.run_async(), loop).result())
                    else:
                        exps = list(wf.run())
                finally:
                    wf.model.release()
                return episode(exps, k)

            parts = await asyncio.gather(*(loop.run_in_executor(self._threads, threaded, k)
                                           for k in range(repeat)))
        return [e for p in parts for e in p]

    async def _run_part(self, part: _Part) -> tuple[str | None, int]:
        """Run one sub-task with retries; return (error or None, attempts)."""
        err = None
        tries = self.cfg.max_retry_times + 1
        for attempt in range(1, tries + 1):
            engine = await self._slots.get()
            timeout = self.current_timeout()
            t0 = time.monotonic()
            self._running[id(part)] = (part.task.task_id, t0)
            try:
                exps = await asyncio.wait_for(self._call(engine, part.task, part.repeat), timeout)
                if not exps:
                    raise RuntimeError("workflow returned no experiences")
                part.experiences = exps
                self._success_seconds.append(time.monotonic() - t0)
                return None, attempt
            except asyncio.TimeoutError:
                why = "max_timeout" if timeout >= self.timeout else "dynamic_timeout"
                err = f"timed out after {timeout:g}s ({why})"
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a workflow may raise anything
                err = f"{type(e).__name__}: {e}"
                log.debug("workflow_traceback", task_id=part.task.task_id, traceback=traceback.format_exc())
            finally:
                self._running.pop(id(part), None)
                self._slots.put_nowait(engine)
            log.warning("workflow_failed", task_id=part.task.task_id, attempt=f"{attempt}/{tries}", error=err)
        return err, tries

    # -- one task ----------------------------------------------------------------------

    def split(self, task: Task) -> list[_Part]:
        cap = self.cfg.max_repeat_times_per_runner or task.repeat_times
        parts, off = [], 0
        while off < task.repeat_times:
            r = min(cap, task.repeat_times - off)
            parts.append(_Part(task, r, off))
            off += r
        return parts

    async def run_task(self, task: Task) -> TaskResult:
        """All rollouts of ``task`` as one group, or the error (never raises for a workflow
        failure; cancellation propagates)."""
        t0 = time.monotonic()
        parts = self.split(task)
        with self.work.busy() if self.work is not None else contextlib.nullcontext():
            results = await asyncio.gather(*(self._run_part(p) for p in parts))
        attempts = max(a for _, a in results)
        errors = [e for e, _ in results if e]
        if errors:
            self.failed += 1
            log.error("task_failed", task_id=task.task_id, error=errors[0])
            return TaskResult(task, error=errors[0], attempts=attempts, seconds=time.monotonic() - t0)
        gid = group_id(task)
        exps: list[Experience] = []
        for p in parts:
            for i, e in enumerate(p.experiences):
                exps.append(
                    dataclasses.replace(
                        e, id=f"{gid}/{p.offset + i}", task_id=task.task_id, group_id=gid,
                        run_id=self.run_id,
                        episode=None if e.episode is None else p.offset + e.episode,
                    )
                )
        if self.teacher and not task.is_eval:
            try:
                await self.score_with_teacher(exps)
            except Exception as e:  # noqa: BLE001 - an engine may raise anything
                self.failed += 1
                log.error("task_failed", task_id=task.task_id, error=f"teacher: {e}")
                return TaskResult(task, error=f"teacher: {type(e).__name__}: {e}", attempts=attempts)
        version = min(e.model_version for e in exps)
        group = ExperienceGroup(
            group_id=gid, task_id=task.task_id, run_id=self.run_id, model_version=version,
            experiences=exps, is_eval=task.is_eval, taskset=task.taskset, task_index=task.index,
        )
        try:
            group.validate()
        except ValueError as e:
            self.failed += 1
            log.error("task_failed", task_id=task.task_id, error=f"invalid experiences: {e}")
            return TaskResult(task, error=f"invalid experiences: {e}", attempts=attempts)
        self.succeeded += 1
        return TaskResult(task, group=group, attempts=attempts, seconds=time.monotonic() - t0)
