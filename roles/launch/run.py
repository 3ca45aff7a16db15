"""``trinity run --config FILE``: every role an experiment needs, as separate processes.

What it does, in order:

1. Load the config and check it before anything starts (bad keys, missing taskset, dataset or
   model files fail here, named).
2. ``continue_from_checkpoint: false`` with an existing job dir: the new run is named
   ``<name>_<timestamp>`` (nothing of the old run is touched).
3. Start an embedded ``nats-server`` when ``nats.url`` is local, nothing listens there and
   ``nats.embedded`` allows it (the same code as ``trinity server``). It is supervised like a
   role: if it dies it is started again on the same port and store directory (JetStream's
   file storage keeps every stream and consumer), and the roles reconnect by themselves.
4. Start the roles the stages' modes need (``python -m roles.cli <role>`` with the same
   config), stream their output with a role prefix and show a progress line.
5. A role that dies (a crash, a kill) is restarted, up to ``--max-restarts`` times: every
   role resumes (trainer from its checkpoint, explorer from its KV cursor, buffer from the
   durable consumer). When every role exits 0 the run is complete: print the evaluation summary
   (with the dead letters, if any) and exit 0. A role that keeps dying, or exits 2 (its config
   failed to load or a pre-start check failed: a restart cannot help), stops the run with its
   last output and exit code 1. A role that exits 3 found that the run cannot succeed
   (``roles/runtime/verdicts.py``: a step's worth of groups dead-lettered for one reason, a trainer
   short of its steps, a wait for weights with nothing trained): the run stops, prints its
   summary and, as its last line, the cause (``run.failed`` in KV), and exits 1.
   Exit codes of a role: 0 done, 2 config/pre-start, 3 the run cannot succeed, anything else
   (1: an error mid-run, logged with its traceback; a signal) is restarted.
   Ctrl-C / SIGTERM stops every role cleanly (SIGTERM, then a kill after a grace period).

Honcho runs the same role processes from the Procfile; this command adds the supervision.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import bus
from bus.server import default_store_dir, ensure_server
from roles.launch.checks import gpu_gib, preflight
from roles.launch.owner import JobLock, RunLease, lock_job
from roles.launch.runrecord import RunRecord, job_dir_of
from roles.launch.stages import roles_needed
from roles.runtime.config import SESSION_START_ENV, SUPERVISED_ENV, load
from roles.runtime.fit import describe_memory
from roles.runtime.monitor import read_metrics, summary
from roles.runtime.placement import child_env, describe, device_plan, trainer_ranks
from roles.runtime.verdicts import RUN_FAILED_EXIT
from roles.trainer.main import require_engine_for
from schemas import keys
from schemas.config import TrinityConfig
from schemas.loader import ConfigError, LoadedConfig

if TYPE_CHECKING:
    from bus.server import EmbeddedServer
    from roles.runtime.placement import DevicePlan

#: Seconds a role gets between SIGTERM and SIGKILL when the run stops.
STOP_GRACE = 30.0


@dataclass
class Child:
    role: str
    #: what follows ``python -m roles.cli`` (None: the role and the run's own arguments)
    argv: list[str] | None = None
    #: how its output and the supervisor's lines name it (None: the role)
    label: str | None = None
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20))
    done: bool = False
    pump: asyncio.Task | None = None  # copies its output to ours until the pipe ends


def stage_label(s: TrinityConfig) -> str:
    """A stage's own name (its experiment is ``<name>/<stage_name>``)."""
    return s.name.rsplit("/", 1)[-1]


def fresh_name(cfg: TrinityConfig) -> str | None:
    """``continue_from_checkpoint: false`` and the job dir exists: the new run's name."""
    if cfg.continue_from_checkpoint or not Path(cfg.checkpoint_job_dir).exists():
        return None
    return f"{cfg.name}_{time.strftime('%Y%m%d%H%M%S')}"


# -- progress and summary ---------------------------------------------------------------------


