"""One run, one owner (``roles/launch/owner.py``): a second start of a running job is refused before it
starts anything (exit 2, naming the holder), so no experience is trained twice; two names
that give one bus run id are refused too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bus
from bus.server import free_port
from roles.launch.owner import LEASE_S, RunLease, lock_job
from schemas.config import TrinityConfig
from schemas.loader import ConfigError
from tests.conftest import nats_settings
from tests.helpers import wait_for

from .helpers import running, steps_log, tiny_run_config, trained_exactly_once, trinity

# 24 train rows / batch 3 = 8 steps of 3 groups x 4 experiences
STEPS, PER_STEP = 8, 12


def _lock_holder(job: Path, role: str = "trainer") -> int | None:
    f = job.parent / f".{job.name}.lock" / role
    try:
        return json.loads(f.read_text() or "{}").get("pid")
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_the_same_job_started_twice_runs_once(tmp_path, tiny_model, arith):
    """Two ``trinity run`` of one config (a double-click in the studio, a script run twice):
    the second exits 2 naming the first's pid and host, before it starts a server or a role;
    the first trains every experience exactly once."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False)
    job = tmp_path / "ckpt/t/r"
    log = tmp_path / "first.log"
    with running("run", "--config", str(cfg), log=log) as first:
        wait_for("the first run's lock", lambda: _lock_holder(job) == first.pid, first, log=log)
        t0 = time.monotonic()
        second = trinity("run", "--config", str(cfg))
        out, _ = second.communicate(timeout=120)
        text = out.decode()
        assert second.returncode == 2, text[-3000:]
        assert f"already running: pid {first.pid} on host {socket.gethostname()}" in text, text[-3000:]
        assert "embedded nats-server" not in text and " | " not in text  # no server, no role
        assert time.monotonic() - t0 < 60
    assert first.returncode == 0, log.read_text()[-4000:]
    trained_exactly_once(job, STEPS, PER_STEP)
    assert {e["pid"] for e in steps_log(job)} == {steps_log(job)[0]["pid"]}


def test_the_job_lock_names_its_holder_and_dies_with_it(tmp_path):
    job = tmp_path / "p" / "n"
    held = lock_job(job, ["buffer", "trainer"])
    with pytest.raises(ConfigError, match=rf"job {job} is already running: pid {os.getpid()} on host .* its trainer"):
        lock_job(job, ["explorer", "trainer"])
    lock_job(job, ["explorer"]).release()  # an explore run beside a train run of one job: fine
    held.release()  # the holder is gone: the lock is free; no job folder was made, so nothing is left
    assert not (tmp_path / "p").exists()
    lock_job(job, ["trainer"]).release()
    # a process that holds it and is killed leaves it free too
    code = f"from roles.launch.owner import lock_job; import time; f = lock_job({str(job)!r}, ['trainer']); print('held', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    assert p.stdout is not None and p.stdout.readline() == b"held\n"
    with pytest.raises(ConfigError, match=f"pid {p.pid}"):
        lock_job(job, ["trainer"])
    p.send_signal(signal.SIGKILL)
    p.wait()
    lock_job(job, ["trainer"]).release()


def _cfg(tmp_path: Path, url: str, project: str, name: str) -> TrinityConfig:
    return TrinityConfig(project=project, name=name, checkpoint_root_dir=str(tmp_path / "ckpt"),
                         nats={"url": url, "embedded": False})


async def _lease(js: object, cfg: TrinityConfig) -> RunLease:
    lease = RunLease([await bus.RunState.open(js, cfg.run_id)], [cfg], ["buffer", "trainer"])
    await lease.take()
    return lease


async def test_two_names_that_give_one_run_id_are_refused(tmp_path, nats_server):
    """``a.b``/``c`` and ``a``/``b.c`` are two job folders and one run id: the second would have
    deleted the first's live streams as stale. Refused while the first runs, and afterwards
    while the first's job folder exists (the bus state is that job's)."""
    tag = os.urandom(3).hex()
    first = _cfg(tmp_path, nats_server.url, f"x{tag}.b", "c")
    other = _cfg(tmp_path, nats_server.url, f"x{tag}", "b.c")
    assert first.run_id == other.run_id and first.checkpoint_job_dir != other.checkpoint_job_dir
    nc = await bus.connect(nats_settings(nats_server.url), name="owner-test")
    try:
        js = bus.jetstream(nc, first.nats)
        lease = await _lease(js, first)
        with pytest.raises(ConfigError, match=rf"run id {first.run_id} is in use by job .*{first.name}"):
            await _lease(js, other)
        with pytest.raises(ConfigError, match=rf"job {first.checkpoint_job_dir} is already running: pid {os.getpid()}"):
            await _lease(js, first)
        await lease.release()
        Path(first.checkpoint_job_dir).mkdir(parents=True)
        with pytest.raises(ConfigError, match=f"belongs to job {first.checkpoint_job_dir}"):
            await _lease(js, other)
        await (await _lease(js, first)).release()  # the same job again, once released: fine
    finally:
        await nc.close()


