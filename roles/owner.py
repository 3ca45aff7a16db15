"""One run, one owner: a second ``trinity run`` (or ``trinity sweep``) of a job that is running
is refused before it starts anything (exit 2, naming the holder).

Why: two starts of one job share its bus namespace, so the second trained every experience
again and, when the first ended, lost its server; and two job names that give one run id
(``run_id_of``) deleted each other's streams as stale. Two locks, each for what the other
cannot see:

- **the job's lock file** (:func:`lock_job`): ``<root>/<project>/.<name>.lock``, beside the job
  folder (``continue_from_checkpoint: false`` renames under it), held with ``flock`` for the
  life of the process, so a killed owner leaves no stale lock. It refuses a second start on
  this machine before the server starts.
- **the run id's lease** (:class:`RunLease`): ``run.owner`` in each stage's KV bucket, taken and
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


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time(),
            "command": " ".join(["trinity", *sys.argv[1:]])[:500]}


def _describe(pid: Any, host: Any, since: Any = None, command: Any = "") -> str:
    when = f", since {time.strftime('%H:%M:%S', time.localtime(since))}" if isinstance(since, (int, float)) else ""
    return f"pid {pid} on host {host}{when}" + (f" ({command})" if command else "")


class JobLock:
    """A job's lock file, held open (see :func:`lock_job`)."""

    def __init__(self, job: Path, path: Path, file: IO[str], made: list[Path]) -> None:
        self.job, self.path, self.file, self.made = job, path, file, made

    def release(self) -> None:
        """Give the lock up. A start that never made its job folder (refused by a check, or by
        the bus's owner) leaves nothing behind: the lock file goes, and the folders taking it
        made, if empty. Removed while held, so a process waiting on the old file sees it go
        (:func:`lock_job` checks that the file it locked is still the one at the path)."""
        if not self.job.exists():
            self.path.unlink(missing_ok=True)
            for d in reversed(self.made):
                with contextlib.suppress(OSError):
                    d.rmdir()
        self.file.close()


def lock_job(job_dir: str | Path) -> JobLock:
    """Hold ``job_dir``'s lock file for as long as this process lives (or until
    :meth:`JobLock.release`); ConfigError naming the holder when another process holds it."""
    job = Path(job_dir)
    path = job.parent / f".{job.name}.lock"
    made = [p for p in reversed(path.parents) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        f = open(path, "a+")  # noqa: SIM115 - held open on purpose: the lock lives as long as it
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            try:
                h = json.loads(f.read() or "{}")
            except ValueError:
                h = {}
            f.close()
            holder = _describe(h.get("pid", "?"), h.get("host", "?"), h.get("started_at"), h.get("command", ""))
            raise ConfigError([f"job {job} is already running: {holder} holds {path}; "
                               "stop it first, or give this run another name"]) from None
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()  # its holder released and removed it meanwhile: lock the file now there
    f.seek(0)
    f.truncate()
    f.write(json.dumps(_me()))
    f.flush()
    return JobLock(job, path, f, made)


class LeaseLost(RuntimeError):
    """Another process took this run's lease (this one was cut off the bus too long)."""


class RunLease:
    """This process's ``run.owner`` on every stage's run id (``states``: the stages' RunStates,
    ``job_dirs``: their job folders, in the same order)."""

    def __init__(self, states: list[Any], stages: list[TrinityConfig]) -> None:
        self.states = states
        self.stages = stages
        self.revisions = [0] * len(states)
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
        """Own every stage's run id, or raise ConfigError naming who does."""
        for i, state in enumerate(self.states):
            held, rev = await state.entry(keys.RUN_OWNER)
            why = self._refusal(i, held) if held is not None else None
            if why is None:
                self.revisions[i] = await state.swap(keys.RUN_OWNER, self._value(i), rev)
                if not self.revisions[i]:
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
        for i, state in enumerate(self.states):
            rev = await state.swap(keys.RUN_OWNER, self._value(i), self.revisions[i])
            if not rev:  # a renewal sent twice lands here too: is it still ours?
                held, rev = await state.entry(keys.RUN_OWNER)
                if held is not None and (held.pid, held.host) != (os.getpid(), socket.gethostname()):
                    raise LeaseLost(f"run {self.stages[i].run_id}: {_describe(held.pid, held.host)} took it "
                                    "over while this process was cut off the bus")
                rev = await state.swap(keys.RUN_OWNER, self._value(i), rev)
            self.revisions[i] = rev or self.revisions[i]

    async def release(self) -> None:
        """Leave the lease expired (the record stays: it names the job the run id belongs to)."""
        for i, state in enumerate(self.states):
            if self.revisions[i]:
                with contextlib.suppress(Exception):
                    await state.swap(keys.RUN_OWNER, self._value(i, until=0.0), self.revisions[i])
                self.revisions[i] = 0
