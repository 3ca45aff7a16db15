"""How messages flow: the only way trinity's roles talk to each other.

This package wraps nats-py around a real ``nats-server`` with JetStream: starting an embedded
server, connecting with auth/TLS and reconnects, creating the per-experiment streams and the KV
bucket for run state, publishing experience groups and events with de-duplication ids and
readable headers, durable pull consumption with ack-after-durable semantics and a dead-letter
subject, and request/reply. It knows message *shapes* (via ``schemas``) but nothing about
algorithms, models or storage.

Typical use in a role::

    nc = await bus.connect(cfg.nats, name="explorer")
    js = bus.jetstream(nc, cfg.nats)
    await bus.ensure_streams(js, cfg.nats, cfg.run_id)
    pub = bus.Publisher(nc, cfg.nats, cfg.run_id)
    await pub.publish_group(group)
"""

from .connection import connect, jetstream, redact
from .consume import Consumer, Delivery
from .errors import (
    BusConnectError,
    BusError,
    NoResponders,
    PayloadTooLarge,
    PublishError,
    RemoteError,
    RequestTimeout,
    StreamConflict,
)
from .inspect import inspect_run, render_text
from .kv import RunState, open_bucket
from .publish import MAX_MESSAGE_BYTES, Publisher
from .rpc import Message, request, serve
from .server import EmbeddedServer, default_store_dir, ensure_server, free_port, serve_forever
from .streams import ensure_streams
from .subjects import KINDS, RunNames, names

__all__ = [
    "KINDS",
    "MAX_MESSAGE_BYTES",
    "BusConnectError",
    "BusError",
    "Consumer",
    "Delivery",
    "EmbeddedServer",
    "Message",
    "NoResponders",
    "PayloadTooLarge",
    "PublishError",
    "Publisher",
    "RemoteError",
    "RequestTimeout",
    "RunNames",
    "RunState",
    "StreamConflict",
    "connect",
    "default_store_dir",
    "ensure_server",
    "ensure_streams",
    "free_port",
    "inspect_run",
    "jetstream",
    "names",
    "open_bucket",
    "redact",
    "render_text",
    "request",
    "serve",
    "serve_forever",
]
