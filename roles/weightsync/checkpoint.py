"""``sync_method: checkpoint``: the trainer writes a Hugging Face folder, the engines load it.

Slower than a broadcast (a full save and load per sync) but needs nothing shared between the
two ends but a file system: the method for one GPU, for ``colocate`` mode and for explorers on
other machines that read the same disk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from roles.weightsync.base import Loaded, Receiver, Sender
from schemas import keys
from schemas.state import Offer
from storage.checkpoints import save_state_dict_checkpoint


class CheckpointSender(Sender):
    """Writes the trainer's weights as ``global_step_<version>`` and offers its path."""

    async def offer(self, version: int, trainer: Any) -> None:
        t0 = time.perf_counter()
        path = await asyncio.to_thread(lambda: save_state_dict_checkpoint(
            trainer.job, version, state_dict=dict(trainer.weights()), config=trainer.engine.model.config,
            tokenizer=trainer.tokenizer,
        ))
        self.seq += 1
        await self.side.state.put(keys.SYNC_OFFER, Offer(version, "checkpoint", self.seq, time.time(), path=str(path)))
        await self.side.event("weights_ready", version, version, checkpoint_path=str(path),
                              info={"seconds": time.perf_counter() - t0})


class CheckpointReceiver(Receiver):
    """Every engine loads the offered folder."""

    async def load(self, offer: Offer, engines: Sequence[Any], step: int) -> Loaded:
        t0 = time.perf_counter()
        await asyncio.gather(*(e.load_checkpoint(offer.path, offer.version) for e in engines))
        return offer.version, time.perf_counter() - t0
