"""``trinity synchronizer``: the run's sync referee and monitor.

The trainer and explorer clients (``client.py``) move weights themselves, following the
pure policy in ``policy.py``; this process publishes that plan to KV (``sync.plan``) so
``trinity inspect`` shows it, watches every offer, and when an offer is not taken within
``sync_timeout`` publishes a ``timeout`` event naming who did not arrive (from heartbeats and
versions) and, with ``on_timeout: stop``, a ``stop`` control message. It also appends sync
events to ``<job_dir>/monitor/sync_events.jsonl`` (metrics go to the monitor of the role that
measured them: ``roles/runtime/monitor.py``).

Why a referee and not the owner of the sync state: that state is the ``sync.*`` records in the
run's KV (``schemas/keys.py``), written by the two ends that act on it; a process between them
would add a round trip and a point of failure to every sync. No role waits on this one: while
it is down (or restarted) weights still move; only the timeout reports pause.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import structlog

import bus
from roles.runtime.role import RoleContext
from schemas import keys
from schemas.data import SyncEvent
from schemas.state import Offer, SyncPlan

log = structlog.get_logger(__name__)


def _jsonable(obj: object) -> dict:
    return {k: v for k, v in dataclasses.asdict(obj).items()}  # type: ignore[arg-type]


def overdue(offer: Offer | None, explorer_version: int | None, now: float, timeout: float) -> bool:
    """An offer nobody took within ``timeout`` seconds (pure, unit-tested)."""
    if offer is None:
        return False
    taken = explorer_version is not None and explorer_version >= offer.version
    return not taken and now - offer.ts > timeout


def missing_roles(heartbeats: dict[str, dict], now: float, stale_after: float) -> list[str]:
    """Roles among trainer/explorer whose heartbeat is absent or older than ``stale_after``."""
    out = []
    for role in ("explorer", "trainer"):
        hb = heartbeats.get(role)
        if hb is None or now - float(hb.get("ts", 0)) > stale_after:
            out.append(role)
    return out or ["explorer"]


async def run_synchronizer(ctx: RoleContext) -> bool:
    """Referee until ``ctx.stop`` (set by the stage walker: SIGTERM, or the stage done):
    publish the plan, log every sync event, and call out an offer nobody took in time."""
    cfg, nc, state, pub, stop, log = ctx.cfg, ctx.nc, ctx.state, ctx.pub, ctx.stop, ctx.log
    ctx.beat.as_("synchronizer")
    plan = SyncPlan.from_config(cfg.synchronizer)
    await state.put(keys.SYNC_PLAN, plan)
    mon = Path(cfg.checkpoint_job_dir) / "monitor"
    mon.mkdir(parents=True, exist_ok=True)
    events = await bus.Consumer(nc, cfg.nats, cfg.run_id, "sync", "synchronizer", expect=SyncEvent).start()
    flagged: set[int] = set()
    log.info("synchronizer_started", **dataclasses.asdict(plan))
    try:
        while not stop.is_set():
            for consumer, fname in ((events, "sync_events.jsonl"),):
                items = await consumer.fetch(timeout=0.2)
                if items:
                    with open(mon / fname, "a") as f:
                        for d in items:
                            f.write(json.dumps(_jsonable(d.obj), default=str) + "\n")
                    await consumer.ack(items)
            offer = await state.get(keys.SYNC_OFFER)
            now = time.time()
            if offer is not None and offer.seq not in flagged and overdue(
                offer, await state.model_version("explorer"), now, plan.timeout
            ):
                flagged.add(offer.seq)
                missing = missing_roles(await state.heartbeats(), now, max(plan.timeout / 2, 10.0))
                log.warning("sync_overdue", version=offer.version, missing=missing)
                await pub.publish_event(SyncEvent(kind="timeout", model_version=offer.version,
                                                  method=plan.method, source="synchronizer", missing=missing))
                if plan.on_timeout == "stop":
                    await pub.publish_event(SyncEvent(kind="stop", model_version=offer.version,
                                                      method=plan.method, source="synchronizer",
                                                      missing=missing), kind="ctl")
    finally:
        await events.close()
