"""The explorer process: tasks in, experience groups out, one step at a time.

One step = ``buffer.batch_size`` tasks from the taskset (resumable cursor in the run's KV),
each run by the runner pool into one :class:`ExperienceGroup` published on the ``exp``
stream the moment it is complete. The tasks go through the run's task queue
(``roles/explorer/queue.py``), so any number of explorer processes can share a run: every one
works the queue, and the one holding the lead (``roles/explorer/lease.py``) also reads the
taskset, cuts the steps and does what follows here. Before every step the sync client decides whether the
explorer may go on (it waits when it is too far ahead of the trainer) and loads new weights
when a sync is due; the explorer itself decides nothing about weights. Evaluation runs at
startup and every ``eval_interval`` steps. SIGTERM stops taking tasks, lets the step in
flight finish for a short grace period, then abandons it: a group is published whole or not
at all, and the cursor only moves past fully finished steps.

With ``explorer.rollout_model.enable_openai_api`` (always in ``mode: serve``) the explorer
also serves an OpenAI-compatible API over its engines (``roles/explorer/api``), and weight
loads wait for the requests in flight (:class:`roles.explorer.api.WeightGate`). In ``mode:
serve`` there is no taskset: agents outside trinity open episodes and post rewards, a step is
every ``buffer.batch_size`` rewarded episodes, and weights move at step boundaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import bus
from roles.explorer.checkpoint_watch import CheckpointWatcher, NoSync
from roles.explorer.engines import RolloutEngine, create_auxiliary, create_engines
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
from roles.explorer.runner import RunnerPool, TaskResult
from roles.explorer.workflows.registry import reads_prompt
from roles.runtime.config import algorithm_spec
from roles.runtime.monitor import Monitor
from roles.runtime.placement import device_plan
from roles.runtime.role import HEARTBEAT_S, open_bus
from roles.runtime.signals import until_stopped
from roles.weightsync.client import ExplorerSyncClient
from schemas import keys
from schemas.config import TrinityConfig
from schemas.data import Metric, group_id
from schemas.modes import MODES
from schemas.state import ApiAddress, Cursor, ExplorerFinished, JoinSettings
from storage import checkpoints as ckpt
from storage.checkpoints import write_meta
from storage.hub import hub_origin
from storage.juicer import run_task_pipeline
from storage.lora import adapter_sync
from storage.scheduler import TaskScheduler, scheduler_from_config

log = logging.getLogger("trinity.explorer")

#: KV key of the explorer's resumable position: ``{"step": int, "reader": state_dict}``.
CURSOR_KEY = keys.EXPLORER_CURSOR
#: KV key set once the taskset is exhausted and every group is stored on the stream.
FINISHED_KEY = keys.EXPLORER_FINISHED
#: KV key where the explorer announces its OpenAI API: ``{"url": ..., "model": ...}``.
API_KEY = keys.EXPLORER_API


class SyncClient(Protocol):
    """What the explorer asks the synchronizer (``roles/weightsync/client.py``)."""

    async def before_step(self, step: int, engines: list[RolloutEngine]) -> None: ...

    async def after_step(self, step: int) -> None: ...

    async def final(self, engines: list[RolloutEngine]) -> None: ...

    async def catch_up(self, engines: list[RolloutEngine], floor: int) -> int: ...

    def assist(self, name: str) -> None: ...

    async def take_lead(self) -> None: ...

    async def leave(self) -> None: ...


async def make_sync(cfg: TrinityConfig, nc: Any, state: bus.RunState, pub: bus.Publisher) -> SyncClient:
    """The synchronizer's client; in ``explore`` mode a watcher of the trainer's checkpoints
    (``roles/explorer/checkpoint_watch.py``: a ``train`` run beside it writes them); :class:`NoSync` in
    ``bench`` mode, which loads every checkpoint itself (:meth:`Explorer.bench`)."""
    weights = MODES[cfg.mode].weights
    if weights == "watch":
        return CheckpointWatcher(cfg)
    if weights == "each":
        return NoSync()
    return ExplorerSyncClient(cfg, nc, state, pub)


@dataclass
class ExplorerStats:
    steps: int = 0
    published: int = 0
    episodes: int = 0  # serve mode: rewarded episodes stored on the bus
    failed: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False


def make_pool(cfg: TrinityConfig, engines: list[RolloutEngine], auxiliary: list[list[RolloutEngine]] | None,
              api: Any = None) -> RunnerPool:
    """The runner pool over the rollout engines, handing workflows the auxiliary models, and
    scoring rollouts with the teacher (auxiliary model 0) when the algorithm distills."""

    teacher = MODES[cfg.mode].makes_experience and algorithm_spec(cfg).use_teacher
    return RunnerPool(engines, cfg.explorer, cfg.run_id, auxiliary=auxiliary, api=api, teacher=teacher)


async def start_auxiliary_apis(cfg: TrinityConfig, pool: RunnerPool) -> None:
    """An OpenAI API (any free port, nothing recorded) per auxiliary model, for workflows'
    ``self.auxiliary_models[i].get_openai_client()``; :func:`stop_auxiliary_apis` ends them."""
    from roles.explorer.api import ApiServer

    api_cfg = cfg.explorer.openai_api.model_copy(update={"port": 0})
    for aux_cfg, engines in zip(cfg.explorer.auxiliary_models, pool.auxiliary, strict=True):
        server = ApiServer(api_cfg, engines, aux_cfg.model_path or "auxiliary", cfg.run_id,
                           publish=None, record=False)
        await server.start()
        pool.aux_apis.append(server)


async def stop_auxiliary_apis(pool: RunnerPool) -> None:
    for server in pool.aux_apis:
        await server.stop()
    pool.aux_apis = []


def served_model_name(cfg: TrinityConfig) -> str:
    """The model name the OpenAI API serves (``GET /v1/models``): the hub id the config named
    (``Org/Name``) when the path is that id's snapshot in the hub cache."""

    path = cfg.explorer.rollout_model.model_path or cfg.model.model_path or "model"
    origin = hub_origin(path)
    return origin.split("@", 1)[0] if origin else path


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


