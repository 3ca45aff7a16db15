"""Run state in a JetStream KV bucket: model versions, role heartbeats, rendezvous points.

Why KV and not a stream: these are *current values* (the explorer's model version now, when
did the trainer last beat), read by key, not a history to consume. Each value is a record of :mod:`schemas.state` as
JSON, so ``nats kv get trinity_<run> version.trainer`` is readable. Keys: ``version.<role>``,
``heartbeat.<role>``, ``rendezvous.<name>`` here, and every other one the roles use: all are
declared in :mod:`schemas.keys`.

Waiting for a value: a role reads the key until the value it waits for is there, and between
reads sleeps until *any* key of the bucket changes (:meth:`RunState.changed`: a KV watch sets
an event) or at most its pause has passed. The read is the truth; the watch only cuts the
wait from the pause (up to 250 ms) to the change's arrival (a millisecond), and a watch lost
to a reconnect costs no more than the pause did before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from typing import Any

import msgspec
import structlog
from nats.errors import ConnectionClosedError
from nats.js import JetStreamContext, api
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from schemas import codec, keys
from schemas.state import Heartbeat, ModelVersion, Rendezvous

from .errors import BusError, RequestTimeout, replicas_hint
from .retry import TRANSIENT, ride_out
from .subjects import names

log = structlog.get_logger(__name__)

_KEY_PART = re.compile(r"^[-_=A-Za-z0-9]+$")
HISTORY = 8


def _key(prefix: str, name: str) -> str:
    if not isinstance(name, str) or not _KEY_PART.match(name):
        raise ValueError(f"{prefix} name {name!r}: use letters, digits, '-', '_', '='")
    return f"{prefix}.{name}"


async def open_bucket(js: JetStreamContext, run_id: str, replicas: int = 1) -> KeyValue:
    """The run's KV bucket, created on first use (file storage, a little history,
    ``replicas`` copies on a cluster: ``nats.replicas``)."""
    bucket = names(run_id).kv_bucket
    try:
        return await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        pass
    try:
        return await js.create_key_value(
            api.KeyValueConfig(
                bucket=bucket,
                description=f"trinity run {run_id}: versions, heartbeats, rendezvous",
                history=HISTORY,
                storage=api.StorageType.FILE,
                replicas=replicas,
            )
        )
    except Exception as e:  # lost a creation race: the bucket is there now
        try:
            return await js.key_value(bucket)
        except Exception:
            raise BusError(f"cannot create KV bucket {bucket}: {e}{replicas_hint(replicas, e)}") from e


def _decode(key: str, raw: bytes | None, warned: dict[str, bytes]) -> Any | None:
    """The record ``raw`` holds for ``key`` (:func:`schemas.keys.record_for`); None when absent,
    and when it is not that record: a malformed value (another program's, a hand-made ``nats
    kv put``, a field of the wrong type) is logged, naming key and field, and read as absent,
    never fatal to the role reading it; the key's next write replaces it. Logged once per value
    (``warned``: key -> the value last logged): a role waiting on the key reads it every 250 ms."""
    if not raw:
        return None
    try:
        return codec.decode_value(raw, keys.record_for(key), f"KV {key}")
    except codec.CodecError as e:
        if warned.get(key) != raw:
            warned[key] = raw
            log.warning("kv_malformed", key=key, error=str(e), value=raw[:80].decode("utf-8", "replace"))
        return None


def _encode(key: str, value: Any) -> bytes:
    """``value`` as ``key``'s JSON; TypeError when it is not the record ``key`` holds (a bug of
    the writer: the key table and the code disagree)."""
    want = keys.record_for(key)
    if type(value) is not want:
        raise TypeError(f"KV key {key} holds a {want.__name__}, not {type(value).__name__}")
    return codec.encode_value(value)


class RunState:
    """Typed helpers over the run's KV bucket. Every operation waits out a server restart
    (:func:`bus.retry.ride_out`); a heartbeat that cannot be sent is skipped instead."""

    def __init__(self, kv: KeyValue, js: JetStreamContext, bucket: str) -> None:
        self.kv, self.js, self.bucket = kv, js, bucket
        self._changed: asyncio.Event | None = None
        self._warned: dict[str, bytes] = {}  # malformed values logged, by key
        self._watch: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference

    def changed(self) -> asyncio.Event:
        """An event set whenever a key of the bucket is put or deleted (a KV watch, started on
        first use, for this process's lifetime). Clear it *before* reading what you wait for,
        then wait on it: a change between the read and the wait still wakes you."""
        if self._changed is None:
            self._changed = asyncio.Event()
            self._watch = asyncio.get_running_loop().create_task(self._watch_changes())
        return self._changed

    async def _watch_changes(self) -> None:
        """Set :attr:`_changed` on every update of the bucket, for as long as the connection
        lives (a server restart included: the watch is made again)."""
        assert self._changed is not None
        while True:
            watcher = None
            try:
                watcher = await self.kv.watchall(include_history=False)
                while True:
                    try:
                        if await watcher.updates(timeout=60.0) is not None:
                            self._changed.set()
                    except asyncio.TimeoutError:  # nats-py's TimeoutError is one
                        # a quiet minute: is the connection still open? (a closed one only
                        # times the watch out; this raises ConnectionClosedError instead)
                        await self.js.account_info()
            except asyncio.CancelledError:
                raise
            except ConnectionClosedError:
                return  # the process closed its connection: nothing left to watch
            except Exception as e:  # noqa: BLE001 - a server away; the readers' pauses cover it
                log.info("kv_watch_restart", error=f"{type(e).__name__}: {e}",
                         description=getattr(e, "description", None))
                await asyncio.sleep(1.0)
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()

    async def wait(self, fn: Any, timeout: float, pause: float = 0.25) -> Any:
        """Await ``fn()`` until it returns something truthy (returned); None after ``timeout``
        seconds. Reads again whenever the bucket changes, or every ``pause`` seconds."""
        changed = self.changed()
        deadline = time.monotonic() + timeout
        while True:
            changed.clear()
            v = await fn()
            if v:
                return v
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(changed.wait(), min(pause, left))
            except asyncio.TimeoutError:
                pass

    @classmethod
    async def open(cls, js: JetStreamContext, run_id: str, replicas: int = 1) -> RunState:
        """The run's state over its KV bucket (created with ``replicas`` copies if new)."""
        return cls(await open_bucket(js, run_id, replicas), js, names(run_id).kv_bucket)

    # -- records (schemas/state.py) --------------------------------------------------------

    async def put(self, key: str, value: Any) -> int:
        """Store ``key``'s record (:func:`schemas.keys.record_for`); returns the KV revision."""
        data = _encode(key, value)
        return await ride_out(lambda: self.kv.put(key, data), f"KV put {key}")

    async def get(self, key: str) -> Any | None:
        """``key``'s record, or None if absent, deleted or malformed (logged)."""
        try:
            entry = await ride_out(lambda: self.kv.get(key), f"KV get {key}")
        except (KeyNotFoundError, NotFoundError):
            return None
        return _decode(key, entry.value, self._warned)

    async def delete(self, key: str) -> None:
        await ride_out(lambda: self.kv.delete(key), f"KV delete {key}")

    async def entry(self, key: str) -> tuple[Any | None, int]:
        """``(value, revision)`` of ``key``; ``(None, 0)`` when it is absent or deleted (a
        :meth:`swap` at revision 0 creates it)."""
        try:
            e = await ride_out(lambda: self.kv.get(key), f"KV get {key}")
        except (KeyNotFoundError, NotFoundError):
            return None, 0
        return _decode(key, e.value, self._warned), int(e.revision or 0)

    async def swap(self, key: str, value: Any, revision: int) -> int:
        """Store ``value`` only if ``key`` is still at ``revision`` (0: absent); returns the
        new revision, or 0 when another process wrote it first. What a lease is taken and
        renewed with."""
        data = _encode(key, value)
        try:
            if revision:
                return int(await ride_out(lambda: self.kv.update(key, data, last=revision), f"KV update {key}"))
            return int(await ride_out(lambda: self.kv.create(key, data), f"KV create {key}"))
        except (KeyWrongLastSequenceError, BadRequestError) as e:
            log.debug("kv_swap_lost", key=key, error=str(e))
            return 0

    async def keys(self, prefix: str = "") -> list[str]:
        """The keys that start with ``prefix`` (deleted ones included: their value reads as
        None), from the server's index of the bucket's stream (ADR-8: stream ``KV_<bucket>``,
        subjects ``$KV.<bucket>.<key>``). Not nats-py's ``kv.keys()``: that one watches the
        bucket and ends at the first message it believes is the last, which another process
        writing meanwhile makes come early; it then leaves out live keys (NOTES.md)."""
        pre = f"$KV.{self.bucket}."
        wanted = pre + (prefix if prefix.endswith(".") else "") + ">"
        info = await ride_out(lambda: self.js.stream_info(f"KV_{self.bucket}", subjects_filter=wanted),
                              f"KV keys {prefix}*")
        return sorted(k for k in (s[len(pre):] for s in info.state.subjects or {}) if k.startswith(prefix))

    async def snapshot(self) -> dict[str, Any]:
        """Every live key and its value as plain data (what ``trinity inspect`` prints); a
        malformed value as ``{"malformed": <its text>, "error": ...}``: inspecting is how it is found."""
        out: dict[str, Any] = {}
        for k in await self.keys():
            try:
                entry = await self.kv.get(k)
            except (KeyNotFoundError, NotFoundError):
                continue
            if not entry.value:
                continue
            try:
                out[k] = msgspec.to_builtins(codec.decode_value(entry.value, keys.record_for(k), f"KV {k}"))
            except (codec.CodecError, KeyError) as e:
                out[k] = {"malformed": entry.value.decode("utf-8", "replace"), "error": str(e).strip("'\"")}
        return out

    async def with_prefix(self, prefix: str) -> dict[str, Any]:
        """The live keys that start with ``prefix`` and their values (one get per such key)."""
        out: dict[str, Any] = {}
        for k in await self.keys(prefix):
            value = await self.get(k)
            if value is not None:
                out[k] = value
        return out

    # -- model versions --------------------------------------------------------------------

    async def set_model_version(self, role: str, version: int, step: int | None = None) -> None:
        """Record the model version a role now holds (explorer after a sync, trainer after a step)."""
        await self.put(_key(keys.VERSION, role), ModelVersion(int(version), time.time(), step))

    async def model_version(self, role: str) -> int | None:
        v = await self.get(_key(keys.VERSION, role))
        return None if v is None else v.version

    # -- heartbeats ------------------------------------------------------------------------

    async def heartbeat(self, role: str, **info: Any) -> None:
        """Say "I am alive" with a timestamp, pid and host (plus any info, e.g. step). Best
        effort: while the server is away a beat is skipped (the next one says it all), so a
        role never waits on its heartbeat."""
        key = _key(keys.HEARTBEAT, role)
        data = _encode(key, Heartbeat(ts=time.time(), pid=os.getpid(), host=socket.gethostname(), **info))
        try:
            await self.kv.put(key, data)
        except TRANSIENT as e:
            log.debug("heartbeat_skipped", role=role, error=type(e).__name__)

    async def heartbeats(self) -> dict[str, dict[str, Any]]:
        """``{role: last heartbeat}`` as plain data, with ``age`` (seconds since it was sent) added."""
        now = time.time()
        return {k.split(".", 1)[1]: {**msgspec.to_builtins(v), "age": round(now - v.ts, 3)}
                for k, v in (await self.with_prefix(f"{keys.HEARTBEAT}.")).items()}

    # -- rendezvous ------------------------------------------------------------------------

    async def set_rendezvous(self, rdv: Rendezvous) -> None:
        """Publish where a process group meets (``rendezvous.<group_name>``)."""
        await self.put(_key(keys.RENDEZVOUS, rdv.group_name), rdv)

    async def rendezvous(self, name: str) -> Rendezvous | None:
        return await self.get(_key(keys.RENDEZVOUS, name))

    async def clear_rendezvous(self, name: str) -> None:
        await self.delete(_key(keys.RENDEZVOUS, name))

    async def wait_rendezvous(self, name: str, timeout: float, newer_than: float = 0.0) -> Rendezvous:
        """Wait until rendezvous ``name`` is set (with ``ts > newer_than``) and return it."""

        async def ready() -> Rendezvous | None:
            v = await self.rendezvous(name)
            return v if v is not None and v.ts > newer_than else None

        v = await self.wait(ready, timeout)
        if v is None:
            raise RequestTimeout(f"rendezvous {name!r} not set within {timeout}s (KV key {_key(keys.RENDEZVOUS, name)})")
        return v
