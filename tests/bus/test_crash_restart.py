"""Crashes: a SIGKILLed consumer, a restarted nats-server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import bus
from bus.consume import Consumer
from bus.publish import Publisher
from tests.conftest import make_group, nats_settings

ROOT = Path(__file__).resolve().parents[2]
PROC = Path(__file__).with_name("consumer_proc.py")


def _start_consumer(
    url: str, run_id: str, durable: str, mode: str, ack_wait: float
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(PROC), url, run_id, durable, mode, str(ack_wait)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _report_then_kill(p: subprocess.Popen[str]) -> str:
    """Wait for the child's GOT/ACKED line, SIGKILL it, return the line."""
    try:
        assert p.stdout is not None
        for line in p.stdout:  # structlog also writes here; skip its lines
            if line.startswith(("GOT ", "ACKED ")):
                return line.strip()
        return ""
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)


async def test_sigkilled_consumer_gets_unacked_message_again(nats_server, run_id) -> None:
    cfg = nats_settings(nats_server.url, ack_wait=1.0)
    nc = await bus.connect(cfg)
    await bus.ensure_streams(bus.jetstream(nc, cfg), cfg, run_id)
    pub = Publisher(nc, cfg, run_id)
    await pub.publish_group(make_group(run_id, group_id="held"))
    await pub.publish_group(make_group(run_id, group_id="acked"))

    # Two separate durables (processes started together: imports are slow on 2 cores): one
    # is killed holding its message, the other after a confirmed ack.
    holder_p = _start_consumer(nats_server.url, run_id, "holder", "hold", 1.0)
    acker_p = _start_consumer(nats_server.url, run_id, "acker", "ack", 1.0)
    lines = await asyncio.gather(
        asyncio.to_thread(_report_then_kill, holder_p),
        asyncio.to_thread(_report_then_kill, acker_p),
    )
    assert lines == [f"GOT {run_id}/held/v0", f"ACKED {run_id}/held/v0"]

    # Restarted "holder": the message it never acked comes back (after ack_wait; the server
    # may hand out the next new message first, so collect both).
    holder = await Consumer(nc, cfg, run_id, "exp", "holder").start()
    got = {}
    for _ in range(10):
        got.update({d.msg_id: d.num_delivered for d in await holder.fetch(2, timeout=1)})
        if len(got) == 2:
            break
    assert got == {f"{run_id}/held/v0": 2, f"{run_id}/acked/v0": 1}
    # Restarted "acker": the acked one is gone, it continues with the next.
    acker = await Consumer(nc, cfg, run_id, "exp", "acker").start()
    got2 = await acker.fetch(1, timeout=5)
    assert [d.msg_id for d in got2] == [f"{run_id}/acked/v0"] and got2[0].num_delivered == 1
    await nc.close()


async def test_server_restart_under_publisher_and_consumer(
    nats_server_factory, tmp_path, run_id
) -> None:
    server = nats_server_factory(store_dir=tmp_path / "store")
    cfg = nats_settings(server.url, reconnect_time_wait=0.1, ack_wait=2.0, publish_timeout=30)
    pnc = await bus.connect(cfg, name="pub")
    cnc = await bus.connect(cfg, name="con")
    await bus.ensure_streams(bus.jetstream(pnc, cfg), cfg, run_id)
    pub = Publisher(pnc, cfg, run_id, attempt_timeout=1.0)
    con = await Consumer(cnc, cfg, run_id, "exp", "buffer").start()

    total = 120
    acked: set[str] = set()
    received: set[str] = set()
    published_half = asyncio.Event()

    async def produce() -> None:
        for i in range(total):
            g = make_group(run_id, group_id=f"g{i}", n=2, tokens=256, prompt=64, seed=i)
            mid = g.msg_id()
            t = await pub.submit_group(g)
            t.add_done_callback(lambda t, m=mid: t.exception() is None and acked.add(m))
            if i == total // 2:
                published_half.set()
            await asyncio.sleep(0.01)
        await pub.flush()

    async def consume() -> None:
        while len(received) < total:
            items = await con.fetch(16, timeout=0.5)
            received.update(d.msg_id for d in items)
            if items:
                await con.ack(items)

    producer = asyncio.ensure_future(produce())
    consumer = asyncio.ensure_future(consume())
    await published_half.wait()
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(0.3)
    await asyncio.to_thread(server.start)
    await asyncio.wait_for(producer, 60)
    await asyncio.wait_for(consumer, 60)

    assert len(acked) == total and received == acked
    info = await bus.jetstream(pnc, cfg).stream_info(bus.names(run_id).stream("exp"))
    assert info.state.messages == total  # every acked message is there, and only once
    assert pnc.stats["reconnects"] >= 1 and cnc.stats["reconnects"] >= 1
    await pnc.close()
    await cnc.close()
