"""No orphans: a ``trinity run`` killed by SIGKILL takes its roles and its nats-server with it,
a role told to stop does not wait for a server that is gone, and a supervised role whose
supervisor died stops by itself (``roles/runtime/signals.py``).

Real processes on a real nats-server, the tiny config of the other ``trinity run`` tests.
The bounds are loose (10 s; measured 2-4 s on 2 cores): the machine may be busy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bus.server import free_port
from tests.helpers import wait_for

from .helpers import nats_server_pid, role_pid, steps_log, tiny_run_config, trinity

pytestmark = pytest.mark.slow

ROLES = ("buffer", "synchronizer", "trainer", "explorer")
#: Seconds within which a stopped role must be gone (measured: 2-4 s).
GONE_WITHIN = 10.0


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (a zombie waiting for its parent's wait does not count)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid`` (each role is a session leader: its children too)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state, ppid, pgrp, session
            out.append(int(pid))
    return out


def gone_within(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Seconds until each of ``pids`` is gone; fails naming those still alive after ``seconds``."""
    t0 = time.monotonic()
    left, took = dict(pids), {}
    while left and time.monotonic() - t0 < seconds:
        for name, pid in list(left.items()):
            if not alive(pid):
                took[name] = round(time.monotonic() - t0, 1)
                del left[name]
        time.sleep(0.1)
    assert not left, f"still alive {seconds:.0f}s later: {left} (gone: {took})"
    return took


def test_a_sigkilled_trinity_run_leaves_no_process_behind(tmp_path, tiny_model, arith):
    """SIGKILL ``trinity run`` mid-GRPO (after the SFT stage): its nats-server (PR_SET_PDEATHSIG)
    and every role (the same, then a clean stop that gives up on the lost server) are gone."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port())
    log = tmp_path / "run.log"
    p = trinity("run", "--config", str(cfg), log=log)
    try:
        wait_for("a GRPO train step", lambda: steps_log(tmp_path / "ckpt/t/r/grpo"), p, log=log, timeout=300)
        pids = {r: role_pid(r, cfg) for r in ROLES}
        pids["nats-server"] = nats_server_pid(tmp_path / "ckpt/nats")
        assert all(pids.values()), pids
    finally:
        p.kill()
        p.wait()
    took = gone_within(pids, GONE_WITHIN)
    print(f"gone after SIGKILL of trinity run: {took}")
    leftovers = {r: session_members(pids[r]) for r in ROLES}
    assert not any(leftovers.values()), f"children of the roles left: {leftovers}"
    # each role stopped cleanly: giving up on the lost server (``stopping_without_the_bus``), or
    # the ordinary way when its work ended before it noticed (seen under load)
    logs = tmp_path / "ckpt/t/r/log"
    for r in ROLES:
        text = (logs / f"{r}.log").read_text()
        for bad in ("Traceback", "never retrieved"):
            assert bad not in text, text[text.index(bad) - 500:][:3000]


def test_roles_stop_on_sigterm_with_the_server_gone(tmp_path, tiny_model, arith, nats_server_factory):
    """Four roles started alone (as honcho does) on an external server; the server is SIGKILLed
    under them, then each role gets SIGTERM: all exit 0 within seconds, not after riding the
    lost server out (3 minutes a round trip, reconnecting forever)."""
    server = nats_server_factory()
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=server.port,
                          stages=False, extra={"nats.embedded": False})
    procs = {r: trinity(r, "--config", str(cfg), log=tmp_path / f"{r}.log") for r in ROLES}
    try:
        wait_for("train step 1", lambda: steps_log(tmp_path / "ckpt/t/r"), *procs.values(), timeout=300)
        server.proc.kill()
        server.proc.wait()
        time.sleep(1.0)  # the roles notice (they would reconnect for ever)
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        took = gone_within({r: proc.pid for r, proc in procs.items()}, GONE_WITHIN)
        print(f"exit after SIGTERM with the server gone: {took}")
        for r, proc in procs.items():
            text = (tmp_path / f"{r}.log").read_text(errors="replace")
            assert proc.wait() == 0, f"{r} exited {proc.returncode}: {text[-3000:]}"
            assert "Traceback" not in text, text[text.index("Traceback"):][:3000]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_supervised_role_stops_when_its_supervisor_dies(tmp_path, tiny_model, arith, nats_server_factory):
    """The portable fallback: a buffer whose ``TRINITY_SUPERVISED`` names a process that then
    dies (not its parent, so no PR_SET_PDEATHSIG fires: the watchdog must see it) stops
    cleanly, exit 0, with the server still there."""
    server = nats_server_factory()
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=server.port,
                          stages=False, extra={"nats.embedded": False})
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    log = tmp_path / "buffer.log"
    buffer = trinity("buffer", "--config", str(cfg), log=log, env_extra={"TRINITY_SUPERVISED": str(supervisor.pid)})
    try:
        wait_for("the buffer's start", lambda: "buffer_started" in log.read_text(errors="replace"), buffer,
                 log=log, timeout=120)
        supervisor.kill()
        supervisor.wait()
        gone_within({"buffer": buffer.pid}, GONE_WITHIN)
        text = log.read_text(errors="replace")
        assert buffer.wait() == 0, text[-3000:]
        assert "supervisor_gone_stopping" in text and "stopping_without_the_bus" not in text, text[-3000:]
    finally:
        for proc in (supervisor, buffer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
