"""Durable pull consumption: bounded fetches, ack-after-durable, dead letters, reassembly.

A :class:`Consumer` is one durable JetStream pull consumer (name = ``durable``) on one stream
of a run. It hands out :class:`Delivery` items: the decoded object plus ``ack``/``nak``/
``in_progress``/``term``. The caller acks only once the item's effect is durable (LMDB commit,
optimizer step recorded); anything unacked comes back after ``ack_wait`` (the process crashed,
say), so effects must be idempotent per message id (``Delivery.msg_id``).

Why fetch sizes adapt: the server cuts off a client whose undelivered bytes pass its
``max_pending`` (64 MB), so one fetch must stay well under that. The batch is therefore
``min(n, fetch_bytes // largest recent message)``, starting from the worst case
(``max_payload``) until real sizes are seen.

Why a dead-letter subject: a message that cannot be decoded will never decode, and
redelivering it forever would stall the consumer. The same goes, as a last resort, for a
message delivered ``max_deliver`` times without an ack: on that last delivery it goes to
the dead-letter stream instead of to the caller. It is copied (raw bytes, original headers'
essentials, the error in ``Trinity-Error``) to ``trinity.<run>.dlq``, terminated, counted,
and consumption goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, BadRequestError

from schemas import codec
from schemas.config import NatsConfig

from .connection import jetstream
from .errors import BusError
from .publish import (
    H_CHUNK_COUNT,
    H_CHUNK_ID,
    H_CHUNK_INDEX,
    H_CHUNK_SHA,
    H_CHUNK_TOTAL,
    H_CONSUMER,
    H_ERROR,
    H_MSG_ID,
    H_ORIG_ID,
    H_ORIG_SEQ,
    H_ORIG_STREAM,
    H_ORIG_SUBJECT,
    MAX_MESSAGE_BYTES,
    header_value,
    publish_acked,
)
from .subjects import names

log = structlog.get_logger(__name__)

#: Default byte budget of one fetch (the server's per-client max_pending is 64 MB).
FETCH_BYTES = 32 * 1024 * 1024


@dataclass(eq=False)
class Delivery:
    """One delivered message (or reassembled chunked message) and its ack handles."""

    obj: Any
    subject: str
    headers: dict[str, str]
    size: int
    msgs: list[Msg] = field(repr=False)

    @property
    def msg_id(self) -> str | None:
        """The publisher's de-dup id: use it to make the effect idempotent."""
        return self.headers.get(H_CHUNK_ID) or self.headers.get(H_MSG_ID)

    @property
    def seq(self) -> int:
        """Stream sequence (of the first chunk)."""
        return self.msgs[0].metadata.sequence.stream

    @property
    def num_delivered(self) -> int:
        """How often this message was delivered (>1: a redelivery)."""
        return max(m.metadata.num_delivered for m in self.msgs)

    async def ack(self) -> None:
        """Acknowledge (fire-and-forget; :meth:`Consumer.ack` batches and confirms)."""
        for m in self.msgs:
            await m.ack()

    async def ack_sync(self, timeout: float = 5.0) -> None:
        """Acknowledge and wait until the server confirmed it."""
        for m in self.msgs:
            await m.ack_sync(timeout=timeout)

    async def nak(self, delay: float | None = None) -> None:
        """Ask for redelivery (after ``delay`` seconds)."""
        for m in self.msgs:
            await m.nak(delay=delay)

    async def in_progress(self) -> None:
        """Reset the ack timer: still working on it (long batches, slow commits)."""
        for m in self.msgs:
            await m.in_progress()

    async def term(self) -> None:
        """Never redeliver."""
        for m in self.msgs:
            await m.term()


@dataclass(eq=False)
class _Partial:
    """Chunks of one message seen so far."""

    count: int
    total: int
    sha: str
    first_seen: float
    touched: float
    parts: dict[int, Msg] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(len(m.data) for m in self.parts.values())


def default_decoder(expect: type | None = None) -> Callable[[bytes], Any]:
    """The codec's decode, bounded to MAX_MESSAGE_BYTES (optionally one schema only)."""

    def decode(data: bytes) -> Any:
        return codec.decode(data, expect, max_bytes=MAX_MESSAGE_BYTES)

    return decode


