"""One way to connect: :func:`connect` turns :class:`NatsConfig` into a live ``nats.NATS``.

Why a wrapper: nats-py's own first connect either retries forever (``max_reconnect_attempts``
-1) or raises a bare ``NoServersError`` that hides the cause. Roles start in any order (honcho
starts the server and the roles together), so the first connect retries *refused* for
``connect_wait`` seconds, but fails at once, naming the URL, on errors retrying cannot fix:
wrong token, TLS verification, missing credential files. Once connected, nats-py reconnects
by itself, with our exponential backoff, and every connection event is logged.

The client is nats-py's own ``Client``, used through its public API only: no subclass, no
private names, so a nats-py release cannot break the bus silently. An earlier subclass swapped
in a faster header parser and publish command to save microseconds per message; without it
the bus still carries about 20 times its target of 1,000,000 tokens/s
(``bench/bus_throughput.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import ssl
import time
import weakref
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS

from schemas.config import NatsConfig
from schemas.redact import redact_url

from .errors import BusConnectError

log = structlog.get_logger(__name__)

#: Reconnect backoff cap in seconds (the base is ``reconnect_time_wait``).
BACKOFF_CAP = 10.0

#: Every client :func:`connect` handed out in this process (weakly: a dropped one goes).
_clients: weakref.WeakSet[NATS] = weakref.WeakSet()


def connected() -> bool:
    """Is any client :func:`connect` made in this process connected to a server right now?

    Why: a role told to stop must tell "a step is taking its time" (wait for it) from "the
    server is gone" (every bus round trip it waits on would ride the loss out for minutes:
    give up on them, ``roles/runtime/signals.py``). False while every client is reconnecting, closed,
    or none was made."""
    return any(nc.is_connected for nc in list(_clients))


def _need_file(url: str, what: str, path: str | None) -> None:
    if path and not os.path.isfile(path):
        raise BusConnectError(url, f"{what} {path!r} does not exist")


def ssl_context(cfg: NatsConfig) -> ssl.SSLContext | None:
    """TLS context from the settings, or None when TLS is not asked for.

    TLS is on when the URL scheme is ``tls://`` or any ``tls_*`` file is set. ``tls_ca_file``
    replaces the system CAs (a private CA is the common case for a training cluster).
    """
    url = redact_url(cfg.url)
    wants = cfg.url.strip().startswith("tls://") or any(
        (cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file)
    )
    if not wants:
        return None
    _need_file(url, "TLS CA file", cfg.tls_ca_file)
    _need_file(url, "TLS certificate file", cfg.tls_cert_file)
    _need_file(url, "TLS key file", cfg.tls_key_file)
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.tls_ca_file)
        if cfg.tls_cert_file:
            ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
        elif cfg.tls_key_file:
            raise BusConnectError(url, "tls_key_file is set but tls_cert_file is not")
    except ssl.SSLError as e:
        raise BusConnectError(url, f"cannot load TLS files: {e}") from e
    return ctx


def _auth_kwargs(cfg: NatsConfig) -> dict[str, Any]:
    url = redact_url(cfg.url)
    kw: dict[str, Any] = {}
    if cfg.token:
        kw["token"] = cfg.token
    if cfg.user:
        kw["user"] = cfg.user
        kw["password"] = cfg.password or ""
    if cfg.creds_file or cfg.nkey_seed_file:
        try:
            import nkeys  # noqa: F401  (nats-py signs with it)
        except ImportError as e:
            raise BusConnectError(
                url, "credentials/nkey auth needs the `nkeys` package (pip install nkeys)"
            ) from e
        _need_file(url, "credentials file", cfg.creds_file)
        _need_file(url, "nkey seed file", cfg.nkey_seed_file)
        if cfg.creds_file:
            kw["user_credentials"] = cfg.creds_file
        else:
            kw["nkeys_seed"] = cfg.nkey_seed_file
    return kw


def _classify(exc: BaseException, seen: list[BaseException]) -> tuple[str, bool]:
    """(human cause, worth retrying) for a failed first connect."""
    # NoServersError says nothing; the real cause is the last error nats-py reported.
    if isinstance(exc, nats.errors.NoServersError) and seen:
        exc = seen[-1]
    text = str(exc) or type(exc).__name__
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization" in text.lower():
        return "authorization failed (wrong token, user/password or credentials)", False
    if "authentication" in text.lower():
        return f"authentication failed ({text})", False
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {exc.verify_message or text}", False
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {text}", False
    if isinstance(exc, nats.errors.SecureConnRequiredError):
        return "the server requires TLS: use a tls:// URL or set tls_ca_file", False
    if isinstance(exc, nats.errors.SecureConnWantedError):
        return "TLS was requested but the server does not offer it", False
    if isinstance(exc, ConnectionRefusedError):
        return (
            "connection refused (no nats-server listening there; start one with `trinity server`)",
            True,
        )
    if isinstance(exc, OSError) and "Name or service not known" in text:
        return f"cannot resolve host ({text})", False
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timed out (is it a NATS server, and reachable?)", True
    if isinstance(exc, nats.errors.NoServersError):
        return "no server answered", True
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {text}", True
    return f"{type(exc).__name__}: {text}", False


class _Events:
    """nats-py callbacks: collect errors while connecting, log everything afterwards."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.connecting = True
        self.seen: list[BaseException] = []
        self.nc: NATS | None = None

    async def error(self, e: Exception) -> None:
        if self.connecting:
            self.seen.append(e)
        else:
            log.warning(
                "nats_error", conn=self.name, url=self.url, error=f"{type(e).__name__}: {e}"
            )

    async def disconnected(self) -> None:
        if self.connecting:
            return
        if self.nc is not None and self.nc.is_closed:  # our own close(), not a lost server
            log.debug("nats_disconnected", conn=self.name, url=self.url)
        else:
            log.warning("nats_disconnected", conn=self.name, url=self.url)

    async def reconnected(self) -> None:
        where = self.nc.connected_url.netloc if self.nc and self.nc.connected_url else self.url
        log.info("nats_reconnected", conn=self.name, server=where)

    async def closed(self) -> None:
        if not self.connecting:
            log.debug("nats_closed", conn=self.name, url=self.url)

    async def lame_duck(self) -> None:
        log.warning("nats_lame_duck", conn=self.name, url=self.url)


