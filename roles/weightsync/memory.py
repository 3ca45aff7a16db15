"""``sync_method: memory``: trainer and engines on one machine, weights through shared memory.

The trainer copies its weights (the LoRA adapter alone where the engine takes it, as a
broadcast sends) into one of two memory files of its process and offers that file's path
(``storage/shared_weights.py``); each engine copies them out. Two files, written in turn: an
offer stays readable while the next one is written. Nothing waits for the explorer: like a
checkpoint, an offer is there until the trainer writes the file again two offers later.

Faults, as the broadcast's: a trainer that died takes its files with it (the explorer's open
fails before any copy: the load is reported and the restarted trainer offers again); an
offer whose file holds another version is refused before any copy; a torn read (the trainer
came back to the file while an engine read it) is detected after the copy, and the engines
then load the trainer's newest offer, complete by then. Only :data:`TRIES` torn reads in a row
(two offers written during each copy) fail the load as a broadcast cut mid-way does: the
engines hold a mix of two versions until the next offer.

On a GPU the tensors pass through the host's memory (the trainer copies device to host, the
engine host to device). CUDA IPC handles, which would spare both copies, are not built yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import structlog

from roles.weightsync.base import Loaded, Receiver, Sender, Side, WeightsFailed
from schemas import keys
from schemas.state import Offer
from storage.shared_weights import SharedSlot, TornRead

log = structlog.get_logger(__name__)

#: Loads a receiver tries (the offer, then the newest one after each torn read) before it fails.
TRIES = 3
#: The slots of this process, kept from one stage to the next: the explorer of a finished
#: stage may still load the last offer after the trainer's sync client closed.
_SLOTS: list[SharedSlot] = []


class MemorySender(Sender):
    """Trainer end: writes each offer into the next of its two slots and offers its path."""

    def __init__(self, side: Side) -> None:
        super().__init__(side)
        while len(_SLOTS) < 2:
            _SLOTS.append(SharedSlot(f"trinity-weights-{len(_SLOTS)}"))

    async def offer(self, version: int, trainer: Any) -> None:
        t0 = time.perf_counter()
        self.seq += 1
        slot = _SLOTS[self.seq % 2]
        nbytes = await asyncio.to_thread(lambda: slot.write(trainer.sync_tensors(), version, self.seq))
        dt = time.perf_counter() - t0
        await self.side.state.put(keys.SYNC_OFFER, Offer(version, "memory", self.seq, time.time(), path=slot.path))
        await self.side.event("weights_ready", version, version, info={"bytes": nbytes, "seconds": dt})
        log.info("weights_written", version=version, mb=round(nbytes / 2**20, 1), seconds=round(dt, 3))


class MemoryReceiver(Receiver):
    """Explorer end: every engine copies the offered slot out (see the module doc)."""

    async def load(self, offer: Offer, engines: Sequence[Any], step: int) -> Loaded:
        t0 = time.perf_counter()
        for _ in range(TRIES):
            try:
                await asyncio.gather(*(e.load_shared(offer.path, offer.version, offer.seq) for e in engines))
                return offer.version, time.perf_counter() - t0
            except TornRead as e:
                newest = await self.side.state.get(keys.SYNC_OFFER)
                if newest is None or newest.method != "memory" or newest.ts == offer.ts:
                    raise WeightsFailed(f"loading weights from the trainer's memory ({e})") from e
                log.info("weights_torn", version=offer.version, next_version=newest.version, error=str(e))
                offer = newest
        raise WeightsFailed(f"loading weights from the trainer's memory: torn {TRIES} times in a row")
