"""``trinity inspect``: what is on the bus for one run, for machines without the NATS CLI.

For each of the run's streams: message count, bytes, sequence range and every consumer's
pending / ack-pending / redelivered counts; the KV run state; the dead-letter count; and with
``tail`` the last N messages of one stream decoded to JSON (arrays summarized when long).
The same facts are visible with ``nats stream report``, ``nats consumer report`` and
``nats stream view`` since names and headers are meant to be read there too.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
from typing import Any

import numpy as np
import orjson
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError

from schemas import codec
from schemas.config import NatsConfig
from schemas.redact import redact_url

from .connection import connect, jetstream
from .kv import RunState
from .publish import H_CHUNK_COUNT, H_CHUNK_ID, H_CHUNK_INDEX, H_ERROR, MAX_MESSAGE_BYTES
from .subjects import KINDS, names

#: Arrays with at most this many elements are printed whole; longer ones are summarized.
ARRAY_INLINE = 32


def to_jsonable(x: Any) -> Any:
    """A JSON-ready view of a decoded message: dataclasses to dicts, arrays to lists (or a
    dtype/shape/head summary when long), bytes to text or base64."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.ndarray) or type(x).__module__.startswith("torch"):
        a = np.asarray(
            x.float()
            if hasattr(x, "float") and str(getattr(x, "dtype", "")) == "torch.bfloat16"
            else x
        )
        if a.size <= ARRAY_INLINE:
            return a.tolist()
        return {"dtype": str(a.dtype), "shape": list(a.shape), "head": a.reshape(-1)[:16].tolist()}
    if isinstance(x, bytes | bytearray | memoryview):
        b = bytes(x)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(b).decode()}
    if isinstance(x, np.generic):
        return x.item()
    return x


def _msg_json(raw: Any) -> dict[str, Any]:
    h = dict(raw.headers or {})
    h = {k: v for k, v in h.items() if not k.startswith("Nats-") or k == "Nats-Msg-Id"}
    data = raw.data or b""
    when = (
        raw.time.isoformat() if isinstance(getattr(raw, "time", None), datetime.datetime) else None
    )
    out: dict[str, Any] = {
        "seq": raw.seq,
        "subject": raw.subject,
        "time": when,
        "bytes": len(data),
        "headers": h,
    }
    if H_CHUNK_ID in h:
        out["chunk"] = (
            f"{int(h.get(H_CHUNK_INDEX, 0)) + 1}/{h.get(H_CHUNK_COUNT, '?')} of {h[H_CHUNK_ID]}"
        )
        return out
    try:
        out["body"] = to_jsonable(codec.decode(data, max_bytes=MAX_MESSAGE_BYTES))
    except Exception as e:
        out["decode_error"] = f"{type(e).__name__}: {e}"
        out["raw"] = to_jsonable(data[:512])
    return out


