"""``sync_method: nccl``: the trainer broadcasts its tensors straight into the engines.

One torch.distributed group joins the trainer (rank 0) and every engine worker: NCCL on GPU,
gloo on CPU (:mod:`roles.weightsync.weights` moves the tensors). The group is formed at the
first offer and kept; the rest of this module is who belongs to it, through the run's KV:

* ``rendezvous.<group_name>``: where the group meets; ``sync.join``: the explorer's engines
  are about to receive ``version``; ``sync.formed``: when the trainer's current group was
  complete (all members in);
* ``sync.hello``: a (re)started explorer asks for a group of its own when the current one was
  formed before it started (with a predecessor that is gone: joining it would only wait for
  ``sync_timeout``). The trainer answers with a fresh group and its current weights, also
  while it waits for a batch (it may be waiting for this very explorer's experience);
* ``sync.pull.<explorer>``: an explorer that does not lead the run (``roles/explorer/lease.py``)
  asks for the trainer's current weights before a task that needs newer ones, with
  ``sync.pulls`` bumped so the trainer reads one key per step to know there is news. Each such
  explorer has a group of its own (``rendezvous.<group_name>-<explorer>``), formed at its
  first pull and kept while the pull names it (``group_ts``; an explorer whose receive failed
  names none, and gets a new one): one that dies breaks its own group, never the leader's;
* ``sync.serving.<explorer>``: the trainer answers a pull: which group (by its rendezvous
  ``ts``) and which version it is about to send.

What each end remembers of its group is one state of ``states.py``'s machines (the trainer's
group with the leader; the leader's and a helper's membership): every change of it is a named
move of their tables.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import structlog

from bus.errors import RequestTimeout
from bus.server import free_port
from roles.weightsync.base import Loaded, Receiver, Sender, Side, WeightsFailed
from roles.weightsync.states import MACHINES, ExplorerGroup, Machine, TrainerGroup
from roles.weightsync.weights import WeightSender
from schemas import keys
from schemas.state import Formed, Hello, Join, Offer, Pull, Pulls, Rendezvous, Serving

log = structlog.get_logger(__name__)

JOIN, HELLO, FORMED = keys.SYNC_JOIN, keys.SYNC_HELLO, keys.SYNC_FORMED
PULL, PULLS, SERVING = keys.SYNC_PULL_PREFIX, keys.SYNC_PULLS, keys.SYNC_SERVING_PREFIX


def helper_group(group_name: str, explorer: str) -> str:
    """The name of a non-leading explorer's own broadcast group (a KV key part: a host name's
    dots become ``_``)."""
    return re.sub(r"[^-\w=]", "_", f"{group_name}-{explorer}")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _host() -> str:
    """The address explorers reach the trainer's group at (``TRINITY_WEIGHT_SYNC_HOST`` on
    several nodes)."""
    return os.environ.get("TRINITY_WEIGHT_SYNC_HOST", "127.0.0.1")


def receivers(cfg: Any) -> int:
    """The leading explorer's ranks in the group: one per engine worker."""
    rm = cfg.explorer.rollout_model
    return rm.engine_num * rm.tensor_parallel_size


def bucket_bytes(cfg: Any, backend: str) -> int:
    """``explorer.rollout_model.weight_sync_buffer_size`` (MB) for NCCL; gloo sends tensor by
    tensor (on CPU the copy into a flat bucket measured slower than the broadcasts it saves)."""
    if backend != "nccl":
        return 0
    return cfg.explorer.rollout_model.weight_sync_buffer_size * 2**20


