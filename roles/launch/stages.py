"""One role process across the stages of an experiment (``stages:`` in the config).

Every role process (``trinity explorer|trainer|buffer|synchronizer``, started by ``trinity
run`` or by honcho) walks the same list of stages in order. A stage is its own sub-experiment
(its own job dir, streams and KV bucket); in each one a role either works (its mode needs it)
or idles, and every role moves on when the stage's ``run.done`` flag appears in that stage's
KV bucket. The flag is set by the stage's *finisher*: the explorer when the mode has one (it
finishes last: final weights, final evaluation), else the trainer. A stage that is already
done (a restarted process, a resumed run) is skipped, so restarts need no extra bookkeeping.

Stage ``i > 0`` starts from the previous stage's final weights: its ``model.model_path``
becomes that stage's last Hugging Face checkpoint (a stage without a trainer passes its
model on unchanged). A config without ``stages`` is one stage.

At the end every role process leaves at the same point (``exit.*`` in ``schemas/keys.py``): it
says it is done, waits until every other role process says so too, then exits 0 and ignores
SIGTERM. Under honcho, which SIGTERMs everything when the first process exits, nobody is then
killed mid-shutdown, and ``trinity server --until-done`` (the Procfile's nats line) stops last.
The explorer also prints the run's eval summary there, as ``trinity run`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

import bus
from roles.runtime.cpu_tuning import share_cpu, tuning_on
from roles.runtime.role import RoleContext, role_context
from roles.runtime.signals import (
    ignore_signals_from_now,
    stop_on_signals,
    until_done_or_bus_gone,
    until_stopped,
)
from roles.runtime.verdicts import RunFailed
from schemas import keys
from schemas.config import TrinityConfig
from schemas.modes import MODES
from schemas.state import ExitMarker, RunFailure, StageDone

log = structlog.get_logger(__name__)

#: A role's work for one stage (``roles/runtime/role.py``): True when it got to its end.
Runner = Callable[[RoleContext], Awaitable[bool]]

#: Seconds a role process whose work is over waits for the others to say they are done before
#: it exits anyway (a role that died and was not restarted never says so).
FINISH_WAIT = 60.0
#: Seconds an explorer's "running" exit marker counts without renewal (see :func:`_leased`).
MARKER_LEASE = 20.0


def roles_needed(stages: list[TrinityConfig]) -> list[str]:
    """Every role some stage needs, in start order (buffer first: the others talk to it)."""
    order = ("buffer", "synchronizer", "trainer", "explorer")
    need = {r for s in stages for r in MODES[s.mode].roles}
    return [r for r in order if r in need]


def final_hf_dir(cfg: TrinityConfig) -> str | None:
    """The last Hugging Face checkpoint a stage's trainer wrote, if any."""
    from storage import checkpoints as ckpt

    for step in reversed(ckpt.list_steps(cfg.checkpoint_job_dir)):
        hf = ckpt.hf_dir(cfg.checkpoint_job_dir, step)
        if ckpt.hf_weights_complete(hf):
            return str(hf)
    return None


def chain(cfg: TrinityConfig, prev: TrinityConfig | None) -> TrinityConfig:
    """Stage ``cfg`` starting from the final weights of the stage before it."""
    if prev is None:
        return cfg
    src = final_hf_dir(prev) if MODES[prev.mode].trains else prev.model.model_path
    if src is None:
        raise FileNotFoundError(
            f"stage {cfg.name}: the previous stage ({prev.name}) left no Hugging Face checkpoint "
            f"under {prev.checkpoint_job_dir} (save_hf_checkpoint must not be 'never' there)"
        )
    out = cfg.model_copy(deep=True)
    old = cfg.model.model_path
    out.model.model_path = src
    # paths the loader derived from model.model_path follow it (set explicitly: kept)
    if out.model.critic_model_path == old:
        out.model.critic_model_path = src
    if out.explorer.rollout_model.model_path == old:
        out.explorer.rollout_model.model_path = src
    return out


async def _watch_done(state: object, key: str, stop: asyncio.Event, terminate: asyncio.Event) -> None:
    """Set ``stop`` once the stage is done elsewhere (``key``) or the process is told to terminate."""
    while not stop.is_set():
        if terminate.is_set() or await state.get(key):  # type: ignore[attr-defined]
            stop.set()
            return
        await asyncio.sleep(0.5)


async def run_stages(role: str, stages: list[TrinityConfig], runner: Runner,
                     terminate: asyncio.Event | None = None) -> int:
    """Walk the stages as ``role`` (see the module doc); 0 when all are done or on SIGTERM
    (or the death of the ``trinity run`` that started this process: ``roles/runtime/signals.py``).
    ``terminate``: the process's own stop event when it hosts several runs (a sweep's
    shared trainer or explorer): it handles the signals, and one run that finishes must not
    make the process deaf to them. Once stopping, a NATS server that stays unreachable is not
    waited for (:func:`roles.runtime.signals.until_done_or_bus_gone`)."""
    from bus.connection import connected
    from roles.runtime.config import session_start

    since = session_start()
    name = process_name(role)
    own_signals = terminate is None
    if terminate is None:
        terminate = asyncio.Event()
        stop_on_signals(terminate)
    finished, code = await until_done_or_bus_gone(
        _run_stages(role, stages, runner, terminate, name, since, own_signals), terminate, connected)
    return code if finished and code is not None else 0


