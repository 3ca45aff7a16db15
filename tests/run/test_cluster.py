"""A run on a three-node NATS cluster (three ``trinity server --cluster-port`` nodes with
routes, every stream and the KV bucket at three replicas): one node is killed mid-run and brought back later; the roles
fail over to the others and the run finishes with every experience trained exactly once.
And ``nats.replicas`` larger than the cluster fails naming the setting."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import bus
from bus.server import free_port
from schemas.config import NatsConfig
from tests.helpers import wait_for

from .helpers import (
    nats_server_pid,
    steps_log,
    tiny_run_config,
    trained_exactly_once,
    trinity,
)

pytestmark = pytest.mark.slow

STEPS, PER_STEP = 8, 12


def _cluster(tmp_path, cfg) -> list[tuple[Any, Path, str]]:
    """Three ``trinity server`` nodes (the README's command), each with its own store:
    (process, store, client URL)."""
    ports = [(free_port(), free_port()) for _ in range(3)]
    nodes = []
    for i, (port, route_port) in enumerate(ports):
        routes = ",".join(f"nats-route://127.0.0.1:{rp}" for j, (_, rp) in enumerate(ports) if j != i)
        store = tmp_path / f"node{i}"
        p = trinity("server", "--config", str(cfg), "--set", f"nats.store_dir={store}", "--port", str(port),
                    "--cluster-port", str(route_port), "--name", f"n{i}", "--routes", routes,
                    log=tmp_path / f"node{i}.log")
        nodes.append((p, store, f"nats://127.0.0.1:{port}"))
    return nodes


def _stop(nodes: list[tuple[Any, Path, str]]) -> None:
    for p, _, _ in nodes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p, _, _ in nodes:
        try:
            p.wait(30)
        except Exception:
            p.kill()


async def _jetstream_ready(url: str, timeout: float = 60.0) -> None:
    """Until the cluster has elected its JetStream meta leader (an R3 stream can be made)."""
    # the nodes are `trinity server` processes: on a busy machine they take more than the
    # default 10 s to listen (CI, 2026-11-27: refused for 10 s while the suite ran vLLM)
    nc = await bus.connect(NatsConfig(url=url, embedded=False), name="probe", connect_wait=timeout)
    deadline = time.monotonic() + timeout
    try:
        js = bus.jetstream(nc, NatsConfig(url=url))
        while True:
            try:
                await js.add_stream(name="probe", subjects=["probe"], num_replicas=3)
                await js.delete_stream("probe")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await bus.disconnect(nc)


def test_a_run_survives_losing_a_cluster_node(tmp_path, tiny_model, arith):
    base = tiny_run_config(tmp_path / "base.yaml", model=tiny_model, data=arith, port=free_port(), stages=False)
    nodes = _cluster(tmp_path, base)
    url = ",".join(u for _, _, u in nodes)
    try:
        asyncio.run(_jetstream_ready(url))
        cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=0, stages=False,
                              extra={"nats.url": url, "nats.embedded": False, "nats.replicas": 3})
        job = tmp_path / "ckpt/t/r"
        log = tmp_path / "run.log"
        p = trinity("run", "--config", str(cfg), log=log)
        try:
            wait_for("train step 2", lambda: any(e["step"] >= 2 for e in steps_log(job)), p, log=log)
            # the node of the first URL, killed hard (its nats-server, not the trinity server
            # wrapping it, which would stop it cleanly)
            os.kill(nats_server_pid(nodes[0][1]), signal.SIGKILL)
            nodes[0][0].wait(30)
            wait_for("train step 5", lambda: any(e["step"] >= 5 for e in steps_log(job)), p, log=log)
            first = nodes[0]
            nodes[0] = (trinity(*first[0].args[3:], log=tmp_path / "node0-again.log"), first[1], first[2])
            p.wait(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
        text = log.read_text()
        assert p.returncode == 0, text[-4000:]
        trained_exactly_once(job, STEPS, PER_STEP)
    finally:
        _stop(nodes)


def test_more_replicas_than_servers_fails_naming_the_setting(tmp_path, tiny_model, arith):
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False,
                          extra={"nats.replicas": 3})
    p = trinity("run", "--config", str(cfg), "--max-restarts", "0")
    out = p.communicate(timeout=300)[0].decode()
    assert p.returncode != 0
    assert "nats.replicas is 3" in out, out[-3000:]
