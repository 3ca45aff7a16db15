"""SIGTERM/SIGINT as a request to finish, for every role process.

Why its own module: the stage loop (:mod:`roles.stages`) imports each role's main to run it,
and the role mains need this too; kept here, below both, no module imports back the one that
imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any, NoReturn

import bus


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop`` (the role then finishes cleanly) instead of killing."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread / not POSIX
            pass


def ignore_signals_from_now() -> None:
    """SIGTERM/SIGINT are ignored for the rest of this process, which is exiting by itself.

    Why: under honcho, the first process to exit makes honcho SIGTERM all the others. A role
    whose work is over and that is already on its way out must end with its own exit 0, not
    be killed in its last second (honcho would print ``rc=-15``). Call it from the event
    loop's thread, once nothing is left to stop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` at once: logs flushed, children killed, the
    interpreter's own teardown skipped.

    Why: a role calls this when its work is over (every effect durable, engines closed, "done"
    said on the bus), so there is nothing left to save, yet the interpreter's teardown of
    torch and vLLM (atexit handlers, module finalisation) took 1.5 s on a quiet machine and
    past honcho's 5 s grace under load, and honcho then killed a finished role (``rc=-9``)."""
    if "multiprocessing" in sys.modules:  # an engine core that outlived its close
        import multiprocessing

        for child in multiprocessing.active_children():
            child.kill()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


async def until_stopped(coro: Any, stop: asyncio.Event, grace: float = 0.0) -> tuple[bool, Any]:
    """Run ``coro``; if ``stop`` is set first, give it ``grace`` seconds more, then cancel it.
    Returns (finished, result)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and grace > 0:
            await asyncio.wait({task}, timeout=grace)
        if task.done():
            return True, task.result()
        await bus.stop_tasks(task)
        return False, None
    finally:
        stopper.cancel()