async def _tail(
    js: JetStreamContext, stream: str, first: int, last: int, n: int
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seq = last
    while seq >= max(first, 1) and len(out) < n:
        try:
            raw = await js.get_msg(stream, seq)
        except NotFoundError:  # deleted or expired
            seq -= 1
            continue
        if raw.seq is None:
            raw.seq = seq
        out.append(_msg_json(raw))
        seq -= 1
    return out[::-1]


async def dead_letters(js: JetStreamContext, run_id: str, first: int = 3, scan: int = 200) -> tuple[int, list[str]]:
    """How many messages ``run_id``'s dead-letter stream holds, and the first ``first``
    distinct reasons (each message's ``Trinity-Error``) among its first ``scan`` messages:
    what ``trinity run``'s summary lists. (0, []) when the stream does not exist."""
    stream = names(run_id).stream("dlq")
    try:
        si = await js.stream_info(stream)
    except NotFoundError:
        return 0, []
    reasons: list[str] = []
    seq, last = max(si.state.first_seq, 1), min(si.state.last_seq, si.state.first_seq + scan - 1)
    while seq <= last and len(reasons) < first:
        try:
            raw = await js.get_msg(stream, seq)
        except NotFoundError:  # deleted or expired
            seq += 1
            continue
        reason = (raw.headers or {}).get(H_ERROR, "(no reason recorded)")
        if reason not in reasons:
            reasons.append(reason)
        seq += 1
    return si.state.messages, reasons


async def inspect_run(
    cfg: NatsConfig, run_id: str, tail: int | None = None, stream: str | None = None
) -> dict[str, Any]:
    """Everything ``trinity inspect`` shows, as a dict (JSON-ready). ``stream`` picks the
    stream for ``tail`` by kind (``exp``, ``sync``, ``metrics``, ``ctl``, ``dlq``) or name;
    default ``exp``."""
    n = names(run_id)
    nc = await connect(cfg, name="trinity-inspect", connect_wait=min(cfg.connect_wait, 2.0))
    try:
        js = jetstream(nc, cfg)
        report: dict[str, Any] = {
            "run": run_id,
            "url": redact_url(cfg.url),
            "streams": {},
            "kv_bucket": n.kv_bucket,
        }
        for kind in KINDS:
            name = n.stream(kind)
            try:
                si = await js.stream_info(name)
            except NotFoundError:
                report["streams"][kind] = {
                    "name": name,
                    "subject": n.subject(kind),
                    "exists": False,
                }
                continue
            consumers = []
            for ci in await js.consumers_info(name):
                consumers.append(
                    {
                        "name": ci.name,
                        "pending": ci.num_pending or 0,
                        "ack_pending": ci.num_ack_pending or 0,
                        "redelivered": ci.num_redelivered or 0,
                        "waiting": ci.num_waiting or 0,
                        "delivered_seq": ci.delivered.stream_seq if ci.delivered else 0,
                        "ack_floor_seq": ci.ack_floor.stream_seq if ci.ack_floor else 0,
                    }
                )
            report["streams"][kind] = {
                "name": name,
                "subject": n.subject(kind),
                "exists": True,
                "messages": si.state.messages,
                "bytes": si.state.bytes,
                "first_seq": si.state.first_seq,
                "last_seq": si.state.last_seq,
                "consumers": consumers,
            }
        dlq = report["streams"]["dlq"]
        report["dead_letters"] = dlq.get("messages", 0)
        try:
            state = RunState(await js.key_value(n.kv_bucket), js, n.kv_bucket)
            report["kv"] = await state.snapshot()
        except (BucketNotFoundError, NotFoundError):
            report["kv"] = None
        if tail:
            key = stream or "exp"
            kind = key if key in KINDS else n.kind_of_stream(key)
            if kind is None:
                raise ValueError(
                    f"unknown stream {key!r}: use one of {', '.join(KINDS)} or a stream name of this run"
                )
            s = report["streams"][kind]
            report["tail"] = {
                "stream": s["name"],
                "messages": await _tail(js, s["name"], s["first_seq"], s["last_seq"], tail)
                if s["exists"]
                else [],
            }
        return report
    finally:
        await nc.close()


def _size(b: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1024 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b} B"


def render_text(report: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`inspect_run`'s dict."""
    lines = [f"run {report['run']}  ({report['url']})", ""]
    lines.append(f"{'STREAM':<40} {'SUBJECT':<40} {'MSGS':>8} {'BYTES':>10}")
    for s in report["streams"].values():
        if not s["exists"]:
            lines.append(f"{s['name']:<40} {s['subject']:<40} {'(not created)':>19}")
            continue
        lines.append(
            f"{s['name']:<40} {s['subject']:<40} {s['messages']:>8} {_size(s['bytes']):>10}"
        )
        for c in s["consumers"]:
            lines.append(
                f"    consumer {c['name']}: pending {c['pending']}, ack pending {c['ack_pending']}, "
                f"redelivered {c['redelivered']}, acked through seq {c['ack_floor_seq']}"
            )
    lines += ["", f"dead letters: {report['dead_letters']}", ""]
    kv = report.get("kv")
    if kv is None:
        lines.append(f"KV {report['kv_bucket']}: (not created)")
    else:
        lines.append(f"KV {report['kv_bucket']}: {len(kv)} keys")
        for k, v in kv.items():
            lines.append(f"    {k} = {orjson.dumps(v).decode() if not isinstance(v, str) else v}")
    t = report.get("tail")
    if t is not None:
        lines += ["", f"last {len(t['messages'])} messages of {t['stream']}:"]
        for m in t["messages"]:
            lines.append(
                orjson.dumps(m, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
            )
    return "\n".join(lines) + "\n"
