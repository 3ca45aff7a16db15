"""The sync machines' tables (``roles/weightsync/states.py``): every state is reachable
from the start and has a way back to it, and a move the table lacks raises, naming the
machine, the move and the state."""

from __future__ import annotations

import enum
from collections.abc import Mapping

import pytest

from roles.weightsync.states import (
    EXPLORER_MOVES,
    MACHINES,
    MEANINGS,
    TRAINER_MOVES,
    ExplorerGroup,
    IllegalMove,
    Machine,
    TrainerGroup,
)


def _reachable(moves: Mapping[tuple[enum.Enum, str], enum.Enum], start: enum.Enum) -> set[enum.Enum]:
    seen, todo = {start}, [start]
    while todo:
        s = todo.pop()
        for (a, _), b in moves.items():
            if a is s and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


@pytest.mark.parametrize("name", list(MACHINES))
def test_every_state_is_reachable_and_can_get_back_to_the_start(name):
    moves, start = MACHINES[name]
    states = set(type(start))
    assert _reachable(moves, start) == states
    for s in states:  # a state with no way back would strand an end in it for the run
        assert start in _reachable(moves, s), s


def test_a_move_the_table_lacks_raises_and_names_it():
    m = Machine("trainer", TRAINER_MOVES, TrainerGroup.NONE)
    with pytest.raises(IllegalMove, match="trainer: no move 'connected' from state 'none'"):
        m.move("connected")
    assert m.state is TrainerGroup.NONE  # unchanged


def test_the_trainer_forms_connects_and_drops_a_group():
    m = Machine("trainer", TRAINER_MOVES, TrainerGroup.NONE)
    assert [m.move(e) for e in ("form", "connected", "hello", "form", "broken")] == [
        TrainerGroup.FORMING, TrainerGroup.FORMED, TrainerGroup.NONE, TrainerGroup.FORMING, TrainerGroup.NONE]


def test_an_explorer_that_asked_goes_back_outside_when_no_group_comes():
    m = Machine("explorer", EXPLORER_MOVES, ExplorerGroup.OUTSIDE)
    assert m.move("hello") is ExplorerGroup.ASKED
    assert m.move("no_rendezvous") is ExplorerGroup.OUTSIDE
    with pytest.raises(IllegalMove):
        m.move("lost")  # only a member loses its group


def test_every_state_says_what_it_means():
    assert {s for _, start in MACHINES.values() for s in type(start)} == set(MEANINGS)


def test_a_receive_cancelled_mid_broadcast_leaves_no_unretrieved_exception():
    """A stop cancels the explorer's wait for a broadcast while its receives run in threads;
    asyncio must not log "exception was never retrieved" for the gathered receives (it did
    in a role's log after its run was SIGKILLed, failing the no-orphans test)."""
    import asyncio
    import gc
    import time

    from roles.weightsync.broadcast import _receive

    class Blocked:
        async def receive_weights(self) -> int:
            await asyncio.to_thread(time.sleep, 0.3)
            return 1

    async def main() -> list[dict]:
        seen: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        task = asyncio.create_task(_receive([Blocked(), Blocked()], timeout=60))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0.5)  # the threads finish
        gc.collect()
        await asyncio.sleep(0)
        return seen

    seen = asyncio.run(main())
    # only the gathered receives' own report counts: gc.collect() also finalises other tests'
    # leftovers in this worker (an HTTP client's task of a closed loop), reported here too
    ours = [c for c in seen if type(c.get("future")).__name__ == "_GatheringFuture"]
    assert not ours, ours
