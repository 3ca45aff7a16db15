"""Request/reply, KV run state, streams' idempotency and `trinity inspect`."""

from __future__ import annotations

import asyncio
import time

import pytest
import structlog.testing
from nats.js import api

import bus
from bus.errors import NoResponders, RemoteError, RequestTimeout, StreamConflict
from bus.publish import Publisher
from bus.rpc import Message, request, serve
from schemas.codec import CodecError
from schemas.data import SyncEvent
from schemas.state import Join, Offer, Pull, Rendezvous, StageDone
from tests.conftest import make_group


async def test_request_reply(nats_conn, run_id) -> None:
    subject = bus.names(run_id).rpc("batch")

    async def handler(req: Message) -> bytes | Message:
        if req.data == b"fail":
            raise ValueError("no batch for you")
        if req.data == b"slow":
            await asyncio.sleep(1)
        if req.data == b"big":  # bigger than max_payload: sent as chunks
            return Message(bytes(range(256)) * (40 * 1024), {"Trinity-Count": "7"})
        return b"re:" + req.data

    sub = await serve(nats_conn, subject, handler)
    assert (await request(nats_conn, subject, b"x", timeout=5)).data == b"re:x"
    big = await request(nats_conn, subject, b"big", timeout=10)
    assert big.data == bytes(range(256)) * (40 * 1024) and big.headers["Trinity-Count"] == "7"
    with pytest.raises(RemoteError, match="no batch for you"):
        await request(nats_conn, subject, b"fail", timeout=5)
    t = time.monotonic()
    with pytest.raises(RequestTimeout, match=subject):
        await request(nats_conn, subject, b"slow", timeout=0.3)
    assert time.monotonic() - t < 1
    await sub.unsubscribe()
    with pytest.raises(NoResponders, match=subject):
        await request(nats_conn, subject, b"x", timeout=5)


async def test_kv_run_state(nats_conn, nats_cfg, run_id) -> None:
    js = bus.jetstream(nats_conn, nats_cfg)
    st = await bus.RunState.open(js, run_id)
    st2 = await bus.RunState.open(js, run_id)  # idempotent
    assert await st.model_version("explorer") is None
    await st.set_model_version("explorer", 3)
    assert await st2.model_version("explorer") == 3
    await st.heartbeat("trainer", step=5)
    hb = await st2.heartbeats()
    assert hb["trainer"]["step"] == 5 and hb["trainer"]["age"] < 5
    t0 = time.time()

    async def later() -> None:
        await asyncio.sleep(0.2)
        await st.set_rendezvous(Rendezvous(time.time(), "127.0.0.1", 29500, 2, "gloo", "weights"))

    task = asyncio.ensure_future(later())
    rv = await st2.wait_rendezvous("weights", timeout=5, newer_than=t0)
    await task
    assert (rv.host, rv.port, rv.world_size) == ("127.0.0.1", 29500, 2)
    with pytest.raises(RequestTimeout):
        await st2.wait_rendezvous("nobody", timeout=0.2)
    with pytest.raises(ValueError):
        await st.heartbeat("bad role")
    assert set(await st.snapshot()) == {
        "version.explorer",
        "heartbeat.trainer",
        "rendezvous.weights",
    }


@pytest.mark.parametrize("raw, error", [
    (b"\xff{not json", "not JSON"),
    (b"{}", "ModelVersion: object missing required field version"),
    (b'{"version": "3", "ts": 1.0}', "ModelVersion.version: expected int, got str"),
    (b'{"version": -1, "ts": 1.0}', "ModelVersion.version: must be >= 0"),
    (b"[3]", "ModelVersion: expected object, got array"),
])
async def test_a_malformed_kv_value_reads_as_absent_and_is_named(nats_conn, nats_cfg, run_id, raw, error) -> None:
    """A value that is not its key's record (no JSON, a field missing or of the wrong type: another
    program's, a hand-made ``nats kv put``) must not end the role that reads it: it reads as
    absent, a warning names the key and the field, ``trinity inspect`` shows its text, and the
    key's next write replaces it."""
    js = bus.jetstream(nats_conn, nats_cfg)
    st = await bus.RunState.open(js, run_id)
    rev = await st.kv.put("version.trainer", raw)
    with structlog.testing.capture_logs() as logs:
        assert await st.get("version.trainer") is None
        assert await st.model_version("trainer") is None
        assert await st.entry("version.trainer") == (None, rev)
    warned = [e for e in logs if e["event"] == "kv_malformed"]  # once per value: readers poll
    assert [e["key"] for e in warned] == ["version.trainer"], warned
    assert warned[0]["error"].startswith("KV version.trainer: ") and error in warned[0]["error"], warned
    shown = (await st.snapshot())["version.trainer"]
    assert shown["malformed"] == raw.decode("utf-8", "replace") and error in shown["error"]
    await st.set_model_version("trainer", 4)
    assert await st.model_version("trainer") == 4


async def test_a_kv_key_holds_only_its_record(nats_conn, nats_cfg, run_id) -> None:
    """Writers are held to schemas/keys.py: a key's value is its record, and a key that is not
    declared there has no place in the bucket."""
    st = await bus.RunState.open(bus.jetstream(nats_conn, nats_cfg), run_id)
    with pytest.raises(TypeError, match="KV key sync.offer holds a Offer, not dict"):
        await st.put("sync.offer", {"version": 1})
    with pytest.raises(TypeError, match="KV key sync.offer holds a Offer, not Join"):
        await st.put("sync.offer", Join(1, 1.0))
    with pytest.raises(KeyError, match="KV key 'sync.other' is not declared in schemas/keys.py"):
        await st.put("sync.other", Join(1, 1.0))
    with pytest.raises(CodecError, match="Offer.path: a checkpoint offer needs a path"):
        await st.put("sync.offer", Offer(1, "checkpoint", 1, 1.0))
    assert await st.get("sync.offer") is None