class Progress:
    """The latest numbers of the running stage, read from its ``monitor/metrics.jsonl``."""

    def __init__(self, stages: list[TrinityConfig]) -> None:
        self.stages = stages
        self.t0 = time.monotonic()
        self.done: set[int] = set()
        self.stage_t0: dict[int, tuple[float, int]] = {}  # when progress first saw a train step

    def current(self) -> tuple[int, TrinityConfig]:
        """The first stage that is not done; the last one when all are."""
        for i, s in enumerate(self.stages):
            if i not in self.done:
                return i, s
        return len(self.stages) - 1, self.stages[-1]

    async def refresh(self, nc: object) -> None:
        """Which stages are done: their ``run.done`` key in KV (what the roles go by)."""

        js = bus.jetstream(nc, self.stages[0].nats)
        for i, s in enumerate(self.stages):
            if i not in self.done:
                state = await bus.RunState.open(js, s.run_id, s.nats.replicas)
                if not await state.get(keys.run_done(s.mode)):
                    return
                self.done.add(i)

    def line(self) -> str:
        i, s = self.current()
        last: dict[str, dict] = {}
        for r in read_metrics(s.checkpoint_job_dir):
            last[r["kind"]] = r
        parts = [f"stage {i + 1}/{len(self.stages)} {stage_label(s)} ({s.mode})"]
        if "rollout" in last:
            ro = last["rollout"]
            parts.append(f"explore step {ro['step']}")
            v = ro["values"]
            if "reward_mean" in v:
                parts.append(f"reward {v['reward_mean']:.3f}")
            if v.get("turns_per_episode", 1) > 1 or v.get("tool_calls_per_episode"):  # agents
                parts.append(f"turns {v['turns_per_episode']:.1f} tools {v.get('tool_calls_per_episode', 0):.1f}")
            parts.append(f"weights v{int(v.get('model_version', 0))}")
        if "train" in last:
            step = last["train"]["step"]
            parts.append(f"train step {step}")
            total = s.trainer.total_steps or s.buffer.total_steps
            if total:
                parts[-1] += f"/{total}"
                if self.stage_t0.get(i) is None:
                    self.stage_t0[i] = (time.monotonic(), step)
                t0, s0 = self.stage_t0[i]
                if step > s0:
                    eta = (time.monotonic() - t0) / (step - s0) * (total - step)
                    parts.append(f"ETA {eta / 60:.1f} min")
        if "eval" in last:
            parts.append(f"eval acc {last['eval']['values'].get('accuracy', float('nan')):.3f}")
        parts.append(f"{time.monotonic() - self.t0:.0f}s")
        return " | ".join(parts)


# -- the supervisor ---------------------------------------------------------------------------


