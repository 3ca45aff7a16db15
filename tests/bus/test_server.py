"""The embedded server: generated config, start/stop, ensure_server, serve_forever."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import bus
from bus.errors import BusConnectError, BusError
from bus.server import (
    EmbeddedServer,
    EmbeddedServerRefused,
    ensure_server,
    free_port,
    is_listening,
    render_config,
)
from schemas.config import NatsConfig
from schemas.loader import ConfigError
from tests.conftest import nats_settings


def test_render_config_has_limits_and_jetstream(tmp_path: Path) -> None:
    text = render_config(host="127.0.0.1", port=4333, store_dir=str(tmp_path), token='t"ok')
    assert "max_payload: 8388608" in text
    assert "max_pending: 67108864" in text
    assert f'store_dir: "{tmp_path}"' in text
    assert 'token: "t\\"ok"' in text
    with pytest.raises(ValueError, match="max_payload"):
        render_config(host="h", port=1, store_dir="d", max_payload=16 * 1024 * 1024)


def test_render_config_auth_blocks() -> None:
    kw = dict(host="127.0.0.1", port=4333, store_dir="d")
    text = render_config(**kw, user="bob", password="pw")
    assert 'user: "bob"' in text and 'password: "pw"' in text
    text = render_config(**kw, nkey="UABC")
    assert 'users = [ { nkey: "UABC" } ]' in text
    assert "authorization" not in render_config(**kw)
    for bad in (dict(token="t", user="u"), dict(token="t", nkey="U"), dict(user="u", nkey="U")):
        with pytest.raises(ValueError, match="one of token, user/password or nkey"):
            render_config(**kw, **bad)
    with pytest.raises(ValueError, match="password needs a user"):
        render_config(**kw, password="pw")


def _user_seed(path: Path, prefix: int | None = None) -> Path:
    """A fresh nkey seed file (a user's unless ``prefix`` says otherwise)."""
    import nkeys

    path.write_bytes(
        nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER if prefix is None else prefix)
        + b"\n"
    )
    return path


# (settings the embedded server starts with, right client settings, wrong client settings);
# "URL" stands for the server's host:port.
AUTH_KINDS = {
    "token": (dict(token="s3cret"), dict(token="s3cret"), dict(token="wrong")),
    "user_password": (
        dict(user="bob", password="hunter2"),
        dict(user="bob", password="hunter2"),
        dict(user="bob", password="wrong"),
    ),
    "user_no_password": (dict(user="bob"), dict(user="bob"), dict(user="eve")),
    "url_token": (dict(url="nats://s3cret@URL"), dict(url="nats://s3cret@URL"), dict(token="x")),
    "url_user_password": (
        dict(url="nats://bob:hunter2@URL"),
        dict(user="bob", password="hunter2"),
        dict(url="nats://bob:wrong@URL"),
    ),
    "nkey": (
        dict(nkey_seed_file="user.nk"),
        dict(nkey_seed_file="user.nk"),
        dict(nkey_seed_file="other.nk"),
    ),
}


@pytest.mark.parametrize("kind", list(AUTH_KINDS))
async def test_embedded_server_enforces_auth(nats_binary, tmp_path: Path, kind: str) -> None:
    """Each kind of auth the nats section accepts: the server ensure_server starts lets a
    client with the right credentials in and refuses one without (or with wrong ones)."""
    _user_seed(tmp_path / "user.nk")
    _user_seed(tmp_path / "other.nk")
    hostport = f"127.0.0.1:{free_port()}"

    def settings(kw: dict[str, str], **more: object) -> NatsConfig:
        kw = {k: v.replace("URL", hostport) for k, v in kw.items()}
        if "nkey_seed_file" in kw:
            kw["nkey_seed_file"] = str(tmp_path / kw["nkey_seed_file"])
        return nats_settings(**{"url": f"nats://{hostport}", **kw, **more})  # type: ignore[arg-type]

    server_kw, right, wrong = AUTH_KINDS[kind]
    s = ensure_server(settings(server_kw), tmp_path / "st")
    assert s is not None
    try:
        assert "authorization {" in s.config_path.read_text()
        nc = await bus.connect(settings(right), name="right")
        assert nc.is_connected
        await nc.close()
        for label, kw in (("none", {}), ("wrong", wrong)):
            with pytest.raises(BusConnectError, match="authorization failed") as e:
                await bus.connect(settings(kw, connect_wait=0), name=label)
            assert "hunter2" not in str(e.value)
    finally:
        s.stop()


