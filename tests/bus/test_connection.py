"""connect(): clear errors naming the URL and cause, fast; auth by token; TLS."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

import bus
from bus.errors import BusConnectError
from bus.server import free_port
from tests.conftest import nats_settings


async def test_refused_names_url_and_cause() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    t = time.monotonic()
    with pytest.raises(BusConnectError) as e:
        await bus.connect(nats_settings(url, connect_wait=0.3))
    assert url in str(e.value) and "refused" in str(e.value)
    assert time.monotonic() - t < 3


async def test_connect_waits_for_a_starting_server(nats_server_factory) -> None:
    import asyncio

    port = free_port()

    async def start_later() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(nats_server_factory, port=port)

    starter = asyncio.ensure_future(start_later())
    nc = await bus.connect(nats_settings(f"nats://127.0.0.1:{port}", connect_wait=10))
    await starter
    assert nc.is_connected
    assert type(nc) is NatsClient  # nats-py's client as it is: no subclass
    await nc.close()


async def test_token_auth(nats_server_factory) -> None:
    s = nats_server_factory(token="s3cret")
    nc = await bus.connect(nats_settings(s.url, token="s3cret"))
    assert nc.is_connected
    await nc.close()
    for bad in ("wrong", None):
        t = time.monotonic()
        with pytest.raises(BusConnectError) as e:
            await bus.connect(nats_settings(s.url, token=bad, connect_wait=5))
        assert "authorization failed" in str(e.value) and s.url in str(e.value)
        assert time.monotonic() - t < 3, "auth errors must not be retried"


async def test_password_is_redacted_in_errors() -> None:
    url = f"nats://bob:hunter2@127.0.0.1:{free_port()}"
    with pytest.raises(BusConnectError) as e:
        await bus.connect(nats_settings(url, connect_wait=0))
    assert "hunter2" not in str(e.value) and "bob:***@" in str(e.value)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("certs")
    _make_ca(d, "ca")
    _make_ca(d, "otherca")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        cwd=d,
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "san.cnf", "-out", "server.pem", cwd=d)  # fmt: skip
    return d


async def test_tls_right_and_wrong_ca(nats_server_factory, certs: Path) -> None:
    s = nats_server_factory(
        tls_cert_file=str(certs / "server.pem"), tls_key_file=str(certs / "server.key")
    )
    assert s.url.startswith("tls://")
    nc = await bus.connect(nats_settings(s.url, tls_ca_file=str(certs / "ca.pem")))
    js = bus.jetstream(nc, nats_settings(s.url))
    await bus.ensure_streams(js, nats_settings(s.url), "tls.run")
    await nc.close()
    t = time.monotonic()
    with pytest.raises(BusConnectError) as e:
        await bus.connect(
            nats_settings(s.url, tls_ca_file=str(certs / "otherca.pem"), connect_wait=5)
        )
    assert "TLS" in str(e.value) and s.url in str(e.value)
    assert time.monotonic() - t < 3


async def test_missing_tls_file_is_named() -> None:
    with pytest.raises(BusConnectError, match="TLS CA file '/nope/ca.pem' does not exist"):
        await bus.connect(nats_settings("tls://127.0.0.1:4222", tls_ca_file="/nope/ca.pem"))


async def test_nkey_seed_file_auth(nats_binary: str, tmp_path: Path) -> None:
    """A user authenticated by an nkey seed file connects; a different key is refused."""
    import os
    import signal

    import nkeys

    def new_user() -> tuple[bytes, str]:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        return seed, nkeys.from_seed(bytearray(seed)).public_key.decode()

    seed, public = new_user()
    other_seed, _ = new_user()
    port = free_port()
    conf = tmp_path / "nkey.conf"
    conf.write_text(f'port: {port}\nhost: "127.0.0.1"\nauthorization {{ users = [ {{ nkey: "{public}" }} ] }}\n')
    good, bad = tmp_path / "user.nk", tmp_path / "other.nk"
    good.write_bytes(seed)
    bad.write_bytes(other_seed)
    proc = subprocess.Popen([nats_binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"nats://127.0.0.1:{port}"
        nc = await bus.connect(nats_settings(url, nkey_seed_file=str(good), connect_wait=10))
        assert nc.is_connected
        await nc.close()
        with pytest.raises(BusConnectError) as e:
            await bus.connect(nats_settings(url, nkey_seed_file=str(bad), connect_wait=5))
        assert url in str(e.value)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
