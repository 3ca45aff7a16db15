"""SIGTERM/SIGINT as a request to finish, for every role process; and no orphans.

Why its own module: the stage loop (:mod:`roles.launch.stages`) imports each role's main to run it,
and the role mains need this too; kept here, below both, no module imports back the one that
imports it.

No orphans (``docs/running.md``, "No orphans"): a role that ``trinity run`` (or ``trinity
sweep``) started stops as on SIGTERM when that supervisor dies, even by SIGKILL; and a role
told to stop does not wait for a NATS server that is gone (:func:`until_done_or_bus_gone`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import structlog

import bus

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: Seconds between two looks at whether this process's supervisor is still alive.
ORPHAN_CHECK_S = 1.0
#: Seconds a role told to stop keeps waiting on a NATS server that none of its clients reaches.
BUS_GONE_S = 2.0
#: Seconds the work cancelled then has to end (its ``finally`` blocks, a checkpoint being
#: written) before the process is ended anyway.
CANCEL_WAIT_S = 30.0
#: prctl(2) option: the signal this process gets when its parent ends (Linux).
PR_SET_PDEATHSIG = 1

_watchers: set[asyncio.Task[None]] = set()  # strong references: the loop keeps weak ones


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop`` (the role then finishes cleanly) instead of killing; so does
    the death of the supervisor that started this process (:func:`supervisor_pid`)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread / not POSIX
            pass
    supervisor = supervisor_pid()
    if supervisor is not None:
        stop_with_supervisor(stop, supervisor)


def supervisor_pid() -> int | None:
    """The pid of the ``trinity run`` (or ``trinity sweep``) that started this process, which
    puts it in ``TRINITY_SUPERVISED`` (:data:`roles.runtime.config.SUPERVISED_ENV`); None for a
    process started otherwise (honcho, by hand, a test).

    Why only those: a role started alone belongs to whoever started it (``nohup trinity
    explorer &`` must outlive its shell, and honcho's own ``nats`` line outlives honcho, so its
    roles can still finish the run); ``trinity run``'s roles cannot go on without it, as their
    nats-server dies with it."""
    from roles.runtime.config import SUPERVISED_ENV

    value = os.environ.get(SUPERVISED_ENV, "")
    return int(value) if value.isdigit() and int(value) > 1 else None


def stop_with_supervisor(stop: asyncio.Event, supervisor: int) -> None:
    """Set ``stop`` once ``supervisor`` (or this process's parent, as it is now) has died.

    Linux tells at once: PR_SET_PDEATHSIG makes the parent's death a SIGTERM, which
    :func:`stop_on_signals` has made a stop request. Everywhere, and for a process whose parent
    is not the supervisor (a trainer rank under torchrun), a watchdog looks every
    :data:`ORPHAN_CHECK_S` seconds; it also catches a supervisor that died before this process
    got here (its parent is then already another)."""
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)
    task = asyncio.get_running_loop().create_task(_watch_supervisor(stop, parent, supervisor))
    _watchers.add(task)
    task.add_done_callback(_watchers.discard)


def die_with_parent(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent ends; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def orphaned(parent: int, supervisor: int) -> bool:
    """This process's parent is no longer ``parent``, or ``supervisor`` no longer exists."""
    if os.getppid() != parent:
        return True
    try:
        os.kill(supervisor, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive as far as can be told (another user's: a reused pid?)
        pass
    return False


async def _watch_supervisor(stop: asyncio.Event, parent: int, supervisor: int) -> None:
    while not stop.is_set():
        if orphaned(parent, supervisor):
            log.warning("supervisor_gone_stopping", supervisor=supervisor, parent=parent)
            stop.set()
            return
        await asyncio.sleep(ORPHAN_CHECK_S)


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


def run_role(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` for a role process, except that worker threads still running at
    the end are not waited for.

    Why: a role stopped mid-step (SIGTERM) leaves its step's thread running (a train step in
    ``asyncio.to_thread``: cancelling the await does not stop the thread), and
    ``asyncio.run`` joins every such thread before it returns: under load the role outlived
    its stop by 10 s and more (tests/run/test_orphans.py). Nothing of an abandoned step is
    durable (saves run to their end through :func:`to_thread_to_end`), and the caller ends
    the process with :func:`exit_now` right after."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:  # cancelled until they end (bus.stop_tasks): on 3.11 a single cancel can be lost
            loop.run_until_complete(bus.stop_tasks(*asyncio.all_tasks(loop)))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()  # its default executor shut down without waiting for its threads


def stacks_on_sigusr1() -> None:
    """SIGUSR1 prints every thread's Python stack to stderr (a role's lines in the run's log),
    then every asyncio task's, and the process goes on.

    Why: a run that seems stuck can be asked where each process is (``kill -USR1 <pid>``),
    and the tests ask every process of a run that outlived its timeout before they kill it, so
    a hang seen once in CI says where it was. The threads' stacks alone say "in the event
    loop" of a process whose awaits hang: the tasks' say which await."""
    import faulthandler

    with contextlib.suppress(AttributeError, ValueError, RuntimeError):  # no SIGUSR1 (Windows)
        signal.signal(signal.SIGUSR1, _print_tasks)  # runs after faulthandler's dump (chain)
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)


def _print_tasks(signum: int, frame: object) -> None:
    """Every task of the event loop running in this (the main) thread, with its stack."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop running here: the threads' stacks said it all
        return
    tasks = asyncio.all_tasks(loop)
    print(f"asyncio: {len(tasks)} tasks", file=sys.stderr)
    for task in tasks:
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


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


async def until_done_or_bus_gone(coro: Coroutine[Any, Any, T], stop: asyncio.Event,
                                 connected: Callable[[], bool]) -> tuple[bool, T | None]:
    """Run ``coro`` to its end (after ``stop`` too: that is a role's clean stop), unless
    ``stop`` is set and ``connected()`` stays false for :data:`BUS_GONE_S` seconds: then cancel
    it, and give it :data:`CANCEL_WAIT_S` seconds to end before ending the process
    (:func:`exit_now`). Returns (finished, result); (False, None) when it was cancelled.

    Why: with the server gone, every KV read, publish and request a stopping role still makes
    rides the loss out (``bus.retry.RIDE_OUT``, 3 minutes) and the clients reconnect forever:
    a role SIGTERMed then (``trinity run`` SIGKILLed: its nats-server went with it) stopped
    after minutes, or never. What it could still do needs the server; what is durable without
    it is kept: a checkpoint being written finishes (:func:`to_thread_to_end`), the replay
    store's close waits for the transaction in flight, and each of them was made to survive a
    SIGKILL anyway (an unacked message comes again, an uncommitted step is redone)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        lost_since: float | None = None
        while not task.done():
            now = time.monotonic()
            if connected():
                lost_since = None
            elif lost_since is None:
                lost_since = now
            elif now - lost_since >= BUS_GONE_S:
                break
            await asyncio.wait({task}, timeout=0.2)
        if task.done():
            return True, task.result()
        log.warning("stopping_without_the_bus", seconds=BUS_GONE_S,
                    why="no NATS server reachable: waits on it are cancelled")
        await bus.stop_tasks(task, timeout=CANCEL_WAIT_S)
        if not task.done():
            log.error("stop_stuck_exiting", seconds=CANCEL_WAIT_S)
            exit_now(1)
        if not task.cancelled() and task.exception() is not None:
            log.info("stopped_with", error=f"{type(task.exception()).__name__}: {task.exception()}")
        return False, None
    finally:
        stopper.cancel()


async def to_thread_to_end(fn: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread(fn, *args)`` whose thread is awaited to its end even when the
    caller is cancelled meanwhile; the cancel goes on after it.

    Why: a stop that gives up on a lost bus (:func:`until_done_or_bus_gone`) cancels the role's
    work wherever it waits; a durable write in a thread (a checkpoint) must finish rather than
    run on beside the clean-up, or be cut by the exit that follows."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(fut)
            break
        except asyncio.CancelledError:
            if fut.done() and fut.cancelled():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result
