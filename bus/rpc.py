"""Request/reply over core NATS (the trainer asking the buffer for a batch).

Why not a stream: a request is only meaningful while the requester waits for it; if nobody
serves the subject the requester should hear so at once (``NoResponders``), not find a stale
request replayed later. Subjects are ``trinity.<run>.rpc.<name>`` (:meth:`RunNames.rpc`);
responders join the queue group ``trinity`` so several can share the load.

Replies bigger than the server's max_payload (a training batch easily is) are sent as
numbered chunks to the requester's private inbox and joined, with the same size/SHA-256
check as stream chunks. A responder that raises answers with ``Trinity-Error`` and the
requester raises :class:`RemoteError` with that text.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from .errors import NoResponders, PayloadTooLarge, RemoteError, RequestTimeout
from .publish import (
    H_CHUNK_COUNT,
    H_CHUNK_INDEX,
    H_CHUNK_SHA,
    H_CHUNK_TOTAL,
    H_ERROR,
    HEADER_ROOM,
    MAX_MESSAGE_BYTES,
    header_value,
)

log = structlog.get_logger(__name__)

QUEUE = "trinity"


@dataclass
class Message:
    """A request or a reply: bytes plus headers."""

    data: bytes
    headers: dict[str, str] = field(default_factory=dict)
    subject: str = ""


Handler = Callable[[Message], Awaitable[bytes | Message]]


def _chunk_size(nc: NATS) -> int:
    return max(1024, (nc.max_payload or 1024 * 1024) - HEADER_ROOM)


async def _send_reply(nc: NATS, reply: str, data: bytes, headers: dict[str, str]) -> None:
    size = _chunk_size(nc)
    if len(data) <= size:
        await nc.publish(reply, data, headers=headers or None)
        return
    if len(data) > MAX_MESSAGE_BYTES:
        raise PayloadTooLarge("reply", len(data), MAX_MESSAGE_BYTES)
    count = math.ceil(len(data) / size)
    sha = hashlib.sha256(data).hexdigest()
    view = memoryview(data)
    for i in range(count):
        h = dict(headers)
        h.update(
            {
                H_CHUNK_INDEX: str(i),
                H_CHUNK_COUNT: str(count),
                H_CHUNK_TOTAL: str(len(data)),
                H_CHUNK_SHA: sha,
            }
        )
        await nc.publish(reply, bytes(view[i * size : (i + 1) * size]), headers=h)


async def serve(nc: NATS, subject: str, handler: Handler, queue: str = QUEUE) -> Subscription:
    """Answer requests on ``subject`` with ``handler`` (bytes or Message out). Requests are
    handled one at a time per subscription; a handler error becomes an error reply."""

    async def on_request(msg: Msg) -> None:
        if not msg.reply:
            return
        req = Message(msg.data, dict(msg.headers or {}), msg.subject)
        try:
            out = await handler(req)
            if isinstance(out, bytes | bytearray | memoryview):
                out = Message(bytes(out))
            await _send_reply(nc, msg.reply, out.data, dict(out.headers))
        except Exception as e:
            log.warning("rpc_handler_failed", subject=subject, error=f"{type(e).__name__}: {e}")
            try:
                await nc.publish(
                    msg.reply,
                    b"",
                    headers={H_ERROR: header_value(f"{type(e).__name__}: {e}", 1000)},
                )
            except Exception as e2:
                log.error("rpc_error_reply_failed", subject=subject, error=str(e2))

    return await nc.subscribe(subject, queue=queue, cb=on_request)


async def request(
    nc: NATS,
    subject: str,
    data: bytes = b"",
    *,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
) -> Message:
    """Send a request and wait up to ``timeout`` seconds for the whole reply.

    Raises RequestTimeout (naming the subject), NoResponders when nobody serves it, and
    RemoteError with the responder's error text.
    """
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    deadline = time.monotonic() + timeout
    try:
        await nc.publish(subject, data, reply=inbox, headers=headers)
        parts: dict[int, bytes] = {}
        count = 1
        first: Msg | None = None
        while len(parts) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeout(f"no reply on {subject} within {timeout}s")
            try:
                msg = await sub.next_msg(timeout=left)
            except asyncio.TimeoutError:
                got = f" (got {len(parts)} of {count} chunks)" if parts else ""
                raise RequestTimeout(f"no reply on {subject} within {timeout}s{got}") from None
            h = msg.headers or {}
            if h.get("Status") == "503":
                raise NoResponders(
                    f"nobody serves {subject} (is the role that answers it running?)"
                )
            if H_ERROR in h:
                raise RemoteError(f"{subject}: {h[H_ERROR]}")
            if H_CHUNK_COUNT in h:
                count = int(h[H_CHUNK_COUNT])
                parts[int(h[H_CHUNK_INDEX])] = msg.data
            else:
                parts[0] = msg.data
            first = first or msg
        body = b"".join(parts[i] for i in range(count))
        assert first is not None
        fh = dict(first.headers or {})
        if count > 1:
            if (
                len(body) != int(fh[H_CHUNK_TOTAL])
                or hashlib.sha256(body).hexdigest() != fh[H_CHUNK_SHA]
            ):
                raise RemoteError(f"{subject}: chunked reply failed its size/SHA-256 check")
            for k in (H_CHUNK_INDEX, H_CHUNK_COUNT, H_CHUNK_TOTAL, H_CHUNK_SHA):
                fh.pop(k, None)
        return Message(body, fh, subject)
    finally:
        try:
            await sub.unsubscribe()
        except Exception:
            pass
