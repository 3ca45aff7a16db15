"""Stream trimming: only what every durable consumer acknowledged goes, the newest ``keep``
stay, and a consumer started again after the trim gets everything it had not acknowledged."""

from __future__ import annotations

import pytest

import bus
from bus.consume import Consumer
from bus.publish import Publisher
from bus.retention import purge_below, trim_streams
from schemas import keys
from schemas.data import Metric
from schemas.state import Cursor
from tests.conftest import make_group


@pytest.mark.unit
@pytest.mark.parametrize(("last", "floors", "keep", "first"), [
    (100, [], 10, 91),          # no durable consumer: the newest 10 stay
    (100, [50], 10, 51),        # acknowledged up to 50: 51.. stay (more than keep)
    (100, [95, 30], 10, 31),    # the slowest consumer decides
    (100, [0], 10, 1),          # a consumer that acknowledged nothing: nothing goes
    (5, [5], 10, 1),            # fewer messages than keep
])
def test_purge_below(last: int, floors: list[int], keep: int, first: int) -> None:
    assert purge_below(last, floors, keep) == first


async def test_trim_purges_only_what_the_consumer_acknowledged(nats_conn, nats_cfg, run_id) -> None:
    js = bus.jetstream(nats_conn, nats_cfg)
    pub = Publisher(nats_conn, nats_cfg, run_id)
    for i in range(12):
        await pub.submit_group(make_group(run_id, group_id=f"g{i}", n=1, tokens=16, prompt=8, seed=i))
    await pub.flush()
    cfg = nats_cfg.model_copy(update={"ack_wait": 1.0})  # unacknowledged: redelivered after 1 s
    c = await Consumer(nats_conn, cfg, run_id, "exp", "buffer").start()
    got = []
    while len(got) < 12:
        got += await c.fetch(16, timeout=2)
    await c.ack(got[:8])  # g8..g11 delivered, not acknowledged: the buffer "crashed"
    # a reader that keeps its own position (the leader's cursor) holds the trim back too
    assert await trim_streams(js, run_id, keep=2, readers={"exp": 5}) == {"exp": 5}
    assert await trim_streams(js, run_id, keep=2) == {"exp": 3}
    assert await trim_streams(js, run_id, keep=-1) == {}
    # a restarted buffer gets exactly the four it had not acknowledged
    await c.close()
    c2 = await Consumer(nats_conn, cfg, run_id, "exp", "buffer").start()
    again = []
    for _ in range(20):
        again += await c2.fetch(16, timeout=0.5)
        if len(again) >= 4:
            break
    assert sorted(d.obj.group_id for d in again) == ["g10", "g11", "g8", "g9"]
    await c2.ack(again)
    assert await trim_streams(js, run_id, keep=2) == {"exp": 2}  # now only the newest 2 stay
    info = await js.stream_info(bus.names(run_id).stream("exp"))
    assert (info.state.first_seq, info.state.messages) == (11, 2)


async def test_the_buffer_tidies_by_its_settings(nats_conn, nats_cfg, run_id, tmp_path) -> None:
    """``roles.buffer.main.tidy`` (once a minute in the buffer): the replay store keeps
    ``keep_used_groups`` used-up groups, the streams ``nats.stream_keep`` messages."""
    from types import SimpleNamespace

    from roles.buffer.main import FORGET_BATCH, tidy
    from schemas.config import TrinityConfig
    from storage.replay import ReplayStore
    from tests.storage.test_replay import group

    project, name = run_id.split(".", 1)
    cfg = TrinityConfig.model_validate({
        "project": project, "name": name, "nats": {"url": nats_cfg.url, "stream_keep": 100},
        "buffer": {"trainer_input": {"experience_buffer": {"name": "exp", "keep_used_groups": 3}}}})
    assert cfg.run_id == run_id
    js = bus.jetstream(nats_conn, nats_cfg)
    pub = Publisher(nats_conn, nats_cfg, run_id)
    for kind in ("metrics", "done"):
        for i in range(150):
            await pub.publish(Metric(role="test", step=i, kind="test", values={}), kind)
    state = await bus.RunState.open(js, run_id)
    await tidy(cfg, SimpleNamespace(store=None), js, state)  # no leader's cursor yet: done is all unread
    await state.put(keys.EXPLORER_CURSOR, Cursor(step=1, done_from=21))  # it read 20 of them
    with ReplayStore(tmp_path / "r") as store:
        n = 2 * FORGET_BATCH + 8  # more than one transaction's worth: a round takes them all
        store.put_groups([group(f"g{i}", 0) for i in range(n)])
        store.take_batch("step-1", 2 * n)
        store.commit_batch("step-1")
        await tidy(cfg, SimpleNamespace(store=store), js, state)
        assert store.stats().groups == 3  # keep_used_groups
    metrics = await js.stream_info(bus.names(run_id).stream("metrics"))
    done = await js.stream_info(bus.names(run_id).stream("done"))
    assert metrics.state.messages == 100  # stream_keep: no durable consumer reads metrics
    assert done.state.first_seq == 21  # the cursor's first unread, though stream_keep is 100

