"""Publish and consume against a real server: dedup, headers, chunking, DLQ, acks."""

from __future__ import annotations

import asyncio

import pytest

import bus
from bus.consume import Consumer
from bus.errors import PayloadTooLarge, PublishError
from bus.publish import H_CHUNK_COUNT, H_MSG_ID, MAX_MESSAGE_BYTES, Publisher
from schemas import codec
from schemas.data import ExperienceGroup, Metric, SyncEvent
from tests.conftest import make_group, nats_settings


async def _stream_msgs(nc, cfg, run_id: str, kind: str = "exp") -> int:
    info = await bus.jetstream(nc, cfg).stream_info(bus.names(run_id).stream(kind))
    return info.state.messages


async def test_same_group_twice_is_stored_once(nats_conn, nats_cfg, run_id) -> None:
    pub = Publisher(nats_conn, nats_cfg, run_id)
    g = make_group(run_id)
    a1 = await pub.publish_group(g)
    # A retry after a crash re-encodes a fresh but identical object: same id, stored once.
    a2 = await pub.publish_group(make_group(run_id))
    assert a1.seq == a2.seq and a2.duplicate
    t = await pub.submit_group(make_group(run_id))
    await pub.flush()
    assert t.result()[0].duplicate
    assert await _stream_msgs(nats_conn, nats_cfg, run_id) == 1
    assert pub.duplicates == 2


async def test_roundtrip_headers_and_ack(nats_conn, nats_cfg, run_id) -> None:
    pub = Publisher(nats_conn, nats_cfg, run_id)
    for i in range(5):
        await pub.submit_group(make_group(run_id, group_id=f"g{i}", version=3, seed=i))
    await pub.flush()
    c = await Consumer(nats_conn, nats_cfg, run_id, "exp", "buffer").start()
    got = []
    while len(got) < 5:
        got += await c.fetch(16, timeout=2)
    g0 = got[0]
    assert isinstance(g0.obj, ExperienceGroup) and g0.obj.group_id == "g0"
    assert g0.msg_id == f"{run_id}/g0/v3" == g0.headers[H_MSG_ID]
    h = g0.headers
    assert h["Trinity-Schema"] == "experience_group" and h["Trinity-Run"] == run_id
    assert h["Trinity-Model-Version"] == "3" and h["Trinity-Task-Id"] == "task-g0"
    assert h["Trinity-Tokens"] == str(8 * 1024) and h["Trinity-Reward-Mean"] == "0.5"
    assert [d.obj.group_id for d in got] == [f"g{i}" for i in range(5)]
    await c.ack(got)
    info = await c.info()
    assert info.num_ack_pending == 0 and info.num_pending == 0
    # Acked messages are not delivered again, even to a fresh consumer object.
    c2 = await Consumer(nats_conn, nats_cfg, run_id, "exp", "buffer").start()
    assert await c2.fetch(16, timeout=0.3) == []


async def test_nak_redelivers_and_in_progress_holds(nats_conn, nats_cfg, run_id) -> None:
    pub = Publisher(nats_conn, nats_cfg, run_id)
    await pub.publish_group(make_group(run_id))
    cfg = nats_cfg.model_copy(update={"ack_wait": 1.0})
    c = await Consumer(nats_conn, cfg, run_id, "exp", "slow").start()
    [d] = await c.fetch(1, timeout=2)
    for _ in range(3):  # 1.5 s of work > ack_wait, kept alive by in_progress
        await asyncio.sleep(0.5)
        await d.in_progress()
    assert await c.fetch(1, timeout=0.2) == []
    await d.nak()
    [again] = await c.fetch(1, timeout=2)
    assert again.num_delivered == 2 and again.msg_id == d.msg_id
    await again.ack_sync()


async def test_events_go_to_their_streams(nats_conn, nats_cfg, run_id) -> None:
    pub = Publisher(nats_conn, nats_cfg, run_id)
    await pub.publish_event(SyncEvent(kind="ready", model_version=2, step=7))
    await pub.publish_event(Metric(role="trainer", step=7, kind="train", values={"loss": 0.5}))
    await pub.publish_event(SyncEvent(kind="stop", model_version=2), kind="ctl")
    for kind, typ in (("sync", SyncEvent), ("metrics", Metric), ("ctl", SyncEvent)):
        c = await Consumer(nats_conn, nats_cfg, run_id, kind, "mon").start()
        [d] = await c.fetch(4, timeout=2)
        assert isinstance(d.obj, typ)
        await d.ack()
    s = await Consumer(nats_conn, nats_cfg, run_id, "sync", "mon2").start()
    [d] = await s.fetch(1, timeout=2)
    assert d.headers["Trinity-Kind"] == "ready" and d.headers["Trinity-Step"] == "7"


