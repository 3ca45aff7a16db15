"""Idempotent creation of a run's streams (and, via :mod:`bus.kv`, its KV bucket).

Every role calls :func:`ensure_streams` at start, in any order and concurrently: JetStream
accepts a create with an identical config as a no-op, a changed limit (new settings) is
applied as an update, and a stream of the same name bound to *other* subjects is refused
rather than rewritten (it belongs to someone else).
"""

from __future__ import annotations

import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError

from schemas.config import NatsConfig

from .errors import BusError, StreamConflict, replicas_hint
from .subjects import KINDS, names

log = structlog.get_logger(__name__)

#: What each stream of a run carries (its record type, from ``schemas.data``), writer -> reader:
#: the streams' descriptions on the server and in ``docs/protocol.md``.
DESCRIPTIONS = {
    "exp": "experience groups (ExperienceGroup), explorer -> buffer",
    "sync": "weight synchronization events (SyncEvent), trainer/explorer -> synchronizer",
    "metrics": "metrics of every role (Metric), for trinity inspect and the NATS CLI",
    "ctl": "control messages (SyncEvent of kind stop: a sync timed out under on_timeout stop)",
    "dlq": "dead letters: undecodable messages, raw, with the error in Trinity-Error",
    "tasks": "the task queue (TaskOrder): each step's tasks, taken by whichever explorer is free",
    "done": "what became of each queued task (TaskDone: error or rollout scalars), for the leading explorer",
    "feedback": "what the buffer's pipeline made of each group (TaskFeedback: pass rate, kept), for the task selectors",
}


def stream_config(cfg: NatsConfig, run_id: str, kind: str) -> api.StreamConfig:
    """The config of one stream: file storage, limits retention (a restarted consumer
    resumes from its ack floor; ``inspect --tail`` can show history), the de-dup window and
    the byte/age limits from settings."""
    n = names(run_id)
    max_age = float(cfg.stream_max_age) if cfg.stream_max_age and cfg.stream_max_age > 0 else 0.0
    dup = float(cfg.duplicate_window)
    if max_age and dup > max_age:  # JetStream requires duplicate_window <= max_age
        dup = max_age
    return api.StreamConfig(
        name=n.stream(kind),
        description=f"trinity run {run_id}: {DESCRIPTIONS[kind]}",
        subjects=[n.subject(kind)],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        discard=api.DiscardPolicy.OLD,
        max_bytes=int(cfg.stream_max_bytes) if cfg.stream_max_bytes else -1,
        max_age=max_age,
        max_msgs=-1,
        max_consumers=-1,
        max_msg_size=-1,
        duplicate_window=dup,
        num_replicas=int(cfg.replicas),
    )


async def ensure_stream(
    js: JetStreamContext, cfg: NatsConfig, run_id: str, kind: str
) -> api.StreamInfo:
    """Create or update one stream of the run; see the module docstring."""
    want = stream_config(cfg, run_id, kind)
    try:
        return await js.add_stream(want)
    except BadRequestError as e:
        # 10058: "stream name already in use with a different configuration".
        if e.err_code != 10058:
            raise BusError(f"cannot create stream {want.name}: {e.description}{replicas_hint(cfg.replicas, e)}") from e
    info = await js.stream_info(want.name)
    have = list(info.config.subjects or [])
    if have != want.subjects:
        raise StreamConflict(
            f"stream {want.name} exists with subjects {have}, not {want.subjects}: "
            "another run or tool owns that name; refusing to change it"
        )
    try:
        info = await js.update_stream(want)
    except BadRequestError as e:
        raise BusError(
            f"stream {want.name} exists with an incompatible config: {e.description}"
        ) from e
    log.info("stream_updated", stream=want.name)
    return info


async def ensure_streams(
    js: JetStreamContext, cfg: NatsConfig, run_id: str
) -> dict[str, api.StreamInfo]:
    """Create (or update) every stream of the run; returns ``{kind: StreamInfo}``."""
    return {kind: await ensure_stream(js, cfg, run_id, kind) for kind in KINDS}


async def delete_run(js: JetStreamContext, run_id: str) -> list[str]:
    """Delete the streams and the KV bucket of ``run_id``; returns what existed.

    ``trinity run`` calls it for an experiment whose job folder does not exist: whatever the
    server still holds under that name belongs to a run whose files were deleted, and would
    otherwise be resumed (a cursor at the end, a stage marked done)."""
    from nats.js.errors import NotFoundError

    n = names(run_id)
    gone = []
    for kind in KINDS:
        try:
            await js.delete_stream(n.stream(kind))
            gone.append(n.stream(kind))
        except NotFoundError:
            pass
    try:
        await js.delete_key_value(n.kv_bucket)
        gone.append(n.kv_bucket)
    except NotFoundError:  # BucketNotFoundError is one
        pass
    return gone
