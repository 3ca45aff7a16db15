"""One run, one owner: a second ``trinity run`` (or ``trinity sweep``) of a job that is running
is refused before it starts anything (exit 2, naming the holder).

Why: two starts of one job share its bus namespace, so the second trained every experience
again and, when the first ended, lost its server; and two job names that give one run id
(``run_id_of``) deleted each other's streams as stale. Two locks, each for what the other
cannot see:

- **the job's lock files** (:func:`lock_job`): ``<root>/<project>/.<name>.lock/<role>``, beside
  the job folder (``continue_from_checkpoint: false`` renames under them), held with ``flock``
  while the run lives, so a killed owner leaves no stale lock. They refuse a second start on
  this machine before the server starts. One per role: a ``train`` run and an ``explore`` run
  of one job share it by design.
- **the run id's lease** (:class:`RunLease`): ``run.owner.<role>`` in each stage's KV bucket, taken and
  renewed by compare-and-swap, as the explorer's lead is (``roles/explorer/lease.py``). It
  refuses a start on another machine of the same bus, and another job whose name gives the
  same run id. A lease whose holder was killed expires after :data:`LEASE_S`, or at once when
  the holder was a process of this host that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

import structlog

from bus import BusError
from roles.explorer.lease import process_gone
from schemas import keys
from schemas.config import TrinityConfig
from schemas.loader import ConfigError
from schemas.state import Owner

log = structlog.get_logger(__name__)

#: Seconds a run's lease lasts without renewal (its owner was killed, or cut off the bus).
LEASE_S = 30.0
#: Seconds between renewals.
RENEW_S = 5.0
#: Seconds :meth:`RunLease.release` tries before it leaves the lease to expire.
RELEASE_S = 5.0


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time(),
            "command": " ".join(["trinity", *sys.argv[1:]])[:500]}


def _describe(pid: Any, host: Any, since: Any = None, command: Any = "") -> str:
    when = f", since {time.strftime('%H:%M:%S', time.localtime(since))}" if isinstance(since, (int, float)) else ""
    return f"pid {pid} on host {host}{when}" + (f" ({command})" if command else "")


class JobLock:
    """A job's lock files, held open (see :func:`lock_job`)."""

    def __init__(self, job: Path, folder: Path, made: list[Path]) -> None:
        self.job, self.folder, self.made = job, folder, made
        self.files: list[IO[str]] = []

    def release(self) -> None:
        """Give the locks up. A start that never made its job folder (refused by a check, or by
        the bus's owner) leaves nothing behind: the lock files go, and the folders taking them
        made, if empty. Removed while held, so a process waiting on an old file sees it go
        (:func:`lock_job` checks that the file it locked is still the one at the path)."""
        for f in self.files:
            if not self.job.exists():
                Path(f.name).unlink(missing_ok=True)
            f.close()
        self.files = []
        if not self.job.exists():
            for d in [self.folder, *reversed(self.made)]:
                with contextlib.suppress(OSError):  # not empty: another start's, or the project's
                    d.rmdir()


def _lock_file(path: Path) -> IO[str] | dict[str, Any]:
    """``path`` opened and flocked; or, when another process holds it, what it says of that
    process."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            f = open(path, "a+")  # noqa: SIM115 - held open on purpose: the lock lives as long as it
        except FileNotFoundError:  # its folder was removed by a holder's release meanwhile
            continue
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            try:
                holder = json.loads(f.read() or "{}")
            except ValueError:
                holder = {}
            f.close()
            return holder
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                f.seek(0)
                f.truncate()
                f.write(json.dumps(_me()))
                f.flush()
                return f
        except FileNotFoundError:
            pass
        f.close()  # its holder released and removed it meanwhile: lock the file now there


def lock_job(job_dir: str | Path, roles: list[str]) -> JobLock:
    """Hold the job's lock on each of ``roles`` (files ``<project>/.<name>.lock/<role>``) for as
    long as this process lives (or until :meth:`JobLock.release`); ConfigError naming the holder
    when another process holds one. Per role: a ``mode: train`` run (buffer, trainer) and a
    ``mode: explore`` run (explorer) of one job go side by side, as the guide's modes mean."""
    job = Path(job_dir)
    folder = job.parent / f".{job.name}.lock"
    lock = JobLock(job, folder, [p for p in reversed(folder.parents) if not p.exists()])
    for role in sorted(set(roles)):
        got = _lock_file(folder / role)
        if isinstance(got, dict):
            lock.release()
            holder = _describe(got.get("pid", "?"), got.get("host", "?"), got.get("started_at"), got.get("command", ""))
            raise ConfigError([f"job {job} is already running: {holder} holds its {role} ({folder / role}); "
                               "stop it first, or give this run another name"])
        lock.files.append(got)
    return lock


