"""``trinity sweep --config FILE --set KEY=V1,V2,...``: several LoRA runs on one base model.

Each combination of the swept values is an ordinary run (``<name>-<choice>``): its own job
folder, bus namespace, buffer and synchronizer, so it can be inspected, converted or
continued alone (``trinity run`` with the same config and ``--set`` values). What the runs
share is the base model: one trainer process trains every run's adapter
(``roles/trainer/shared.py``) and one explorer process serves every run from one rollout
engine (``roles/explorer/engines/shared.py``); both are ``trinity sweep-host`` processes. The
supervision is ``trinity run``'s: a process that dies is restarted and every run resumes from
its own checkpoint, KV cursor and durable consumer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from bus.server import default_store_dir, ensure_server
from roles.launch.checks import preflight
from roles.launch.owner import JobLock, lock_job
from roles.launch.run import Child, Progress, Supervisor
from roles.launch.runrecord import RunRecord
from roles.runtime.config import load
from roles.runtime.monitor import summary
from roles.runtime.placement import device_plan
from roles.tools.sweep.plan import SweepRun, check_shared, expand, split_sets
from schemas.config import TrinityConfig
from schemas.derive import DERIVED
from schemas.loader import ConfigError, LoadedConfig

SWEEP_FILE = "sweep.json"
#: What every run of a sweep runs: each its buffer and synchronizer, the shared trainer and explorer.
ROLES = ["buffer", "explorer", "synchronizer", "trainer"]
#: Each run's own processes (its buffer and synchronizer) and what one costs in memory
#: (measured: 200 swept values started 402 processes, ~100 GB): what bounds ``--max-runs``.
PROCESSES_PER_RUN, PROCESS_MB = 2, 250


def default_max_runs() -> int:
    """The most runs whose own processes fit in half of this machine's memory (at least 2)."""
    total_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    return max(2, total_mb // 2 // (PROCESSES_PER_RUN * PROCESS_MB))


def sweep_dir(cfg: TrinityConfig) -> Path:
    """``<checkpoint_root_dir>/<project>/<name>-sweep``: the sweep's own files (the list of
    runs, the shared processes' logs); each run's job folder is beside it."""
    return Path(cfg.checkpoint_root_dir) / cfg.project / f"{cfg.name}-sweep"


def write_sweep(path: Path, config: str | None, dotenv: str, runs: list[SweepRun]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": config and os.path.abspath(config), "dotenv": dotenv,
                                "runs": [vars(r) for r in runs]}, indent=1))