async def test_garbage_goes_to_dlq_and_consumer_goes_on(nats_conn, nats_cfg, run_id) -> None:
    n = bus.names(run_id)
    pub = Publisher(nats_conn, nats_cfg, run_id)
    js = bus.jetstream(nats_conn, nats_cfg)
    await pub.publish_group(make_group(run_id, group_id="before"))
    await js.publish(n.exp, b"\x00garbage\xff", headers={"Nats-Msg-Id": "junk-1"})
    await js.publish(
        n.exp, codec.encode(Metric(role="x", step=0, kind="k", values={}))
    )  # wrong schema
    await pub.publish_group(make_group(run_id, group_id="after"))
    c = await Consumer(nats_conn, nats_cfg, run_id, "exp", "buffer", expect=ExperienceGroup).start()
    got = []
    for _ in range(10):
        got += await c.fetch(8, timeout=1)
        if len(got) == 2:
            break
    assert [d.obj.group_id for d in got] == ["before", "after"]
    await c.ack(got)
    assert c.dead_letters == 2
    dl = await Consumer(nats_conn, nats_cfg, run_id, "dlq", "reader", decode=lambda b: b).start()
    dead = await dl.fetch(8, timeout=2)
    assert [d.obj for d in dead][0] == b"\x00garbage\xff"
    h = dead[0].headers
    assert "CodecError" in h["Trinity-Error"] and h["Trinity-Original-Subject"] == n.exp
    assert h["Trinity-Original-Msg-Id"] == "junk-1" and h["Trinity-Consumer"] == "buffer"
    assert "expected a ExperienceGroup" in dead[1].headers["Trinity-Error"]
    # The garbage was terminated, not left to be redelivered forever.
    info = await c.info()
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_message_never_acked_goes_to_dlq_on_its_last_delivery(
    nats_conn, nats_cfg, run_id
) -> None:
    """max_deliver is the last resort: a message that is delivered and never acked (its
    consumer crashes on it, say) is dead-lettered on delivery max_deliver, not retried."""
    cfg = nats_cfg.model_copy(update={"max_deliver": 3})
    pub = Publisher(nats_conn, cfg, run_id)
    await pub.publish_group(make_group(run_id, group_id="poison"))
    await pub.publish_group(make_group(run_id, group_id="fine"))
    c = await Consumer(nats_conn, cfg, run_id, "exp", "buffer", expect=ExperienceGroup).start()
    seen = []
    for _ in range(20):
        for d in await c.fetch(8, timeout=1):
            seen.append(d.obj.group_id)
            if d.obj.group_id == "poison":
                await d.nak()  # as if the consumer had died on it
            else:
                await c.ack([d])
        if c.dead_letters:
            break
    assert seen.count("poison") == 2 and seen.count("fine") == 1, seen
    assert c.dead_letters == 1
    dl = await Consumer(nats_conn, cfg, run_id, "dlq", "reader", decode=lambda b: b).start()
    [dead] = await dl.fetch(8, timeout=2)
    assert "delivered 3 times, never acked" in dead.headers["Trinity-Error"]
    assert dead.headers["Trinity-Original-Msg-Id"] == f"{run_id}/poison/v0"


async def test_long_group_ids_sharing_a_prefix_are_not_duplicates(
    nats_conn, nats_cfg, run_id
) -> None:
    """Nats-Msg-Id is limited to a header's 200 characters: ids past it (or with characters a
    header cannot carry) get a hash of the whole id, so neither group is dropped by dedup."""
    from bus.publish import id_header

    assert id_header("run/g/v1") == "run/g/v1"
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert id_header(a) != id_header(b) and len(id_header(a)) == 200
    assert id_header("g\n1") != id_header("g\r1")  # both render as 'g1'
    pub = Publisher(nats_conn, nats_cfg, run_id)
    for gid in (a, b):
        assert not (await pub.publish_group(make_group(run_id, group_id=gid))).duplicate
    c = await Consumer(nats_conn, nats_cfg, run_id, "exp", "buffer", expect=ExperienceGroup).start()
    got = await c.fetch(8, timeout=2)
    assert sorted(d.obj.group_id for d in got) == [a, b]