class LeaseLost(RuntimeError):
    """Another process took this run's lease (this one was cut off the bus too long)."""


class RunLease:
    """This process's ``run.owner.<role>`` for each of ``roles`` on every stage's run id
    (``states``: the stages' RunStates, in the stages' order)."""

    def __init__(self, states: list[Any], stages: list[TrinityConfig], roles: list[str]) -> None:
        self.stages = stages
        self.slots = [(i, state, keys.run_owner(role)) for i, state in enumerate(states) for role in sorted(set(roles))]
        self.revisions = [0] * len(self.slots)
        self.command = _me()["command"]

    def _value(self, i: int, until: float | None = None) -> Owner:
        return Owner(os.getpid(), socket.gethostname(), os.path.abspath(self.stages[i].checkpoint_job_dir),
                     time.time() + LEASE_S if until is None else until, self.command)

    def _refusal(self, i: int, held: Owner) -> str | None:
        """Why ``held`` keeps this process from owning stage ``i``'s run id; None when it may."""
        cfg, mine = self.stages[i], self._value(i)
        who = _describe(held.pid, held.host, command=held.command)
        live = time.time() <= held.until and not process_gone(held)  # type: ignore[arg-type]
        if live and held.job_dir == mine.job_dir:
            return f"job {mine.job_dir} is already running: {who} owns run {cfg.run_id}; stop it first"
        if live:
            return (f"run id {cfg.run_id} is in use by job {held.job_dir} ({who}): name {cfg.project}/{cfg.name} "
                    f"gives the same run id; choose another project or name")
        if held.job_dir != mine.job_dir and held.host == mine.host and Path(held.job_dir).exists():
            return (f"run id {cfg.run_id} belongs to job {held.job_dir}: name {cfg.project}/{cfg.name} gives the "
                    f"same run id, and its bus state is that job's; choose another project or name")
        return None

    async def take(self) -> None:
        """Own every stage's run id (for this run's roles), or raise ConfigError naming who does."""
        for n, (i, state, key) in enumerate(self.slots):
            held, rev = await state.entry(key)
            why = self._refusal(i, held) if held is not None else None
            if why is None:
                self.revisions[n] = await state.swap(key, self._value(i), rev)
                if not self.revisions[n]:
                    why = f"run {self.stages[i].run_id}: another process took it at this very moment"
            if why is not None:
                await self.release()
                raise ConfigError([why])

    async def keep(self) -> None:
        """Renew until cancelled; LeaseLost when another process took a run id meanwhile."""
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                await self._renew()
            except BusError as e:  # the server away (trinity run restarts it): renew next time
                log.warning("run_lease_not_renewed", error=str(e))

    async def _renew(self) -> None:
        for n, (i, state, key) in enumerate(self.slots):
            rev = await state.swap(key, self._value(i), self.revisions[n])
            if not rev:  # a renewal sent twice lands here too: is it still ours?
                held, rev = await state.entry(key)
                if held is not None and (held.pid, held.host) != (os.getpid(), socket.gethostname()):
                    raise LeaseLost(f"run {self.stages[i].run_id}: {_describe(held.pid, held.host)} took it "
                                    "over while this process was cut off the bus")
                rev = await state.swap(key, self._value(i), rev)
            self.revisions[n] = rev or self.revisions[n]

    async def release(self) -> None:
        """Leave the lease expired (the record stays: it names the job the run id belongs to).

        Best effort for :data:`RELEASE_S`: with the server gone (killed with the run) each
        write would wait it out for minutes, and a lease left behind expires by itself
        (:data:`LEASE_S`, at once here when this process is gone)."""

        async def expire() -> None:
            for n, (i, state, key) in enumerate(self.slots):
                if self.revisions[n]:
                    with contextlib.suppress(Exception):
                        await state.swap(key, self._value(i, until=0.0), self.revisions[n])
                    self.revisions[n] = 0

        try:
            await asyncio.wait_for(expire(), RELEASE_S)
        except asyncio.TimeoutError:
            log.warning("run_lease_left_to_expire", seconds=RELEASE_S)
            self.revisions = [0] * len(self.slots)
