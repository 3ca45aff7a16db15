"""Mode ``explore`` (and both/colocate): tasks in, experience groups out, one step at a time.

One step = ``buffer.batch_size`` tasks from the taskset (resumable cursor in the run's KV),
each run by the runner pool into one :class:`ExperienceGroup` published on the ``exp``
stream the moment it is complete. The tasks go through the run's task queue
(``roles/explorer/queue.py``), so any number of explorer processes can share a run: every one
works the queue (:func:`explore`), and the one holding the lead (``roles/explorer/lease.py``)
also reads the taskset, cuts the steps and does what follows (:class:`Leader`). Before every
step the sync client decides whether the explorer may go on (it waits when it is too far
ahead of the trainer) and loads new weights when a sync is due. Evaluation runs at startup
and every ``eval_interval`` steps. SIGTERM stops taking tasks, lets the step in flight
finish for a short grace period, then abandons it: a group is published whole or not at all,
and the cursor only moves past fully finished steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import structlog

import bus
from roles.explorer.core import CURSOR_KEY, Explorer, ExplorerStats, SyncClient
from roles.explorer.eval import evaluate, group_metrics
from roles.explorer.feedback import FeedbackInbox
from roles.explorer.lease import (
    JOIN_KEY,
    LEASE_S,
    RENEW_S,
    Lease,
    LeaseLost,
    check_joining,
    join_fingerprint,
)
from roles.explorer.queue import TaskQueue, TaskWorker
from roles.explorer.runner import TaskResult
from roles.explorer.workflows.registry import reads_prompt
from roles.runtime.signals import until_stopped
from schemas.config import TrinityConfig
from schemas.data import Metric, group_id
from schemas.modes import MODES
from schemas.state import Cursor, JoinSettings
from storage.checkpoints import write_meta
from storage.juicer import run_task_pipeline
from storage.scheduler import TaskScheduler, scheduler_from_config

log = structlog.get_logger(__name__)

#: Seconds a step waits for the buffer's verdict on its groups before filling dropped ones.
FILL_WAIT_S = 60.0
#: Per-taskset rollout metrics of a mixed run (``<taskset>/<metric>``).
TASKSET_METRICS = ("tasks", "reward_mean", "accuracy", "groups_with_signal", "response_length_mean")


def needs_feedback(cfg: TrinityConfig) -> bool:
    """Whether the leader reads the buffer's feedback: a taskset's selector learns from pass
    rates, or dropped groups are replaced (``drop_equal_reward_groups`` with ``fill``)."""
    return cfg.data_processor.experience_pipeline.fill_rounds() > 0 or any(
        ts.task_selector.selector_type == "difficulty_based" for _, ts in cfg.buffer.explorer_input.training())


def over_rollout_minimum(n: int, cfg: TrinityConfig) -> int:
    """Tasks a step waits for: all ``n``, or ``ceil((1 - ratio) * n)`` (at least 1) with
    over-rollout under a dynamic sync style."""
    ratio = cfg.explorer.over_rollout.ratio
    if ratio <= 0 or cfg.synchronizer.sync_style == "fixed" or n == 0:
        return n
    return max(1, math.ceil((1 - ratio) * n))


async def explore(ex: Explorer) -> ExplorerStats:
    """Every explorer process of a run: work the task queue, and lead the run
    (:class:`Leader`) once this process holds the lead. Another explorer leads already:
    this one must be of the same run's config (else ValueError, before it takes a task) and
    takes the newest checkpoint, or pulls a broadcast of the trainer's weights, before a task
    that needs newer weights than it holds."""
    cfg = ex.cfg
    sync = await ex.open()
    lease = Lease(ex.state, ex.me)
    leading = await lease.try_take()
    if not leading and cfg.synchronizer.sync_method == "nccl" and MODES[cfg.mode].weights == "live":
        # a lease nobody renews is this role's predecessor's, killed on another host before
        # it could give it up (under a broadcast a run mostly has one explorer): it expires
        # within LEASE_S; a renewed one is a live leader's, which this process assists
        if not await lease.renewed():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(lease.acquire(), LEASE_S + RENEW_S)
                leading = True
    if leading:
        await ex.state.put(JOIN_KEY, JoinSettings(join_fingerprint(cfg)))
        ex.beat(cfg.explorer.name)
    else:
        check_joining(cfg, await ex.state.get(JOIN_KEY))
        log.info("explorer_joins_run", explorer=ex.me, run=cfg.run_id, why="another explorer leads")
        ex.beat(ex.me)  # a helper beats under its process name
        sync.assist(ex.me)

    async def catch_up(floor: int) -> int:  # before a task that needs newer weights
        version = await sync.catch_up(ex.sync_engines, floor)
        ex.beat()
        return version

    worker = TaskWorker(cfg, ex.nc, ex.pub, ex.pool.run_task, ex.pool.size, ex.me, catch_up, ex.stats)
    stop_work = asyncio.Event()
    work = asyncio.create_task(worker.run(stop_work, ex.shutdown_grace))
    forward = asyncio.create_task(_forward(ex.stop, stop_work))
    lead = asyncio.create_task(_lead(ex, lease, sync, leading))
    try:
        done, _ = await asyncio.wait({work, lead}, return_when=asyncio.FIRST_COMPLETED)
        if work in done and work.exception() is not None:  # the worker failed: the process ends
            await bus.stop_tasks(lead)
        else:
            await lead  # the run is over, or ``stop`` (the lead handles it)
            stop_work.set()
        await work
    finally:
        await bus.stop_tasks(forward, lead, work)
        with contextlib.suppress(Exception):  # the trainer drops this process's group
            await sync.leave()
        if ex.stats.interrupted:  # a finished run keeps the lead until its stage ends
            await lease.release()
    return ex.stats


async def _lead(ex: Explorer, lease: Lease, sync: SyncClient, leading: bool) -> None:
    """Wait for the lead (a helper waits until the run ends or the leader is gone), then run
    the steps while renewing it."""
    if not leading:
        ok, _ = await until_stopped(lease.acquire(), ex.stop)
        if not ok:
            ex.stats.interrupted = True
            return
        await ex.state.put(JOIN_KEY, JoinSettings(join_fingerprint(ex.cfg)))
        await sync.take_lead()
    ex.beat(ex.cfg.explorer.name)
    keep = asyncio.create_task(lease.keep())
    done = asyncio.create_task(Leader(ex).run(sync))
    try:
        await asyncio.wait({keep, done}, return_when=asyncio.FIRST_COMPLETED)
        if keep.done():  # lost the lead: another explorer leads now; this process ends
            raise keep.exception() or LeaseLost("the lease keeper stopped")  # (a supervisor restarts it)
        await done
    finally:
        await bus.stop_tasks(keep, done)


async def _forward(src: asyncio.Event, dst: asyncio.Event) -> None:
    await src.wait()
    dst.set()


class Leader:
    """The leading explorer's steps: read the taskset, queue each step's tasks, wait for
    their results, save the cursor, report, sync, evaluate; at the end take the final
    weights. A step's tasks are saved in the cursor before they are queued, so a restarted
    leader re-runs that very step; the selectors get the buffer's feedback only just before
    a step is picked."""

    def __init__(self, ex: Explorer) -> None:
        self.ex, self.cfg = ex, ex.cfg
        self.queue: TaskQueue | None = None
        self.tasks_of: TaskScheduler | None = None
        self.inbox: FeedbackInbox | None = None
        self.done_from = 1  # the first unread ``done`` sequence
        self._counted = [0, 0]  # engines' token_counts at the last step report

    async def run(self, sync: SyncClient) -> ExplorerStats:
        ex, cfg, name = self.ex, self.cfg, self.cfg.explorer.name
        if cfg.data_processor.task_pipeline is not None:  # done by the launcher; not when started alone
            await asyncio.to_thread(run_task_pipeline, cfg)
        tasks_of = scheduler_from_config(cfg, reads_prompt)
        saved = await ex.state.get(CURSOR_KEY)
        in_flight = None
        if saved:
            tasks_of.load_state_dict(saved.reader or {})
            ex.step, in_flight = saved.step, saved.batch
            log.info("resuming", step=ex.step, offset=tasks_of.offset, step_in_flight=bool(in_flight))
        self.queue = TaskQueue(ex.nc, cfg, ex.pub)
        self.done_from = (saved.done_from or 1) if saved else 1
        await self.queue.start(self.done_from)
        inbox = None
        if needs_feedback(cfg):
            inbox = FeedbackInbox(self.queue.js, cfg.run_id, track_kept=cfg.data_processor.experience_pipeline.fill_rounds() > 0)
            inbox.start((saved.feedback_from or 1) if saved else 1)
        self.inbox, self.tasks_of = inbox, tasks_of
        version = ex.engines[0].model_version
        await ex.state.set_model_version(name, version)
        every_s = cfg.explorer.runner_state_report_interval
        report = asyncio.create_task(ex.pool.report_state(every_s)) if every_s > 0 else None
        try:
            if cfg.explorer.eval_on_startup and ex.step == 0:
                await until_stopped(evaluate(cfg, ex.pool, 0, ex.report), ex.stop)
            while not ex.stop.is_set() and (in_flight or not tasks_of.exhausted):
                ok, _ = await until_stopped(sync.before_step(ex.step, ex.sync_engines), ex.stop)
                if not ok:
                    break
                if ex.engines[0].model_version != version:
                    version = ex.engines[0].model_version
                    await ex.state.set_model_version(name, version)
                t0 = time.monotonic()
                if in_flight:
                    tasks, in_flight = tasks_of.rebuild(in_flight), None
                else:
                    if inbox is not None:
                        inbox.apply(tasks_of)
                    tasks = tasks_of.next_batch()
                    await self._save_cursor(batch=tasks)
                finished, results = await until_stopped(self._step(tasks), ex.stop, ex.shutdown_grace)
                if not finished:  # the cursor holds the step: a restart re-runs it
                    ex.stats.interrupted = True
                    log.warning("step_abandoned", step=ex.step + 1, why="SIGTERM; nothing half published")
                    break
                ex.step += 1
                ex.stats.steps += 1
                ex.pool.steps_seen = ex.step
                ex.beat()
                self.done_from = await self.queue.next_done_seq()
                await self._save_cursor()
                await self._step_metrics(results, time.monotonic() - t0)
                await sync.after_step(ex.step)
                every = cfg.explorer.eval_interval
                # after the last step _finish evaluates the final weights: an interval
                # evaluation here would rate the weights before them, under the same step
                last = tasks_of.exhausted
                if every > 0 and ex.step % every == 0 and not last and cfg.buffer.explorer_input.eval_tasksets:
                    await until_stopped(evaluate(cfg, ex.pool, ex.step, ex.report), ex.stop)
            await ex.pub.flush()
            if ex.stop.is_set():
                ex.stats.interrupted = True
            else:
                await self._finish(sync)
        finally:
            await bus.stop_tasks(report)
            await self.queue.close()
            if inbox is not None:
                await inbox.close()
            ex.close()
            await ex.beat_stopped()
        return ex.stats

    async def _step(self, tasks: list[Any]) -> list[TaskResult]:
        """Queue one step's tasks and return their results, whoever ran them.

        With ``explorer.over_rollout.ratio`` r > 0 (dynamic sync styles only, as in
        Trinity-RFT) the step ends once ``ceil((1 - r) * n)`` tasks are done plus at most
        ``wait_after_min`` seconds: slow tasks go on and publish their groups when they
        finish (the end of the taskset waits for them: :meth:`TaskQueue.drained`)."""
        assert self.queue is not None and self.tasks_of is not None
        ex, step = self.ex, self.ex.step + 1
        await self.queue.put(step, tasks, ex.engines[0].model_version)
        results = await self.queue.wait_step(step, tasks, over_rollout_minimum(len(tasks), self.cfg),
                                             self.cfg.explorer.over_rollout.wait_after_min)
        rounds = self.cfg.data_processor.experience_pipeline.fill_rounds()
        new = results
        for _ in range(rounds if self.inbox is not None else 0):  # DAPO's dynamic sampling
            fates = await self.inbox.fates([group_id(r.task) for r in new if r.ok], FILL_WAIT_S)
            dropped = sum(1 for kept in fates.values() if kept == 0)
            extra = self.tasks_of.more(dropped) if dropped else []
            if not extra:
                break
            log.info("fill", step=step, more_tasks=len(extra), dropped_groups=dropped)
            start, tasks = len(tasks), tasks + extra
            await self._save_cursor(batch=tasks)  # a restart re-runs the filled step whole
            await self.queue.put(step, extra, ex.engines[0].model_version, start=start)
            results = await self.queue.wait_step(step, tasks, len(tasks), 0.0)
            new = results[start:]
        if len(results) < len(tasks):
            log.info("over_rollout_goes_on", step=step, done=len(results), tasks=len(tasks),
                     still_running=len(tasks) - len(results))
        ex.stats.failed.extend((r.task.task_id, r.error or "?") for r in results if not r.ok)
        self.queue.done.pop(step, None)
        self.queue.floor = step + 1
        return results

    async def _finish(self, sync: SyncClient) -> None:
        """The taskset is done: every queued task's group published, the final weights
        taken and evaluated; the selectors' final state reported."""
        ex = self.ex
        assert self.queue is not None and self.tasks_of is not None
        ok, _ = await until_stopped(self.queue.drained(), ex.stop)
        if not ok:
            ex.stats.interrupted = True
            return
        await ex.final_weights(sync)
        if self.inbox is not None and not ex.stats.interrupted:
            # the final weights are in: every group was trained, so every pass rate is on
            # the stream; take them in so the final selector state is complete
            await self.inbox.tail.caught_up()
            self.inbox.apply(self.tasks_of)
            await ex.report(Metric(role="explorer", step=ex.step, kind="selection", values=self.tasks_of.metrics()))

    async def _save_cursor(self, batch: list[Any] | None = None) -> None:
        """The leader's position after ``ex.step`` steps; ``batch``: the tasks of the step
        now starting, which a restarted leader then runs again."""
        assert self.tasks_of is not None
        ex, reader = self.ex, self.tasks_of.state_dict()
        await ex.state.put(CURSOR_KEY, Cursor(
            ex.step, reader=reader, done_from=self.done_from,
            feedback_from=self.inbox.next_seq if self.inbox else None,
            batch=TaskScheduler.picks(batch) if batch is not None else None))
        # the seeds' explorer_meta.json: the same position for people and scripts (a run
        # resumes from the bus's cursor, which this copies)
        await asyncio.to_thread(write_meta, self.cfg.checkpoint_job_dir, "explorer",
                                {"latest_iteration": ex.step, "taskset_states": reader})

    async def _step_metrics(self, results: list[TaskResult], seconds: float) -> None:
        assert self.tasks_of is not None
        ex, cfg = self.ex, self.cfg
        values = group_metrics(results, cfg.monitor.detailed_stats) | self.tasks_of.metrics()
        if len(cfg.buffer.explorer_input.training()) > 1:  # per taskset: how the mix went
            for ts in sorted({r.task.taskset for r in results}):
                part = group_metrics([r for r in results if r.task.taskset == ts])
                values.update({f"{ts}/{k}": v for k, v in part.items() if k in TASKSET_METRICS})
        if self.inbox is not None:
            values["feedback_applied"] = float(self.inbox.applied)
        tokens = sum(e.response_length for r in results if r.group for e in r.group.experiences)
        values.update(step_seconds=seconds, tokens_per_second=tokens / max(seconds, 1e-9),
                      model_version=float(ex.engines[0].model_version))
        counts = [sum(e.token_counts[i] for e in ex.engines) for i in (0, 1)]
        computed, real = counts[0] - self._counted[0], counts[1] - self._counted[1]
        self._counted = counts
        if computed:  # the share of what the engines computed this step that was padding
            values["generation_padding_fraction"] = 1.0 - real / computed
        log.info("rollout_step", step=ex.step, **{k: round(v, 4) for k, v in values.items()})
        await ex.report(Metric(role="explorer", step=ex.step, kind="rollout", values=values))