class Supervisor:
    def __init__(self, loaded: LoadedConfig, role_args: list[str], max_restarts: int,
                 plan: DevicePlan, record: RunRecord, server: EmbeddedServer | None = None) -> None:
        self.stages = loaded.stages or [loaded.config]
        self.plan = plan  # each role's GPUs (roles/runtime/placement.py)
        self.server = server
        self.server_restarts = 0
        self.cfg = loaded.config
        self.role_args = role_args
        self.max_restarts = max_restarts
        self.children: list[Child] = []
        self.tty = sys.stdout.isatty()
        self.progress = Progress(self.stages)
        self.status = ""
        self.stopping = False
        self.started = time.time()
        #: No job folder yet: a new experiment (bus state under its name is stale).
        self.fresh = not Path(self.cfg.checkpoint_job_dir).exists()
        self.record = record  # <job>/run.json: what a role did, for the studio and inspect
        #: why the run cannot succeed, when a role said so (exit RUN_FAILED_EXIT): the last line
        self.failure: str | None = None
        #: by stage run id: its dead-letter count and first reasons, read as the run ends
        self.dead: dict[str, tuple[int, list[str]]] = {}

    def say(self, line: str) -> None:
        if self.tty and self.status:
            sys.stdout.write("\r\x1b[K")
        sys.stdout.write(line + "\n")
        if self.tty and self.status:
            sys.stdout.write(self.status)
        sys.stdout.flush()

    async def start(self, child: Child) -> None:
        # unbuffered: lines arrive as they happen; no tqdm: \r progress bars garble the log;
        # CUDA_VISIBLE_DEVICES: the role's GPUs of the device plan; SUPERVISED_ENV: our pid, so
        # the role stops if we die, even by SIGKILL (roles.runtime.signals.stop_with_supervisor)
        env = dict(child_env(self.plan, child.role, os.environ), PYTHONUNBUFFERED="1", TQDM_DISABLE="1",
                   **{SUPERVISED_ENV: str(os.getpid()), SESSION_START_ENV: repr(self.started)})
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "roles.cli", *(child.argv or [child.role, *self.role_args]),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the roles in order
        )
        child.pump = asyncio.get_running_loop().create_task(self.pump(child, child.proc))
        self.record.role(child.label or child.role, "running", child.restarts)

    async def pump(self, child: Child, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            child.tail.append(line)
            self.say(f"{child.label or child.role:>12} | {line}")

    async def stop_all(self) -> None:
        """SIGTERM every role's process group (a role's own children, e.g. vLLM's engine
        processes, included), SIGKILL what is left after ``STOP_GRACE`` seconds. Every wait
        is bounded: stopping must never hang."""
        self.stopping = True
        live = [c.proc for c in self.children if c.proc and c.proc.returncode is None]
        for p in live:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for p in live:
            try:
                await asyncio.wait_for(p.wait(), max(deadline - time.monotonic(), 0.1))
            except asyncio.TimeoutError:
                _signal_group(p.pid, signal.SIGKILL)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(p.wait(), 5.0)
        for c in self.children:  # leftovers of roles that exited by themselves
            if c.proc is not None:
                _signal_group(c.proc.pid, signal.SIGKILL)
        # Read every pipe to its end: a pipe still open when the event loop closes prints
        # "Exception ignored in BaseSubprocessTransport.__del__" after a clean run.
        pumps = [c.pump for c in self.children if c.pump is not None and not c.pump.done()]
        if pumps:
            _, late = await asyncio.wait(pumps, timeout=5.0)
            for t in late:
                t.cancel()

    async def run(self, roles: list[str], children: list[Child] | None = None) -> int:
        """Start ``roles`` (or the given ``children``: a sweep's) and watch them."""
        interrupted = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupted.set)

        self.children = children or [Child(r) for r in roles]
        nc = await bus.connect(self.cfg.nats, name="trinity-run")
        js = bus.jetstream(nc, self.cfg.nats)
        lease = None
        try:
            lease = await self.own(js)  # before anything is deleted or started (roles/launch/owner.py)
            if self.fresh:
                for s in self.stages:
                    gone = await bus.delete_run(js, s.run_id)
                    if gone:
                        self.say(f"trinity run: {s.checkpoint_job_dir} does not exist: removed the "
                                 f"stale bus state of run {s.run_id} ({', '.join(gone)})")
                lease = await self.own(js)  # the lease went with the stale bucket
            for c in self.children:
                await self.start(c)
            rc = await self.watch(interrupted, nc, asyncio.get_running_loop().create_task(lease.keep()))
            if rc == 0 or self.failure:  # for the summary
                with contextlib.suppress(Exception):
                    self.dead = await asyncio.wait_for(self.dead_letters(js), 10.0)
            return rc
        finally:
            if lease is not None:
                await lease.release()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 5.0)

    async def dead_letters(self, js: object) -> dict[str, tuple[int, list[str]]]:
        """Every stage's dead-letter count and first reasons (``bus.dead_letters``)."""

        return {s.run_id: await bus.dead_letters(js, s.run_id) for s in self.stages}

    async def failure_cause(self, nc: object, child: Child) -> str:
        """Why the run failed, as the role that ended it said: its ``run.failed`` record of
        this session in a stage's KV bucket, else its last line naming it, else its exit."""

        async def recorded() -> str | None:
            js = bus.jetstream(nc, self.cfg.nats)
            for s in self.stages:
                rec = await (await bus.RunState.open(js, s.run_id, s.nats.replicas)).get(keys.RUN_FAILED)
                if rec is not None and rec.ts >= self.started:  # older: a previous session's
                    return f"{s.name}: {rec.cause}" if len(self.stages) > 1 else rec.cause
            return None

        with contextlib.suppress(Exception):  # a server that is gone: the role's own line
            cause = await asyncio.wait_for(recorded(), 10.0)
            if cause:
                return cause
        for line in reversed(child.tail):
            if "the run failed: " in line:
                return line.split("the run failed: ", 1)[1]
        return f"{child.label or child.role} exited with {RUN_FAILED_EXIT} (the run cannot succeed)"

    async def own(self, js: object) -> RunLease:
        """Take every stage's ``run.owner`` lease; ConfigError naming the owner if another has it."""

        states = [await bus.RunState.open(js, s.run_id, s.nats.replicas) for s in self.stages]
        lease = RunLease(states, self.stages, [c.role for c in self.children])
        await lease.take()
        return lease

    async def watch(self, interrupted: asyncio.Event, nc: object, lease: asyncio.Task) -> int:
        """Restart, fail or finish as the children exit; print progress meanwhile. ``lease``
        renews the run's ownership: if another process took it, this run stops."""
        try:
            return await self._watch(interrupted, nc, lease)
        finally:  # not cancel-and-await: a cancel that lands as a renewal's KV write ends is
            await bus.stop_tasks(lease)  # dropped on 3.11, and the run never ended (bus/retry.py)

    async def _watch(self, interrupted: asyncio.Event, nc: object, lease: asyncio.Task) -> int:
        last_line = 0.0
        while True:
            if interrupted.is_set():
                self.say("trinity run: stopping every role (Ctrl-C / SIGTERM)")
                await self.stop_all()
                return 130
            if lease.done():
                self.say(f"trinity run: this run is no longer its owner ({lease.exception()}): stopping every role")
                await self.stop_all()
                return 1
            if not self.keep_server():
                await self.stop_all()
                return 1
            for c in self.children:
                rc = c.proc.returncode if c.proc else None
                if rc is None or c.done:
                    continue
                who = c.label or c.role
                if rc == 0:
                    c.done = True
                    self.say(f"trinity run: {who} finished")
                    self.record.role(who, "finished", c.restarts, 0)
                    continue
                await asyncio.sleep(0.2)  # let the pump print the last lines
                if rc == RUN_FAILED_EXIT:  # the run cannot succeed (roles/runtime/verdicts.py): no restart
                    self.failure = await self.failure_cause(nc, c)
                    self.say(f"trinity run: {who} ended the run (exit {rc}: a restart cannot help); "
                             "stopping every role")
                    self.record.role(who, "failed", c.restarts, rc)
                    await self.stop_all()
                    return 1
                if rc == 2 or c.restarts >= self.max_restarts:  # 2: its config or a pre-start check
                    self.say(f"trinity run: {who} failed for good (exit {rc}); last output:")
                    for line in list(c.tail)[-10:]:
                        self.say(f"  {line}")
                    self.record.role(who, "failed", c.restarts, rc)
                    await self.stop_all()
                    return 1
                c.restarts += 1
                _signal_group(c.proc.pid, signal.SIGKILL)  # what the dead role left behind
                self.say(f"trinity run: {who} exited with {rc}; restart {c.restarts}/{self.max_restarts}")
                await self.start(c)
            if all(c.done for c in self.children):
                await self.stop_all()  # nothing should be left; make sure of it
                return 0
            if time.monotonic() - last_line > (2.0 if self.tty else 15.0):
                last_line = time.monotonic()
                try:
                    await self.progress.refresh(nc)
                    self.status = "progress | " + self.progress.line()
                except Exception:  # a torn file mid-write: next time
                    pass
                if self.tty:
                    sys.stdout.write("\r\x1b[K" + self.status)
                    sys.stdout.flush()
                elif self.status:
                    self.say(self.status)
            await asyncio.sleep(0.25)


    def keep_server(self) -> bool:
        """Start the embedded server again if it died (same port, same store: every stream,
        consumer and KV key survives). False once it died more than ``max_restarts`` times
        or cannot start: the run cannot go on without it. Synchronous on purpose: the server
        is started from the main thread, so it dies with ``trinity run``."""
        server = self.server
        if server is None or server.running or self.stopping:
            return True
        rc = server.proc.returncode if server.proc is not None else None
        if self.server_restarts >= self.max_restarts:
            self.say(f"trinity run: nats-server failed for good (exit {rc}): {server.log_tail(5)}")
            return False
        self.server_restarts += 1
        self.say(f"trinity run: nats-server exited with {rc}; restart "
                 f"{self.server_restarts}/{self.max_restarts}")
        server.stop()
        try:
            server.start()
        except Exception as e:  # BusError: port taken, store unreadable, ...
            self.say(f"trinity run: nats-server cannot start again: {e}")
            return False
        return True