def _backoff(base: float) -> Any:
    """nats-py reconnect handler: exponential backoff with jitter, per server."""

    def pick(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        s = min(servers, key=lambda s: s.reconnects)
        delay = 0.0 if s.reconnects == 0 else min(base * 2 ** min(s.reconnects - 1, 8), BACKOFF_CAP)
        return s, delay * random.uniform(0.8, 1.2)

    return pick


async def connect(
    cfg: NatsConfig, name: str = "trinity", *, connect_wait: float | None = None
) -> NATS:
    """Connect to ``cfg.url`` (comma-separated for a cluster) with auth and TLS from ``cfg``.

    The first connect retries while nothing listens, for ``cfg.connect_wait`` seconds (or
    ``connect_wait``); auth and TLS failures raise at once. Errors are
    :class:`BusConnectError` naming the URL and the cause. Afterwards the client reconnects
    on its own (``max_reconnect_attempts``, -1 forever) and logs every event.
    """
    url = redact_url(cfg.url)
    servers = [u.strip() for u in cfg.url.split(",") if u.strip()]
    if not servers:
        raise BusConnectError(url, "nats.url is empty")
    tls = ssl_context(cfg)
    auth = _auth_kwargs(cfg)
    wait = cfg.connect_wait if connect_wait is None else connect_wait
    deadline = time.monotonic() + wait
    supports_handler = "reconnect_to_server_handler" in inspect.signature(NATS.connect).parameters
    pause = 0.05
    while True:
        ev = _Events(url, name)
        nc = NATS()
        ev.nc = nc
        kw: dict[str, Any] = dict(
            servers=servers,
            name=name,
            error_cb=ev.error,
            disconnected_cb=ev.disconnected,
            reconnected_cb=ev.reconnected,
            closed_cb=ev.closed,
            lame_duck_mode_cb=ev.lame_duck,
            connect_timeout=cfg.connect_timeout,
            # First connect: one pass over the servers, we do the retrying (see module doc).
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=min(cfg.reconnect_time_wait, 0.05),
            ping_interval=20,
            max_outstanding_pings=3,
            # Publishes made while reconnecting are buffered, up to a chunk and some.
            pending_size=max(2 * cfg.max_payload, 16 * 1024 * 1024),
            tls=tls,
            **auth,
        )
        if supports_handler:
            kw["reconnect_to_server_handler"] = _backoff(cfg.reconnect_time_wait)
        budget = 4 * cfg.connect_timeout * len(servers) + 1.0
        try:
            await asyncio.wait_for(nc.connect(**kw), timeout=budget)
        except Exception as e:
            cause, retry = _classify(e, ev.seen)
            try:  # a half-open TLS transport can make close() hang: bound it
                await asyncio.wait_for(nc.close(), timeout=0.5)
            except (Exception, asyncio.TimeoutError):
                pass
            left = deadline - time.monotonic()
            if not retry or left <= 0:
                raise BusConnectError(url, cause, retryable=retry) from e
            log.info(
                "nats_connect_retry", conn=name, url=url, cause=cause, seconds_left=round(left, 1)
            )
            await asyncio.sleep(min(pause, max(left, 0.0)))
            pause = min(pause * 2, 1.0)
            continue
        # Connected: from now on nats-py reconnects by itself (``options`` is its public
        # settings dict, read again on every disconnect).
        ev.connecting = False
        _clients.add(nc)
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = cfg.max_reconnect_attempts
        nc.options["reconnect_time_wait"] = cfg.reconnect_time_wait
        log.info(
            "nats_connected", conn=name, server=nc.connected_url.netloc if nc.connected_url else url
        )
        return nc


def jetstream(nc: NATS, cfg: NatsConfig) -> nats.js.JetStreamContext:
    """The JetStream context with our API timeout and async-publish window."""
    return nc.jetstream(
        timeout=cfg.request_timeout, publish_async_max_pending=max(cfg.publish_concurrency, 1) * 4
    )


async def disconnect(nc: NATS, timeout: float = 10.0) -> None:
    """Drain (deliver what is buffered, then close) when the server is there; just close
    when it is not: a role ending while the server restarts must still end cleanly."""
    try:
        await asyncio.wait_for(nc.drain(), timeout)
    except Exception as e:  # ConnectionReconnectingError, a timeout, ...
        log.info("nats_drain_skipped", error=f"{type(e).__name__}: {e}")
        try:
            await asyncio.wait_for(nc.close(), timeout)
        except Exception:
            pass