class Explorer:
    """The explorer role, given its engines and a bus connection."""

    def __init__(self, cfg: TrinityConfig, engines: list[RolloutEngine], nc: Any,
                 sync: SyncClient | None = None, shutdown_grace: float = 5.0,
                 auxiliary: list[list[RolloutEngine]] | None = None) -> None:
        self.cfg, self.engines, self.nc = cfg, engines, nc
        self.sync = sync
        self.shutdown_grace = shutdown_grace
        self.stop = asyncio.Event()
        self.stats = ExplorerStats()
        self._counted = [0, 0]  # engines' token_counts at the last step report
        self.step = 0
        self.pool = make_pool(cfg, engines, auxiliary)
        self.monitor: Any = None
        self.api: Any = None
        #: what the sync client loads weights into (gated when the API serves requests)
        self.sync_engines: list[Any] = list(engines)
        self._rewards: list[float] = []
        self._episode_done = asyncio.Event()
        #: this process among the run's explorers (lease, heartbeat, TaskDone notices)
        self.me = f"{cfg.explorer.name}-{socket.gethostname()}-{os.getpid()}"
        self.beat_name = cfg.explorer.name  # a helper explorer beats under ``self.me``
        self.queue: TaskQueue | None = None
        #: the leader's taskset scheduler, feedback inbox and first unread ``done`` sequence
        self.tasks_of: TaskScheduler | None = None
        self.inbox: FeedbackInbox | None = None
        self.done_from = 1
        self.worker: TaskWorker | None = None

    async def start_api(self) -> str:
        """Serve the OpenAI API over the engines; weight loads then wait for requests."""
        from roles.explorer.api import ApiServer, GatedEngine, WeightGate

        gate = WeightGate()
        publish = self._publish_episode if MODES[self.cfg.mode].serves_api else None
        self.api = ApiServer(self.cfg.explorer.openai_api, self.engines, served_model_name(self.cfg),
                             self.cfg.run_id, publish, gate)
        self.pool.api = self.api
        self.sync_engines = [GatedEngine(e, gate) for e in self.engines]
        url = await self.api.start()
        await start_auxiliary_apis(self.cfg, self.pool)
        return url

    async def _open_bus(self) -> SyncClient:
        """Streams, publisher, run state and the sync client; announce the API if any."""
        cfg = self.cfg
        rb = await open_bus(cfg, self.nc)
        self.pub, self.state = rb.pub, rb.state
        if self.api is not None:
            await self.state.put(API_KEY, ApiAddress(url=self.api.url, model=self.api.model_name))
        return self.sync or await make_sync(cfg, self.nc, self.state, self.pub)

    async def report(self, m: Metric) -> None:
        """A metric to the monitor files and the metrics subject."""
        if self.monitor is None:
            self.monitor = Monitor(self.cfg, "explorer")
        self.monitor.log(m)
        await self.pub.publish_event(m)

    async def explore(self) -> ExplorerStats:
        """Every explorer process of a run (modes both/explore/colocate): work the task queue,
        and lead the run (:meth:`run`) once this process holds the lead. Another explorer
        leads already: this one must be of the same run's config (else ValueError, before it
        takes a task) and takes the newest checkpoint, or pulls a broadcast of the trainer's
        weights, before a task that needs newer weights than it holds."""
        sync = await self._open_bus()
        lease = Lease(self.state, self.me)
        leading = await lease.try_take()
        if not leading and self.cfg.synchronizer.sync_method != "checkpoint" and MODES[self.cfg.mode].weights == "live":
            # a lease nobody renews is this role's predecessor's, killed on another host before
            # it could give it up (under a broadcast a run mostly has one explorer): it expires
            # within LEASE_S; a renewed one is a live leader's, which this process assists
            if not await lease.renewed():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(lease.acquire(), LEASE_S + RENEW_S)
                    leading = True
        if leading:
            await self.state.put(JOIN_KEY, JoinSettings(join_fingerprint(self.cfg)))
        else:
            check_joining(self.cfg, await self.state.get(JOIN_KEY))
            log.info("explorer %s joins run %s: another explorer leads", self.me, self.cfg.run_id)
            self.beat_name = self.me
            sync.assist(self.me)
        self.worker = TaskWorker(self.cfg, self.nc, self.pub, self.pool.run_task, self.pool.size, self.me,
                                 lambda floor: sync.catch_up(self.sync_engines, floor), self.stats)
        stop_work = asyncio.Event()
        work = asyncio.create_task(self.worker.run(stop_work, self.shutdown_grace))
        forward = asyncio.create_task(_forward(self.stop, stop_work))
        beat = asyncio.create_task(self._heartbeats())
        lead = asyncio.create_task(self._lead(lease, sync, leading))
        try:
            done, _ = await asyncio.wait({work, lead}, return_when=asyncio.FIRST_COMPLETED)
            if work in done and work.exception() is not None:  # the worker failed: the process ends
                await bus.stop_tasks(lead)
            else:
                await lead  # the run is over, or ``stop`` (the lead handles it)
                stop_work.set()
            await work
        finally:
            await bus.stop_tasks(forward, beat, lead, work)
            with contextlib.suppress(Exception):  # the trainer drops this process's group
                await sync.leave()
            if self.stats.interrupted:  # a finished run keeps the lead until its stage ends
                await lease.release()
        return self.stats

    async def _lead(self, lease: Lease, sync: SyncClient, leading: bool) -> None:
        """Wait for the lead (a helper waits until the run ends or the leader is gone), then
        run the steps while renewing it."""
        if not leading:
            ok, _ = await until_stopped(lease.acquire(), self.stop)
            if not ok:
                self.stats.interrupted = True
                return
            await self.state.put(JOIN_KEY, JoinSettings(join_fingerprint(self.cfg)))
            await sync.take_lead()
        self.beat_name = self.cfg.explorer.name
        keep = asyncio.create_task(lease.keep())
        done = asyncio.create_task(self.run(sync))
        try:
            await asyncio.wait({keep, done}, return_when=asyncio.FIRST_COMPLETED)
            if keep.done():  # lost the lead: another explorer leads now; this process ends
                raise keep.exception() or LeaseLost("the lease keeper stopped")  # (a supervisor restarts it)
            await done
        finally:
            await bus.stop_tasks(keep, done)

    async def run(self, sync: SyncClient) -> ExplorerStats:
        """The leader's steps (:meth:`explore` calls it once this process leads). A step's tasks
        are saved in the cursor before they are queued, so a restarted leader re-runs that very
        step; the selectors get the buffer's feedback only just before a step is picked."""
        cfg, name = self.cfg, self.cfg.explorer.name
        if cfg.data_processor.task_pipeline is not None:  # done by the launcher; not when started alone

            await asyncio.to_thread(run_task_pipeline, cfg)
        tasks_of = scheduler_from_config(cfg, reads_prompt)
        saved = await self.state.get(CURSOR_KEY)
        in_flight = None
        if saved:
            tasks_of.load_state_dict(saved.reader or {})
            self.step, in_flight = saved.step, saved.batch
            log.info("resuming step=%d offset=%d%s", self.step, tasks_of.offset, " (step in flight)" if in_flight else "")
        self.queue = TaskQueue(self.nc, cfg, self.pub)
        self.done_from = (saved.done_from or 1) if saved else 1
        await self.queue.start(self.done_from)
        inbox = None
        if needs_feedback(cfg):
            inbox = FeedbackInbox(self.queue.js, cfg.run_id, track_kept=cfg.data_processor.experience_pipeline.fill_rounds() > 0)
            inbox.start((saved.feedback_from or 1) if saved else 1)
        self.inbox, self.tasks_of = inbox, tasks_of
        version = self.engines[0].model_version
        await self.state.set_model_version(name, version)
        every_s = cfg.explorer.runner_state_report_interval
        report = asyncio.create_task(self.pool.report_state(every_s)) if every_s > 0 else None
        try:
            if cfg.explorer.eval_on_startup and self.step == 0:
                await until_stopped(evaluate(cfg, self.pool, 0, self.report), self.stop)
            while not self.stop.is_set() and (in_flight or not tasks_of.exhausted):
                ok, _ = await until_stopped(sync.before_step(self.step, self.sync_engines), self.stop)
                if not ok:
                    break
                if self.engines[0].model_version != version:
                    version = self.engines[0].model_version
                    await self.state.set_model_version(name, version)
                t0 = time.monotonic()
                if in_flight:
                    tasks, in_flight = tasks_of.rebuild(in_flight), None
                else:
                    if inbox is not None:
                        inbox.apply(tasks_of)
                    tasks = tasks_of.next_batch()
                    await self._save_cursor(batch=tasks)
                finished, results = await until_stopped(
                    self._explore_step(tasks), self.stop, self.shutdown_grace)
                if not finished:  # the cursor holds the step: a restart re-runs it
                    self.stats.interrupted = True
                    log.warning("SIGTERM: abandoned step %d (nothing half published)", self.step + 1)
                    break
                self.step += 1
                self.stats.steps += 1
                self.pool.steps_seen = self.step
                self.done_from = await self.queue.next_done_seq()
                await self._save_cursor()
                await self._step_metrics(results, time.monotonic() - t0)
                await sync.after_step(self.step)
                every = cfg.explorer.eval_interval
                # after the last step _finish evaluates the final weights: an interval
                # evaluation here would rate the weights before them, under the same step
                last = tasks_of.exhausted
                if every > 0 and self.step % every == 0 and not last and cfg.buffer.explorer_input.eval_tasksets:
                    await until_stopped(evaluate(cfg, self.pool, self.step, self.report), self.stop)
            await self.pub.flush()
            if self.stop.is_set():
                self.stats.interrupted = True
            else:
                await self._finish(sync)
                if inbox is not None and not self.stats.interrupted:
                    # the final weights are in: every group was trained, so every pass rate
                    # is on the stream; take them in so the final selector state is complete
                    await inbox.tail.caught_up()
                    inbox.apply(tasks_of)
                    await self.report(Metric(role="explorer", step=self.step, kind="selection",
                                             values=tasks_of.metrics()))
        finally:
            if report is not None:
                report.cancel()
            await self.queue.close()
            if inbox is not None:
                await inbox.close()
            if self.monitor is not None:
                self.monitor.close()
            self.beat_name = ""  # no "running" beat after this one
            with contextlib.suppress(Exception):
                await self.state.heartbeat(name, step=self.step, state="stopped",
                                           model_version=self.engines[0].model_version)
        return self.stats

    async def bench(self) -> ExplorerStats:
        """``mode: bench``: evaluate the model, then every checkpoint of this job that has a
        Hugging Face folder, in step order (Trinity-RFT's benchmark mode); with
        ``explorer.bench_on_latest_checkpoint`` only the newest one."""
        cfg = self.cfg
        if not cfg.buffer.explorer_input.eval_tasksets:
            raise ValueError("buffer.explorer_input.eval_tasksets: mode bench needs at least one")
        await self._open_bus()

        todo = [(0, None)] + [(s, ckpt.hf_dir(cfg.checkpoint_job_dir, s))
                              for s in ckpt.list_steps(cfg.checkpoint_job_dir)
                              if ckpt.hf_weights_complete(ckpt.hf_dir(cfg.checkpoint_job_dir, s))]
        if cfg.explorer.bench_on_latest_checkpoint:  # the newest checkpoint only (the model if none)
            todo = todo[-1:]
        for i, (step, path) in enumerate(todo):
            if path is not None:
                await asyncio.gather(*(e.load_checkpoint(str(path), step) for e in self.sync_engines))
            ok, _ = await until_stopped(evaluate(cfg, self.pool, step, self.report,
                                                 final=i == len(todo) - 1), self.stop)
            if not ok:
                self.stats.interrupted = True
                break
            self.stats.steps += 1
        await self.pub.flush()
        if self.monitor is not None:
            self.monitor.close()
        return self.stats

    async def serve(self) -> ExplorerStats:
        """``mode: serve`` (online RL): no taskset; agents drive the API, and every
        ``buffer.batch_size`` rewarded episodes are a step (cursor, metrics, weight sync). With
        ``buffer.total_steps`` (or ``trainer.total_steps``) the run ends once the trainer has
        trained them and the final weights are loaded; without, it serves until stopped."""
        cfg, name = self.cfg, self.cfg.explorer.name
        sync = await self._open_bus()
        saved = await self.state.get(CURSOR_KEY)
        if saved:
            self.step, self.stats.episodes = saved.step, saved.episodes or 0
            log.info("resuming serve step=%d episodes=%d", self.step, self.stats.episodes)
        await self.state.set_model_version(name, self.engines[0].model_version)
        last = cfg.trainer.total_steps or cfg.buffer.total_steps
        beat = asyncio.create_task(self._heartbeats())
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                ok, what = await until_stopped(self._serve_wait(last), self.stop)
                if not ok:
                    break
                if what == "trained":
                    await self._finish(sync)
                    break
                self.step += 1
                self.stats.steps += 1
                await self.state.put(CURSOR_KEY, Cursor(self.step, episodes=self.stats.episodes))
                await self._serve_metrics(time.monotonic() - t0)
                await sync.after_step(self.step)
                ok, _ = await until_stopped(sync.before_step(self.step, self.sync_engines), self.stop)
                if not ok:
                    break
                await self.state.set_model_version(name, self.engines[0].model_version)
            self.stats.interrupted = self.stop.is_set() or self.stats.interrupted
            await self.pub.flush()
        finally:
            beat.cancel()
            if self.monitor is not None:
                self.monitor.close()
        return self.stats

    async def _serve_wait(self, last: int | None) -> str:
        """Until a step's worth of episodes is in ("step") or the trainer has trained its
        last step ("trained")."""
        need = (self.step + 1) * self.cfg.buffer.batch_size
        while True:
            if self.stats.episodes >= need:
                return "step"
            if last is not None and (await self.state.model_version("trainer") or 0) >= last:
                return "trained"
            self._episode_done.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._episode_done.wait(), 1.0)

    async def _publish_episode(self, group: Any) -> bool:
        """Store a closed episode's group on the bus (the API's ``publish``); True when the
        bus already had it."""
        ack = await self.pub.publish_group(group)
        if not ack.duplicate:
            self.stats.episodes += 1
            self.stats.published += 1
            self._rewards.append(group.experiences[0].reward)
            self._episode_done.set()
        return bool(ack.duplicate)

    async def _serve_metrics(self, seconds: float) -> None:
        s, rewards = self.api.stats, self._rewards
        self._rewards = []
        values = {"reward_mean": sum(rewards) / max(len(rewards), 1), "episodes": float(len(rewards)),
                  "step_seconds": seconds, "api_requests": float(s.requests),
                  "api_errors": float(s.errors), "episodes_expired": float(s.episodes_expired),
                  "model_version": float(self.engines[0].model_version)}
        log.info("step=%d %s", self.step, " ".join(f"{k}={v:.4g}" for k, v in values.items()))
        await self.report(Metric(role="explorer", step=self.step, kind="rollout", values=values))

    async def _explore_step(self, tasks: list[Any]) -> list[TaskResult]:
        """Queue one step's tasks and return their results, whoever ran them.

        With ``explorer.over_rollout.ratio`` r > 0 (dynamic sync styles only, as in
        Trinity-RFT) the step ends once ``ceil((1 - r) * n)`` tasks are done plus at most
        ``wait_after_min`` seconds: slow tasks go on and publish their groups when they
        finish (the end of the taskset waits for them: :meth:`TaskQueue.drained`)."""
        assert self.queue is not None
        step = self.step + 1
        await self.queue.put(step, tasks, self.engines[0].model_version)
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
            log.info("fill: step %d draws %d more tasks for %d dropped groups", step, len(extra), dropped)
            start, tasks = len(tasks), tasks + extra
            await self._save_cursor(batch=tasks)  # a restart re-runs the filled step whole
            await self.queue.put(step, extra, self.engines[0].model_version, start=start)
            results = await self.queue.wait_step(step, tasks, len(tasks), 0.0)
            new = results[start:]
        if len(results) < len(tasks):
            log.info("over_rollout: step %d goes on with %d of %d tasks (%d still running)",
                     step, len(results), len(tasks), len(tasks) - len(results))
        self.stats.failed.extend((r.task.task_id, r.error or "?") for r in results if not r.ok)
        self.queue.done.pop(step, None)
        self.queue.floor = step + 1
        return results

    async def _finish(self, sync: SyncClient) -> None:
        """The taskset is done: say so, take the trainer's final weights, evaluate them."""
        if self.queue is not None:  # every queued task's group is published before "finished"
            ok, _ = await until_stopped(self.queue.drained(), self.stop)
            if not ok:
                self.stats.interrupted = True
                return
        await self.state.put(FINISHED_KEY, ExplorerFinished(self.step, time.time()))
        log.info("taskset exhausted after step %d: waiting for the final weights", self.step)
        ok, _ = await until_stopped(sync.final(self.sync_engines), self.stop)
        if not ok:
            self.stats.interrupted = True
            return
        await self.state.set_model_version(self.cfg.explorer.name, self.engines[0].model_version)
        if self.cfg.buffer.explorer_input.eval_tasksets:
            ok, _ = await until_stopped(
                evaluate(self.cfg, self.pool, self.step, self.report, final=True), self.stop)
            self.stats.interrupted = not ok
            await self.pub.flush()

    async def _save_cursor(self, batch: list[Any] | None = None) -> None:
        """The leader's position after ``self.step`` steps; ``batch``: the tasks of the step
        now starting, which a restarted leader then runs again."""
        assert self.tasks_of is not None
        reader = self.tasks_of.state_dict()
        await self.state.put(CURSOR_KEY, Cursor(
            self.step, reader=reader, done_from=self.done_from,
            feedback_from=self.inbox.next_seq if self.inbox else None,
            batch=TaskScheduler.picks(batch) if batch is not None else None))
        # the seeds' explorer_meta.json: the same position for people and scripts (a run
        # resumes from the bus's cursor, which this copies)
        await asyncio.to_thread(write_meta, self.cfg.checkpoint_job_dir, "explorer",
                                {"latest_iteration": self.step, "taskset_states": reader})

    async def _step_metrics(self, results: list[TaskResult], seconds: float) -> None:
        assert self.tasks_of is not None
        values = group_metrics(results, self.cfg.monitor.detailed_stats) | self.tasks_of.metrics()
        if len(self.cfg.buffer.explorer_input.training()) > 1:  # per taskset: how the mix went
            for ts in sorted({r.task.taskset for r in results}):
                part = group_metrics([r for r in results if r.task.taskset == ts])
                values.update({f"{ts}/{k}": v for k, v in part.items() if k in TASKSET_METRICS})
        if self.inbox is not None:
            values["feedback_applied"] = float(self.inbox.applied)
        tokens = sum(e.response_length for r in results if r.group for e in r.group.experiences)
        values.update(step_seconds=seconds, tokens_per_second=tokens / max(seconds, 1e-9),
                      model_version=float(self.engines[0].model_version))
        counts = [sum(e.token_counts[i] for e in self.engines) for i in (0, 1)]
        computed, real = counts[0] - self._counted[0], counts[1] - self._counted[1]
        self._counted = counts
        if computed:  # the share of what the engines computed this step that was padding
            values["generation_padding_fraction"] = 1.0 - real / computed
        log.info("step=%d %s", self.step, " ".join(f"{k}={v:.4g}" for k, v in values.items()))
        await self.report(Metric(role="explorer", step=self.step, kind="rollout", values=values))

    async def _heartbeats(self) -> None:
        while self.beat_name:
            with contextlib.suppress(Exception):
                await self.state.heartbeat(self.beat_name, step=self.step, state="running",
                                           model_version=self.engines[0].model_version,
                                           failed_tasks=len(self.stats.failed))
            await asyncio.sleep(HEARTBEAT_S)