def read_sweep(path: str | Path) -> tuple[str | None, str, list[SweepRun]]:
    """(config file, dotenv file, runs) of a sweep file."""
    try:
        data = json.loads(Path(path).read_text())
        return data["config"], data["dotenv"], [SweepRun(**r) for r in data["runs"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError([f"{path}: not a sweep file ({e})"]) from e


def load_runs(config: str | None, dotenv: str, runs: list[SweepRun]) -> dict[str, LoadedConfig]:
    """Every run's config, loaded as ``trinity run`` would load it; then the checks that
    they can share (``ConfigError`` naming the run and field)."""

    loaded, problems = {}, []
    for r in runs:
        try:
            lc = load(argparse.Namespace(config=config, overrides=r.overrides, dotenv=dotenv), quiet=True)
            if lc.sources.get("synchronizer.sync_method") == DERIVED and lc.config.synchronizer.sync_method == "memory":
                # the shared engine takes each run's adapter by broadcast: not the CPU default
                r.overrides.append("synchronizer.sync_method=nccl")
                lc = load(argparse.Namespace(config=config, overrides=r.overrides, dotenv=dotenv), quiet=True)
            loaded[r.name] = lc
        except ConfigError as e:
            problems += [f"run {r.name}: {p}" for p in e.problems]
    if problems:
        raise ConfigError(problems)
    problems = check_shared({n: lc.config for n, lc in loaded.items()})
    if problems:
        raise ConfigError(problems)
    return loaded


class SweepRecord:
    """Each run's ``run.json`` (the studio and ``trinity inspect`` find each run as itself):
    a run's own buffer and synchronizer, and the shared processes, in every run's record."""

    def __init__(self, loaded: dict[str, LoadedConfig], config: str | None) -> None:
        self.records = {n: RunRecord([lc.config], config, None) for n, lc in loaded.items()}
        for rec in self.records.values():
            rec.data["sweep"] = sorted(self.records)

    def role(self, label: str, state: str, restarts: int = 0, exit_code: int | None = None) -> None:
        run, _, role = label.rpartition("/")
        for name, rec in self.records.items():
            if not run or run == name:
                rec.role(role if run else f"{role} (shared)", state, restarts, exit_code)

    def end(self, exit_code: int) -> None:
        for rec in self.records.values():
            rec.end(exit_code)


class SweepProgress:
    """Every run's latest step, on one line."""

    def __init__(self, cfgs: list[TrinityConfig]) -> None:
        self.runs = [Progress([c]) for c in cfgs]

    async def refresh(self, nc: object) -> None:
        for p in self.runs:
            await p.refresh(nc)

    def line(self) -> str:
        return " || ".join(f"{p.stages[0].name}: {p.line().split(' | ', 1)[1]}" for p in self.runs)


def children(runs: list[SweepRun], config: str | None, dotenv: str, sweep_file: Path) -> list[Child]:
    """Each run's buffer and synchronizer; the shared trainer and explorer."""
    out = []
    for r in runs:
        args = (["--config", config] if config else []) + [a for o in r.overrides for a in ("--set", o)]
        out += [Child(role, [role, *args, "--dotenv", dotenv], f"{r.name}/{role}") for role in ("buffer", "synchronizer")]
    host = ["sweep-host", "--sweep", str(sweep_file)]
    out += [Child(role, [*host, "--role", role], f"{role}*") for role in ("trainer", "explorer")]
    return out


def name_runs(args: argparse.Namespace, locks: list[JobLock]) -> tuple[TrinityConfig, list[SweepRun], Path]:
    """The sweep's base config (every run's fixed values), its runs and its folder; ``locks``
    gets the locks it takes (roles/launch/owner.py: on the sweep's folder, and on every run's). As ``trinity run``
    does, ``continue_from_checkpoint: false`` with a folder of the sweep or of one of its runs
    on disk starts a new sweep, ``<name>_<timestamp>``, named under the first lock."""

    try:  # the values are checked before anything loads
        n = len(expand("sweep", args.overrides))
    except ValueError as e:
        raise ConfigError([str(e)]) from e
    most = default_max_runs() if args.max_runs is None else args.max_runs
    if most < 2:
        raise ConfigError([f"--max-runs {most}: a sweep is at least 2 runs"])
    if n > most:
        raise ConfigError([f"--set: {n} runs; this sweep may start at most {most} (--max-runs: each run "
                           f"is {PROCESSES_PER_RUN} processes of ~{PROCESS_MB} MB beside the shared ones)"])
    fixed, _ = split_sets(args.overrides)
    base = load(argparse.Namespace(config=args.config, overrides=fixed, dotenv=args.dotenv)).config
    locks.append(lock_job(sweep_dir(base), ROLES))
    runs = expand(base.name, args.overrides)
    used = [sweep_dir(base)] + [Path(base.checkpoint_root_dir) / base.project / r.name for r in runs]
    if not base.continue_from_checkpoint and any(p.exists() for p in used):
        stamp = time.strftime("%Y%m%d%H%M%S")
        print(f"trinity sweep: {next(p for p in used if p.exists())} exists and continue_from_checkpoint is "
              f"false: this sweep is {base.name}_{stamp}")
        base.name = f"{base.name}_{stamp}"
        runs = expand(base.name, args.overrides)
        locks.append(lock_job(sweep_dir(base), ROLES))
    locks += [lock_job(Path(base.checkpoint_root_dir) / base.project / r.name, ROLES) for r in runs]
    return base, runs, sweep_dir(base)


def main(args: argparse.Namespace) -> int:
    """``trinity sweep``: exit 0 when every run is done, 1 a process failed for good, 2 config."""
    locks: list[JobLock] = []
    try:
        return _main(args, locks)
    finally:
        for lock in reversed(locks):  # a sweep refused before its folders existed leaves nothing
            lock.release()


def _main(args: argparse.Namespace, locks: list[JobLock]) -> int:
    base, runs, folder = name_runs(args, locks)
    loaded = load_runs(args.config, args.dotenv, runs)
    cfgs = [lc.config for lc in loaded.values()]
    # nothing of these runs on disk: bus state under their names is stale (as trinity run)
    fresh = not folder.exists() and not any(Path(c.checkpoint_job_dir).exists() for c in cfgs)
    preflight(cfgs)
    try:
        plan = device_plan(cfgs[:1])
    except ValueError as e:
        raise ConfigError([str(e)]) from e
    write_sweep(folder / SWEEP_FILE, args.config, args.dotenv, runs)
    resume = [] if base.continue_from_checkpoint else ["continue_from_checkpoint=true"]
    for r in runs:
        sets = " ".join(f"--set {o}" for o in [*r.overrides, *resume])
        print(f"trinity sweep: run {r.name} (continue it alone: trinity run --config {args.config or '$TRINITY_CONFIG'} {sets})")
    first = cfgs[0]
    server = ensure_server(first.nats, first.nats.store_dir or default_store_dir(first.nats, first.checkpoint_root_dir))
    if server is not None:
        print(f"trinity sweep: embedded nats-server at {server.url} (store {server.store_dir})")
    record = SweepRecord(loaded, args.config)
    sup = Supervisor(next(iter(loaded.values())), [], args.max_restarts, plan, record, server)  # type: ignore[arg-type]
    sup.stages, sup.fresh, sup.progress = cfgs, fresh, SweepProgress(cfgs)  # type: ignore[assignment]
    rc = 1
    try:
        rc = asyncio.run(sup.run([], children(runs, args.config, args.dotenv, folder / SWEEP_FILE)))
    finally:
        record.end(rc)
        if server is not None:
            server.stop()
    if sup.tty:
        sys.stdout.write("\n")
    if rc == 0:
        print(f"trinity sweep: done; {len(runs)} runs under {Path(first.checkpoint_job_dir).parent}")
        print_table(cfgs)
    elif sup.failure:
        print(f"trinity sweep: failed: {sup.failure}", flush=True)
    return rc


def print_table(cfgs: list[TrinityConfig]) -> None:
    """Each run's eval accuracy at its start and end, run after run."""

    for c in cfgs:
        print(f"run {c.name}:")
        for line in summary([c])[1:]:
            print(line)
