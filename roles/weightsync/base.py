"""How weights move, one class pair per ``synchronizer.sync_method``: the interface.

The trainer's and the explorer's sync clients (:mod:`roles.weightsync.client`, both a
:class:`Side`) decide *when* weights move: the plan, offers, waits, timeouts. A
:class:`Sender` and a :class:`Receiver` decide *how*: ``checkpoint`` writes a Hugging Face
folder the engines load (:mod:`roles.weightsync.checkpoint`); ``nccl`` broadcasts the tensors
over a torch.distributed group, NCCL on GPU and gloo on CPU (:mod:`roles.weightsync.broadcast`).
A new method is one more pair, named in the client's ``SENDERS`` and ``RECEIVERS``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import structlog

from schemas.config import TrinityConfig
from schemas.data import SyncEvent
from schemas.state import Offer, SyncPlan

log = structlog.get_logger(__name__)

#: What a receiver hands back for weights the engines now hold: (their version, seconds taken).
Loaded = tuple[int, float]


class SyncTimeout(RuntimeError):
    """A sync did not complete within ``sync_timeout`` and ``on_timeout`` is ``stop``."""


class WeightsFailed(RuntimeError):
    """A receiver could not load weights (the trainer gone mid-way, a group that never formed);
    the message says what failed. Its side reports it as every timeout, and goes on or stops
    as ``on_timeout`` says."""


class Side:
    """What both ends share: the plan, the run's KV (``state``), events and timeouts."""

    role = ""

    def __init__(self, cfg: TrinityConfig, nc: Any, state: Any, pub: Any) -> None:
        self.cfg = cfg
        self.plan = SyncPlan.from_config(cfg.synchronizer)
        self.nc, self.state, self.pub = nc, state, pub

    async def event(self, kind: str, version: int, step: int = 0, **kw: Any) -> None:
        ev = SyncEvent(kind=kind, model_version=version, method=self.plan.method, step=step,
                       source=self.role, **kw)
        try:
            await self.pub.publish_event(ev)
        except Exception as e:  # an event is a report; never let it break a sync
            log.warning("sync_event_failed", kind=kind, error=str(e))

    async def timed_out(self, what: str, version: int, step: int, missing: list[str]) -> None:
        log.warning("sync_timeout", what=what, version=version, missing=missing, on_timeout=self.plan.on_timeout)
        await self.event("timeout", version, step, missing=missing, info={"what": what})
        if self.plan.on_timeout == "stop":
            raise SyncTimeout(f"{self.role}: {what} for version {version} timed out after "
                              f"{self.plan.timeout:.0f}s; missing: {', '.join(missing)}")


class Sender(abc.ABC):
    """The trainer's end of one method: puts its weights up as an offer and delivers them."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.seq = 0  #: offers made, so a reader tells two offers of one version apart

    @abc.abstractmethod
    async def offer(self, version: int, trainer: Any) -> None:
        """Offer the trainer's current weights as ``version`` and deliver them to whoever
        takes the offer, within ``sync_timeout`` (a timeout reported through the side)."""

    async def serve_pulls(self, trainer: Any) -> None:
        """Answer the explorers that asked for the current weights since last time."""
        return None  # nothing to do, unless the method keeps something

    async def serve_hello(self, trainer: Any) -> bool:
        """Answer a restarted explorer that asked for its own delivery; True when the current
        weights went out afresh (the side then counts them as offered)."""
        return False

    async def close(self) -> None:
        """Let go of what delivery holds (a process group)."""
        return None  # nothing to do, unless the method keeps something


class Receiver(abc.ABC):
    """The explorer's end of one method: loads an offer into the rollout engines."""

    #: whether an explorer that does not lead the run asks the trainer for its weights
    #: (:meth:`pull`) rather than loading the newest offer itself
    pulls = False

    def __init__(self, side: Side) -> None:
        self.side = side

    async def usable(self, offer: Offer) -> bool:
        """Whether ``offer`` can be taken now."""
        return True

    @abc.abstractmethod
    async def load(self, offer: Offer, engines: Sequence[Any], step: int) -> Loaded:
        """Every engine loads ``offer``; :class:`WeightsFailed` when that could not be done."""

    async def pull(self, engines: Sequence[Any], name: str) -> Loaded:
        """The trainer's current weights, asked for as explorer ``name`` (where :attr:`pulls`)."""
        raise NotImplementedError(f"{type(self).__name__} does not pull")

    def lead(self) -> None:
        """This process leads the run from now on (its leader died)."""
        return None  # nothing to do, unless the method keeps something

    async def leave(self, name: str) -> None:
        """Explorer ``name`` pulls no more: the trainer may drop what it kept for it."""
        return None  # nothing to do, unless the method keeps something
