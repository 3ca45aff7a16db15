"""Publishing experience groups and events, acked, de-duplicated, chunked when too big.

Why every message carries a ``Nats-Msg-Id`` derived from what it *is* (``group.msg_id()``:
run/group/version; for events a hash of the encoded bytes): a publish whose ack got lost is
simply retried, and JetStream's duplicate window stores it once. So "retry until acked" is
safe, and that is what :meth:`Publisher.publish` does, within ``publish_timeout``.

Why chunking: the server refuses messages above ``max_payload`` (1 MB by default on a stock
server, 8 MB on ours). A message bigger than that is split into numbered chunks on the same
subject, each with its own id ``<id>:<i>`` and headers saying index, count, total size and the
SHA-256 of the whole; :mod:`bus.consume` reassembles them. Nothing is dropped silently:
beyond :data:`MAX_MESSAGE_BYTES` (or with chunking off) the publish raises
:class:`PayloadTooLarge` naming size and limit.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.errors import (
    APIError,
    TooManyStalledMsgsError,
)

from schemas import codec
from schemas.config import NatsConfig
from schemas.data import ExperienceGroup, Metric, SyncEvent

from .connection import jetstream
from .errors import PayloadTooLarge, PublishError
from .retry import TRANSIENT
from .subjects import names

log = structlog.get_logger(__name__)

#: Largest logical message the bus carries (chunked). It is also what the consumer lets the
#: codec decode, so a producer can never make a consumer allocate more than this.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Bytes of a message's budget kept for headers (ours are ~0.5 KB).
HEADER_ROOM = 8 * 1024
#: Seconds to wait for one ack before re-sending (same id, so a late ack is harmless).
ATTEMPT_TIMEOUT = 5.0

H_MSG_ID = "Nats-Msg-Id"
H_SCHEMA = "Trinity-Schema"
H_RUN = "Trinity-Run"
H_VERSION = "Trinity-Model-Version"
H_TASK = "Trinity-Task-Id"
H_REWARD = "Trinity-Reward-Mean"
H_TOKENS = "Trinity-Tokens"
H_KIND = "Trinity-Kind"
H_STEP = "Trinity-Step"
H_ROLE = "Trinity-Role"
H_CHUNK_ID = "Trinity-Chunk-Id"
H_CHUNK_INDEX = "Trinity-Chunk-Index"
H_CHUNK_COUNT = "Trinity-Chunk-Count"
H_CHUNK_TOTAL = "Trinity-Chunk-Total"
H_CHUNK_SHA = "Trinity-Chunk-Sha256"
H_ERROR = "Trinity-Error"
H_ORIG_SUBJECT = "Trinity-Original-Subject"
H_ORIG_STREAM = "Trinity-Original-Stream"
H_ORIG_SEQ = "Trinity-Original-Seq"
H_ORIG_ID = "Trinity-Original-Msg-Id"
H_CONSUMER = "Trinity-Consumer"

_SAFE = {i: None for i in range(32)} | {127: None}


def header_value(v: Any, limit: int = 256) -> str:
    """A header-safe rendering: no control characters, ASCII, at most ``limit`` chars (so
    ``nats stream view`` stays readable and a hostile task id cannot break the protocol)."""
    s = str(v)
    if not (s.isascii() and s.isprintable()):  # the usual id needs neither pass (both slow)
        s = s.translate(_SAFE).encode("ascii", "backslashreplace").decode("ascii")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def describe(obj: Any, run_id: str) -> dict[str, str]:
    """Readable headers of a message: schema, run, and per type the fields worth seeing in
    ``nats stream view`` (model version, task id, reward mean, token count, ...). Kept to
    these few on purpose: nats-py parses every header of every message in Python, so each
    one costs throughput (the group id is already in ``Nats-Msg-Id``)."""
    h = {H_SCHEMA: codec.schema_name(obj), H_RUN: run_id}
    if isinstance(obj, ExperienceGroup):
        h[H_VERSION] = str(obj.model_version)
        h[H_TASK] = header_value(obj.task_id)
        h[H_TOKENS] = str(obj.token_count)
        rm = obj.reward_mean
        if rm is not None:
            h[H_REWARD] = f"{rm:.6g}"
    elif isinstance(obj, SyncEvent):
        h[H_KIND] = header_value(obj.kind)
        h[H_VERSION] = str(obj.model_version)
        h[H_STEP] = str(obj.step)
    elif isinstance(obj, Metric):
        h[H_ROLE] = header_value(obj.role)
        h[H_KIND] = header_value(obj.kind)
        h[H_STEP] = str(obj.step)
    elif hasattr(obj, "task_id"):
        h[H_TASK] = header_value(obj.task_id)
    return h


def id_header(ident: str, limit: int = 200) -> str:
    """``ident`` as a header value that stays unique: where rendering it for a header would
    change it (control characters, non-ASCII, past ``limit``), a hash of the whole id is
    appended. Otherwise two long group ids sharing their first 200 characters would get one
    Nats-Msg-Id, and JetStream would silently drop the second group as a duplicate."""
    shown = header_value(ident, limit)
    if shown == ident:
        return ident
    digest = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{shown[: limit - 33]}#{digest}"


def message_id(obj: Any, data: bytes) -> str:
    """The de-dup id: the object's own ``msg_id()`` when it has one (identity), else a hash of
    its encoded bytes (a retry of the same event encodes to the same bytes)."""
    own = getattr(obj, "msg_id", None)
    if callable(own):
        return id_header(own())
    return f"{codec.schema_name(obj)}:{hashlib.sha256(data).hexdigest()[:32]}"


def default_kind(obj: Any) -> str:
    """Stream kind a message type goes to."""
    if isinstance(obj, ExperienceGroup):
        return "exp"
    if isinstance(obj, SyncEvent):
        return "sync"
    if isinstance(obj, Metric):
        return "metrics"
    raise TypeError(f"no default subject for {type(obj).__name__}; pass kind=")


def split_chunks(
    data: bytes, msg_id: str, headers: dict[str, str], chunk_size: int
) -> list[tuple[bytes, dict[str, str]]]:
    """Split ``data`` into chunk messages (payload, headers), each with id ``<id>:<i>``."""
    count = math.ceil(len(data) / chunk_size)
    sha = hashlib.sha256(data).hexdigest()
    view = memoryview(data)
    out = []
    for i in range(count):
        h = dict(headers)
        h[H_MSG_ID] = f"{msg_id}:{i}"
        h[H_CHUNK_ID] = msg_id
        h[H_CHUNK_INDEX] = str(i)
        h[H_CHUNK_COUNT] = str(count)
        h[H_CHUNK_TOTAL] = str(len(data))
        h[H_CHUNK_SHA] = sha
        out.append((bytes(view[i * chunk_size : (i + 1) * chunk_size]), h))
    return out


#: What a publish retries: a missing server's errors, and nats-py's full ack window.
_RETRY = (*TRANSIENT, TooManyStalledMsgsError)


def attempt_wait(size: int, attempt_timeout: float) -> float:
    """Seconds to wait for one attempt's ack: the base, plus time to move ``size`` bytes at a
    slow 20 MB/s (a big chunk on a busy server must not be re-sent while still arriving)."""
    return attempt_timeout + size / (20 * 1024 * 1024)


async def publish_acked(
    js: JetStreamContext,
    subject: str,
    payload: bytes,
    headers: dict[str, str],
    timeout: float,
    attempt_timeout: float = ATTEMPT_TIMEOUT,
    max_payload: int = -1,
) -> api.PubAck:
    """Publish one message and wait for JetStream's ack, re-sending on lost acks, timeouts and
    reconnects until ``timeout`` seconds have passed. The caller's ``Nats-Msg-Id`` makes the
    re-sends harmless. Raises PublishError when the server refuses or never acks, and
    PayloadTooLarge naming ``max_payload`` (the connection's, ``nc.max_payload``) when the
    message is too big to send."""
    deadline = time.monotonic() + timeout
    attempt = 0
    wait = attempt_wait(len(payload), attempt_timeout)
    last: BaseException | None = None
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise PublishError(
                f"no ack for {subject} (id {headers.get(H_MSG_ID)}, {len(payload)} bytes) "
                f"after {attempt - 1} attempts in {timeout}s: {type(last).__name__}: {last}"
            ) from last
        try:
            # No wait_stall: callers bound what is in flight (Publisher's slots) below nats-py's
            # own window, and a stall timeout would cost an extra task per message.
            fut = await js.publish_async(subject, payload, headers=dict(headers))
            ack = await asyncio.wait_for(fut, timeout=min(wait, left))
            if attempt > 1:
                log.info(
                    "publish_retried",
                    subject=subject,
                    msg_id=headers.get(H_MSG_ID),
                    attempts=attempt,
                )
            return ack
        except _RETRY as e:
            last = e
            await asyncio.sleep(min(0.05 * attempt, 1.0, max(deadline - time.monotonic(), 0)))
        except nats.errors.MaxPayloadError as e:
            raise PayloadTooLarge(f"message on {subject}", len(payload), max_payload) from e
        except (APIError, nats.errors.Error) as e:
            raise PublishError(f"publish to {subject} refused: {type(e).__name__}: {e}") from e


class Publisher:
    """Publishes a run's messages: acked, de-duplicated, bounded in flight, chunked if big.

    ``publish(obj)`` returns once the server has stored it. ``submit(obj)`` returns as soon
    as the message is on its way (waiting only for a free slot of ``publish_concurrency``),
    which is what makes throughput; ``flush()`` then waits for every ack and raises the first
    failure. Nothing is ever dropped silently.

    How a submitted message travels: it takes a slot, then one task runs :meth:`_send` (the
    same acked, retrying publish as :meth:`publish`) and, when it ends, the task's callback
    gives the slot back and counts the message or records its failure. That is all: a lost
    ack, a reconnect or a refusal is :func:`publish_acked`'s business, within
    ``publish_timeout``, and the same ``Nats-Msg-Id`` makes every re-send harmless.
    """

    def __init__(
        self,
        nc: NATS,
        cfg: NatsConfig,
        run_id: str,
        *,
        chunking: bool = True,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
    ) -> None:
        self.nc = nc
        self.js = jetstream(nc, cfg)
        self.cfg = cfg
        self.run_id = run_id
        self.names = names(run_id)
        self.chunking = chunking
        self.attempt_timeout = attempt_timeout
        self._slots = asyncio.Semaphore(max(1, cfg.publish_concurrency))
        self._flights: set[asyncio.Task[list[api.PubAck]]] = set()
        self._failed: list[BaseException] = []
        self.published = 0
        self.duplicates = 0

    @property
    def chunk_size(self) -> int:
        """Largest payload per message: the smaller of the server's and our max_payload,
        less room for headers."""
        server = self.nc.max_payload or self.cfg.max_payload
        return max(1024, min(server, self.cfg.max_payload) - HEADER_ROOM)

    def prepare(
        self, obj: Any, kind: str | None = None
    ) -> tuple[str, list[tuple[bytes, dict[str, str]]]]:
        """Encode ``obj`` into (subject, [(payload, headers), ...]): one message, or chunks.
        Raises PayloadTooLarge (size and limit in the message) when it cannot be carried."""
        subject = self.names.subject(kind or default_kind(obj))
        data = codec.encode(obj)
        headers = describe(obj, self.run_id)
        mid = message_id(obj, data)
        headers[H_MSG_ID] = mid
        return subject, self.frame(data, mid, headers, what=f"{codec.schema_name(obj)} {mid}")

    def frame(
        self, data: bytes, msg_id: str, headers: dict[str, str], what: str = "message"
    ) -> list[tuple[bytes, dict[str, str]]]:
        """One message if it fits, else chunks (or PayloadTooLarge)."""
        size = self.chunk_size
        if len(data) <= size:
            return [(data, headers)]
        if not self.chunking:
            raise PayloadTooLarge(f"{what} (chunking is off)", len(data), size)
        if len(data) > MAX_MESSAGE_BYTES:
            raise PayloadTooLarge(what, len(data), MAX_MESSAGE_BYTES)
        return split_chunks(data, msg_id, headers, size)

    async def _send(
        self, subject: str, frames: list[tuple[bytes, dict[str, str]]], timeout: float
    ) -> list[api.PubAck]:
        """Publish every frame and wait for their acks (retrying within ``timeout``)."""
        limit = self.nc.max_payload
        if len(frames) == 1:  # the usual case: no gather, no task around the one publish
            p, h = frames[0]
            return [
                await publish_acked(self.js, subject, p, h, timeout, self.attempt_timeout, limit)
            ]
        return list(
            await asyncio.gather(
                *(
                    publish_acked(self.js, subject, p, h, timeout, self.attempt_timeout, limit)
                    for p, h in frames
                )
            )
        )

    def _count(self, acks: list[api.PubAck]) -> None:
        self.published += 1
        if acks[0].duplicate:
            self.duplicates += 1

    async def publish(self, obj: Any, kind: str | None = None) -> api.PubAck:
        """Encode, publish and wait until stored. Returns the (last chunk's) PubAck;
        ``ack.duplicate`` is True when the server already had this message."""
        subject, frames = self.prepare(obj, kind)
        async with self._slots:
            acks = await self._send(subject, frames, self.cfg.publish_timeout)
        self._count(acks)
        return acks[-1]

    async def publish_group(self, group: ExperienceGroup) -> api.PubAck:
        """Publish one experience group on ``trinity.<run>.exp`` and wait until stored."""
        return await self.publish(group, "exp")

    async def publish_event(
        self, obj: SyncEvent | Metric | Any, kind: str | None = None
    ) -> api.PubAck:
        """Publish a sync event (``.sync``), metric (``.metrics``) or control message
        (``kind="ctl"``) and wait until stored."""
        return await self.publish(obj, kind)

    async def submit(self, obj: Any, kind: str | None = None) -> asyncio.Future[list[api.PubAck]]:
        """Start publishing ``obj``; returns once it holds an in-flight slot (backpressure)
        and a task is sending it (tasks start in submit order). The returned future resolves
        to its acks (or the failure); cancelling it gives the slot back. :meth:`flush` waits
        for all of them."""
        self.raise_failed()
        subject, frames = self.prepare(obj, kind)
        return await self._start(subject, frames)

    async def submit_group(self, group: ExperienceGroup) -> asyncio.Future[list[api.PubAck]]:
        """:meth:`submit` on ``trinity.<run>.exp``."""
        return await self.submit(group, "exp")

    async def submit_encoded(
        self, data: bytes, kind: str, msg_id: str, headers: dict[str, str] | None = None
    ) -> asyncio.Future[list[api.PubAck]]:
        """Like :meth:`submit` for bytes that are already encoded (re-publishing a dead
        letter after a fix, forwarding, benchmarks): the caller supplies the de-dup id."""
        self.raise_failed()
        h = dict(headers or {})
        h.setdefault(H_RUN, self.run_id)
        h[H_MSG_ID] = id_header(msg_id)
        frames = self.frame(data, h[H_MSG_ID], h)
        return await self._start(self.names.subject(kind), frames)

    async def _start(
        self, subject: str, frames: list[tuple[bytes, dict[str, str]]]
    ) -> asyncio.Task[list[api.PubAck]]:
        """Take a slot (waiting while ``publish_concurrency`` messages are in flight), then
        send in a task whose end gives the slot back (:meth:`_landed`)."""
        await self._slots.acquire()
        task = asyncio.create_task(self._send(subject, frames, self.cfg.publish_timeout))
        self._flights.add(task)
        task.add_done_callback(self._landed)
        return task

    def _landed(self, task: asyncio.Task[list[api.PubAck]]) -> None:
        """A submitted message is stored, failed or cancelled: free its slot, count it, or
        keep its failure for :meth:`flush` / the next submit."""
        self._flights.discard(task)
        self._slots.release()
        if task.cancelled():
            return
        err = task.exception()  # also marks it retrieved: flush() reports it
        if err is not None:
            self._failed.append(err)
        else:
            self._count(task.result())

    def raise_failed(self) -> None:
        """Raise the first failure of a submitted publish (once)."""
        if self._failed:
            err = self._failed[0]
            self._failed.clear()
            raise err

    @property
    def in_flight(self) -> int:
        """Submitted messages not yet stored, failed or cancelled."""
        return len(self._flights)

    async def flush(self) -> None:
        """Wait until every submitted message is acked; raise the first failure."""
        while self._flights:
            await asyncio.wait(list(self._flights))
        self.raise_failed()
