"""The embedded server: generated config, start/stop, ensure_server, serve_forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bus.errors import BusError
from bus.server import EmbeddedServer, ensure_server, free_port, is_listening, render_config
from schemas.config import NatsConfig


def test_render_config_has_limits_and_jetstream(tmp_path: Path) -> None:
    text = render_config(host="127.0.0.1", port=4333, store_dir=str(tmp_path), token='t"ok')
    assert "max_payload: 8388608" in text
    assert "max_pending: 67108864" in text
    assert f'store_dir: "{tmp_path}"' in text
    assert 'token: "t\\"ok"' in text
    with pytest.raises(ValueError, match="max_payload"):
        render_config(host="h", port=1, store_dir="d", max_payload=16 * 1024 * 1024)


def test_start_stop_keeps_data_dir_and_config(nats_server_factory, tmp_path: Path) -> None:
    s = nats_server_factory(store_dir=tmp_path / "st")
    assert s.running and is_listening(s.host, s.port)
    assert (tmp_path / "st" / "nats-server.conf").stat().st_mode & 0o777 == 0o600
    s.stop()
    assert not s.running and not is_listening(s.host, s.port)
    assert (tmp_path / "st" / "jetstream").is_dir()


def test_start_failure_says_why(nats_server_factory, tmp_path: Path) -> None:
    first = nats_server_factory()
    clash = EmbeddedServer(tmp_path / "other", port=first.port)
    t = time.monotonic()
    with pytest.raises(BusError, match="nats-server"):
        clash.start(timeout=5)
    assert time.monotonic() - t < 5


def test_ensure_server(nats_binary, tmp_path: Path, nats_server) -> None:
    # Something listens already: leave it alone.
    assert ensure_server(NatsConfig(url=nats_server.url), tmp_path / "a") is None
    # Remote URL or embedded off: not ours to start.
    assert ensure_server(NatsConfig(url="nats://10.1.2.3:4222"), tmp_path / "b") is None
    port = free_port()
    assert (
        ensure_server(NatsConfig(url=f"nats://127.0.0.1:{port}", embedded=False), tmp_path / "c")
        is None
    )
    # Local and nothing there: start one.
    s = ensure_server(NatsConfig(url=f"nats://127.0.0.1:{port}"), tmp_path / "d")
    try:
        assert s is not None and is_listening("127.0.0.1", port)
        assert (tmp_path / "d" / "nats-server.conf").exists()
    finally:
        if s:
            s.stop()


# The slow variant holds serve_forever in its wait-until-ready loop for 2 s after the server
# listens, so the SIGTERM reaches the server while serve_forever is still "starting" it (a race
# CI once lost: the server's clean exit was reported as a failed start, exit 1).
SLOW_READY = (
    "import time; from bus.server import EmbeddedServer; _t0 = time.monotonic();"
    "_ready = EmbeddedServer._says_ready;"
    "EmbeddedServer._says_ready = lambda self: time.monotonic() - _t0 > 2 and _ready(self);"
)


@pytest.mark.parametrize("slow_ready", [False, True], ids=["ready", "sigterm_while_starting"])
def test_serve_forever_runs_until_sigterm(nats_binary, tmp_path: Path, slow_ready: bool) -> None:
    port = free_port()
    code = (SLOW_READY if slow_ready else "") + (
        "import sys; from bus.server import serve_forever; from schemas.config import NatsConfig;"
        f"sys.exit(serve_forever(NatsConfig(url='nats://127.0.0.1:{port}'), {str(tmp_path)!r}))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 15
        while not is_listening("127.0.0.1", port):
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        assert not is_listening("127.0.0.1", port)
    finally:
        if p.poll() is None:
            p.kill()