async def test_a_lease_is_renewed_and_outlives_no_dead_holder(tmp_path, nats_server):
    """A holder that renews keeps the run; one whose process is gone (this host) is replaced
    at once, without waiting :data:`LEASE_S` out."""
    cfg = _cfg(tmp_path, nats_server.url, f"y{os.urandom(3).hex()}", "r")
    nc = await bus.connect(nats_settings(nats_server.url), name="owner-test")
    try:
        js = bus.jetstream(nc, cfg.nats)
        state = await bus.RunState.open(js, cfg.run_id)
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        from schemas import keys
        from schemas.state import Owner

        await state.put(keys.run_owner("trainer"), Owner(dead.pid, socket.gethostname(), cfg.checkpoint_job_dir,
                                                         time.time() + LEASE_S))
        lease = await _lease(js, cfg)  # its holder is gone: taken at once
        held, _ = await state.entry(keys.run_owner("trainer"))
        assert held.pid == os.getpid() and held.until > time.time()
        await lease._renew()
        renewed, _ = await state.entry(keys.run_owner("trainer"))
        assert renewed.until >= held.until and renewed.pid == os.getpid()
        await lease.release()
    finally:
        await nc.close()


async def test_releasing_a_lease_does_not_wait_for_a_server_that_is_gone(tmp_path, nats_server_factory):
    """Stopping ``trinity run`` after its nats-server was killed hung for minutes: each of the
    lease's keys waited the server out (seen 2026-11-28). Release is best effort, bounded."""
    from roles.launch.owner import RELEASE_S

    server = nats_server_factory()
    cfg = _cfg(tmp_path, server.url, f"z{os.urandom(3).hex()}", "r")
    nc = await bus.connect(nats_settings(server.url), name="owner-test")
    try:
        lease = await _lease(bus.jetstream(nc, cfg.nats), cfg)
        server.stop()
        t0 = time.monotonic()
        await lease.release()
        assert time.monotonic() - t0 < RELEASE_S + 2.0
        assert lease.revisions == [0, 0]
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5.0)


@pytest.mark.slow
def test_a_twin_sweep_is_refused_before_it_starts_anything(tmp_path, tiny_model, arith):
    """Two identical ``trinity sweep``s started a second apart got the same run names and
    trained 384 experiences for 256; the second is refused, naming the first."""
    lora = {"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"}
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), name="s",
                          stages=False, extra={"model.lora_configs": [lora]})
    sweep = ("sweep", "--config", str(cfg), "--set", "algorithm.optimizer.lr=1e-4,1e-3")
    folder = tmp_path / "ckpt/t/s-sweep"
    # (after the SIGTERM below the first has a minute to end: its exit is not what this tests)
    with running(*sweep, log=tmp_path / "first.log", timeout=60) as first:
        wait_for("the first sweep's lock", lambda: _lock_holder(folder) == first.pid, first, log=tmp_path / "first.log")
        second = trinity(*sweep)
        out, _ = second.communicate(timeout=120)
        text = out.decode()
        assert second.returncode == 2, text[-3000:]
        assert f"already running: pid {first.pid} on host {socket.gethostname()}" in text, text[-3000:]
        assert " | " not in text  # no process of its own started
        first.send_signal(signal.SIGTERM)  # the first need not finish: this test is about the second


@pytest.mark.slow
async def test_run_clicked_twice_in_the_studio_trains_once(tmp_path, tiny_model, arith):
    """The studio's Run, twice on one config: the second ``trinity run`` exits 2 naming the
    first (the page shows its exit code and log), the first trains every experience once."""
    from aiohttp.test_utils import TestClient, TestServer

    from roles.tools.studio.app import make_app

    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False)
    import yaml

    doc = yaml.safe_load(cfg.read_text())
    client = TestClient(TestServer(make_app(tmp_path / "ckpt", "tok", cwd=tmp_path)),
                        headers={"Authorization": "Bearer tok", "X-Studio": "1"})
    await client.start_server()
    try:
        runs = [await (await client.post("/api/run", json={"doc": doc, "path": "studio.yaml"})).json() for _ in range(2)]
        assert all(r["started"] for r in runs), runs

        async def exit_code(pid: int) -> int | None:
            return (await (await client.get(f"/api/launch/{pid}")).json())["exit_code"]

        codes = {}
        deadline = time.monotonic() + 600
        while len(codes) < 2 and time.monotonic() < deadline:
            for r in runs:
                if r["pid"] not in codes and (rc := await exit_code(r["pid"])) is not None:
                    codes[r["pid"]] = rc
            await asyncio.sleep(1)
        assert sorted(codes.values()) == [0, 2], codes
        refused = next(r for r in runs if codes[r["pid"]] == 2)
        assert "is already running: pid" in Path(refused["log"]).read_text()
    finally:
        await client.close()
    trained_exactly_once(tmp_path / "ckpt/t/r", STEPS, PER_STEP)
