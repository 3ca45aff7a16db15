"""``roles/runtime/signals.py``: a stop gives up on a lost bus, a durable thread finishes first, and
who counts as this process's supervisor. The processes themselves: ``tests/run/test_orphans.py``."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from roles.runtime import signals
from roles.runtime.config import SUPERVISED_ENV


async def test_a_stop_waits_for_the_work_while_the_bus_is_there():
    stop = asyncio.Event()

    async def work() -> str:
        await asyncio.sleep(signals.BUS_GONE_S + 0.5)  # longer than the bus-gone wait
        return "done"

    stop.set()
    assert await signals.until_done_or_bus_gone(work(), stop, lambda: True) == (True, "done")


async def test_a_stop_gives_up_on_work_that_waits_for_a_lost_bus():
    stop = asyncio.Event()
    cleaned = []

    async def waits_on_the_bus() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(True)  # its finally blocks run: a clean stop, minus the bus

    t0 = time.monotonic()
    stop.set()
    assert await signals.until_done_or_bus_gone(waits_on_the_bus(), stop, lambda: False) == (False, None)
    assert signals.BUS_GONE_S <= time.monotonic() - t0 < signals.BUS_GONE_S + 5  # + the cancel
    assert cleaned == [True]


async def test_without_a_stop_a_lost_bus_is_waited_out():
    async def work() -> int:
        await asyncio.sleep(0.1)
        return 7

    assert await signals.until_done_or_bus_gone(work(), asyncio.Event(), lambda: False) == (True, 7)


async def test_a_durable_thread_finishes_before_the_cancel_goes_on():
    started, written = threading.Event(), []

    def save() -> None:
        started.set()
        time.sleep(0.5)
        written.append("checkpoint")

    task = asyncio.ensure_future(signals.to_thread_to_end(save))
    await asyncio.to_thread(started.wait)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert written == ["checkpoint"]


def test_the_supervisor_is_the_pid_trinity_run_put_in_the_environment(monkeypatch):
    monkeypatch.delenv(SUPERVISED_ENV, raising=False)
    assert signals.supervisor_pid() is None  # started alone: honcho, by hand
    monkeypatch.setenv(SUPERVISED_ENV, "1")  # not a supervisor's pid (init)
    assert signals.supervisor_pid() is None
    monkeypatch.setenv(SUPERVISED_ENV, "4242")
    assert signals.supervisor_pid() == 4242


def test_orphaned_when_the_supervisor_or_the_parent_is_gone():
    assert not signals.orphaned(os.getppid(), os.getpid())
    assert signals.orphaned(os.getppid() + 1 if os.getppid() > 1 else 2, os.getpid())  # another parent now
    assert signals.orphaned(os.getppid(), 2**30)  # past any pid_max: no such process


def _sigusr1_in(body: str) -> str:
    """Run ``body`` in a Python process that called ``stacks_on_sigusr1`` and must print
    "still here" last, exit 0; its stderr (where the stacks go)."""
    import subprocess
    import sys

    code = "from roles.runtime.signals import stacks_on_sigusr1\nstacks_on_sigusr1()\n" + body
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "still here\n"
    return out.stderr


def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on():
    """What the run tests send a run that outlived its timeout (``tests/run/helpers.py``)."""
    err = _sigusr1_in("import os, signal, threading, time\n"
                      "threading.Thread(target=time.sleep, args=(5,), daemon=True, name='sleeper').start()\n"
                      "os.kill(os.getpid(), signal.SIGUSR1)\n"
                      "print('still here', flush=True)\n")
    assert "Current thread 0x" in err and "\nThread 0x" in "\n" + err, err  # both


def test_sigusr1_also_prints_every_asyncio_task_with_the_await_it_waits_on():
    """A supervisor hung at its end showed only "in asyncio.run": the tasks say which await."""
    err = _sigusr1_in("import asyncio, os, signal\n"
                      "async def renew_forever():\n"
                      "    await asyncio.sleep(60)\n"
                      "async def main():\n"
                      "    t = asyncio.create_task(renew_forever())\n"
                      "    await asyncio.sleep(0.1)\n"
                      "    os.kill(os.getpid(), signal.SIGUSR1)\n"
                      "    await asyncio.sleep(0.2)\n"
                      "    t.cancel()\n"
                      "    print('still here', flush=True)\n"
                      "asyncio.run(main())\n")
    assert "Current thread 0x" in err, err  # the threads first
    assert "asyncio: 2 tasks" in err and "renew_forever" in err, err