async def _run_stages(role: str, stages: list[TrinityConfig], runner: Runner, terminate: asyncio.Event,
                      name: str, since: float, own_signals: bool) -> int:
    """:func:`run_stages`'s work: say "running", walk the stages, finish together."""

    await _say_exit(stages[-1], name, "running")
    renew = asyncio.create_task(_renew_marker(stages[-1], name)) if _leased(name) else None
    try:
        code = await _walk(role, stages, runner, terminate)
    finally:
        await bus.stop_tasks(renew)  # ended for sure: a renewal must not outlive "done"
    if code >= 0:
        return code
    await finish_together(stages[-1], name, since, terminate, own_signals)
    if role == "explorer":
        _print_summary(stages)
    return 0


async def _walk(role: str, stages: list[TrinityConfig], runner: Runner, terminate: asyncio.Event) -> int:
    """The stages as ``role``: 0 when SIGTERM ends it, -1 when every stage was walked."""

    prev: TrinityConfig | None = None
    for raw in stages:
        if terminate.is_set():
            return 0
        cfg = chain(raw, prev)
        prev = cfg
        nc = await bus.connect(cfg.nats, name=process_name(role))
        try:
            async with role_context(cfg, role, nc) as ctx:
                code = await _stage(role, ctx, runner, terminate)
        finally:
            await bus.disconnect(nc)
        if code is not None:
            return code
    return -1  # every stage walked: finish together (run_stages)


async def _stage(role: str, ctx: RoleContext, runner: Runner, terminate: asyncio.Event) -> int | None:
    """One stage as ``role``: work it (its mode needs the role) or idle, until it is done;
    0 when SIGTERM ends it, None to go on to the next."""
    cfg, state = ctx.cfg, ctx.state
    done_key = keys.run_done(cfg.mode)
    if await state.get(done_key):
        log.info("stage_already_done", stage=cfg.name)
        return None
    if role in MODES[cfg.mode].roles:
        log.info("stage_start", stage=cfg.name, mode=cfg.mode, model=cfg.model.model_path)
        if role == "trainer" and tuning_on(cfg.cluster.cpu_tuning, cfg.cluster.gpu_per_node):
            share_cpu(cfg.mode)
        watcher = asyncio.create_task(_watch_done(state, done_key, ctx.stop, terminate))
        try:
            completed = await runner(ctx)
        except RunFailed as e:  # said in the stage's bucket, for trinity run and inspect
            await _record_failure(state, role, e)
            raise
        finally:
            # ended before the connection it reads closes: a watcher left mid-read would
            # fail on the closed connection with nobody to hear it. ``stop`` first: the
            # loop ends by itself even if a cancel is lost
            ctx.stop.set()
            await bus.stop_tasks(watcher)
        if terminate.is_set():
            return 0
        if completed and role == MODES[cfg.mode].finisher:
            await state.put(done_key, StageDone(role, time.time()))
            log.info("stage_done", stage=cfg.name)
            return None
    else:
        log.info("stage_idle", stage=cfg.name, mode=cfg.mode)
    while not await state.get(done_key):
        if terminate.is_set():
            return 0
        await asyncio.sleep(0.5)
    return None


async def _record_failure(state: Any, role: str, failure: RunFailed) -> None:
    """Put ``run.failed`` (see ``roles/runtime/verdicts.py``). Best effort and bounded: the process
    exits :data:`~roles.runtime.verdicts.RUN_FAILED_EXIT` with the cause on stderr either way."""
    log.error("run_failed", role=role, cause=failure.cause)
    try:
        await asyncio.wait_for(state.put(keys.RUN_FAILED, RunFailure(role, failure.cause, time.time())), 10.0)
    except Exception as e:  # noqa: BLE001 - the cause is still printed
        log.warning("run_failed_not_recorded", error=f"{type(e).__name__}: {e}")


def process_name(role: str) -> str:
    """The name of this process's exit marker (a trainer rank other than 0 has its own; every
    explorer process has its own, as a run may have several)."""
    if role == "explorer":
        return f"explorer-{socket.gethostname()}-{os.getpid()}"
    rank = os.environ.get("RANK", "0")
    return role if rank in ("", "0") else f"{role}_rank{rank}"


def _leased(name: str) -> bool:
    """Explorer markers are leased: explorers come and go (a killed one never says "done",
    and its restart has another name), so a "running" marker counts only while renewed."""
    return name.startswith("explorer-")


def _marker(name: str, state: str) -> ExitMarker:
    """Process ``name``'s exit marker now (leased for an explorer)."""
    return ExitMarker(state, time.time(), os.getpid(), MARKER_LEASE if _leased(name) else None)