class Consumer:
    """A durable pull consumer on one stream of a run.

    ``await Consumer(nc, cfg, run_id, "exp", "buffer").start()``, then ``await fetch()`` or
    ``async for batch in batches()``. ``dead_letters`` counts messages sent to the DLQ.
    """

    def __init__(
        self,
        nc: NATS,
        cfg: NatsConfig,
        run_id: str,
        kind: str = "exp",
        durable: str = "buffer",
        *,
        decode: Callable[[bytes], Any] | None = None,
        expect: type | None = None,
        fetch_bytes: int = FETCH_BYTES,
        max_partial_bytes: int = 2 * MAX_MESSAGE_BYTES,
        stale_after: float | None = None,
    ) -> None:
        self.nc = nc
        self.js = jetstream(nc, cfg)
        self.cfg = cfg
        self.names = names(run_id)
        self.kind = kind
        self.stream = self.names.stream(kind)
        self.subject = self.names.subject(kind)
        self.durable = durable
        self.decode = decode or default_decoder(expect)
        self.fetch_bytes = fetch_bytes
        self.max_partial_bytes = max_partial_bytes
        # A chunked message still incomplete after this long will not complete: its
        # publisher gave up (publish_timeout) or died. Its chunks go to the DLQ.
        self.stale_after = (
            stale_after if stale_after is not None else max(cfg.publish_timeout, cfg.ack_wait) * 2
        )
        self._sub: Any = None
        self._partials: OrderedDict[str, _Partial] = OrderedDict()
        self._largest = max(cfg.max_payload, 1)
        self.dead_letters = 0
        self.delivered = 0

    # -- setup ----------------------------------------------------------------------------

    def consumer_config(self) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            description=f"trinity {self.kind} consumer {self.durable}",
            deliver_policy=api.DeliverPolicy.ALL,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=float(self.cfg.ack_wait),
            max_deliver=int(self.cfg.max_deliver),
            filter_subject=self.subject,
            max_ack_pending=-1,
            replay_policy=api.ReplayPolicy.INSTANT,
        )

    async def start(self) -> Consumer:
        """Create (or update) the durable consumer and bind a pull subscription to it."""
        try:
            await self.js.add_consumer(self.stream, self.consumer_config())
        except BadRequestError as e:
            raise BusError(
                f"cannot create consumer {self.durable} on {self.stream}: {e.description}"
            ) from e
        except nats.js.errors.NotFoundError as e:
            raise BusError(
                f"stream {self.stream} does not exist: call bus.ensure_streams first"
            ) from e
        self._sub = await self.js.pull_subscribe_bind(durable=self.durable, stream=self.stream)
        return self

    async def close(self) -> None:
        """Stop fetching (the durable consumer and its ack floor stay on the server).
        Chunks of incomplete messages are nak'ed so they come back promptly."""
        for p in self._partials.values():
            for m in p.parts.values():
                await _quiet(m.nak())
        self._partials.clear()
        if self._sub is not None:
            await _quiet(self._sub.unsubscribe())
            self._sub = None

    async def info(self) -> api.ConsumerInfo:
        return await self.js.consumer_info(self.stream, self.durable)

    # -- fetching -------------------------------------------------------------------------

    def batch_size(self, n: int | None = None) -> int:
        """Messages to ask for: ``n`` (default ``fetch_batch``) bounded by the byte budget."""
        want = n or self.cfg.fetch_batch
        return max(1, min(want, self.fetch_bytes // max(self._largest, 1)))

    async def fetch(self, n: int | None = None, timeout: float = 1.0) -> list[Delivery]:
        """Up to ``n`` deliveries; waits at most ``timeout`` seconds for the first one and
        returns [] if none came. Chunks are gathered until their message is whole."""
        if self._sub is None:
            raise BusError("Consumer.start() was not called")
        deadline = time.monotonic() + timeout
        out: list[Delivery] = []
        while not out:
            left = deadline - time.monotonic()
            if left <= 0.001:
                break
            try:
                msgs = await self._sub.fetch(self.batch_size(n), timeout=left)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                break
            except (nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError):
                await asyncio.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
                continue
            except APIError as e:  # e.g. 409 while the server restarts: try again shortly
                log.warning("fetch_failed", stream=self.stream, durable=self.durable, error=str(e))
                await asyncio.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
                continue
            if msgs:
                self._largest = max(len(m.data) for m in msgs)
            for m in msgs:
                d = await self._handle(m)
                if d is not None:
                    out.append(d)
            await self._tend_partials()
        self.delivered += len(out)
        return out

    async def batches(
        self, n: int | None = None, timeout: float = 1.0, stop: asyncio.Event | None = None
    ) -> AsyncIterator[list[Delivery]]:
        """Yield non-empty lists of deliveries until ``stop`` is set (forever otherwise).
        Survives reconnects: a failed fetch is logged and retried."""
        while stop is None or not stop.is_set():
            try:
                items = await self.fetch(n, timeout)
            except nats.errors.ConnectionClosedError:
                raise
            except (nats.errors.Error, OSError) as e:
                log.warning(
                    "fetch_retry",
                    stream=self.stream,
                    durable=self.durable,
                    error=f"{type(e).__name__}: {e}",
                )
                await asyncio.sleep(0.2)
                continue
            if items:
                yield items

    async def ack(self, items: list[Delivery], timeout: float = 5.0) -> bool:
        """Ack many deliveries with one round trip: call it after their effects are durable.

        All but the last message are acked fire-and-forget and the last with ``ack_sync``;
        the server handles a consumer's acks in order, so its reply means all were applied.
        Returns False (and logs) if that confirmation did not come: the messages may then be
        delivered again, which an idempotent effect tolerates.
        """
        msgs = [m for d in items for m in d.msgs]
        if not msgs:
            return True
        for m in msgs[:-1]:
            await m.ack()
        try:
            await msgs[-1].ack_sync(timeout=timeout)
            return True
        except Exception as e:
            log.warning(
                "ack_unconfirmed",
                stream=self.stream,
                durable=self.durable,
                n=len(msgs),
                error=f"{type(e).__name__}: {e}",
            )
            return False

    # -- one message ----------------------------------------------------------------------

    async def _handle(self, m: Msg) -> Delivery | None:
        h = m.headers or {}
        meta = _meta(m)
        limit = self.cfg.max_deliver
        if limit > 0 and meta is not None and meta.num_delivered >= limit:
            # The last resort: whatever keeps this message from being acked (a consumer that
            # crashes on it, say) would happen again, and the server delivers it no more.
            await self.dead_letter(
                [m], BusError(f"delivered {meta.num_delivered} times, never acked")
            )
            return None
        if H_CHUNK_ID in h:
            return await self._chunk(m, h)
        try:
            obj = self.decode(m.data)
        except Exception as e:
            await self.dead_letter([m], e)
            return None
        return Delivery(obj, m.subject, dict(h), len(m.data), [m])

    async def _chunk(self, m: Msg, h: dict[str, str]) -> Delivery | None:
        cid = h[H_CHUNK_ID]
        try:
            idx, count, total = int(h[H_CHUNK_INDEX]), int(h[H_CHUNK_COUNT]), int(h[H_CHUNK_TOTAL])
            sha = h[H_CHUNK_SHA]
            if not (0 <= idx < count and 0 < total <= MAX_MESSAGE_BYTES and count <= total):
                raise ValueError(f"chunk {idx} of {count}, total {total} bytes is out of range")
        except (KeyError, ValueError) as e:
            await self.dead_letter([m], ValueError(f"bad chunk headers: {e}"))
            return None
        now = time.monotonic()
        p = self._partials.get(cid)
        if p is None or (p.count, p.total, p.sha) != (count, total, sha):
            if p is not None:  # same id, different content: keep the newest, drop the old
                await self.dead_letter(
                    list(p.parts.values()), ValueError(f"chunk set {cid} changed shape")
                )
            p = _Partial(count, total, sha, now, now)
            self._partials[cid] = p
        p.parts[idx] = m  # a redelivered chunk replaces the older delivery
        if len(p.parts) < count:
            await self._bound_partials()
            return None
        del self._partials[cid]
        msgs = [p.parts[i] for i in range(count)]
        data = b"".join(x.data for x in msgs)
        if len(data) != total or hashlib.sha256(data).hexdigest() != sha:
            await self.dead_letter(
                msgs, ValueError(f"chunked message {cid}: size or SHA-256 mismatch")
            )
            return None
        try:
            obj = self.decode(data)
        except Exception as e:
            await self.dead_letter(msgs, e)
            return None
        headers = {
            k: v for k, v in (msgs[0].headers or {}).items() if not k.startswith("Trinity-Chunk-")
        }
        headers[H_CHUNK_ID] = cid
        return Delivery(obj, m.subject, headers, len(data), msgs)

    async def _bound_partials(self) -> None:
        """Keep reassembly memory bounded: nak the oldest incomplete messages (they come back
        later) while more than ``max_partial_bytes`` are held."""
        while (
            len(self._partials) > 1
            and sum(p.nbytes for p in self._partials.values()) > self.max_partial_bytes
        ):
            cid, p = self._partials.popitem(last=False)
            log.warning("chunks_evicted", chunk_id=cid, have=len(p.parts), of=p.count)
            for x in p.parts.values():
                await _quiet(x.nak(delay=1.0))

    async def _tend_partials(self) -> None:
        """Keep held chunks from being redelivered while we wait for the rest, and give up on
        messages that can no longer complete."""
        if not self._partials:
            return
        now = time.monotonic()
        for cid, p in list(self._partials.items()):
            if now - p.first_seen > self.stale_after:
                del self._partials[cid]
                await self.dead_letter(
                    list(p.parts.values()),
                    ValueError(
                        f"chunked message {cid} incomplete: {len(p.parts)} of {p.count} chunks in {now - p.first_seen:.0f}s"
                    ),
                )
            elif now - p.touched > self.cfg.ack_wait / 3:
                p.touched = now
                for x in p.parts.values():
                    await _quiet(x.in_progress())

    async def dead_letter(self, msgs: list[Msg], error: BaseException) -> None:
        """Copy messages to the run's DLQ with the error, then terminate them. If the DLQ
        publish fails the originals are nak'ed instead (they come back; nothing is lost)."""
        text = header_value(f"{type(error).__name__}: {error}", limit=1000)
        if self.kind == "dlq":  # never dead-letter a dead letter (it would loop forever)
            for m in msgs:
                await _quiet(m.term())
                self.dead_letters += 1
            log.warning("dead_letter_undecodable", stream=self.stream, n=len(msgs), error=text)
            return
        for m in msgs:
            meta = _meta(m)
            stream, seq = (meta.stream, meta.sequence.stream) if meta else (self.stream, 0)
            h = {
                H_MSG_ID: f"dlq:{stream}:{seq}",
                H_ERROR: text,
                H_ORIG_SUBJECT: m.subject,
                H_ORIG_STREAM: stream,
                H_ORIG_SEQ: str(seq),
                H_CONSUMER: self.durable,
            }
            orig = (m.headers or {}).get(H_MSG_ID)
            if orig:
                h[H_ORIG_ID] = header_value(orig)
            for k, v in (m.headers or {}).items():
                if k.startswith("Trinity-") and k not in h:
                    h[k] = header_value(v)
            try:
                await publish_acked(
                    self.js,
                    self.names.dlq,
                    m.data,
                    h,
                    timeout=self.cfg.publish_timeout,
                    max_payload=self.nc.max_payload,
                )
            except Exception as e:
                log.error("dead_letter_failed", stream=stream, seq=seq, error=str(e))
                await _quiet(m.nak(delay=5.0))
                continue
            await _quiet(m.term())
            self.dead_letters += 1
            log.warning(
                "dead_letter",
                stream=stream,
                seq=seq,
                subject=m.subject,
                error=text,
                dlq=self.names.dlq,
            )


def _meta(m: Msg) -> Any:
    try:
        return m.metadata
    except Exception:
        return None


async def _quiet(aw: Any) -> None:
    """Await an ack-type call whose failure only means a later redelivery."""
    try:
        await aw
    except Exception as e:
        log.debug("ack_call_failed", error=f"{type(e).__name__}: {e}")
