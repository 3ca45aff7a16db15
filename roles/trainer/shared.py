"""One trainer process for several LoRA runs (a sweep): the base model once, turns in order.

Why: the runs of a LoRA sweep train different adapters on the same frozen base. Each run's
trainer here is an ordinary :class:`roles.trainer.main.Trainer` (its own adapter, optimizer,
scheduler, batches, checkpoints and algorithm settings) whose model is built on a copy of the
base that shares its parameter tensors (:func:`storage.lora.share_base`): 8 runs hold one base.
Steps take turns (:attr:`SharedBase.turn`, a FIFO lock): a run that just stepped queues behind
every run that is waiting, so none starves, and one step's activations are in memory at a
time. Two steps at once (each in a thread, on a CPU) were measured on SmolLM2 and trained no
faster: 4 steps every ~100 s either way (docs/sweep.md; why is not established, a likely
cause being the runs' Python work sharing this process's one interpreter lock).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import torch

from schemas.config import TrinityConfig


class SharedBase:
    """The base model the runs of a sweep share, loaded on first use."""

    def __init__(self, run_ids: Sequence[str] = ()) -> None:
        #: the sweep's runs: each run's trainer takes the cores the explorer host leaves while
        #: every run's explorer idles (their rollouts share that one process's engine). Without
        #: it the host trained on one core while the other idled between rollouts: the SmolLM2
        #: sweep took 1.18x the time of its runs apart (2026-11-28).
        self.run_ids = tuple(run_ids)
        self._model: torch.nn.Module | None = None
        self._path: str | None = None
        self._load = threading.Lock()  # runs start their trainers in threads, together
        #: whose step it is: asyncio's lock wakes its waiters in the order they came
        self.turn = asyncio.Lock()

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

