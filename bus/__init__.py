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

from __future__ import annotations

import importlib
from typing import Any

# Names resolve lazily (PEP 562): ``import bus.server`` (the ``trinity server`` process) must
# not pay for nats-py, numpy and the codec, which only the roles need.
_WHERE = {
    "connect": "connection",
    "disconnect": "connection",
    "jetstream": "connection",
    "Consumer": "consume",
    "Delivery": "consume",
    "BusConnectError": "errors",
    "BusError": "errors",
    "NoResponders": "errors",
    "PayloadTooLarge": "errors",
    "PublishError": "errors",
    "RemoteError": "errors",
    "RequestTimeout": "errors",
    "StreamConflict": "errors",
    "dead_letters": "inspect",
    "inspect_run": "inspect",
    "render_text": "inspect",
    "RunState": "kv",
    "stop_tasks": "retry",
    "open_bucket": "kv",
    "MAX_MESSAGE_BYTES": "publish",
    "Publisher": "publish",
    "Message": "rpc",
    "request": "rpc",
    "serve": "rpc",
    "EmbeddedServer": "server",
    "default_store_dir": "server",
    "ensure_server": "server",
    "free_port": "server",
    "serve_forever": "server",
    "ensure_streams": "streams",
    "trim_streams": "retention",
    "delete_run": "streams",
    "StreamTail": "tail",
    "KINDS": "subjects",
    "RunNames": "subjects",
    "names": "subjects",
}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'bus' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


__all__ = [  # noqa: F822 (resolved by __getattr__)
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
    "dead_letters",
    "disconnect",
    "default_store_dir",
    "ensure_server",
    "ensure_streams",
    "free_port",
    "inspect_run",
    "jetstream",
    "names",
    "open_bucket",
    "render_text",
    "request",
    "serve",
    "serve_forever",
]