async def test_big_group_is_chunked_and_reassembled(nats_server_factory, run_id) -> None:
    s = nats_server_factory(max_payload=256 * 1024)
    cfg = nats_settings(s.url, max_payload=256 * 1024)
    nc = await bus.connect(cfg)
    js = bus.jetstream(nc, cfg)
    await bus.ensure_streams(js, cfg, run_id)
    pub = Publisher(nc, cfg, run_id)
    big = make_group(run_id, group_id="big", n=16, tokens=4096, prompt=512)  # ~0.5 MB
    small = make_group(run_id, group_id="small")
    await pub.publish_group(big)
    await pub.publish_group(big)  # the retry is de-duplicated chunk by chunk
    await pub.publish_group(small)
    stored = await _stream_msgs(nc, cfg, run_id)
    size = len(codec.encode(big))
    chunks = -(-size // pub.chunk_size)
    assert chunks >= 3 and stored == chunks + 1
    c = await Consumer(nc, cfg, run_id, "exp", "buffer").start()
    got = []
    while len(got) < 2:
        got += await c.fetch(16, timeout=2)
    d = got[0]
    assert d.obj.group_id == "big" and d.size == size and len(d.msgs) == chunks
    assert H_CHUNK_COUNT not in d.headers and d.msg_id == big.msg_id()
    assert (d.obj.experiences[3].tokens == big.experiences[3].tokens).all()
    assert got[1].obj.group_id == "small"
    await c.ack(got)
    assert (await c.info()).num_ack_pending == 0
    await nc.close()


async def test_unacked_chunks_come_back_whole(nats_server_factory, run_id) -> None:
    s = nats_server_factory(max_payload=128 * 1024)
    cfg = nats_settings(s.url, max_payload=128 * 1024, ack_wait=1.0)
    nc = await bus.connect(cfg)
    await bus.ensure_streams(bus.jetstream(nc, cfg), cfg, run_id)
    big = make_group(run_id, group_id="big", n=8, tokens=4096, prompt=512)
    await Publisher(nc, cfg, run_id).publish_group(big)
    c = await Consumer(nc, cfg, run_id, "exp", "buffer").start()
    [d] = await c.fetch(4, timeout=2)
    await c.close()  # "crash" before ack: every chunk is redelivered
    c2 = await Consumer(nc, cfg, run_id, "exp", "buffer").start()
    [d2] = await c2.fetch(4, timeout=4)
    assert d2.obj.group_id == "big" and d2.num_delivered >= 2
    await c2.ack([d2])
    await nc.close()


async def test_oversize_is_rejected_with_size_and_limit(nats_conn, nats_cfg, run_id) -> None:
    pub = Publisher(nats_conn, nats_cfg, run_id, chunking=False)
    big = make_group(run_id, group_id="big", n=16, tokens=65536, prompt=1024)  # ~9.5 MB
    with pytest.raises(PayloadTooLarge, match=r"bytes exceeds the limit of \d+ bytes") as e:
        await pub.publish_group(big)
    assert "chunking is off" in str(e.value)
    pub2 = Publisher(nats_conn, nats_cfg, run_id)
    with pytest.raises(PayloadTooLarge, match=str(MAX_MESSAGE_BYTES)):
        pub2.frame(bytes(MAX_MESSAGE_BYTES + 1), "id", {})
    assert await _stream_msgs(nats_conn, nats_cfg, run_id) == 0


async def test_batches_iterator_and_fetch_budget(nats_conn, nats_cfg, run_id) -> None:
    pub = Publisher(nats_conn, nats_cfg, run_id)
    for i in range(20):
        await pub.submit_group(make_group(run_id, group_id=f"g{i}", n=2, tokens=64, prompt=16))
    await pub.flush()
    c = await Consumer(nats_conn, nats_cfg, run_id, "exp", "buffer").start()
    # Before any message was seen the batch assumes max_payload-sized messages.
    assert c.batch_size(64) == c.fetch_bytes // nats_cfg.max_payload
    stop = asyncio.Event()
    seen = 0
    async for batch in c.batches(8, timeout=0.5, stop=stop):
        assert 1 <= len(batch) <= 8
        seen += len(batch)
        await c.ack(batch)
        if seen == 20:
            stop.set()
    assert c.batch_size(64) == 64  # small messages seen: the full batch fits the budget


async def test_submitted_publish_that_cannot_be_stored_fails_flush(nats_cfg, run_id) -> None:
    """A submitted message nobody stores (no stream for the run) is retried until
    publish_timeout, then flush() raises PublishError naming its id; the slot comes back and
    the publisher goes on (here: a stream appears and the next message is stored)."""
    cfg = nats_cfg.model_copy(update={"publish_timeout": 1.5})
    nc = await bus.connect(cfg, name="test-nostream")
    try:
        pub = Publisher(nc, cfg, run_id, attempt_timeout=0.5)
        g = make_group(run_id)
        fut = await pub.submit_group(g)
        with pytest.raises(PublishError, match=g.msg_id()):
            await pub.flush()
        assert fut.done() and isinstance(fut.exception(), PublishError)
        assert pub.in_flight == 0 and pub.published == 0
        await bus.ensure_streams(bus.jetstream(nc, cfg), cfg, run_id)
        await pub.submit_group(make_group(run_id, group_id="g1"))
        await pub.flush()
        assert pub.published == 1 and await _stream_msgs(nc, cfg, run_id) == 1
    finally:
        await nc.close()


async def test_a_lost_ack_is_noticed_and_the_message_sent_again(
    nats_conn, nats_cfg, run_id
) -> None:
    """The first ack never arrives (the server stored the message, the reply got lost): after
    the attempt's wait the message is sent again with the same id, the stream holds it once,
    and nothing is left waiting (neither in the publisher nor in nats-py's ack window)."""
    pub = Publisher(nats_conn, nats_cfg, run_id, attempt_timeout=0.2)
    real = pub.js.publish_async
    lost: list[asyncio.Future] = []

    async def first_ack_lost(subject: str, payload: bytes, **kw: object) -> asyncio.Future:
        fut = await real(subject, payload, **kw)
        if lost:
            return fut
        lost.append(fut)
        return asyncio.get_running_loop().create_future()  # an ack that never comes

    pub.js.publish_async = first_ack_lost  # type: ignore[method-assign]
    done = await pub.submit_group(make_group(run_id))
    await pub.flush()
    assert len(lost) == 1 and not lost[0].result().duplicate  # the first copy was stored
    assert done.result()[0].duplicate  # the re-send found it stored
    assert pub.published == 1 and pub.duplicates == 1
    assert await _stream_msgs(nats_conn, nats_cfg, run_id) == 1
    assert pub.in_flight == 0 and pub.js.publish_async_pending() == 0


async def test_cancelling_a_submitted_publish_frees_its_slot(nats_cfg, run_id) -> None:
    """A caller may give up on a submitted message (cancel its future): its slot comes back,
    it is neither counted nor reported as a failure, and the next submit goes through."""
    cfg = nats_cfg.model_copy(update={"publish_concurrency": 1, "publish_timeout": 30.0})
    nc = await bus.connect(cfg, name="test-cancel")
    try:
        pub = Publisher(nc, cfg, run_id, attempt_timeout=0.2)
        stuck = await pub.submit_group(make_group(run_id))  # no stream yet: retried, not stored
        assert pub.in_flight == 1
        stuck.cancel()
        await asyncio.wait([stuck])  # the cancellation lands
        assert pub.in_flight == 0
        await bus.ensure_streams(bus.jetstream(nc, cfg), cfg, run_id)
        nxt = await asyncio.wait_for(pub.submit_group(make_group(run_id, group_id="g1")), 5)
        await pub.flush()  # the cancelled one is no failure
        assert stuck.cancelled() and not nxt.result()[0].duplicate
        assert pub.published == 1 and await _stream_msgs(nc, cfg, run_id) == 1
    finally:
        await nc.close()


def test_header_value_is_ascii_without_control_characters() -> None:
    """Headers must stay one readable ASCII line whatever a task id holds (the fast path for
    plain ids must give what the full rendering gives)."""
    from bus.publish import header_value

    def full(v: object, limit: int = 256) -> str:
        s = str(v).translate({i: None for i in range(32)} | {127: None})
        s = s.encode("ascii", "backslashreplace").decode("ascii")
        return s if len(s) <= limit else s[: limit - 3] + "..."

    for v in [chr(i) for i in range(0x3000)] + ["t/1", "a\r\nb", "é", "x" * 300, 42, None]:
        got = header_value(v)
        assert got == full(v) and got.isascii() and "\r" not in got and "\n" not in got
