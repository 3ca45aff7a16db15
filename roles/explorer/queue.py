"""The task queue: how one or several explorer processes share a run's rollouts.

The leading explorer (:mod:`roles.explorer.lease`) reads the taskset and puts each step's
tasks on ``trinity.<run>.tasks`` as :class:`TaskOrder` messages (``Nats-Msg-Id``
``task:<step>:<index>``: a leader that restarts mid-step re-sends them harmlessly). Every
explorer, the leader too, runs a :class:`TaskWorker`: it takes as many orders as it has free
runners from one shared durable consumer (``explorers``, explicit acks), runs each, publishes
its group, reports a :class:`TaskDone` on ``trinity.<run>.done`` and only then acks the order.
What that buys:

* an order is run by one explorer at a time. One whose explorer dies unacked is handed to
  another after ``nats.ack_wait`` (a worker says "in progress" every third of it while the
  task runs, so a long task is never handed out twice); one given back on SIGTERM (a nak)
  comes back at once;
* a group published twice (an explorer killed between its publish and its ack) is dropped by
  its group id, by the bus's de-dup window and by the buffer's store: never trained twice;
* the leader's step is over when its :class:`TaskDone` notices are in (``over_rollout``: the
  first ``ceil((1 - r) n)`` of them), read from the ``done`` stream, from where its cursor
  says, so a restarted leader counts what was done before it restarted.

What a step is with several explorers: the same as with one. The leader cuts the taskset into
batches of ``buffer.batch_size`` tasks, waits for the weights the step needs, queues the batch
with that version as ``min_version``, and the step ends when its tasks are done, whoever ran
them. An explorer that holds older weights than an order's ``min_version`` loads the newest
offered checkpoint before running it (under a broadcast it pulls the trainer's weights:
``roles/weightsync/broadcast.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats
import structlog
from nats.js.errors import NotFoundError

import bus
from bus.retry import ride_out
from roles.explorer.runner import TaskResult
from schemas import codec
from schemas.data import Task, TaskDone, TaskOrder

log = structlog.get_logger(__name__)

#: The durable consumer every explorer of a run takes orders from.
WORKERS = "explorers"
#: ``Experience.info`` keys the rollout metrics read (``roles/explorer/eval.py``).
METRIC_INFO = ("accuracy", "calls", "tool_calls", "tool_call_errors")


@dataclass
class Rollout:
    """The scalars of one experience that the rollout metrics read (see ``eval.group_metrics``)."""

    group_id: str
    id: str
    episode: int | None
    reward: float | None
    info: dict[str, Any]
    prompt_length: int
    response_length: int
    prompt_truncated: bool
    response_truncated: bool

    @property
    def episode_key(self) -> tuple[str, int | str]:
        return self.group_id, self.id if self.episode is None else self.episode


@dataclass
class Rollouts:
    """A group as the leader sees it: its experiences' scalars."""

    experiences: list[Rollout] = field(default_factory=list)


def rollout_scalars(e: Any) -> dict[str, Any]:
    return {"group_id": e.group_id, "id": e.id, "episode": e.episode,
            "reward": None if e.reward is None else float(e.reward),
            "info": {k: e.info[k] for k in METRIC_INFO if k in e.info},
            "prompt_length": int(e.prompt_length), "response_length": int(e.response_length),
            "prompt_truncated": bool(e.prompt_truncated), "response_truncated": bool(e.response_truncated)}


def result_of(task: Task, done: TaskDone) -> TaskResult:
    """The leader's :class:`TaskResult` of a task some explorer reported done."""
    if done.error is not None:
        return TaskResult(task, error=done.error, seconds=done.seconds)
    return TaskResult(task, group=Rollouts([Rollout(**r) for r in done.rollouts]),  # type: ignore[arg-type]
                      seconds=done.seconds)


