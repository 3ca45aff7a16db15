"""What every mode of the explorer runs on: :class:`Explorer` (engines, the runner pool, the
OpenAI API if any, metrics, the weight sync client, the heartbeat), and the helpers that
build it. The modes' runners (``explore.py``, ``bench.py``, ``serve.py``) and the role's entry
point (``main.py``) sit above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

import bus
from roles.explorer.checkpoint_watch import CheckpointWatcher, NoSync
from roles.explorer.engines import RolloutEngine
from roles.explorer.eval import evaluate
from roles.explorer.runner import RunnerPool
from roles.runtime.config import algorithm_spec
from roles.runtime.core_share import ExplorerWork, follows_explorer
from roles.runtime.monitor import Monitor
from roles.runtime.role import RoleContext
from roles.runtime.signals import until_stopped
from roles.weightsync.client import ExplorerSyncClient
from schemas import keys
from schemas.config import TrinityConfig
from schemas.data import Metric
from schemas.modes import MODES
from schemas.state import ApiAddress, ExplorerFinished
from storage.hub import hub_origin

__all__ = ["NoSync"]  # the sync client of a mode without weight sync, named here for the modes

log = structlog.get_logger(__name__)

#: KV key of the explorer's resumable position: ``{"step": int, "reader": state_dict}``.
CURSOR_KEY = keys.EXPLORER_CURSOR
#: KV key set once the taskset is exhausted and every group is stored on the stream.
FINISHED_KEY = keys.EXPLORER_FINISHED
#: KV key where the explorer announces its OpenAI API: ``{"url": ..., "model": ...}``.
API_KEY = keys.EXPLORER_API


class SyncClient(Protocol):
    """What the explorer asks the synchronizer (``roles/weightsync/client.py``)."""

    async def before_step(self, step: int, engines: list[RolloutEngine]) -> None: ...

    async def after_step(self, step: int) -> None: ...

    async def final(self, engines: list[RolloutEngine]) -> None: ...

    async def catch_up(self, engines: list[RolloutEngine], floor: int) -> int: ...

    def assist(self, name: str) -> None: ...

    async def take_lead(self) -> None: ...

    async def leave(self) -> None: ...


async def make_sync(cfg: TrinityConfig, nc: Any, state: bus.RunState, pub: bus.Publisher) -> SyncClient:
    """The synchronizer's client; in ``explore`` mode a watcher of the trainer's checkpoints
    (``roles/explorer/checkpoint_watch.py``: a ``train`` run beside it writes them); :class:`NoSync` in
    ``bench`` mode, which loads every checkpoint itself (``roles/explorer/bench.py``)."""
    weights = MODES[cfg.mode].weights
    if weights == "watch":
        return CheckpointWatcher(cfg)
    if weights == "each":
        return NoSync()
    return ExplorerSyncClient(cfg, nc, state, pub)


@dataclass
class ExplorerStats:
    steps: int = 0
    published: int = 0
    episodes: int = 0  # serve mode: rewarded episodes stored on the bus
    failed: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False


def make_pool(cfg: TrinityConfig, engines: list[RolloutEngine], auxiliary: list[list[RolloutEngine]] | None,
              api: Any = None) -> RunnerPool:
    """The runner pool over the rollout engines, handing workflows the auxiliary models, and
    scoring rollouts with the teacher (auxiliary model 0) when the algorithm distills."""

    teacher = MODES[cfg.mode].makes_experience and algorithm_spec(cfg).use_teacher
    return RunnerPool(engines, cfg.explorer, cfg.run_id, auxiliary=auxiliary, api=api, teacher=teacher)


async def start_auxiliary_apis(cfg: TrinityConfig, pool: RunnerPool) -> None:
    """An OpenAI API (any free port, nothing recorded) per auxiliary model, for workflows'
    ``self.auxiliary_models[i].get_openai_client()``; :func:`stop_auxiliary_apis` ends them."""
    from roles.explorer.api import ApiServer

    api_cfg = cfg.explorer.openai_api.model_copy(update={"port": 0})
    for aux_cfg, engines in zip(cfg.explorer.auxiliary_models, pool.auxiliary, strict=True):
        server = ApiServer(api_cfg, engines, aux_cfg.model_path or "auxiliary", cfg.run_id,
                           publish=None, record=False)
        await server.start()
        pool.aux_apis.append(server)


async def stop_auxiliary_apis(pool: RunnerPool) -> None:
    for server in pool.aux_apis:
        await server.stop()
    pool.aux_apis = []


def served_model_name(cfg: TrinityConfig) -> str:
    """The model name the OpenAI API serves (``GET /v1/models``): the hub id the config named
    (``Org/Name``) when the path is that id's snapshot in the hub cache."""

    path = cfg.explorer.rollout_model.model_path or cfg.model.model_path or "model"
    origin = hub_origin(path)
    return origin.split("@", 1)[0] if origin else path