async def run_explorer(cfg: TrinityConfig, stop: asyncio.Event,
                       engines: list[RolloutEngine] | None = None) -> bool:
    """Start engines, connect, explore until done or ``stop`` (set by the stage walker
    on SIGTERM), clean up. True when the taskset (or the bench) was finished.
    ``engines``: this run's views of a sweep's shared engines (``engines/shared.py``)
    instead of engines of its own."""

    # each engine on its own GPUs of the device plan: positions in this process's devices
    plan = device_plan([cfg])
    gpus = plan.engine_devices(plan.of("rollout engine")) if plan.gpu_per_node else None
    aux_gpus = [plan.engine_devices(plan.of(f"auxiliary {i} engine"))
                for i in range(len(cfg.explorer.auxiliary_models))] if plan.gpu_per_node else None
    if engines is None:
        engines = await create_engines(cfg.explorer.rollout_model, cfg.model.external_model, adapter_sync(cfg), gpus)
    auxiliary: list[list[RolloutEngine]] = []
    nc = None
    try:
        auxiliary = await create_auxiliary(cfg.explorer.auxiliary_models, cfg.model.external_model, aux_gpus)
        nc = await bus.connect(cfg.nats, name=cfg.explorer.name)
        explorer = Explorer(cfg, engines, nc, auxiliary=auxiliary)
        if MODES[cfg.mode].serves_api or cfg.explorer.rollout_model.enable_openai_api:
            await explorer.start_api()
        forward = asyncio.get_running_loop().create_task(_forward(stop, explorer.stop))
        try:
            run = {"bench": explorer.bench, "serve": explorer.serve}.get(cfg.mode, explorer.explore)
            stats = await run()
        finally:
            forward.cancel()
            if explorer.api is not None:
                await explorer.api.stop()
                await stop_auxiliary_apis(explorer.pool)
        log.info("explorer done steps=%d published=%d failed=%d interrupted=%s",
                 stats.steps, stats.published, len(stats.failed), stats.interrupted)
        return not stats.interrupted
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        for e in engines + [a for engs in auxiliary for a in engs]:
            with contextlib.suppress(Exception):
                await e.close()


async def _forward(src: asyncio.Event, dst: asyncio.Event) -> None:
    await src.wait()
    dst.set()