async def test_kv_listing_is_complete_while_others_write(nats_conn, nats_cfg, run_id) -> None:
    """A listing of the bucket leaves out no live key, however busy the bucket is. (nats-py's
    ``kv.keys()`` ends its watch early while others write: keys went missing, once the only
    sign of an explorer's weight request, which then waited out ``sync_timeout``.)"""
    js = bus.jetstream(nats_conn, nats_cfg)
    st = await bus.RunState.open(js, run_id)
    for i in range(20):
        await st.heartbeat(f"r{i}")
    await st.put("sync.pull.a", Pull(1, 1.0))
    await st.put("sync.pull.b", Pull(1, 1.0))
    await st.delete("sync.pull.b")
    stop = asyncio.Event()

    async def busy() -> None:
        i = 0
        while not stop.is_set():
            await st.heartbeat(f"r{i % 20}")
            i += 1

    writers = [asyncio.create_task(busy()) for _ in range(3)]
    try:
        for _ in range(150):
            assert list(await st.with_prefix("sync.pull.")) == ["sync.pull.a"]
            assert len(await st.heartbeats()) == 20
    finally:
        stop.set()
        await asyncio.gather(*writers)


async def test_ensure_streams_idempotent_updates_and_conflicts(nats_conn, nats_cfg, run_id) -> None:
    js = bus.jetstream(nats_conn, nats_cfg)
    again = await bus.ensure_streams(js, nats_cfg, run_id)  # nats_conn already created them
    assert again["exp"].config.storage == api.StorageType.FILE
    assert again["exp"].config.duplicate_window == nats_cfg.duplicate_window
    changed = nats_cfg.model_copy(update={"stream_max_bytes": 1 << 30, "duplicate_window": 30.0})
    upd = await bus.ensure_streams(js, changed, run_id)
    assert upd["exp"].config.max_bytes == 1 << 30 and upd["exp"].config.duplicate_window == 30.0
    # A stream with our name but other subjects belongs to someone else.
    other = f"{run_id}x"
    await js.add_stream(name=bus.names(other).stream("exp"), subjects=["elsewhere.>"])
    with pytest.raises(StreamConflict, match="elsewhere"):
        await bus.ensure_streams(js, nats_cfg, other)


async def test_inspect_run(nats_conn, nats_cfg, run_id) -> None:
    js = bus.jetstream(nats_conn, nats_cfg)
    pub = Publisher(nats_conn, nats_cfg, run_id)
    for i in range(3):
        await pub.publish_group(make_group(run_id, group_id=f"g{i}", n=2, tokens=16, prompt=4))
    await pub.publish_event(SyncEvent(kind="ready", model_version=1))
    await js.publish(bus.names(run_id).exp, b"junk")
    c = await bus.Consumer(nats_conn, nats_cfg, run_id, "exp", "buffer").start()
    items = await c.fetch(8, timeout=2)
    await c.ack(items[:1])
    await (await bus.RunState.open(js, run_id)).set_model_version("trainer", 1)

    rep = await bus.inspect_run(nats_cfg, run_id, tail=2)
    exp = rep["streams"]["exp"]
    assert exp["messages"] == 4 and exp["bytes"] > 0
    [cons] = exp["consumers"]
    assert len(items) == 3 and cons["name"] == "buffer"
    assert cons["ack_pending"] == 2 and cons["pending"] == 0
    assert rep["streams"]["sync"]["messages"] == 1 and rep["dead_letters"] == 1
    assert rep["kv"]["version.trainer"]["version"] == 1
    tail = rep["tail"]["messages"]
    assert [m["seq"] for m in tail] == [3, 4]
    assert tail[0]["body"]["group_id"] == "g2" and tail[0]["headers"]["Trinity-Tokens"] == "32"
    assert (
        tail[0]["body"]["experiences"][0]["tokens"]
        == make_group(run_id, "g2", 2, 16, 4).experiences[0].tokens.tolist()
    )
    assert "decode_error" in tail[1]
    text = bus.render_text(rep)
    assert (
        bus.names(run_id).stream("exp") in text
        and "dead letters: 1" in text
        and "ack pending 2" in text
    )
    dlq = await bus.inspect_run(nats_cfg, run_id, tail=5, stream="dlq")
    assert dlq["tail"]["messages"][0]["headers"]["Trinity-Error"].startswith("CodecError")
    with pytest.raises(ValueError, match="unknown stream"):
        await bus.inspect_run(nats_cfg, run_id, tail=1, stream="nope")


async def test_delete_run_removes_streams_and_kv_only_of_that_run(nats_conn, nats_cfg, run_id) -> None:
    js = bus.jetstream(nats_conn, nats_cfg)
    other = run_id + "x"
    for r in (run_id, other):
        await bus.ensure_streams(js, nats_cfg, r)
        await (await bus.RunState.open(js, r)).put("run.done", StageDone("test", 1.0))
    gone = await bus.delete_run(js, run_id)
    assert bus.names(run_id).kv_bucket in gone and bus.names(run_id).stream("exp") in gone
    assert await (await bus.RunState.open(js, run_id)).get("run.done") is None  # a new, empty bucket
    assert await (await bus.RunState.open(js, other)).get("run.done") == StageDone("test", 1.0)
    assert await bus.delete_run(js, run_id + "never") == []
