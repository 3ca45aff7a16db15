"""One trainer process for several LoRA runs (a sweep): the base model once, turns in order.

Why: the runs of a LoRA sweep train different adapters on the same frozen base. Each run's
trainer here is an ordinary :class:`roles.trainer.main.Trainer` (its own adapter, optimizer,
scheduler, batches, checkpoints and algorithm settings) whose model is built on a copy of the
base that shares its parameter tensors (:func:`storage.lora.share_base`): 8 runs hold one base.
Steps take turns (:attr:`SharedBase.turn`, a FIFO semaphore): a run that just stepped queues
behind every run that is waiting, so none starves. How many steps run at once is
:func:`concurrent_steps`: one on a GPU (a step fills it), on a CPU as many as the cores hold
steps of this process's torch threads (measured on SmolLM2, docs/sweep.md: one step at a time
left a core idle whenever the runs' rollouts were done, and the sweep took longer than the runs
apart; each step running at once adds its activations to the peak memory).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import torch

from schemas.config import TrinityConfig


class SharedBase:
    """The base model the runs of a sweep share, loaded on first use."""

    def __init__(self, steps_at_once: int = 1) -> None:
        self._model: torch.nn.Module | None = None
        self._path: str | None = None
        self._load = threading.Lock()  # runs start their trainers in threads, together
        self.steps_at_once = steps_at_once
        #: whose step it is: asyncio's semaphore wakes its waiters in the order they came
        self.turn = asyncio.Semaphore(steps_at_once)

    def model_for(self, cfg: TrinityConfig, load: Any) -> torch.nn.Module:
        """A model of ``cfg.model.model_path`` for one run, sharing the base's parameters
        (``load``: how the trainer loads a model, given the path)."""
        with self._load:
            if self._model is None:
                self._model, self._path = load(cfg.model.model_path), cfg.model.model_path
            elif cfg.model.model_path != self._path:
                raise ValueError(f"model.model_path: {cfg.model.model_path!r}, but the runs of this sweep "
                                 f"share {self._path!r}")
            from storage.lora import share_base

            return share_base(self._model)


def concurrent_steps() -> int:
    """Steps the shared trainer runs at once: 1 with a GPU; on a CPU, the usable cores over
    torch's threads per step (``cluster.cpu_tuning`` gives each role process 1 thread on a
    small machine; ``OMP_NUM_THREADS`` sets it by hand, and so this too)."""
    if torch.cuda.is_available():
        return 1
    from roles.tuning import usable_cores

    return max(1, usable_cores() // torch.get_num_threads())
