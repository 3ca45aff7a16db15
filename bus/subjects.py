"""Names on the wire: subjects, stream names and the KV bucket of one experiment.

Everything of a run lives under ``trinity.<run>.`` so that ``nats sub 'trinity.<run>.>'`` shows
all of it, and two experiments on one server never see each other's messages. ``<run>`` is
:attr:`schemas.config.TrinityConfig.run_id` (``<project>.<name>``, sanitized), so it may hold
dots; JetStream stream and bucket names may not, so there dots become ``_``. Case is kept: a
stream name that folded case could let two runs share (and rewrite) one stream.

Each stream binds exactly one subject (no wildcards), so the streams of runs whose ids are
prefixes of each other (``a.b`` and ``a.b.exp``) can never overlap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "trinity"

#: The stream kinds of a run, in the order ``trinity inspect`` lists them.
KINDS: tuple[str, ...] = ("exp", "sync", "metrics", "ctl", "dlq", "tasks", "done", "feedback")

_RUN_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_RPC_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is usable as subject tokens, else raise ValueError.

    Why strict: a ``*``, ``>`` or space in a subject would silently widen or break a
    subscription, which is the kind of bug that shows up as "the trainer sees nothing".
    """
    if not isinstance(run_id, str) or not _RUN_RE.match(run_id):
        raise ValueError(
            f"run id {run_id!r} is not usable on the bus: use dot-separated tokens of "
            "letters, digits, '_' and '-' (TrinityConfig.run_id produces such ids)"
        )
    return run_id


def _token(run_id: str) -> str:
    return check_run_id(run_id).replace(".", "_")


@dataclass(frozen=True, slots=True)
class RunNames:
    """All names of one run; build it with :func:`names`."""

    run_id: str

    def subject(self, kind: str) -> str:
        """Subject of a stream kind: ``trinity.<run>.<kind>``."""
        if kind not in KINDS:
            raise ValueError(f"unknown stream kind {kind!r}; known: {', '.join(KINDS)}")
        return f"{PREFIX}.{self.run_id}.{kind}"

    def stream(self, kind: str) -> str:
        """JetStream stream name of a kind: ``TRINITY_<run>_<KIND>`` (dots in run -> ``_``)."""
        if kind not in KINDS:
            raise ValueError(f"unknown stream kind {kind!r}; known: {', '.join(KINDS)}")
        return f"TRINITY_{_token(self.run_id)}_{kind.upper()}"

    @property
    def exp(self) -> str:
        """Experience groups (explorer -> buffer)."""
        return self.subject("exp")

    @property
    def sync(self) -> str:
        """Sync events (trainer/explorer/synchronizer)."""
        return self.subject("sync")

    @property
    def metrics(self) -> str:
        """Metrics of every role (-> monitor)."""
        return self.subject("metrics")

    @property
    def ctl(self) -> str:
        """Control messages (stop, pause)."""
        return self.subject("ctl")

    @property
    def dlq(self) -> str:
        """Dead letters: messages a consumer could not decode, with the error in a header."""
        return self.subject("dlq")

    def rpc(self, name: str) -> str:
        """Core-NATS request/reply subject ``trinity.<run>.rpc.<name>`` (no stream behind it)."""
        if not isinstance(name, str) or not _RPC_RE.match(name):
            raise ValueError(f"rpc name {name!r}: use letters, digits, '_' and '-'")
        return f"{PREFIX}.{self.run_id}.rpc.{name}"

    @property
    def kv_bucket(self) -> str:
        """KV bucket of run state: ``trinity_<run>`` (dots -> ``_``)."""
        return f"{PREFIX}_{_token(self.run_id)}"

    def kind_of_stream(self, name: str) -> str | None:
        """Inverse of :meth:`stream` (``TRINITY_x_EXP`` -> ``exp``), or None if not ours."""
        for kind in KINDS:
            if self.stream(kind) == name:
                return kind
        return None


def names(run_id: str) -> RunNames:
    """All subjects, stream names and the KV bucket of ``run_id`` (validated)."""
    return RunNames(check_run_id(run_id))