class TaskQueue:
    """The leader's end: queue a step's orders, count their :class:`TaskDone` notices."""

    def __init__(self, nc: Any, cfg: Any, pub: bus.Publisher) -> None:
        self.nc, self.cfg, self.pub = nc, cfg, pub
        self.js = bus.jetstream(nc, cfg.nats)
        self.names = bus.names(cfg.run_id)
        self.done: dict[int, dict[int, TaskDone]] = {}
        self.arrived = asyncio.Event()
        self.floor = 0  # notices of steps below this one are of finished steps: dropped
        self.tail = bus.StreamTail(self.js, cfg.run_id, "done", self._on_done)

    async def start(self, done_from: int) -> None:
        """Read ``done`` notices from stream sequence ``done_from`` on (the cursor's)."""
        self.tail.start(done_from)

    async def close(self) -> None:
        await self.tail.close()

    def _on_done(self, msg: Any) -> None:
        try:
            d = codec.decode(msg.data, TaskDone)
        except codec.CodecError as e:  # a report, never worth stopping the run for
            log.error("task_done_unreadable", seq=msg.metadata.sequence.stream, error=str(e))
            return
        if d.step >= self.floor:
            self.done.setdefault(d.step, {})[d.index] = d
        self.arrived.set()

    async def next_done_seq(self) -> int:
        """Where a leader restarting after this point must read ``done`` from."""
        info = await ride_out(lambda: self.js.stream_info(self.names.stream("done")), "stream info (done)")
        return int(info.state.last_seq) + 1

    async def put(self, step: int, tasks: list[Task], min_version: int, start: int = 0) -> None:
        """Queue step ``step``'s tasks as its orders ``start, start + 1, ...`` (a re-sent one
        is a duplicate the server drops)."""
        await asyncio.gather(*(self.pub.publish(TaskOrder(step=step, index=start + i, task=t, min_version=min_version),
                                                "tasks") for i, t in enumerate(tasks)))

    async def outstanding(self) -> int:
        """Orders not yet acked by any explorer (waiting or being run); -1 before any
        explorer has made the consumer (nothing can be said yet)."""
        try:
            info = await ride_out(lambda: self.js.consumer_info(self.names.stream("tasks"), WORKERS),
                                  "consumer info (tasks)")
        except NotFoundError:
            return -1
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def wait_step(self, step: int, tasks: list[Task], need: int, after_min: float) -> list[TaskResult]:
        """The results of step ``step`` once ``need`` of its tasks are done, plus whatever
        else finishes within ``after_min`` seconds after that (``over_rollout``). Orders the
        queue gave up on (``nats.max_deliver`` deliveries, none acked) count as failed."""
        got = self.done.setdefault(step, {})
        deadline: float | None = None
        while len(got) < len(tasks):
            if len(got) >= need:
                deadline = deadline or time.monotonic() + after_min
                if time.monotonic() >= deadline:
                    break
            self.arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), 1.0)
            if len(got) < len(tasks) and not self.arrived.is_set() and await self.outstanding() == 0:
                await self.tail.caught_up()
                for i in set(range(len(tasks))) - set(got):
                    log.error("task_given_up", step=step, index=i, task_id=tasks[i].task_id,
                              max_deliver=self.cfg.nats.max_deliver)
                    got[i] = TaskDone(step=step, index=i, task_id=tasks[i].task_id, explorer="",
                                      error=f"the task queue gave up after {self.cfg.nats.max_deliver} deliveries")
        return [result_of(tasks[i], d) for i, d in sorted(got.items()) if i < len(tasks)]

    async def drained(self) -> None:
        """Return once no order is left (every group of every step was published)."""
        while await self.outstanding():
            await asyncio.sleep(0.25)


class TaskWorker:
    """One explorer's hands on the queue: takes orders while it has free runners, runs each
    one, publishes its group and its :class:`TaskDone`, then acks it."""

    def __init__(self, cfg: Any, nc: Any, pub: bus.Publisher, run_task: Callable[[Task], Awaitable[TaskResult]],
                 capacity: int, name: str, before_task: Callable[[int], Awaitable[Any]], stats: Any) -> None:
        self.cfg, self.nc, self.pub = cfg, nc, pub
        self.run_task, self.capacity, self.name = run_task, max(1, capacity), name
        self.before_task = before_task
        self.stats = stats  # ``published`` counts the groups this process stored
        self._running: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event, grace: float = 0.0) -> None:
        """Work until ``stop``; then give running tasks ``grace`` seconds and give the rest
        back to the queue (nak: another explorer, or this one restarted, takes them at once)."""
        consumer = bus.Consumer(self.nc, self.cfg.nats, self.cfg.run_id, "tasks", WORKERS, expect=TaskOrder)
        await consumer.start()
        try:
            while not stop.is_set():
                free = self.capacity - len(self._running)
                if free <= 0:
                    waiter = asyncio.ensure_future(stop.wait())
                    await asyncio.wait([*self._running, waiter], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    continue
                try:
                    items = await consumer.fetch(free, timeout=0.5)
                except (nats.errors.Error, OSError) as e:
                    if isinstance(e, nats.errors.ConnectionClosedError):
                        raise
                    log.warning("task_fetch_retry", error=f"{type(e).__name__}: {e}")
                    await asyncio.sleep(0.2)
                    continue
                for d in items:
                    t = asyncio.create_task(self._one(d))
                    self._running.add(t)
                    t.add_done_callback(self._running.discard)
        finally:
            if self._running and grace > 0:
                await asyncio.wait(list(self._running), timeout=grace)
            await bus.stop_tasks(*self._running)
            await consumer.close()

    async def _keep_alive(self, d: bus.Delivery) -> None:
        while True:
            await asyncio.sleep(max(self.cfg.nats.ack_wait / 3, 0.5))
            with contextlib.suppress(Exception):
                await d.in_progress()

    async def _one(self, d: bus.Delivery) -> None:
        order: TaskOrder = d.obj
        keep = asyncio.create_task(self._keep_alive(d))
        try:
            await self.before_task(order.min_version)
            result = await self.run_task(order.task)
            if result.group is not None:
                await self.pub.publish_group(result.group)
            done = TaskDone(step=order.step, index=order.index, task_id=order.task.task_id, explorer=self.name,
                            error=result.error, seconds=result.seconds,
                            rollouts=[rollout_scalars(e) for e in result.group.experiences] if result.group else [])
            await self.pub.publish(done, "done")
            await d.ack_sync()
            if result.group is not None:
                self.stats.published += 1
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(d.nak())
            raise
        except Exception as e:  # noqa: BLE001 - the bus failed us: the order comes back later
            log.error("task_order_failed", step=order.step, index=order.index, error=f"{type(e).__name__}: {e}")
            with contextlib.suppress(Exception):
                await d.nak(delay=1.0)
        finally:
            keep.cancel()
