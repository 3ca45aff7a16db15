"""The two ends of a weight sync, used inside the trainer and explorer loops.

They meet through the run's KV bucket (``bus.RunState``; each value a record of
:mod:`schemas.state`):

* ``sync.offer``: the trainer has weights of ``version`` ready (``method``; for checkpoints
  the HF folder ``path``);
* ``rendezvous.<group_name>``: where the broadcast group meets;
* ``sync.join``: the explorer's engines are about to receive ``version`` (broadcast only);
* ``sync.want``: under ``explorer_driven``, the explorer asks for the current weights;
* ``sync.formed``: when the trainer's current broadcast group was complete (all members in);
* ``sync.hello``: a (re)started explorer asks for a broadcast group of its own when the
  current one was formed before it started (with a predecessor that is gone: joining it
  would only wait for ``sync_timeout``). The trainer answers with a fresh group and its
  current weights, also while it waits for a batch (it may be waiting for this very
  explorer's experience);
* ``sync.pull.<explorer>``: an explorer that does not lead the run (``roles/explorer/lease.py``)
  asks for the trainer's current weights before a task that needs newer ones, with
  ``sync.pulls`` bumped so the trainer reads one key per step to know there is news. Each such
  explorer has a broadcast group of its own (``rendezvous.<group_name>-<explorer>``), formed
  at its first pull and kept while the pull names it (``group_ts``; an explorer whose receive
  failed names none, and gets a new one): one that dies breaks its own group, never the leader's;
* ``sync.serving.<explorer>``: the trainer answers a pull: which group (by its rendezvous
  ``ts``) and which version it is about to send;
* ``version.trainer`` / ``version.explorer``: who holds what.

Every event also goes to the sync subject as a :class:`SyncEvent`. Every wait is bounded by
``sync_timeout``; a timeout is published with the missing role, and then the run goes on with
the old weights (``on_timeout: continue``) or :class:`SyncTimeout` is raised (``stop``).

What each end remembers of its broadcast group is one state of ``states.py``'s machines
(the trainer's group with the leader; the leader's and a helper's membership): every change
of it is a named move of their tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import structlog

import bus
from bus.server import free_port
from roles.runtime.verdicts import RunFailed, nothing_trained
from schemas import keys
from schemas.config import TrinityConfig
from schemas.data import SyncEvent
from schemas.state import (
    Formed,
    Hello,
    Join,
    Offer,
    Pull,
    Pulls,
    Rendezvous,
    Serving,
    SyncPlan,
    TrainerFinished,
    Want,
)

from .policy import explorer_requests, required_version, trainer_offers
from .states import MACHINES, ExplorerGroup, Machine, TrainerGroup

log = structlog.get_logger(__name__)

OFFER, JOIN, WANT, HELLO = keys.SYNC_OFFER, keys.SYNC_JOIN, keys.SYNC_WANT, keys.SYNC_HELLO
PULL, PULLS, SERVING = keys.SYNC_PULL_PREFIX, keys.SYNC_PULLS, keys.SYNC_SERVING_PREFIX
#: ``{"group": "host:port", "at": ts}``: when the trainer's current broadcast group was formed
FORMED = keys.SYNC_FORMED
#: What ExplorerSyncClient._offer_for answers when the explorer should not wait.
GO_ON = "go on"
TRAINER_FINISHED = keys.TRAINER_FINISHED


class SyncTimeout(RuntimeError):
    """A sync did not complete within ``sync_timeout`` and ``on_timeout`` is ``stop``."""


def helper_group(group_name: str, explorer: str) -> str:
    """The name of a non-leading explorer's own broadcast group (a KV key part: a host name's
    dots become ``_``)."""
    return re.sub(r"[^-\w=]", "_", f"{group_name}-{explorer}")


class _Side:
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


class TrainerSyncClient(_Side):
    """Trainer end: offers weights when the plan says so and sends them (broadcast) or writes
    the HF folder (checkpoint)."""

    role = "trainer"

    def __init__(self, cfg: TrinityConfig, nc: Any, state: Any, pub: Any, receivers: int | None = None) -> None:
        super().__init__(cfg, nc, state, pub)
        rm = cfg.explorer.rollout_model
        self.receivers = receivers if receivers is not None else rm.engine_num * rm.tensor_parallel_size
        #: the group with the leading explorer's engines, and its sender while there is one
        self.group = Machine("trainer", *MACHINES["trainer"])
        self.sender: Any = None
        self.seq = 0
        self.want_served = 0.0
        self.hello_served = 0.0
        self.offered = 0
        #: the groups of explorers that do not lead (``sync.pull.<name>``) by explorer name:
        #: (its sender, its rendezvous ``ts``)
        self.helpers: dict[str, tuple[Any, float]] = {}
        self.pulls_served: dict[str, float] = {}
        self.pulls_seen = 0  # the KV revision of ``sync.pulls`` last read (clocks of hosts differ)

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
            await self.serve_pulls(trainer)
            return
        await self.offer(step, trainer)
        await self.serve_pulls(trainer)

    async def serve_explorers(self, trainer: Any) -> None:
        """What the trainer does while it waits for a batch: answer a restarted leading
        explorer (its hello) and the other explorers' pulls (they may hold the very tasks the
        batch waits for)."""
        await self.serve_hello(trainer)
        await self.serve_pulls(trainer)

    async def serve_pulls(self, trainer: Any) -> None:
        """Send the current weights to every explorer that asked since it was last served,
        each over its own group. One KV read when nobody asked."""
        if self.plan.method == "checkpoint":
            return
        _, revision = await self.state.entry(PULLS)
        if revision <= self.pulls_seen:
            return
        self.pulls_seen = revision
        pulls: dict[str, Pull] = {k[len(PULL):]: v for k, v in (await self.state.with_prefix(PULL)).items()}
        for name in (set(self.helpers) | set(self.pulls_served)) - set(pulls):  # it left, or now leads
            self.helpers.pop(name, None)
            self.pulls_served.pop(name, None)
        for name, req in pulls.items():
            if req.ts > self.pulls_served.get(name, 0.0):
                self.pulls_served[name] = req.ts
                await self._send_to_helper(name, req, trainer)

    async def _send_to_helper(self, name: str, req: Pull, trainer: Any) -> None:
        """Answer one pull: the trainer's current weights over ``name``'s own group (formed
        now if it has none). A failure costs that explorer its group, never the run: it
        asks again, and the leader's group is another one."""
        from .weights import WeightSender

        p = self.plan
        group = helper_group(p.group_name, name)
        version = int(trainer.step)
        known = self.helpers.get(name)
        if known is not None and req.group_ts != known[1]:
            # the explorer dropped that group (a receive failed there): sending on it would
            # wait out the gloo/NCCL timeout for a receiver that is not there; form a new one
            self.helpers.pop(name, None)
            known = None
        try:
            if known is None:
                host = os.environ.get("TRINITY_WEIGHT_SYNC_HOST", "127.0.0.1")
                rdv = Rendezvous(time.time(), host, free_port(""), 1 + req.workers, "nccl" if _cuda() else "gloo", group)
                sender, group_ts = await asyncio.to_thread(WeightSender, rdv, p.timeout), rdv.ts
                await self.state.set_rendezvous(rdv)
            else:
                sender, group_ts = known
            await self.state.put(SERVING + name, Serving(req.ts, group_ts, version, time.time()))
            if known is None:  # the explorer joins once it reads the line above
                await asyncio.wait_for(asyncio.to_thread(sender.connect), p.timeout + 5)
                self.helpers[name] = (sender, group_ts)
            await self._send(sender, version, trainer, explorer=name)
        except (TimeoutError, asyncio.TimeoutError, RuntimeError) as e:
            self.helpers.pop(name, None)
            await self.state.clear_rendezvous(group)
            log.warning("helper_sync_failed", explorer=name, version=version, error=str(e))

    async def serve_hello(self, trainer: Any) -> None:
        """Answer a (re)started explorer's hello (see the module doc) with the current
        weights over a fresh group. Cheap when there is none: one KV read."""
        if self.plan.method == "checkpoint":
            return
        hello = await self.state.get(HELLO)
        if hello is None or hello.ts <= self.hello_served:
            return
        self.hello_served = hello.ts
        self._drop("hello")  # its other member is gone
        log.info("explorer_hello", version=trainer.step)
        # not offer(): its skip rule reads the explorer's version from KV, which is the dead
        # predecessor's; the new process holds the base weights until this arrives
        self.offered = trainer.step
        await self._offer_broadcast(trainer.step, trainer)

    async def offer(self, version: int, trainer: Any) -> None:
        explorer = await self.state.model_version("explorer")
        if explorer is not None and explorer >= version:
            # A restarted trainer redoing steps the explorer already has weights for: the
            # explorer would never take this offer, so waiting for it would only time out.
            log.info("offer_skipped", version=version, explorer_version=explorer)
            return
        self.offered = version
        if self.plan.method == "checkpoint":
            await self._offer_checkpoint(version, trainer)
        else:
            await self._offer_broadcast(version, trainer)

    async def _offer_checkpoint(self, version: int, trainer: Any) -> None:
        from storage.checkpoints import save_state_dict_checkpoint

        t0 = time.perf_counter()
        path = await asyncio.to_thread(lambda: save_state_dict_checkpoint(
            trainer.job, version, state_dict=dict(trainer.weights()), config=trainer.engine.model.config,
            tokenizer=trainer.tokenizer,
        ))
        self.seq += 1
        await self.state.put(OFFER, Offer(version, "checkpoint", self.seq, time.time(), path=str(path)))
        await self.event("weights_ready", version, version, checkpoint_path=str(path),
                         info={"seconds": time.perf_counter() - t0})

    async def _offer_broadcast(self, version: int, trainer: Any) -> None:
        from .weights import WeightSender

        p = self.plan
        backend = "nccl" if _cuda() else "gloo"
        fresh = self.group.state is TrainerGroup.NONE
        if fresh:
            # a group made now answers every hello said so far: its rendezvous is newer
            self.hello_served = max(self.hello_served, time.time())
            host = os.environ.get("TRINITY_WEIGHT_SYNC_HOST", "127.0.0.1")  # a reachable address on multi-node
            rdv = Rendezvous(time.time(), host, free_port(""), 1 + self.receivers, backend, p.group_name)
            self.sender = await asyncio.to_thread(WeightSender, rdv, p.timeout)
            await self.state.set_rendezvous(rdv)
            self.group.move("form")
        self.seq += 1
        await self.state.put(OFFER, Offer(version, "nccl", self.seq, time.time()))
        await self.event("weights_ready", version, version, rendezvous=f"{self.sender.rdv.host}:{self.sender.rdv.port}")
        try:
            if fresh:
                await self._serving_pulls(asyncio.to_thread(self.sender.connect), p.timeout + 5, trainer)
                self.group.move("connected")
                rdv = self.sender.rdv
                await self.state.put(FORMED, Formed(f"{rdv.host}:{rdv.port}", time.time()))
            joined = await self.state.wait(lambda: self._joined(version, trainer), p.timeout)
            if not joined:
                raise TimeoutError("explorer did not join")
            if joined != "hello":
                await self._send(self.sender, version, trainer)
        except (TimeoutError, asyncio.TimeoutError, RuntimeError) as e:
            self._drop("broken")  # the group is unusable after a failed collective: rebuild next time
            await self.state.clear_rendezvous(p.group_name)
            await self.timed_out(f"broadcast ({e})", version, version, ["explorer"])
            return
        if joined == "hello":  # the explorer restarted: this group lost its member
            self._drop("hello")
            await self.state.clear_rendezvous(p.group_name)
            await self.serve_hello(trainer)

    def _drop(self, move: str) -> None:
        """The group with the leader is gone (``move``: why); the next offer forms a new one."""
        self.group.move(move)
        self.sender = None

    async def _serving_pulls(self, work: Any, timeout: float, trainer: Any) -> None:
        """Await ``work`` (within ``timeout`` s), answering pulls meanwhile: while the leading
        explorer's engines come to the group, the other explorers may pull, and the leader may
        be waiting for tasks only they can run (tests/synchronizer/test_interleavings.py)."""
        task = asyncio.ensure_future(work)
        deadline = time.monotonic() + timeout
        try:
            while not task.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"not done within {timeout:.0f}s")
                await asyncio.wait({task}, timeout=min(0.25, left))
                if not task.done():
                    await self.serve_pulls(trainer)
        finally:
            if not task.done():
                task.cancel()
        task.result()

    async def _send(self, sender: Any, version: int, trainer: Any, **who: str) -> None:
        """Broadcast the trainer's weights as ``version`` over ``sender``'s group and report it
        (``who``: ``explorer=<name>`` for a non-leading explorer's own group)."""
        t0 = time.perf_counter()
        sent = await asyncio.to_thread(
            lambda: sender.send(trainer.sync_tensors(), version, self.bucket_bytes(sender.rdv.backend)))
        dt = time.perf_counter() - t0
        await self.event("weights_sent", version, version, info={"bytes": sent, "seconds": dt, **who})
        log.info("weights_sent", version=version, mb=round(sent / 2**20, 1), seconds=round(dt, 3), **who)

    def bucket_bytes(self, backend: str) -> int:
        """``explorer.rollout_model.weight_sync_buffer_size`` (MB) for NCCL; gloo sends tensor by
        tensor (on CPU the copy into a flat bucket measured slower than the broadcasts it saves)."""
        if backend != "nccl":
            return 0
        return self.cfg.explorer.rollout_model.weight_sync_buffer_size * 2**20

    async def _joined(self, version: int, trainer: Any) -> bool | str:
        j = await self.state.get(JOIN)
        if j is not None and j.version == version:
            return True
        # the leader may be waiting for tasks that explorers without weights hold
        await self.serve_pulls(trainer)
        hello = await self.state.get(HELLO)
        return "hello" if hello is not None and hello.ts > self.hello_served else False

    async def close(self) -> None:
        self._drop("close")
        self.helpers.clear()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class ExplorerSyncClient(_Side):
    """Explorer end: ``before_step`` blocks until the explorer may run a step, loading new
    weights into every engine when they are due."""

    role = "explorer"

    def __init__(self, cfg: TrinityConfig, nc: Any, state: Any, pub: Any) -> None:
        super().__init__(cfg, nc, state, pub)
        self.version = 0
        self.step = 0
        self.failed_offer: float | None = None  # ``ts`` of an offer whose load failed
        #: as the leader: its membership of the trainer's group, and that group's rendezvous ``ts``
        self.group = Machine("explorer", *MACHINES["explorer"])
        self.joined_ts: float | None = None
        self.started = time.time()
        self.went_on: int | None = None  # trainer version at the last step run without waiting
        #: the KV key (``version.<key>``) this process reports its weights under: "explorer"
        #: for the leading explorer, which the trainer and synchronizer watch; another
        #: explorer process of the run reports under its own name (:meth:`assist`)
        self.version_key = "explorer"
        self.leading = True
        #: as a helper: its own group with the trainer, and that group's rendezvous ``ts``
        self.helper = Machine("helper", *MACHINES["helper"])
        self.pulled_group: float | None = None
        self._catching_up = asyncio.Lock()

    def assist(self, name: str) -> None:
        """This process is an explorer of the run that does not lead it: it reports its
        weights as ``version.<name>`` and pulls them (:meth:`catch_up`)."""
        self.version_key, self.leading = name, False

    async def take_lead(self) -> None:
        """This process leads the run now (its leader died): it takes the leader's weights
        from here on, over a broadcast group formed for it (as a restarted leader does)."""
        await self.leave()
        self.version_key, self.leading = "explorer", True
        self.group.move("lead")
        self.started, self.joined_ts = time.time(), None

    async def leave(self) -> None:
        """No more pulls from this process: the trainer drops its group."""
        if not self.leading and self.plan.method != "checkpoint":
            await self.state.delete(PULL + self.version_key)
            await self.state.put(PULLS, Pulls(time.time()))

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
        broadcast it pulls the trainer's current weights (:meth:`_pull`). The leader's
        weights are :meth:`before_step`'s."""
        async with self._catching_up:  # tasks of one step ask together: one load
            if self.version >= floor or self.leading:
                return self.version
            if self.plan.method != "checkpoint":
                return await self._pull(engines)
            o = await self._offer()
            if o is None or o.version < floor:
                o = await self.state.wait(lambda: self._offer_at_least(floor), self.plan.timeout)
            if o is None:
                await self.timed_out("waiting for weights", self.version, self.step, ["trainer"])
                return self.version
            await self._load(o, engines, self.step)
            return self.version

    async def _pull(self, engines: Sequence[Any]) -> int:
        """Ask the trainer for its current weights over this process's own broadcast group
        (see the module doc); they are at least what the task needs: the trainer offered that
        version before the leader queued the task. Bounded by ``sync_timeout``, as every wait."""
        p, name = self.plan, self.version_key
        asked = time.time()
        workers = sum(_ranks(e) for e in engines)
        await self.state.put(PULL + name, Pull(workers, asked, self.pulled_group))
        await self.state.put(PULLS, Pulls(asked))
        serving = await self.state.wait(lambda: self._serving(name, asked), p.timeout)
        if serving is None:
            await self.timed_out("waiting for weights", self.version, self.step, ["trainer"])
            return self.version
        t0 = time.perf_counter()
        try:
            if self.pulled_group != serving.group_ts:
                rdv = await self.state.rendezvous(helper_group(p.group_name, name))
                if rdv is None or rdv.ts != serving.group_ts:
                    raise RuntimeError("its rendezvous is gone")
                await _join_group(engines, rdv, p.timeout)
                self.helper.move("joined")
                self.pulled_group = serving.group_ts
            version = await _receive(engines, p.timeout)
        except Exception as e:  # the trainer gone mid-broadcast: ask again next time, over a new group
            self.helper.move("lost")
            self.pulled_group = None
            await self.timed_out(f"receiving weights ({e})", self.version, self.step, ["trainer"])
            return self.version
        await self._loaded(version, p.method, self.step, t0)
        return self.version

    async def _serving(self, name: str, asked: float) -> Serving | None:
        s = await self.state.get(SERVING + name)
        return s if s is not None and s.pull == asked else None

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
        mid-broadcast; the restarted trainer replaces it with a fresh one)."""
        o = await self.state.get(OFFER)
        if o is None or o.ts == self.failed_offer:
            return None
        if o.method != "checkpoint" and await self._predecessors_group() is not None:
            if self.group.state is ExplorerGroup.OUTSIDE:
                await self._say_hello()
            return None
        return o

    async def _predecessors_group(self) -> float | None:
        """What keeps this process from joining the current broadcast group, if anything, as
        the rendezvous ``ts`` a group it can join must be newer than: the ``ts`` of a group
        formed before it started (its other member was a predecessor that is gone: joining
        would wait for ``sync_timeout``), or 0.0 when the trainer tore the group down. None when
        there is nothing in the way: this process has joined a group already, or the current
        one still waits for its members."""
        if self.group.state is ExplorerGroup.JOINED:
            return None
        rdv = await self.state.rendezvous(self.plan.group_name)
        if rdv is None:
            return 0.0
        formed = await self.state.get(FORMED)
        if formed is None:
            return None
        same = formed.group == f"{rdv.host}:{rdv.port}"
        return rdv.ts if same and formed.at < self.started else None

    async def _say_hello(self) -> None:
        """Ask the trainer for a broadcast group formed after this process started."""
        await self.state.put(HELLO, Hello(time.time(), self.version))
        self.group.move("hello")

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
        version = offer.version
        t0 = time.perf_counter()
        if offer.method == "checkpoint":
            await asyncio.gather(*(e.load_checkpoint(offer.path, version) for e in engines))
        else:
            p = self.plan
            stale = await self._predecessors_group()
            if stale is not None and self.group.state is ExplorerGroup.OUTSIDE:
                await self._say_hello()
            try:  # not the group of a gone predecessor: the one the trainer makes instead
                rdv = await self.state.wait_rendezvous(p.group_name, p.timeout, newer_than=stale or 0.0)
            except bus.RequestTimeout as e:  # the trainer gave up on this group meanwhile
                self.group.move("no_rendezvous")  # an unanswered hello: ask again next time
                self.failed_offer = offer.ts
                await self.timed_out(f"rendezvous ({e})", version, step, ["trainer"])
                return
            if self.joined_ts != rdv.ts:
                try:
                    await _join_group(engines, rdv, p.timeout)
                except Exception as e:  # the group's owner is gone (a trainer that died)
                    self.failed_offer = offer.ts
                    await self.timed_out(f"joining the weight group ({e})", version, step, ["trainer"])
                    return
                self.group.move("joined")
                self.joined_ts = rdv.ts
            await self.state.put(JOIN, Join(version, time.time()))
            try:
                version = await _receive(engines, p.timeout)
            except Exception as e:  # a peer gone mid-broadcast: gloo's error, or vLLM's wrap of it
                self.group.move("lost")
                self.joined_ts = None
                self.failed_offer = offer.ts
                await self.timed_out(f"receiving weights ({e})", version, step, ["trainer"])
                return
        await self._loaded(version, offer.method, step, t0)

    async def _loaded(self, version: int, method: str, step: int, t0: float) -> None:
        self.version = version
        dt = time.perf_counter() - t0
        await self.state.set_model_version(self.version_key, version, step=step)
        await self.event("loaded", version, step, info={"seconds": dt})
        log.info("weights_loaded", version=version, method=method, seconds=round(dt, 3))


def _ranks(engine: Any) -> int:
    """The ranks an engine takes in a broadcast group: its tensor parallel size."""
    return int(getattr(engine, "tensor_parallel_size", 1) or 1)


async def _join_group(engines: Sequence[Any], rdv: Rendezvous, timeout: float) -> None:
    """Every engine joins the group of rendezvous ``rdv`` (rank 0 is the trainer; each engine
    takes the next :func:`_ranks` ranks)."""
    d = rdv.to_dict()
    offsets, r = [], 1
    for e in engines:
        offsets.append(r)
        r += _ranks(e)
    await asyncio.gather(*(e.init_weight_group(d, o, timeout) for e, o in zip(engines, offsets, strict=True)))


async def _receive(engines: Sequence[Any], timeout: float) -> int:
    """Every engine receives one broadcast; the version they all hold now. A wait cancelled
    mid-broadcast (a stop) leaves the gathered receives finished with CancelledError, which
    ``wait_for`` never reads: the callback does, or asyncio logs "exception was never
    retrieved" (seen in a role's log after its run was SIGKILLed)."""
    receives = asyncio.gather(*(e.receive_weights() for e in engines))
    receives.add_done_callback(lambda f: f.cancelled() or f.exception())
    got = await asyncio.wait_for(receives, timeout)
    return min(int(v) for v in got)
