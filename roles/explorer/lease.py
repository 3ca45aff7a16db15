"""Which explorer process leads a run: reads the taskset, cuts it into steps, syncs weights,
evaluates. Every explorer process works the task queue (:mod:`roles.explorer.queue`); one of
them also leads.

The lead is a lease in the run's KV (``explorer.leader``: name, pid, host, ``until``) that its
holder renews every :data:`RENEW_S`. Another explorer takes it when it is free, expired (its
holder was killed, or cut off from the bus, for :data:`LEASE_S`), or held by a process of this
host that no longer exists (a leader killed and restarted in place takes over at once).
Takeovers and renewals are compare-and-set on the key's revision, so two processes never both
hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from typing import Any

import structlog

from schemas import keys
from schemas.loader import ConfigError
from schemas.state import JoinSettings, Leader

log = structlog.get_logger(__name__)

LEADER_KEY = keys.EXPLORER_LEADER
#: What the leading explorer runs (:func:`join_fingerprint`): a joining one must match it.
JOIN_KEY = keys.EXPLORER_CONFIG
#: Seconds a lease lasts without renewal.
LEASE_S = 10.0
#: Seconds between renewals (and between a waiting explorer's tries).
RENEW_S = 2.0


def join_fingerprint(cfg: Any) -> dict[str, Any]:
    """The settings every explorer of one run must share: the same model, taskset, algorithm,
    group size and weight sync (a task run on another model would train the wrong policy)."""
    out = {
        "model.model_path": cfg.model.model_path,
        "explorer.rollout_model.engine_type": cfg.explorer.rollout_model.engine_type,
        "algorithm.algorithm_type": cfg.algorithm.algorithm_type,
        "algorithm.repeat_times": cfg.algorithm.repeat_times,
        "synchronizer.sync_method": cfg.synchronizer.sync_method,
    }
    for path, ts in cfg.buffer.explorer_input.training():
        out[f"{path}.path"] = ts.path
    return out


def check_joining(cfg: Any, theirs: JoinSettings | None) -> None:
    """Refuse to join a run whose leading explorer runs other settings, naming the first
    that differs: a pre-start check against the run (a :class:`ConfigError`, exit 2: a restart
    with the same config cannot help)."""
    if theirs is None:
        return
    for key, value in join_fingerprint(cfg).items():
        if key in theirs.settings and theirs.settings[key] != value:
            raise ConfigError([
                f"{key}: this explorer has {value!r}, the leading explorer of run {cfg.run_id} has "
                f"{theirs.settings[key]!r}; an explorer joins a run only with the run's own config"])


class LeaseLost(RuntimeError):
    """This process's lease was taken by another explorer (it was cut off too long)."""


def process_gone(holder: Leader) -> bool:
    """Is ``holder`` a process of this host that no longer runs?"""
    if holder.host != socket.gethostname():
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OSError):
        return False
    return False


class Lease:
    """This process's side of ``explorer.leader``."""

    def __init__(self, state: Any, name: str) -> None:
        self.state, self.name = state, name
        self.revision = 0

    def _value(self, until: float | None = None) -> Leader:
        return Leader(self.name, os.getpid(), socket.gethostname(), time.time() + LEASE_S if until is None else until)

    async def try_take(self) -> bool:
        value, rev = await self.state.entry(LEADER_KEY)
        if value is not None and time.time() <= value.until and not process_gone(value):
            return False
        self.revision = await self.state.swap(LEADER_KEY, self._value(), rev)
        if self.revision:
            log.info("explorer_leads", name=self.name, previous=value.name if value is not None else None)
        return bool(self.revision)

    async def renewed(self) -> bool:
        """Does someone renew the lead over the next renewal period (a live leader)? A lease
        left by a killed leader is held until it expires, but nobody renews it."""
        _, before = await self.state.entry(LEADER_KEY)
        await asyncio.sleep(RENEW_S * 1.5)
        _, after = await self.state.entry(LEADER_KEY)
        return after != before

    async def acquire(self) -> None:
        """Return once this process holds the lead (callers bound it with their stop event)."""
        while not await self.try_take():
            await asyncio.sleep(RENEW_S)

    async def keep(self) -> None:
        """Renew the lease until cancelled; raises LeaseLost if another process took it. A
        lease that expired while the bus was away is still this process's if nobody else
        took it (the compare-and-set says so), and so is one whose value was deleted or
        overwritten with something that is no lease."""
        while True:
            await asyncio.sleep(RENEW_S)
            rev = await self.state.swap(LEADER_KEY, self._value(), self.revision)
            if not rev:  # a renewal whose reply was lost and was sent again lands here too
                value, rev = await self.state.entry(LEADER_KEY)
                if value is None:  # deleted, or malformed (logged): nobody holds it, take it back
                    rev = await self.state.swap(LEADER_KEY, self._value(), rev)
                elif value.name != self.name:
                    rev = 0
                if not rev:
                    raise LeaseLost(f"explorer {self.name}: another explorer took the lead of this run "
                                    f"({value.name if value is not None else 'a process that took it back'} holds it)")
            self.revision = rev

    async def release(self) -> None:
        """Give the lead up at once (a clean exit: the next explorer need not wait it out)."""
        if self.revision:
            with contextlib.suppress(Exception):
                await self.state.swap(LEADER_KEY, self._value(until=0.0), self.revision)
            self.revision = 0