class BroadcastSender(Sender):
    """Trainer end: forms the group with the leading explorer's engines, one group per other
    explorer that pulls, and broadcasts the weights over them."""

    def __init__(self, side: Side) -> None:
        super().__init__(side)
        self.receivers = receivers(side.cfg)
        #: the group with the leading explorer's engines, and its sender while there is one
        self.group = Machine("trainer", *MACHINES["trainer"])
        self.sender: Any = None
        self.hello_served = 0.0
        #: the groups of explorers that do not lead (``sync.pull.<name>``) by explorer name:
        #: (its sender, its rendezvous ``ts``)
        self.helpers: dict[str, tuple[Any, float]] = {}
        self.pulls_served: dict[str, float] = {}
        self.pulls_seen = 0  # the KV revision of ``sync.pulls`` last read (clocks of hosts differ)

    async def serve_pulls(self, trainer: Any) -> None:
        """Send the current weights to every explorer that asked since it was last served,
        each over its own group. One KV read when nobody asked."""
        state = self.side.state
        _, revision = await state.entry(PULLS)
        if revision <= self.pulls_seen:
            return
        self.pulls_seen = revision
        pulls: dict[str, Pull] = {k[len(PULL):]: v for k, v in (await state.with_prefix(PULL)).items()}
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
        p, state = self.side.plan, self.side.state
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
                rdv = Rendezvous(time.time(), _host(), free_port(""), 1 + req.workers, "nccl" if _cuda() else "gloo", group)
                sender, group_ts = await asyncio.to_thread(WeightSender, rdv, p.timeout), rdv.ts
                await state.set_rendezvous(rdv)
            else:
                sender, group_ts = known
            await state.put(SERVING + name, Serving(req.ts, group_ts, version, time.time()))
            if known is None:  # the explorer joins once it reads the line above
                await asyncio.wait_for(asyncio.to_thread(sender.connect), p.timeout + 5)
                self.helpers[name] = (sender, group_ts)
            await self._send(sender, version, trainer, explorer=name)
        except (TimeoutError, asyncio.TimeoutError, RuntimeError) as e:
            self.helpers.pop(name, None)
            await state.clear_rendezvous(group)
            log.warning("helper_sync_failed", explorer=name, version=version, error=str(e))

    async def serve_hello(self, trainer: Any) -> bool:
        """Answer a (re)started explorer's hello (see the module doc) with the current
        weights over a fresh group. Cheap when there is none: one KV read."""
        hello = await self.side.state.get(HELLO)
        if hello is None or hello.ts <= self.hello_served:
            return False
        self.hello_served = hello.ts
        self._drop("hello")  # its other member is gone
        log.info("explorer_hello", version=trainer.step)
        # not the side's offer(): its skip rule reads the explorer's version from KV, which is
        # the dead predecessor's; the new process holds the base weights until this arrives
        await self.offer(trainer.step, trainer)
        return True

    async def offer(self, version: int, trainer: Any) -> None:
        p, state = self.side.plan, self.side.state
        fresh = self.group.state is TrainerGroup.NONE
        if fresh:
            # a group made now answers every hello said so far: its rendezvous is newer
            self.hello_served = max(self.hello_served, time.time())
            rdv = Rendezvous(time.time(), _host(), free_port(""), 1 + self.receivers,
                             "nccl" if _cuda() else "gloo", p.group_name)
            self.sender = await asyncio.to_thread(WeightSender, rdv, p.timeout)
            await state.set_rendezvous(rdv)
            self.group.move("form")
        self.seq += 1
        await state.put(keys.SYNC_OFFER, Offer(version, "nccl", self.seq, time.time()))
        await self.side.event("weights_ready", version, version,
                              rendezvous=f"{self.sender.rdv.host}:{self.sender.rdv.port}")
        try:
            if fresh:
                await self._serving_pulls(asyncio.to_thread(self.sender.connect), p.timeout + 5, trainer)
                self.group.move("connected")
                rdv = self.sender.rdv
                await state.put(FORMED, Formed(f"{rdv.host}:{rdv.port}", time.time()))
            joined = await state.wait(lambda: self._joined(version, trainer), p.timeout)
            if not joined:
                raise TimeoutError("explorer did not join")
            if joined != "hello":
                await self._send(self.sender, version, trainer)
        except (TimeoutError, asyncio.TimeoutError, RuntimeError) as e:
            self._drop("broken")  # the group is unusable after a failed collective: rebuild next time
            await state.clear_rendezvous(p.group_name)
            await self.side.timed_out(f"broadcast ({e})", version, version, ["explorer"])
            return
        if joined == "hello":  # the explorer restarted: this group lost its member
            self._drop("hello")
            await state.clear_rendezvous(p.group_name)
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
        size = bucket_bytes(self.side.cfg, sender.rdv.backend)
        sent = await asyncio.to_thread(lambda: sender.send(trainer.sync_tensors(), version, size))
        dt = time.perf_counter() - t0
        await self.side.event("weights_sent", version, version, info={"bytes": sent, "seconds": dt, **who})
        log.info("weights_sent", version=version, mb=round(sent / 2**20, 1), seconds=round(dt, 3), **who)

    async def _joined(self, version: int, trainer: Any) -> bool | str:
        j = await self.side.state.get(JOIN)
        if j is not None and j.version == version:
            return True
        # the leader may be waiting for tasks that explorers without weights hold
        await self.serve_pulls(trainer)
        hello = await self.side.state.get(HELLO)
        return "hello" if hello is not None and hello.ts > self.hello_served else False

    async def close(self) -> None:
        self._drop("close")
        self.helpers.clear()


