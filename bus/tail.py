"""Read one stream of a run in order, from a given sequence on, for as long as it runs.

For a process that must see every message of a stream exactly once across its own restarts:
it saves the sequence after the last message it used (in its cursor) and tails from there
next time. The messages come through a consumer of its own (no acks, gone a minute after the
process is), made again from the last sequence read when a server restart or a reconnect
loses it. The leading explorer tails ``done`` (its tasks' notices) and ``feedback`` (the
buffer's pass rates) this way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import nats
import structlog
from nats.js import api

from .retry import ride_out, stop_tasks
from .subjects import names

log = structlog.get_logger(__name__)


class StreamTail:
    """Calls ``on_msg(msg)`` for each message of stream ``kind`` after sequence ``read_to``."""

    def __init__(self, js: Any, run_id: str, kind: str, on_msg: Callable[[Any], None]) -> None:
        self.js, self.kind, self.on_msg = js, kind, on_msg
        self.names = names(run_id)
        self.read_to = 0  # the last stream sequence delivered to on_msg
        self.arrived = asyncio.Event()  # set after each fetch that delivered something
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self, start_seq: int) -> None:
        """Deliver messages from stream sequence ``start_seq`` on."""
        self.read_to = max(1, start_seq) - 1
        self._task = asyncio.create_task(self._read())

    async def close(self) -> None:
        """Stop. By a flag checked every fetch, not by cancelling alone: a cancel that lands as
        nats-py's fetch times out can be lost, and the reader would go on."""
        self._closing = True
        await stop_tasks(self._task)
        self._task = None

    async def last_seq(self) -> int:
        """The stream's last sequence now (0: empty)."""
        stream = self.names.stream(self.kind)
        info = await ride_out(lambda: self.js.stream_info(stream), f"stream info ({self.kind})")
        return int(info.state.last_seq)

    async def caught_up(self) -> None:
        """Return once every message stored so far has been delivered."""
        last = await self.last_seq()
        while self.read_to < last:
            self.arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), 0.25)

    async def _read(self) -> None:
        sub = None
        try:
            while not self._closing:
                if sub is None:
                    try:
                        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                                    opt_start_seq=self.read_to + 1, ack_policy=api.AckPolicy.NONE,
                                                    inactive_threshold=60.0)
                        sub = await self.js.pull_subscribe(self.names.subject(self.kind),
                                                           stream=self.names.stream(self.kind), config=config)
                    except (nats.errors.Error, OSError) as e:
                        log.warning("stream_tail_retry", kind=self.kind, error=f"{type(e).__name__}: {e}")
                        await asyncio.sleep(0.5)
                        continue
                try:
                    msgs = await sub.fetch(256, timeout=1.0)
                except (asyncio.TimeoutError, nats.errors.TimeoutError):
                    continue
                except (nats.errors.Error, OSError) as e:  # e.g. the consumer is gone with a restarted server
                    log.warning("stream_tail_retry", kind=self.kind, error=f"{type(e).__name__}: {e}")
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
                    sub = None
                    await asyncio.sleep(0.5)
                    continue
                for m in msgs:
                    seq = m.metadata.sequence.stream
                    if seq <= self.read_to:
                        continue
                    self.read_to = seq
                    self.on_msg(m)
                if msgs:
                    self.arrived.set()
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
