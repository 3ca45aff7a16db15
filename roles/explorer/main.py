"""The explorer process: rollout engines, the runner pool and the OpenAI API, under one of
three mode runners.

:func:`run_explorer` is the role's ``run(ctx)``: it starts the engines, builds the
:class:`~roles.explorer.core.Explorer` every mode shares (engines, runner pool, the API if
any, metrics, the weight sync client, the heartbeat) and hands it to its mode's runner:

- ``explore`` (modes both/explore/colocate, :mod:`roles.explorer.explore`): tasks in,
  experience groups out, one step at a time, any number of explorer processes sharing a run;
- ``bench`` (:mod:`roles.explorer.bench`): evaluate the model and every checkpoint;
- ``serve`` (:mod:`roles.explorer.serve`): online RL, agents outside trinity drive the API.

The explorer itself decides nothing about weights: its sync client does
(``roles/weightsync/client.py``). With ``explorer.rollout_model.enable_openai_api`` (always in
``mode: serve``) the explorer also serves an OpenAI-compatible API over its engines
(``roles/explorer/api``), and weight loads wait for the requests in flight
(:class:`roles.explorer.api.WeightGate`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import structlog

from roles.explorer.bench import bench
from roles.explorer.core import Explorer, ExplorerStats
from roles.explorer.engines import RolloutEngine, create_auxiliary, create_engines
from roles.explorer.explore import explore
from roles.explorer.serve import serve
from roles.runtime.placement import device_plan
from roles.runtime.role import RoleContext
from schemas.modes import MODES
from storage.lora import adapter_sync

log = structlog.get_logger(__name__)

#: Each mode's runner (every other mode explores).
RUNNERS: dict[str, Callable[[Explorer], Awaitable[ExplorerStats]]] = {"bench": bench, "serve": serve}


async def run_explorer(ctx: RoleContext, engines: list[RolloutEngine] | None = None) -> bool:
    """Start engines, explore (or bench, or serve) until done or ``ctx.stop`` (set by the
    stage walker on SIGTERM), clean up. True when the taskset (or the bench) was finished.
    ``engines``: this run's views of a sweep's shared engines (``engines/shared.py``)
    instead of engines of its own."""
    cfg = ctx.cfg
    # each engine on its own GPUs of the device plan: positions in this process's devices
    plan = device_plan([cfg])
    gpus = plan.engine_devices(plan.of("rollout engine")) if plan.gpu_per_node else None
    aux_gpus = [plan.engine_devices(plan.of(f"auxiliary {i} engine"))
                for i in range(len(cfg.explorer.auxiliary_models))] if plan.gpu_per_node else None
    if engines is None:
        engines = await create_engines(cfg.explorer.rollout_model, cfg.model.external_model, adapter_sync(cfg), gpus,
                                       colocated=cfg.mode == "colocate")
    log.info("rollout_engines", engine_type=cfg.explorer.rollout_model.engine_type, engines=len(engines))
    auxiliary: list[list[RolloutEngine]] = []
    try:
        auxiliary = await create_auxiliary(cfg.explorer.auxiliary_models, cfg.model.external_model, aux_gpus)
        ex = Explorer(ctx, engines, auxiliary=auxiliary)
        if MODES[cfg.mode].serves_api or cfg.explorer.rollout_model.enable_openai_api:
            await ex.start_api()
        try:
            stats = await RUNNERS.get(cfg.mode, explore)(ex)
        finally:
            await ex.stop_api()
        log.info("explorer_done", steps=stats.steps, published=stats.published, failed=len(stats.failed),
                 interrupted=stats.interrupted)
        return not stats.interrupted
    finally:
        for e in engines + [a for engs in auxiliary for a in engs]:
            with contextlib.suppress(Exception):
                await e.close()