class BroadcastReceiver(Receiver):
    """Explorer end: its engines join the trainer's group (as the leader) or a group of their
    own (as an explorer that pulls), and receive each broadcast."""

    pulls = True

    def __init__(self, side: Side) -> None:
        super().__init__(side)
        #: as the leader: its membership of the trainer's group, and that group's rendezvous ``ts``
        self.group = Machine("explorer", *MACHINES["explorer"])
        self.joined_ts: float | None = None
        self.started = time.time()
        #: as a helper: its own group with the trainer, and that group's rendezvous ``ts``
        self.helper = Machine("helper", *MACHINES["helper"])
        self.pulled_group: float | None = None

    def lead(self) -> None:
        self.group.move("lead")
        self.started, self.joined_ts = time.time(), None

    async def leave(self, name: str) -> None:
        await self.side.state.delete(PULL + name)
        await self.side.state.put(PULLS, Pulls(time.time()))

    async def usable(self, offer: Offer) -> bool:
        """Not while a gone predecessor's group is in the way: then say hello (once) and wait
        for the trainer's fresh group."""
        if await self._predecessors_group() is None:
            return True
        if self.group.state is ExplorerGroup.OUTSIDE:
            await self._say_hello()
        return False

    async def _predecessors_group(self) -> float | None:
        """What keeps this process from joining the current broadcast group, if anything, as
        the rendezvous ``ts`` a group it can join must be newer than: the ``ts`` of a group
        formed before it started (its other member was a predecessor that is gone: joining
        would wait for ``sync_timeout``), or 0.0 when the trainer tore the group down. None when
        there is nothing in the way: this process has joined a group already, or the current
        one still waits for its members."""
        if self.group.state is ExplorerGroup.JOINED:
            return None
        state = self.side.state
        rdv = await state.rendezvous(self.side.plan.group_name)
        if rdv is None:
            return 0.0
        formed = await state.get(FORMED)
        if formed is None:
            return None
        same = formed.group == f"{rdv.host}:{rdv.port}"
        return rdv.ts if same and formed.at < self.started else None

    async def _say_hello(self) -> None:
        """Ask the trainer for a broadcast group formed after this process started."""
        await self.side.state.put(HELLO, Hello(time.time(), self.side.version))
        self.group.move("hello")

    async def load(self, offer: Offer, engines: Sequence[Any], step: int) -> Loaded:
        p, state = self.side.plan, self.side.state
        t0 = time.perf_counter()
        stale = await self._predecessors_group()
        if stale is not None and self.group.state is ExplorerGroup.OUTSIDE:
            await self._say_hello()
        try:  # not the group of a gone predecessor: the one the trainer makes instead
            rdv = await state.wait_rendezvous(p.group_name, p.timeout, newer_than=stale or 0.0)
        except RequestTimeout as e:  # the trainer gave up on this group meanwhile
            self.group.move("no_rendezvous")  # an unanswered hello: ask again next time
            raise WeightsFailed(f"rendezvous ({e})") from e
        if self.joined_ts != rdv.ts:
            try:
                await _join_group(engines, rdv, p.timeout)
            except Exception as e:  # the group's owner is gone (a trainer that died)
                raise WeightsFailed(f"joining the weight group ({e})") from e
            self.group.move("joined")
            self.joined_ts = rdv.ts
        await state.put(JOIN, Join(offer.version, time.time()))
        try:
            version = await _receive(engines, p.timeout)
        except Exception as e:  # a peer gone mid-broadcast: gloo's error, or vLLM's wrap of it
            self.group.move("lost")
            self.joined_ts = None
            raise WeightsFailed(f"receiving weights ({e})") from e
        return version, time.perf_counter() - t0

    async def pull(self, engines: Sequence[Any], name: str) -> Loaded:
        """Ask the trainer for its current weights over this process's own group (see the
        module doc); they are at least what the task needs: the trainer offered that version
        before the leader queued the task. Bounded by ``sync_timeout``, as every wait."""
        p, state = self.side.plan, self.side.state
        asked = time.time()
        workers = sum(_ranks(e) for e in engines)
        await state.put(PULL + name, Pull(workers, asked, self.pulled_group))
        await state.put(PULLS, Pulls(asked))
        serving = await state.wait(lambda: self._serving(name, asked), p.timeout)
        if serving is None:
            raise WeightsFailed("waiting for weights")
        t0 = time.perf_counter()
        try:
            if self.pulled_group != serving.group_ts:
                rdv = await state.rendezvous(helper_group(p.group_name, name))
                if rdv is None or rdv.ts != serving.group_ts:
                    raise RuntimeError("its rendezvous is gone")
                await _join_group(engines, rdv, p.timeout)
                self.helper.move("joined")
                self.pulled_group = serving.group_ts
            version = await _receive(engines, p.timeout)
        except Exception as e:  # the trainer gone mid-broadcast: ask again next time, over a new group
            self.helper.move("lost")
            self.pulled_group = None
            raise WeightsFailed(f"receiving weights ({e})") from e
        return version, time.perf_counter() - t0

    async def _serving(self, name: str, asked: float) -> Serving | None:
        s = await self.side.state.get(SERVING + name)
        return s if s is not None and s.pull == asked else None


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