async def _renew_marker(cfg: TrinityConfig, name: str) -> None:
    """Keep this process's leased "running" marker fresh until cancelled."""

    nc = await bus.connect(cfg.nats, name=f"{name}-exit")
    try:
        state = await bus.RunState.open(bus.jetstream(nc, cfg.nats), cfg.run_id, cfg.nats.replicas)
        while True:
            await asyncio.sleep(MARKER_LEASE / 4)
            with contextlib.suppress(Exception):
                await state.put(keys.EXIT_PREFIX + name, _marker(name, "running"))
    finally:
        await bus.disconnect(nc)


async def _say_exit(cfg: TrinityConfig, name: str, state: str) -> None:
    """Set this process's exit marker in the last stage's bucket (see ``schemas/keys.py``)."""

    nc = await bus.connect(cfg.nats, name=f"{name}-exit")
    try:
        kv = await bus.RunState.open(bus.jetstream(nc, cfg.nats), cfg.run_id, cfg.nats.replicas)
        await kv.put(keys.EXIT_PREFIX + name, _marker(name, state))
    finally:
        await bus.disconnect(nc)


async def unfinished(state: object, since: float, mode: str) -> list[str] | None:
    """The role processes that have not said "done" since ``since`` (``[]``: every one has);
    None while the stage (of ``mode``) is not done or no role process has started."""
    if not await state.get(keys.run_done(mode)):  # type: ignore[attr-defined]
        return None
    markers = await state.with_prefix(keys.EXIT_PREFIX)  # type: ignore[attr-defined]
    if not markers:
        return None
    now = time.time()

    def waiting(v: ExitMarker) -> bool:
        if v.lease is not None:  # an explorer's: only a live one that has not said "done" yet
            return v.state == "running" and now <= v.ts + v.lease
        return not (v.state == "done" and v.ts >= since)

    return sorted(k[len(keys.EXIT_PREFIX):] for k, v in markers.items() if waiting(v))


async def finish_together(cfg: TrinityConfig, name: str, since: float, terminate: asyncio.Event,
                          own_signals: bool = True) -> None:
    """Say this process is done, wait (at most :data:`FINISH_WAIT` s, or until SIGTERM: the
    work is done either way) until every role process has said so since ``since``, then ignore
    SIGTERM: from here on the process only disconnects and exits 0. Markers older than
    ``since`` are a previous session's and do not count."""

    nc = await bus.connect(cfg.nats, name=f"{name}-exit")
    try:
        state = await bus.RunState.open(bus.jetstream(nc, cfg.nats), cfg.run_id, cfg.nats.replicas)
        await state.put(keys.EXIT_PREFIX + name, _marker(name, "done"))
        # SIGTERM ends the wait at once, also mid-read: under honcho it comes when another
        # process exited, with the server stopping too, and a read would wait the server out
        await until_stopped(_wait_for_all(state, since, cfg.mode), terminate)
        if own_signals:
            ignore_signals_from_now()
    finally:
        await bus.disconnect(nc)


async def _wait_for_all(state: Any, since: float, mode: str) -> None:
    """Until every role process said "done" since ``since``, or :data:`FINISH_WAIT` s."""
    deadline = time.monotonic() + FINISH_WAIT
    while waiting := await unfinished(state, since, mode):
        if time.monotonic() > deadline:
            log.warning("exit_without_them", waiting=waiting, seconds=FINISH_WAIT)
            return
        await asyncio.sleep(0.2)


async def until_finished(stages: list[TrinityConfig], since: float) -> None:
    """Return once the last stage is done and every role process has said "done" since
    ``since``: what ``trinity server --until-done`` waits for before it stops the server."""

    cfg = stages[-1]
    nc = await bus.connect(cfg.nats, name="server-until-done")
    try:
        state = await bus.RunState.open(bus.jetstream(nc, cfg.nats), cfg.run_id, cfg.nats.replicas)
        while await unfinished(state, since, cfg.mode) != []:
            await asyncio.sleep(0.2)
    finally:
        await bus.disconnect(nc)


def _print_summary(stages: list[TrinityConfig]) -> None:
    """The eval summary ``trinity run`` prints at the end, when no ``trinity run`` does (honcho)."""
    from roles.runtime.config import SUPERVISED_ENV
    from roles.runtime.monitor import summary

    if not os.environ.get(SUPERVISED_ENV):
        lines = summary(stages)
        if lines:
            print("\n".join(lines), flush=True)


def runner_for(role: str) -> Runner:
    """The role's stage function (imported lazily: a buffer never imports vLLM)."""
    if role == "explorer":
        from roles.explorer.main import run_explorer

        return run_explorer
    if role == "trainer":
        from roles.trainer.main import run_trainer

        return run_trainer
    if role == "buffer":
        from roles.buffer.main import run_buffer

        return run_buffer
    if role == "synchronizer":
        from roles.synchronizer.main import run_synchronizer

        return run_synchronizer
    raise ValueError(f"unknown role {role!r}")
