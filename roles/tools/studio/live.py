"""What the studio reads from a live run: the bus (streams, consumers, KV, dead letters) and the
experiences of a step, made ready to show.

The bus part is ``trinity inspect``'s report (:func:`bus.inspect_run`) plus what a person asks
of it: each role's heartbeat age and model version, and each dead letter's reason. A run whose
bus is gone (the quickstart's embedded server stops with the run) says so instead of failing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from functools import lru_cache
from typing import Any

from bus import BusError, inspect_run
from bus.connection import connect, jetstream
from bus.publish import H_ERROR
from bus.subjects import names
from roles.runtime.monitor import metric_record
from schemas import codec
from schemas.config import NatsConfig
from schemas.data import Experience


async def bus_snapshot(url: str, run_id: str, dead_letters: int = 20) -> dict[str, Any]:
    """Streams, consumers, KV, roles and the newest ``dead_letters`` dead letters of a run."""
    try:
        report = await asyncio.wait_for(inspect_run(NatsConfig(url=url, connect_wait=2.0), run_id, dead_letters, "dlq"),
                                        timeout=6.0)
    except (BusError, OSError, asyncio.TimeoutError) as e:
        return {"reachable": False, "url": url, "error": str(e) or type(e).__name__}
    kv = report.get("kv") or {}
    now = time.time()
    roles: dict[str, dict[str, Any]] = {}
    for key, value in kv.items():
        kind, _, role = key.partition(".")
        if kind == "heartbeat" and isinstance(value, dict):  # schemas.state.Heartbeat
            roles.setdefault(role, {}).update(heartbeat_age_s=round(now - float(value.get("ts", now)), 1),
                                              state=value.get("state"), step=value.get("step"), pid=value.get("pid"))
        elif kind == "version" and isinstance(value, dict):  # schemas.state.ModelVersion
            roles.setdefault(role, {})["model_version"] = value.get("version")
    letters = []
    for m in (report.get("tail") or {}).get("messages", []):
        h = m.get("headers", {})
        letters.append({"seq": m["seq"], "time": m.get("time"), "subject": m.get("subject"),
                        "reason": h.get(H_ERROR, ""), "headers": h})
    return {"reachable": True, "url": report["url"], "streams": report["streams"], "kv": kv,
            "roles": roles, "dead_letters": report["dead_letters"], "letters": letters[::-1]}


@lru_cache(maxsize=4)
def tokenizer(path: str) -> Any:
    """The run's tokenizer (cached: loading one takes a second); None when it cannot load."""
    if not path:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception:  # noqa: BLE001 - a moved or hub-only model: show token ids instead
        return None


def _floats(a: Any, n: int) -> list[float | None]:
    if a is None:
        return [None] * n
    vals = [float(x) for x in list(a)[-n:]] if n else []
    return [None] * (n - len(vals)) + vals


def experience_view(e: Experience, step: int, tok: Any) -> dict[str, Any]:
    """One experience as the trajectory browser shows it: texts, each response token with its
    log-prob and advantage, reward, group, version, staleness (the trainer held version
    ``step - 1`` when it trained on it), truncation, and an agent episode's turns."""
    tokens = [int(t) for t in e.tokens]
    resp = tokens[e.prompt_length:]
    n = len(resp)
    if tok is not None:
        prompt = tok.decode(tokens[:e.prompt_length])
        pieces = [tok.decode([t]) for t in resp]
    else:
        prompt = e.prompt_text or " ".join(map(str, tokens[:e.prompt_length]))
        pieces = [f"<{t}>" for t in resp]
    adv = e.advantages
    if adv is not None and getattr(adv, "ndim", 1) == 0:
        adv = [float(adv)] * n
    mask = list(e.action_mask)[-n:] if e.action_mask is not None else [1] * n
    return {
        "id": e.id, "task_id": e.task_id, "group_id": e.group_id, "taskset": e.task_id.split("/", 1)[0],
        "reward": e.reward, "model_version": e.model_version, "staleness": max(step - 1 - e.model_version, 0),
        "prompt_truncated": e.prompt_truncated, "response_truncated": e.response_truncated,
        "prompt": prompt, "response_text": e.response_text,
        "tokens": [{"t": p, "logprob": lp, "advantage": a, "trained": bool(m)}
                   for p, lp, a, m in zip(pieces, _floats(e.logprobs, n), _floats(adv, n), mask, strict=True)],
        "messages": e.messages or [], "episode": e.episode, "info": {k: v for k, v in e.info.items()
                                                                    if isinstance(v, str | int | float | bool)},
    }


# -- runs known only by their bus (no job folder here: a cluster's run watched from a laptop) --


async def bus_runs(url: str) -> list[str]:
    """The ids of every run with streams on the bus at ``url`` ([] when it is unreachable)."""

    try:
        nc = await asyncio.wait_for(connect(NatsConfig(url=url, connect_wait=2.0), name="trinity-studio"), 6.0)
    except (BusError, OSError, asyncio.TimeoutError):
        return []
    try:
        runs = set()
        for si in await jetstream(nc, NatsConfig(url=url)).streams_info():
            for subject in si.config.subjects or []:
                head, _, kind = subject.rpartition(".")
                if head.startswith("trinity.") and kind == "metrics":
                    runs.add(head.removeprefix("trinity."))
        return sorted(runs)
    finally:
        await nc.close()


def _as_file_record(kind: str, x: Any) -> dict[str, Any]:
    """A bus record in the shape its monitor file has: ``metrics.jsonl`` lines are
    :func:`roles.runtime.monitor.metric_record`; ``sync_events.jsonl`` lines the event's fields, as the
    synchronizer writes them."""

    return metric_record(x) if kind == "metrics" else dataclasses.asdict(x)


async def bus_records(url: str, run_id: str, kind: str, from_seq: int = 1) -> tuple[list[dict[str, Any]], int]:
    """The ``metrics`` or ``sync`` records of a run from stream sequence ``from_seq`` on, and
    the sequence to go on from. Read with an ordered consumer (the stream keeps its history:
    limits retention), so nothing is acknowledged and no role's consumer is touched."""
    from nats.js.api import ConsumerConfig, DeliverPolicy


    cfg = NatsConfig(url=url, connect_wait=2.0)
    nc = await asyncio.wait_for(connect(cfg, name="trinity-studio"), 6.0)
    out: list[dict[str, Any]] = []
    try:
        js = jetstream(nc, cfg)
        n = names(run_id)
        last = (await js.stream_info(n.stream(kind))).state.last_seq
        if last < from_seq:
            return out, from_seq
        sub = await js.subscribe(n.subject(kind), ordered_consumer=True, config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq))
        try:
            seq = from_seq - 1
            while seq < last:
                msg = await sub.next_msg(timeout=5.0)
                seq = msg.metadata.sequence.stream
                try:
                    out.append(_as_file_record(kind, codec.decode(msg.data)))
                except Exception:  # noqa: BLE001 - not a record: the dead-letter view shows such messages
                    continue
        finally:
            await sub.unsubscribe()
        return out, last + 1
    finally:
        await nc.close()
