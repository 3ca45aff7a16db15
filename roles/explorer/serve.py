"""Mode ``serve`` (online RL): no taskset; agents outside trinity drive the explorer's OpenAI
API, open episodes and post rewards (``roles/explorer/api``), and every ``buffer.batch_size``
rewarded episodes are a step (cursor, metrics, weight sync at its boundary). With
``buffer.total_steps`` (or ``trainer.total_steps``) the run ends once the trainer has trained
them and the final weights are loaded; without, it serves until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from roles.explorer.core import CURSOR_KEY, Explorer, ExplorerStats
from roles.runtime.signals import until_stopped
from schemas.data import Metric
from schemas.state import Cursor

log = structlog.get_logger(__name__)


async def serve(ex: Explorer) -> ExplorerStats:
    cfg, name = ex.cfg, ex.cfg.explorer.name
    sync = await ex.open()
    saved = await ex.state.get(CURSOR_KEY)
    if saved:
        ex.step, ex.stats.episodes = saved.step, saved.episodes or 0
        log.info("resuming_serve", step=ex.step, episodes=ex.stats.episodes)
    await ex.state.set_model_version(name, ex.engines[0].model_version)
    last = cfg.trainer.total_steps or cfg.buffer.total_steps
    ex.beat(name)
    try:
        while not ex.stop.is_set():
            t0 = time.monotonic()
            ok, what = await until_stopped(_wait(ex, last), ex.stop)
            if not ok:
                break
            if what == "trained":
                await ex.final_weights(sync)
                break
            ex.step += 1
            ex.stats.steps += 1
            ex.beat()
            await ex.state.put(CURSOR_KEY, Cursor(ex.step, episodes=ex.stats.episodes))
            await _metrics(ex, time.monotonic() - t0)
            await sync.after_step(ex.step)
            ok, _ = await until_stopped(sync.before_step(ex.step, ex.sync_engines), ex.stop)
            if not ok:
                break
            await ex.state.set_model_version(name, ex.engines[0].model_version)
            ex.beat()
        ex.stats.interrupted = ex.stop.is_set() or ex.stats.interrupted
        await ex.pub.flush()
    finally:
        ex.close()
        await ex.beat_stopped()
    return ex.stats


async def _wait(ex: Explorer, last: int | None) -> str:
    """Until a step's worth of episodes is in ("step") or the trainer has trained its last
    step ("trained")."""
    need = (ex.step + 1) * ex.cfg.buffer.batch_size
    while True:
        if ex.stats.episodes >= need:
            return "step"
        if last is not None and (await ex.state.model_version("trainer") or 0) >= last:
            return "trained"
        ex.episode_done.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ex.episode_done.wait(), 1.0)


async def _metrics(ex: Explorer, seconds: float) -> None:
    s, rewards = ex.api.stats, ex.rewards
    ex.rewards = []
    values = {"reward_mean": sum(rewards) / max(len(rewards), 1), "episodes": float(len(rewards)),
              "step_seconds": seconds, "api_requests": float(s.requests),
              "api_errors": float(s.errors), "episodes_expired": float(s.episodes_expired),
              "model_version": float(ex.engines[0].model_version)}
    log.info("serve_step", step=ex.step, **{k: round(v, 4) for k, v in values.items()})
    await ex.report(Metric(role="explorer", step=ex.step, kind="rollout", values=values))
