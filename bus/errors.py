"""The bus's exceptions: each one says what was attempted, where, and why it failed."""

from __future__ import annotations


class BusError(Exception):
    """Base of every error raised by :mod:`bus`."""


class BusConnectError(BusError, ConnectionError):
    """Connecting failed; the message names the URL and the cause (refused, auth, TLS, ...).
    ``retryable``: whether trying again later could help (no server yet) or not (a wrong
    token, a TLS or credentials problem: a restart would fail the same way)."""

    def __init__(self, url: str, cause: str, retryable: bool = False) -> None:
        super().__init__(f"cannot connect to NATS at {url}: {cause}")
        self.url = url
        self.cause = cause
        self.retryable = retryable


class PayloadTooLarge(BusError, ValueError):
    """A message is larger than the bus will carry, even chunked."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what}: {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class PublishError(BusError):
    """The server did not acknowledge a publish within the publish timeout (or refused it)."""


class StreamConflict(BusError):
    """A stream of this run exists with a different subject: not ours, refuse to touch it."""


class RequestTimeout(BusError, TimeoutError):
    """A request/reply got no answer in time."""


class NoResponders(BusError):
    """Nobody serves the requested subject (the serving role is not running)."""


class RemoteError(BusError):
    """The responder failed; the message carries its error text."""


def replicas_hint(replicas: int, e: Exception) -> str:
    """What to change when the server refused a stream's or bucket's replica count."""
    text = str(getattr(e, "description", "") or e).lower()
    if replicas > 1 and ("replica" in text or "insufficient resources" in text or "cluster" in text):
        return (f" (nats.replicas is {replicas}: the server, or its cluster, has fewer JetStream nodes; "
                "set nats.replicas to at most the number of nodes, 1 on a single server)")
    return ""