@pytest.mark.parametrize(
    "kw, named",
    [
        (
            dict(creds_file="/x/user.creds"),
            ["nats.creds_file", "nats.nkey_seed_file", "nats.token"],
        ),
        (dict(tls_ca_file="/x/ca.pem"), ["nats.tls_ca_file", "does not serve TLS"]),
        (
            dict(tls_cert_file="/x/c.pem", tls_key_file="/x/c.key"),
            ["nats.tls_cert_file, nats.tls_key_file", "does not serve TLS"],
        ),
        (dict(url="tls://127.0.0.1:PORT"), ["nats.url (tls://)"]),
        (dict(url="ws://127.0.0.1:PORT"), ["nats.url", "not ws://"]),
        (dict(token="t", user="u"), ["nats.token and nats.user"]),
        (dict(token="t", nkey_seed_file="SEED"), ["nats.token and nats.nkey_seed_file"]),
        (
            dict(url="nats://u:p@127.0.0.1:PORT", user="u"),
            ["nats.user and credentials in nats.url"],
        ),
        (dict(password="pw"), ["nats.password is set but nats.user is not"]),
        (dict(nkey_seed_file="/x/missing.nk"), ["nats.nkey_seed_file: cannot read"]),
        (dict(nkey_seed_file="GARBAGE"), ["nats.nkey_seed_file:", "does not hold an nkey seed"]),
        (dict(nkey_seed_file="ACCOUNT"), ["nats.nkey_seed_file:", "not a user"]),
        (
            dict(creds_file="/x/user.creds", tls_ca_file="/x/ca.pem"),
            ["nats.creds_file", "nats.tls_ca_file"],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_embedded_server_refuses_what_it_cannot_apply(
    tmp_path: Path, kw: dict[str, str], named: list[str]
) -> None:
    """A setting the embedded server cannot apply stops it before it starts, with an error
    naming the field (never a server that silently runs without it)."""
    import nkeys

    port = free_port()
    files = {
        "SEED": _user_seed(tmp_path / "u.nk"),
        "ACCOUNT": _user_seed(tmp_path / "a.nk", nkeys.PREFIX_BYTE_ACCOUNT),
        "GARBAGE": tmp_path / "garbage.nk",
    }
    files["GARBAGE"].write_text("not a seed\n")
    kw = {k: str(files.get(v, v)).replace("PORT", str(port)) for k, v in kw.items()}
    cfg = NatsConfig(**{"url": f"nats://127.0.0.1:{port}", **kw})  # type: ignore[arg-type]
    with pytest.raises(EmbeddedServerRefused) as e:
        ensure_server(cfg, tmp_path / "st")
    for text in named:
        assert text in str(e.value)
    assert isinstance(e.value, ConfigError)  # trinity run/server: a config error, exit 2
    assert not is_listening("127.0.0.1", port) and not (tmp_path / "st").exists()
    with pytest.raises(EmbeddedServerRefused):
        EmbeddedServer.from_config(cfg, tmp_path / "st")  # trinity server's path


def test_creds_refusal_says_what_to_do(tmp_path: Path) -> None:
    port = free_port()
    cfg = NatsConfig(url=f"nats://127.0.0.1:{port}", creds_file=str(tmp_path / "u.creds"))
    with pytest.raises(EmbeddedServerRefused) as e:
        ensure_server(cfg, tmp_path / "st")
    msg = str(e.value)
    assert "operator" in msg and "nats.embedded: false" in msg
    # Embedded off, or a server already there: the creds go to that server, nothing refused.
    assert ensure_server(cfg.model_copy(update={"embedded": False}), tmp_path / "st") is None


def test_start_stop_keeps_data_dir_and_config(nats_server_factory, tmp_path: Path) -> None:
    s = nats_server_factory(store_dir=tmp_path / "st")
    assert s.running and is_listening(s.host, s.port)
    assert (tmp_path / "st" / "nats-server.conf").stat().st_mode & 0o777 == 0o600
    s.stop()
    assert not s.running and not is_listening(s.host, s.port)
    assert (tmp_path / "st" / "jetstream").is_dir()


def _server_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)


def test_the_embedded_server_collects_garbage_sooner_unless_told_otherwise(
        nats_server_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """GOGC=50 halves the heap's swing (block caches); a GOGC or GOMEMLIMIT of the user's wins."""
    monkeypatch.delenv("GOGC", raising=False)
    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    assert _server_environ(nats_server_factory().proc.pid)["GOGC"] == "50"
    monkeypatch.setenv("GOMEMLIMIT", "200MiB")
    env = _server_environ(nats_server_factory().proc.pid)
    assert env["GOMEMLIMIT"] == "200MiB" and "GOGC" not in env


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


def test_serve_until_done_stops_after_its_last_client_and_ignores_a_late_sigterm(
        nats_binary, tmp_path: Path) -> None:
    """``trinity server --until-done`` under honcho: the run is over (``until`` returned) while a
    role is still connected; the server serves it until it leaves, then stops by itself with exit
    0, and honcho's SIGTERM (sent when the first role exits, so before or after the server
    stopped) changes nothing."""
    port, over = free_port(), tmp_path / "over"
    code = (
        "import sys; from bus.server import serve_forever; from schemas.config import NatsConfig\n"
        "import asyncio, os\n"
        f"async def over():\n    while not os.path.exists({str(over)!r}): await asyncio.sleep(0.05)\n"
        f"sys.exit(serve_forever(NatsConfig(url='nats://127.0.0.1:{port}'), {str(tmp_path)!r},"
        " until=over, linger=0.5))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True).start()

    def logged(event: str) -> bool:
        deadline = time.monotonic() + 15
        while not any(event in line for line in list(lines)):
            if p.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    role: socket.socket | None = None
    try:
        assert logged("nats_server_serving"), "".join(lines)
        role = socket.create_connection(("127.0.0.1", port), timeout=5)  # a client that has not left
        role.recv(4096)  # the server's INFO
        role.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        assert b"PONG" in role.recv(4096)
        over.touch()  # the run is over
        assert logged("run_finished_waiting_for_clients"), "".join(lines)
        p.send_signal(signal.SIGTERM)  # honcho: a role exited
        time.sleep(2)
        assert p.poll() is None and is_listening("127.0.0.1", port), "stopped while a client was on it"
        role.close()
        assert logged("run_finished_stopping"), "".join(lines)
        assert "clients=0" in next(line for line in lines if "run_finished_stopping" in line)
        time.sleep(0.6)  # the linger: honcho's SIGTERM again, racing the server's own exit
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0, "".join(lines)
    finally:
        if role is not None:
            role.close()
        if p.poll() is None:
            p.kill()
