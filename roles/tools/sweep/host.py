"""``trinity sweep-host --role trainer|explorer --sweep FILE``: one process, every run's role.

The trainer host trains every run's adapter on one base model (``roles/trainer/shared.py``);
the explorer host serves every run from one rollout engine, each through its adapter
(``roles/explorer/engines/shared.py``). Inside, each run walks its stage exactly as a role
process of its own would (``roles.launch.stages.run_stages``, with its own bus connections, KV
bucket, checkpoints and metrics), as one asyncio task. A run that fails is logged with its
traceback and the others go on; the process then exits 1 once the others are done, and the
sweep restarts it: the finished runs see their ``run.done`` and leave at once, the failed one
resumes from its checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from pathlib import Path
from typing import Any

import structlog

from roles.launch.stages import run_stages
from roles.runtime.cpu_tuning import tune_process
from roles.runtime.logs import setup_logging
from roles.runtime.placement import device_plan, take_devices
from roles.runtime.signals import stop_on_signals
from roles.runtime.verdicts import RUN_FAILED_EXIT, RunFailed
from roles.tools.sweep.plan import SweepRun
from schemas.config import TrinityConfig
from schemas.loader import ConfigError

log = structlog.get_logger(__name__)


async def host(role: str, runs: list[SweepRun], cfgs: dict[str, TrinityConfig]) -> int:
    """Every run's ``role`` in this process; 0 when every one ended well (or on SIGTERM)."""

    terminate = asyncio.Event()
    stop_on_signals(terminate)
    runners, engines = await _runners(role, runs, cfgs)
    try:
        codes = await asyncio.gather(*(run_one(role, cfgs[r.name], runners[r.name], terminate) for r in runs))
    finally:
        for e in engines:
            with contextlib.suppress(Exception):
                await e.close()
    failed = [r.name for r, c in zip(runs, codes, strict=True) if c]
    if failed:
        log.error("runs_failed", runs=failed)
    if failed and all(c == RUN_FAILED_EXIT for c in codes if c):
        return RUN_FAILED_EXIT  # the sweep stops and says why; a restart would fail the same way
    return 1 if failed else 0


async def run_one(role: str, cfg: TrinityConfig, runner: Any, terminate: asyncio.Event) -> int:
    """One run's ``role`` in this process, as its own role process would walk it; 1 when it
    failed (logged with its traceback: the other runs go on), else its exit code."""

    structlog.contextvars.bind_contextvars(run=cfg.name)  # this task's log lines name the run
    try:
        return await run_stages(role, [cfg], runner, terminate)
    except RunFailed as e:  # recorded in the run's bucket (run.failed); the others go on
        log.error("run_cannot_succeed", run=cfg.name, cause=e.cause)
        return RUN_FAILED_EXIT
    except Exception:  # noqa: BLE001 - one run's failure must not end the others
        log.exception("run_failed", run=cfg.name, why="the other runs go on; the sweep restarts this process")
        return 1


async def _runners(role: str, runs: list[SweepRun], cfgs: dict[str, TrinityConfig]) -> tuple[dict[str, Any], list[Any]]:
    """Each run's role entry point, bound to what the runs share; and the shared engines."""
    if role == "trainer":
        from roles.trainer.main import run_trainer
        from roles.trainer.shared import SharedBase

        base = SharedBase([cfgs[r.name].run_id for r in runs])
        return {r.name: functools.partial(run_trainer, shared=base) for r in runs}, []
    from roles.explorer.engines.shared import create_shared
    from roles.explorer.main import run_explorer

    first = cfgs[runs[0].name]
    plan = device_plan([first])
    gpus = plan.engine_devices(plan.of("rollout engine")) if plan.gpu_per_node else None
    slots = {r.slot: cfgs[r.name].model.lora_configs[0] for r in runs}
    engines, views = await create_shared(first.explorer.rollout_model, slots, gpus)
    return {r.name: functools.partial(run_explorer, engines=views[r.slot]) for r in runs}, engines


def main(role: str, sweep_file: str) -> int:
    """The process: load every run (exit 2 naming what is wrong), then :func:`host`. A bus
    that cannot be reached ends it as it ends a role (``roles.cli``: 1 to retry, 2 not)."""
    from roles.launch.checks import preflight
    from roles.tools.sweep.launch import load_runs, read_sweep

    config, dotenv, runs = read_sweep(sweep_file)
    cfgs = {n: lc.config for n, lc in load_runs(config, dotenv, runs).items()}
    for c in cfgs.values():
        preflight([c], role)
    if role == "trainer":  # before any model loads: exit 2, not a restart that fails again
        from roles.trainer.main import not_shareable

        problems = [f"run {n}: {why}" for n, c in cfgs.items() if (why := not_shareable(c))]
        if problems:
            raise ConfigError(problems)
    first = cfgs[runs[0].name]
    try:
        take_devices(role, device_plan([first]))
    except ValueError as e:
        raise ConfigError([str(e)]) from e
    setup_logging(role, first.log.level, os.path.join(Path(sweep_file).parent, "log"))
    tune_process(first.cluster.cpu_tuning, first.cluster.gpu_per_node)
    try:
        return asyncio.run(host(role, runs, cfgs))
    except ConfigError:
        raise  # exit 2 (roles.cli): restarting cannot help
    except Exception:  # noqa: BLE001 - mid-run: exit 1 with the traceback; the sweep restarts it
        log.exception("sweep_failed_mid_run", role=role, why="exit 1: the sweep restarts it")
        return 1