class Explorer:
    """The explorer's parts every mode shares, over the role's context ``ctx``: the engines
    (``sync_engines``: the same, gated by the API when it serves), the runner pool, the API,
    what it did (``stats``), its metrics, and its heartbeat."""

    def __init__(self, ctx: RoleContext, engines: list[RolloutEngine], sync: SyncClient | None = None,
                 shutdown_grace: float = 5.0, auxiliary: list[list[RolloutEngine]] | None = None) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        self.nc, self.pub, self.state, self.stop = ctx.nc, ctx.pub, ctx.state, ctx.stop
        self.engines = engines
        self.sync = sync
        self.shutdown_grace = shutdown_grace
        self.stats = ExplorerStats()
        self.step = 0
        self.pool = make_pool(self.cfg, engines, auxiliary)
        if follows_explorer(self.cfg):  # the trainer takes its cores while it idles
            try:
                self.pool.work = ExplorerWork(self.cfg.run_id)
            except OSError as e:  # a hint for the trainer's threads: never a reason to stop
                log.warning("explorer_work_flag_unavailable", error=str(e), why="the trainer keeps its thread share")
        self.monitor: Monitor | None = None
        self.api: Any = None
        #: what the sync client loads weights into (gated when the API serves requests)
        self.sync_engines: list[Any] = list(engines)
        #: serve mode: the rewards of the episodes the API stored since the last step
        self.rewards: list[float] = []
        self.episode_done = asyncio.Event()
        #: this process among the run's explorers (lease, heartbeat, TaskDone notices)
        self.me = f"{self.cfg.explorer.name}-{socket.gethostname()}-{os.getpid()}"

    async def start_api(self) -> str:
        """Serve the OpenAI API over the engines; weight loads then wait for requests."""
        from roles.explorer.api import ApiServer, GatedEngine, WeightGate

        gate = WeightGate()
        publish = self._publish_episode if MODES[self.cfg.mode].serves_api else None
        self.api = ApiServer(self.cfg.explorer.openai_api, self.engines, served_model_name(self.cfg),
                             self.cfg.run_id, publish, gate)
        self.pool.api = self.api
        self.sync_engines = [GatedEngine(e, gate) for e in self.engines]
        url = await self.api.start()
        await start_auxiliary_apis(self.cfg, self.pool)
        return url

    async def stop_api(self) -> None:
        if self.api is not None:
            await self.api.stop()
            await stop_auxiliary_apis(self.pool)

    async def open(self) -> SyncClient:
        """Announce the API if any; the sync client (the one given, else the mode's)."""
        if self.api is not None:
            await self.state.put(API_KEY, ApiAddress(url=self.api.url, model=self.api.model_name))
        return self.sync or await make_sync(self.cfg, self.nc, self.state, self.pub)

    def beat(self, name: str | None = None) -> None:
        """Beat as ``name`` (from now on) with what this process is at: step, weights, failures."""
        said = dict(step=self.step, state="running", model_version=self.engines[0].model_version,
                    failed_tasks=len(self.stats.failed))
        if name is None:
            self.ctx.beat.says(**said)
        else:
            self.ctx.beat.as_(name, **said)

    async def beat_stopped(self) -> None:
        """The last beat: "stopped" under the run's explorer name, no "running" after it."""
        await self.ctx.beat.silence()
        with contextlib.suppress(Exception):
            await self.state.heartbeat(self.cfg.explorer.name, step=self.step, state="stopped",
                                       model_version=self.engines[0].model_version)

    async def report(self, m: Metric) -> None:
        """A metric to the monitor files and the metrics subject."""
        if self.monitor is None:
            self.monitor = Monitor(self.cfg, "explorer")
        self.monitor.log(m)
        await self.pub.publish_event(m)

    async def final_weights(self, sync: SyncClient) -> None:
        """The work is done: say so, take the trainer's final weights, evaluate them."""
        await self.state.put(FINISHED_KEY, ExplorerFinished(self.step, time.time()))
        log.info("waiting_for_final_weights", step=self.step)
        ok, _ = await until_stopped(sync.final(self.sync_engines), self.stop)
        if not ok:
            self.stats.interrupted = True
            return
        await self.state.set_model_version(self.cfg.explorer.name, self.engines[0].model_version)
        if self.cfg.buffer.explorer_input.eval_tasksets:
            ok, _ = await until_stopped(
                evaluate(self.cfg, self.pool, self.step, self.report, final=True), self.stop)
            self.stats.interrupted = not ok
            await self.pub.flush()

    async def _publish_episode(self, group: Any) -> bool:
        """Store a closed episode's group on the bus (the API's ``publish``); True when the
        bus already had it."""
        ack = await self.pub.publish_group(group)
        if not ack.duplicate:
            self.stats.episodes += 1
            self.stats.published += 1
            self.rewards.append(group.experiences[0].reward)
            self.episode_done.set()
        return bool(ack.duplicate)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.pool.work is not None:
            self.pool.work.close()
