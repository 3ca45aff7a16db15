"""Riding out a lost server: what to retry, and for how long.

nats-py reconnects by itself (with our backoff), buffering publishes meanwhile; what fails
while it does are the round trips that need an answer: a KV put or get, a JetStream API
call, a request. A role must not die of a server restart (``trinity run`` starts a killed
embedded server again within a second; an operator's restart of an external one may take a
minute), so these operations retry the errors a missing server causes, for up to
:data:`RIDE_OUT` seconds, and only then fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import structlog
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from .errors import RequestTimeout

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: Errors of a connection that is down or a server that is restarting: worth retrying.
TRANSIENT: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoRespondersError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    NoStreamResponseError,
    ServiceUnavailableError,
)

#: Seconds an operation waits out a server that is gone before it fails.
RIDE_OUT = 180.0


async def ride_out(op: Callable[[], Awaitable[T]], what: str, seconds: float = RIDE_OUT) -> T:
    """``await op()``, again after each transient error, until ``seconds`` have passed; then
    RequestTimeout naming ``what``. Only for operations that are safe to repeat (a KV put of
    the same value, a read)."""
    deadline = time.monotonic() + seconds
    pause = 0.05
    first: float | None = None
    while True:
        try:
            result = await op()
        except TRANSIENT as e:
            now = time.monotonic()
            if first is None:
                first = now
                log.info("bus_waiting_for_server", what=what, error=type(e).__name__)
            if now + pause > deadline:
                raise RequestTimeout(
                    f"{what}: no answer from the NATS server for {seconds:.0f}s "
                    f"({type(e).__name__})"
                ) from e
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
            continue
        if first is not None:
            log.info("bus_server_back", what=what, waited=round(time.monotonic() - first, 1))
        return result


async def stop_tasks(*tasks: asyncio.Task[Any] | None, timeout: float = 10.0) -> None:
    """Cancel ``tasks`` and return once they have ended (or after ``timeout`` s, logged).

    Why not ``task.cancel(); await task``: on Python 3.11 ``asyncio.wait_for`` drops a cancel
    that arrives as the call it waits on completes (fixed in 3.12), and nats-py's requests and
    fetches run in ``wait_for``. A loop that lost its cancel runs on, and the ``await`` never
    returns: an explorer hung at the end of a stage this way. So the cancel is repeated until
    each task has ended (every second: time enough for a task's own clean-up)."""
    live = {t for t in tasks if t is not None and not t.done()}
    deadline = time.monotonic() + timeout
    while live:
        if time.monotonic() > deadline:
            log.warning("tasks_not_stopped", tasks=sorted(t.get_name() for t in live), waited=timeout)
            return
        for t in live:
            t.cancel()
        _, live = await asyncio.wait(live, timeout=1.0)
    for t in tasks:  # their errors were theirs to report; read so asyncio does not warn
        if t is not None and t.done() and not t.cancelled():
            t.exception()
