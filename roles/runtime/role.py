"""What a role process opens for a stage: its handles on the run's bus, and one heartbeat.

Why one place: each role opened the bus with the same five lines (connect, JetStream, the
run's streams, a publisher, the run's KV) and said "alive" at a rate of its own (the buffer
every 2 s, the trainer once a step, the synchronizer five times a second, the explorer every
5 s). Readers judge a heartbeat by its age (the synchronizer names a role whose beat is older
than half the sync timeout or 10 s; the trainer sees an explorer beside it within 30 s, and a
restarted buffer by its pid), so one rate serves them all: :data:`HEARTBEAT_S`. A beat from a
task of its own also goes on while the role is busy (a train step of a minute).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import bus
from schemas.config import TrinityConfig

#: Seconds between two heartbeats of a role process, every role.
HEARTBEAT_S = 2.0


@dataclass
class RoleBus:
    """A role's handles on its run: the connection, JetStream, a publisher, the run's KV."""

    nc: Any
    js: Any
    pub: bus.Publisher
    state: bus.RunState


async def open_bus(cfg: TrinityConfig, nc: Any) -> RoleBus:
    """The run's streams (made if missing), publisher and KV over connection ``nc``."""
    js = bus.jetstream(nc, cfg.nats)
    await bus.ensure_streams(js, cfg.nats, cfg.run_id)
    pub = bus.Publisher(nc, cfg.nats, cfg.run_id)
    state = await bus.RunState.open(js, cfg.run_id, cfg.nats.replicas)
    return RoleBus(nc, js, pub, state)


@contextlib.asynccontextmanager
async def role_bus(cfg: TrinityConfig, name: str) -> AsyncIterator[RoleBus]:
    """Connect as ``name``, open the run's bus, and disconnect on the way out."""
    nc = await bus.connect(cfg.nats, name=name)
    try:
        yield await open_bus(cfg, nc)
    finally:
        await bus.disconnect(nc)


class Heartbeat:
    """``heartbeat.<name>`` every :data:`HEARTBEAT_S` while in its ``async with``, saying what
    the role last told it (``said`` at first, then :meth:`says`)."""

    def __init__(self, state: bus.RunState, name: str, **said: Any) -> None:
        self.state, self.name = state, name
        self.said: dict[str, Any] = said
        self._task: asyncio.Task[None] | None = None

    def says(self, **info: Any) -> None:
        """What the next beats carry (merged with what was said before)."""
        self.said.update(info)

    async def beat(self) -> None:
        """One beat now (best effort: ``RunState.heartbeat`` skips one the server misses)."""
        await self.state.heartbeat(self.name, **self.said)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a beat is a report: it never ends a role
                await self.beat()
            await asyncio.sleep(HEARTBEAT_S)

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._run(), name=f"heartbeat-{self.name}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await bus.stop_tasks(self._task)
