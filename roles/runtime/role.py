"""What a role gets for a stage: one context, opened by the stage walker, closed after it.

A role is ``run(ctx) -> bool`` (True: it got to the end of its work). The stage walker
(:mod:`roles.launch.stages`) opens the :class:`RoleContext` once per stage of every role
process: the connection, the run's streams, a publisher, the run's KV, the stop event, one
heartbeat and one logger; it closes them after the role returns.

Why one place: each role opened the bus itself with the same five lines (so every role
process held two connections: the walker's and its own), and said "alive" at a rate of its
own (the buffer every 2 s, the trainer once a step, the synchronizer five times a second, the
explorer every 5 s). Readers judge a heartbeat by its age (the synchronizer names a role whose
beat is older than half the sync timeout or 10 s; the trainer sees an explorer beside it
within 30 s, and a restarted buffer by its pid), so one rate serves them all:
:data:`HEARTBEAT_S`. A beat from a task of its own also goes on while the role is busy (a
train step of a minute).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog

import bus
from schemas.config import TrinityConfig

#: Seconds between two heartbeats of a role process, every role.
HEARTBEAT_S = 2.0


class Heartbeat:
    """``heartbeat.<name>`` every :data:`HEARTBEAT_S` while in its ``async with``, saying what
    the role last told it (:meth:`says`). Silent until the role names itself (:meth:`as_`):
    the name is the role's to choose (a helper explorer beats under its process name, a
    trainer rank other than 0 not at all)."""

    def __init__(self, state: bus.RunState, name: str | None = None, **said: Any) -> None:
        self.state, self.name = state, name
        self.said: dict[str, Any] = said
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sending = asyncio.Lock()

    def says(self, **info: Any) -> None:
        """What the next beats carry (merged with what was said before)."""
        self.said.update(info)

    def as_(self, name: str, **info: Any) -> None:
        """Beat as ``name`` (and say ``info``) from now on; the first beat goes at once."""
        self.name = name
        self.says(**info)
        self._wake.set()

    async def silence(self) -> None:
        """No beat after this returns (one in flight has landed): a role's last word, e.g.
        "stopped", is not overwritten by a "running" a moment later."""
        self.name = None
        async with self._sending:
            pass

    async def beat(self) -> None:
        """One beat now (best effort: ``RunState.heartbeat`` skips one the server misses)."""
        async with self._sending:
            if self.name:
                await self.state.heartbeat(self.name, **self.said)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a beat is a report: it never ends a role
                await self.beat()
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), HEARTBEAT_S)

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._run(), name="heartbeat")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await bus.stop_tasks(self._task)


@dataclass
class RoleContext:
    """One role's stage (see the module doc): valid until its ``run(ctx)`` returns."""

    #: the stage's configuration (the previous stage's final weights already chained in)
    cfg: TrinityConfig
    #: the process's one connection to the NATS server
    nc: Any
    #: JetStream over ``nc`` (the run's streams exist: the walker made any that were missing)
    js: Any
    #: publishes the run's groups, events and control messages
    pub: bus.Publisher
    #: the run's KV bucket (versions, heartbeats, cursors, flags)
    state: bus.RunState
    #: set when the role must wind down: SIGTERM, or the stage done elsewhere
    stop: asyncio.Event
    #: the role's heartbeat, silent until the role names itself (``beat.as_``)
    beat: Heartbeat
    #: the role's logger (structlog; the process's lines already carry the role)
    log: Any


@contextlib.asynccontextmanager
async def role_context(cfg: TrinityConfig, role: str, nc: Any,
                       stop: asyncio.Event | None = None) -> AsyncIterator[RoleContext]:
    """``role``'s context for ``cfg``'s run over connection ``nc`` (the caller's to close):
    the run's streams made if missing, a publisher, the KV, and a heartbeat ended on the way out."""
    js = bus.jetstream(nc, cfg.nats)
    await bus.ensure_streams(js, cfg.nats, cfg.run_id)
    state = await bus.RunState.open(js, cfg.run_id, cfg.nats.replicas)
    async with Heartbeat(state) as beat:
        yield RoleContext(cfg, nc, js, bus.Publisher(nc, cfg.nats, cfg.run_id), state,
                          stop or asyncio.Event(), beat, structlog.get_logger(f"trinity.{role}"))


@contextlib.asynccontextmanager
async def connected_context(cfg: TrinityConfig, role: str,
                            stop: asyncio.Event | None = None) -> AsyncIterator[RoleContext]:
    """:func:`role_context` over a connection of its own, closed on the way out: a role run
    outside the stage walker (a test, a tool)."""
    nc = await bus.connect(cfg.nats, name=role)
    try:
        async with role_context(cfg, role, nc, stop) as ctx:
            yield ctx
    finally:
        await bus.disconnect(nc)
