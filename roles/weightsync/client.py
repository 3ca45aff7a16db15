"""When weights move: the trainer's and the explorer's ends of a sync, used inside their loops.

They meet through the run's KV bucket (``bus.RunState``; each value a record of
:mod:`schemas.state`):

* ``sync.offer``: the trainer has weights of ``version`` ready (``method``; for checkpoints
  the HF folder ``path``);
* ``sync.want``: under ``explorer_driven``, the explorer asks for the current weights;
* ``version.trainer`` / ``version.explorer``: who holds what; ``trainer.finished``: the
  trainer's last version.

How the weights then move is the ``sync_method``'s :class:`~roles.weightsync.base.Sender` and
:class:`~roles.weightsync.base.Receiver` (:data:`SENDERS`, :data:`RECEIVERS`): a checkpoint
folder, or a broadcast group with its own keys (:mod:`roles.weightsync.broadcast`).

Every event also goes to the sync subject as a :class:`SyncEvent`. Every wait is bounded by
``sync_timeout``; a timeout is published with the missing role, and then the run goes on with
the old weights (``on_timeout: continue``) or :class:`SyncTimeout` is raised (``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import structlog

from roles.runtime.verdicts import RunFailed, nothing_trained
from roles.weightsync.base import Receiver, Sender, Side, SyncTimeout, WeightsFailed
from roles.weightsync.broadcast import BroadcastReceiver, BroadcastSender
from roles.weightsync.checkpoint import CheckpointReceiver, CheckpointSender
from roles.weightsync.memory import MemoryReceiver, MemorySender
from roles.weightsync.policy import explorer_requests, required_version, trainer_offers
from schemas import keys
from schemas.config import TrinityConfig
from schemas.state import Offer, TrainerFinished, Want

__all__ = ["RECEIVERS", "SENDERS", "ExplorerSyncClient", "SyncTimeout", "TrainerSyncClient"]

log = structlog.get_logger(__name__)

OFFER, JOIN, WANT = keys.SYNC_OFFER, keys.SYNC_JOIN, keys.SYNC_WANT
#: What ExplorerSyncClient._offer_for answers when the explorer should not wait.
GO_ON = "go on"
TRAINER_FINISHED = keys.TRAINER_FINISHED

#: How weights move, by ``synchronizer.sync_method``: the trainer's end and the explorer's.
SENDERS: dict[str, type[Sender]] = {"checkpoint": CheckpointSender, "nccl": BroadcastSender,
                                    "memory": MemorySender}
RECEIVERS: dict[str, type[Receiver]] = {"checkpoint": CheckpointReceiver, "nccl": BroadcastReceiver,
                                        "memory": MemoryReceiver}


class TrainerSyncClient(Side):
    """Trainer end: offers weights when the plan says so; its :attr:`weights` delivers them."""

    role = "trainer"

    def __init__(self, cfg: TrinityConfig, nc: Any, state: Any, pub: Any) -> None:
        super().__init__(cfg, nc, state, pub)
        self.weights = SENDERS[self.plan.method](self)
        self.want_served = 0.0
        self.offered = 0

    async def start(self) -> None:
        """Forget a previous trainer's offer and rendezvous: after a crash they point at a
        process group whose owner is gone, and an explorer joining it would only time out."""
        await self.state.delete(OFFER)
        await self.state.delete(JOIN)
        await self.state.clear_rendezvous(self.plan.group_name)

    async def finish(self, step: int, trainer: Any) -> None:
        """After the last step: offer the final weights unless just offered, then mark the
        trainer finished so the explorer stops waiting for more."""
        if step > self.offered:
            await self.offer(step, trainer)
        await self.state.put(TRAINER_FINISHED, TrainerFinished(step, time.time()))

    async def after_step(self, step: int, trainer: Any) -> None:
        """Call after every train step (``trainer``: a :class:`roles.trainer.main.Trainer`)."""
        p = self.plan
        if p.style == "explorer_driven":
            want = await self.state.get(WANT)
            if want is None or want.ts <= self.want_served:
                return
            self.want_served = want.ts
        elif not trainer_offers(step, p.trainer_interval, p.style):
            await self.weights.serve_pulls(trainer)
            return
        await self.offer(step, trainer)
        await self.weights.serve_pulls(trainer)

    async def serve_explorers(self, trainer: Any) -> None:
        """What the trainer does while it waits for a batch: answer a restarted leading
        explorer (its hello) and the other explorers' pulls (they may hold the very tasks the
        batch waits for)."""
        if await self.weights.serve_hello(trainer):
            self.offered = trainer.step
        await self.weights.serve_pulls(trainer)

    async def offer(self, version: int, trainer: Any) -> None:
        explorer = await self.state.model_version("explorer")
        if explorer is not None and explorer >= version:
            # A restarted trainer redoing steps the explorer already has weights for: the
            # explorer would never take this offer, so waiting for it would only time out.
            log.info("offer_skipped", version=version, explorer_version=explorer)
            return
        self.offered = version
        await self.weights.offer(version, trainer)

    async def close(self) -> None:
        await self.weights.close()


class ExplorerSyncClient(Side):
    """Explorer end: ``before_step`` blocks until the explorer may run a step, loading new
    weights into every engine (through its :attr:`weights`) when they are due."""

    role = "explorer"

    def __init__(self, cfg: TrinityConfig, nc: Any, state: Any, pub: Any) -> None:
        super().__init__(cfg, nc, state, pub)
        self.weights = RECEIVERS[self.plan.method](self)
        self.version = 0
        self.step = 0
        self.failed_offer: float | None = None  # ``ts`` of an offer whose load failed
        self.went_on: int | None = None  # trainer version at the last step run without waiting
        #: the KV key (``version.<key>``) this process reports its weights under: "explorer"
        #: for the leading explorer, which the trainer and synchronizer watch; another
        #: explorer process of the run reports under its own name (:meth:`assist`)
        self.version_key = "explorer"
        self.leading = True
        self._catching_up = asyncio.Lock()

    def assist(self, name: str) -> None:
        """This process is an explorer of the run that does not lead it: it reports its
        weights as ``version.<name>`` and pulls them (:meth:`catch_up`)."""
        self.version_key, self.leading = name, False

    async def take_lead(self) -> None:
        """This process leads the run now (its leader died): it takes the leader's weights
        from here on (under a broadcast, over a group formed for it, as a restarted leader does)."""
        await self.leave()
        self.version_key, self.leading = "explorer", True
        self.weights.lead()

    async def leave(self) -> None:
        """No more pulls from this process: the trainer drops what it kept for it."""
        if not self.leading:
            await self.weights.leave(self.version_key)

    async def before_step(self, step: int, engines: Sequence[Any]) -> int:
        """Returns the model version the step runs on."""
        p = self.plan
        if p.style == "trainer_driven":
            offer = await self._offer()
            if offer is not None and offer.version > self.version:
                await self._load(offer, engines, step)
            return self.version
        if p.style == "explorer_driven":
            if not explorer_requests(step, p.explorer_interval, p.offset, p.style):
                return self.version
            asked = time.time()
            await self.state.put(WANT, Want(step, asked))
            offer = await self.state.wait(lambda: self._offer_after(asked), p.timeout)
        else:
            need = required_version(step, p.explorer_interval, p.offset)
            deadline = time.monotonic() + p.timeout
            while self.version < need:
                left = deadline - time.monotonic()
                offer = await self.state.wait(lambda: self._offer_for(need), left) if left > 0 else None
                if offer is GO_ON:
                    break
                if offer is None:
                    await self.timed_out("waiting for weights", self.version, step, ["trainer"])
                    break
                before = self.version
                await self._load(offer, engines, step)
                if self.version == before:  # the load failed (reported): go on as we are
                    break
            return self.version
        if offer is None:
            await self.timed_out("waiting for weights", self.version, step, ["trainer"])
            return self.version
        await self._load(offer, engines, step)
        return self.version

    async def after_step(self, step: int) -> None:
        await self.state.set_model_version(self.version_key, self.version, step=step)
        self.step = step

    async def timed_out(self, what: str, version: int, step: int, missing: list[str]) -> None:
        """As every side's timeout, except that a wait for weights that timed out with nothing
        trained (this explorer on the starting weights, the trainer at no step) ends the run
        (:class:`roles.runtime.verdicts.RunFailed`): waiting on would only time out again."""
        if what == "waiting for weights" and nothing_trained(self.version, await self.state.model_version("trainer")):
            log.error("sync_timeout", what=what, version=version, missing=missing, nothing_trained=True)
            await self.event("timeout", version, step, missing=missing, info={"what": what})
            raise RunFailed(f"the explorer waited {self.plan.timeout:.0f}s (synchronizer.sync_timeout) for the "
                            f"weights of its step {step + 1} and the trainer has trained no step: it got no "
                            "experience to train on (see the buffer's dead letters) or cannot train it "
                            "(see the trainer's output)")
        await super().timed_out(what, version, step, missing)

    async def catch_up(self, engines: Sequence[Any], floor: int) -> int:
        """Before a queued task that needs version ``floor``: an explorer holding older weights
        loads the newest offered checkpoint, waiting up to ``sync_timeout`` for one of at
        least ``floor`` (then, as every timeout, it goes on with what it has); under a
        broadcast it pulls the trainer's current weights (they are at least ``floor``: the
        trainer offered that version before the leader queued the task). The leader's weights
        are :meth:`before_step`'s."""
        async with self._catching_up:  # tasks of one step ask together: one load
            if self.version >= floor or self.leading:
                return self.version
            if self.weights.pulls:
                try:
                    version, seconds = await self.weights.pull(engines, self.version_key)
                except WeightsFailed as e:
                    await self.timed_out(str(e), self.version, self.step, ["trainer"])
                    return self.version
                await self._loaded(version, self.plan.method, self.step, seconds)
                return self.version
            o = await self._offer()
            if o is None or o.version < floor:
                o = await self.state.wait(lambda: self._offer_at_least(floor), self.plan.timeout)
            if o is None:
                await self.timed_out("waiting for weights", self.version, self.step, ["trainer"])
                return self.version
            await self._load(o, engines, self.step)
            return self.version

    async def _offer_at_least(self, floor: int) -> Offer | None:
        o = await self.state.get(OFFER)
        return o if o is not None and o.version >= floor else None

    async def final(self, engines: Sequence[Any]) -> int:
        """After the last explorer step: load every newer offer until the trainer says it is
        finished, so the final evaluation sees the trained weights. Waits as long as the
        trainer is working (the caller bounds it with its stop event)."""
        changed = self.state.changed()
        while True:
            changed.clear()
            done = await self.state.get(TRAINER_FINISHED)
            offer = await self._offer()
            if offer is not None and offer.version > self.version:
                # a failed load (reported) marks its offer: the loop then waits for the next
                # one, or for the trainer to say it has finished; never ends the run early
                await self._load(offer, engines, self.step)
                continue
            if done is not None and self.version >= done.version:
                return self.version
            if done is not None and not (offer is not None and offer.version >= done.version):
                log.warning("final_weights_missing", trainer_version=done.version, have=self.version)
                return self.version
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), 0.25)

    async def _offer(self) -> Offer | None:
        """The current offer, unless it is one whose load already failed (its trainer died
        mid-broadcast; the restarted trainer replaces it with a fresh one) or one the method
        cannot take yet (a gone predecessor's broadcast group in the way)."""
        o = await self.state.get(OFFER)
        if o is None or o.ts == self.failed_offer:
            return None
        return o if await self.weights.usable(o) else None

    async def _offer_for(self, need: int) -> Offer | str | None:
        """What explorer step needing version ``need`` should do now: load an offer (the
        :class:`Offer`), go on with the weights it has (:data:`GO_ON`), or wait (None).

        Normally it waits for an offer of at least ``need``: the trainer is at most a sync
        interval behind and on its way there. A trainer further behind restarted from an
        older checkpoint, or from none (a rollback), and will not reach ``need`` for many
        steps; waiting for it would stall both sides until ``sync_timeout`` (the trainer
        waiting for experience, the explorer for weights). Then the trainer's weights are
        the truth: the explorer loads whatever it offers that it does not hold, and
        otherwise goes on one step per trainer step (so a misjudged lag, after a stall say,
        costs staleness, never an explorer running away), until the trainer has caught up. An offer newer than what the
        explorer holds but short of ``need`` is taken on the way when it is the trainer's
        newest: the trainer waits for it to be taken, so leaving it would stall both."""
        o = await self._offer()
        if o is not None and o.version >= need:
            return o
        trainer = await self.state.model_version("trainer")
        if o is not None and o.version > self.version and o.version == trainer:
            # the trainer's newest weights, short of ``need`` (it restarted, or the explorer
            # ran ahead): it waits for someone to take them, so take them on the way
            return o
        if trainer is None or trainer >= need - self.plan.explorer_interval:
            return None
        if o is not None and o.version != self.version:
            log.info("trainer_rolled_back", trainer=trainer, need=need, loading=o.version)
            return o
        if trainer != self.went_on:  # one step per trainer step: the lead stays bounded
            self.went_on = trainer
            return GO_ON
        return None

    async def _offer_after(self, ts: float) -> Offer | None:
        o = await self._offer()
        return o if o is not None and o.ts > ts else None

    async def _load(self, offer: Offer, engines: Sequence[Any], step: int) -> None:
        try:
            version, seconds = await self.weights.load(offer, engines, step)
        except WeightsFailed as e:
            self.failed_offer = offer.ts
            await self.timed_out(str(e), offer.version, step, ["trainer"])
            return
        await self._loaded(version, offer.method, step, seconds)

    async def _loaded(self, version: int, method: str, step: int, seconds: float) -> None:
        self.version = version
        await self.state.set_model_version(self.version_key, version, step=step)
        await self.event("loaded", version, step, info={"seconds": seconds})
        log.info("weights_loaded", version=version, method=method, seconds=round(seconds, 3))
