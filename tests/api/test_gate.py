"""``WeightGate``: requests and weight loads take turns on the engines, and the loads of one
broadcast (one per engine) run together."""

from __future__ import annotations

import asyncio

from roles.explorer.api.gate import WeightGate


async def test_the_loads_of_one_broadcast_hold_the_gate_together():
    """Each engine's load waits in the broadcast for the others: one load waiting for another
    to end waited for itself (4 engines behind the API hung until the sync timeout)."""
    gate, arrived = WeightGate(), asyncio.Barrier(4)

    async def load() -> None:
        async with gate.load():
            await arrived.wait()  # the collective: every engine is in it, or none finishes

    await asyncio.wait_for(asyncio.gather(*(load() for _ in range(4))), 5)


async def test_a_load_waits_for_requests_in_flight_and_new_requests_wait_for_it():
    gate, order = WeightGate(), []
    answered = asyncio.Event()

    async def request(name: str, hold: asyncio.Event | None = None) -> None:
        async with gate.request():
            order.append(f"{name} in")
            if hold is not None:
                await hold.wait()
            order.append(f"{name} out")

    async def load() -> None:
        async with gate.load():
            order.append("load")

    first = asyncio.create_task(request("first", answered))
    await asyncio.sleep(0)
    loading = asyncio.create_task(load())
    await asyncio.sleep(0.01)
    later = asyncio.create_task(request("later"))  # arrives while the load waits: goes after it
    await asyncio.sleep(0.01)
    assert order == ["first in"]
    answered.set()
    await asyncio.wait_for(asyncio.gather(first, loading, later), 5)
    assert order == ["first in", "first out", "load", "later in", "later out"]
