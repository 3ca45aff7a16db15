"""The explorer's sync clients when no synchronizer runs: :class:`NoSync` (``bench`` mode,
``trinity debug``, tests of the explorer alone) and :class:`CheckpointWatcher`.

``mode: explore`` under ``sync_method: checkpoint`` watches a trainer's checkpoints on disk.

Why: Trinity-RFT's decoupled set-up runs a ``train`` run and an ``explore`` run on one job
(same ``checkpoint_root_dir``, ``project`` and ``name``). No synchronizer referees between
them: the trainer writes its weights as Hugging Face folders (``global_step_N/actor/
huggingface``) and the explorer loads the newest one every ``sync_interval`` explorer steps,
never waiting for one. The explorer is as stale as the trainer is slow; that is the deal of
the decoupled mode. Before a task another explorer process of the run needs newer weights
for, and before the final evaluation, it looks again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

from storage import checkpoints as ckpt

log = structlog.get_logger(__name__)


def newest_weights(job: str | Path) -> tuple[int, Path] | None:
    """``(step, folder)`` of the job's newest checkpoint whose Hugging Face weights are complete
    (a full checkpoint or a weights-only one); None when there is none yet."""
    for step in reversed(ckpt.list_steps(job)):
        folder = ckpt.hf_dir(job, step)
        if ckpt.hf_weights_complete(folder):
            return step, folder
    return None


class NoSync:
    """No synchronizer: never waits, never loads weights."""

    async def before_step(self, step: int, engines: list[Any]) -> None:
        return None

    async def after_step(self, step: int) -> None:
        return None

    async def final(self, engines: list[Any]) -> None:
        return None

    async def catch_up(self, engines: list[Any], floor: int) -> int:
        return floor

    def assist(self, name: str) -> None:
        return None

    async def take_lead(self) -> None:
        return None

    async def leave(self) -> None:
        return None


class CheckpointWatcher(NoSync):
    """The explorer's sync client in ``explore`` mode (see the module doc): the newest
    checkpoint at every ``sync_interval``-th step, before a task that needs newer weights,
    and before the final evaluation; nothing else."""

    def __init__(self, cfg: Any) -> None:
        self.job = cfg.checkpoint_job_dir
        self.interval = cfg.synchronizer.explorer_sync_interval or cfg.synchronizer.sync_interval

    async def load_newest(self, engines: list[Any]) -> int:
        """Load the newest checkpoint newer than the engines' weights; the version they hold."""
        held = min(e.model_version for e in engines)
        found = await asyncio.to_thread(newest_weights, self.job)
        if found is None or found[0] <= held:
            return held
        step, folder = found
        await asyncio.gather(*(e.load_checkpoint(str(folder), step) for e in engines))
        log.info("checkpoint_loaded", step=step, path=str(folder))
        return step

    async def before_step(self, step: int, engines: list[Any]) -> None:
        if step % self.interval == 0:
            await self.load_newest(engines)

    async def final(self, engines: list[Any]) -> None:
        await self.load_newest(engines)

    async def catch_up(self, engines: list[Any], floor: int) -> int:
        return await self.load_newest(engines)
