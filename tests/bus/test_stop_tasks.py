"""stop_tasks(): a loop whose cancel was lost still stops (the explorer's end-of-stage hang)."""

from __future__ import annotations

import asyncio
import sys

import bus


async def _requests_forever(current: list[asyncio.Future[None]]) -> None:
    """A loop over ``wait_for`` calls, as a watcher over nats-py requests is."""
    loop = asyncio.get_running_loop()
    while True:
        fut: asyncio.Future[None] = loop.create_future()
        current.append(fut)
        await asyncio.wait_for(fut, 5.0)


async def test_a_cancel_that_lands_as_the_request_completes_still_stops_the_loop() -> None:
    current: list[asyncio.Future[None]] = []
    task = asyncio.create_task(_requests_forever(current))
    await asyncio.sleep(0.01)

    def reply_and_cancel() -> None:  # the reply and the cancel in one turn of the loop
        current[-1].set_result(None)
        task.cancel()

    asyncio.get_running_loop().call_soon(reply_and_cancel)
    await asyncio.sleep(0.05)
    if sys.version_info < (3, 12):  # the race this guards against: the cancel was dropped
        assert not task.done() and len(current) > 1
    await asyncio.wait_for(bus.stop_tasks(task), 5.0)
    assert task.cancelled()


async def test_finished_and_missing_tasks_are_fine() -> None:
    async def fail() -> None:
        raise RuntimeError("its own error")

    done = asyncio.create_task(fail())
    await asyncio.sleep(0)
    await bus.stop_tasks(done, None)  # read, not raised: it was the task's to report
    assert done.done()