def _signal_group(pid: int, sig: int) -> None:
    """Signal a role's process group (each role is started as a session leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def role_args(args: argparse.Namespace) -> list[str]:
    """The arguments every role process gets: the same config, overrides and dotenv."""
    out = []
    if args.config:
        out += ["--config", args.config]
    for o in args.overrides:
        out += ["--set", o]
    return out + ["--dotenv", args.dotenv]


def main(args: argparse.Namespace) -> int:
    """``trinity run``: see the module doc. Exit 0 done, 1 a role failed, 2 config, 130 stopped."""
    locks: list[JobLock] = []
    try:
        return _main(args, locks)
    finally:
        for lock in reversed(locks):  # a start refused before its job folder existed leaves nothing
            lock.release()


def _main(args: argparse.Namespace, locks: list[JobLock]) -> int:


    def lock(loaded: LoadedConfig) -> None:
        """One owner per job's role: held until the run ends (roles/launch/owner.py); the rename below
        happens under it, so two starts of one config cannot both pick one new name."""
        if not args.plan:  # --plan starts nothing
            stages = loaded.stages or [loaded.config]
            locks.append(lock_job(job_dir_of(stages), roles_needed(stages)))

    loaded = load(args)
    lock(loaded)
    new_name = fresh_name(loaded.config)
    renamed_from = None
    if new_name:
        renamed_from = loaded.config.checkpoint_job_dir
        print(f"trinity run: {renamed_from} exists and continue_from_checkpoint "
              f"is false: this run is named {new_name}")
        args.overrides = [*args.overrides, f"name={new_name}"]
        loaded = load(args)
        lock(loaded)
    stages = loaded.stages or [loaded.config]
    needed = roles_needed(stages)
    try:
        plan = device_plan(stages)
        if args.plan:
            for line in describe(plan, stages, needed) + describe_memory(plan, stages, gpu_gib()):
                print(line)
        # refuses a trainer that trinity run cannot start
        ranks = trainer_ranks(plan) if "trainer" in needed else 1
        for role in needed:  # a CUDA_VISIBLE_DEVICES too short for the plan
            child_env(plan, role, os.environ)
    except ValueError as e:
        raise ConfigError([str(e)]) from e
    if args.plan:  # a plan for GPU nodes may be drawn up anywhere; what this machine runs, below
        return 0
    if ranks > 1:  # on CPU, ``auto`` is the one-process PyTorch trainer
        # imported here only: torch and the trainer's modules in this supervisor made it slower
        # to take its lock (a second start raced the first) and to exit after SIGTERM

        try:
            require_engine_for(stages[0], ranks, f"cluster.gpu_per_node gives the trainer {ranks} GPUs")
        except ValueError as e:
            raise ConfigError([str(e)]) from e
    preflight(stages)
    cfg = loaded.config
    server = ensure_server(cfg.nats, cfg.nats.store_dir or default_store_dir(cfg.nats, cfg.checkpoint_root_dir))
    if server is not None:
        print(f"trinity run: embedded nats-server at {server.url} (store {server.store_dir})")
    sup = Supervisor(loaded, role_args(args), args.max_restarts, plan, RunRecord(stages, args.config, renamed_from),
                     server)
    rc = 1
    try:
        rc = asyncio.run(sup.run(needed))
    finally:
        sup.record.end(rc)
        if server is not None:
            server.stop()
    if sup.tty:
        sys.stdout.write("\n")
    if rc == 0:
        print(f"trinity run: done; checkpoints and monitor files under {cfg.checkpoint_job_dir}")
    if rc == 0 or sup.failure:
        for line in summary(stages, sup.dead):
            print(line)
    if sup.failure:  # the last line: what a sweep's log or a CI job shows
        print(f"trinity run: failed: {sup.failure}", flush=True)
    return rc
