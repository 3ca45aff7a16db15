"""What the buffer process does, minus the process: ingest groups, answer batch requests.

Ingest: groups pass the pipeline, are written to LMDB in one transaction, and only then are
their messages acked, so a buffer killed mid-way loses nothing and a redelivered group is
stored once (``put_groups`` is idempotent per experience id). Eval groups are not training
data and are acked without storing.

Quarantine: a group that decoded but cannot be stored or trained (a token id past the
model's vocabulary, a pipeline that raises on it, advantages that came out NaN, a key the
store refuses) is returned to the caller with its error instead of stopping the ingest; the
process loop sends it to the dead-letter stream and acks it. Retrying it could only fail
again, and the other groups of the fetch are stored as usual.

Batches follow the algorithm's ``sample_strategy`` (``ops/sampling.py``), a pure function that
plans each batch: how many experiences from the replay store and from how old a model (e.g.
``staleness_control``), how many from the auxiliary SFT buffer, marked ``info["is_expert"]``
(``mix``, as CHORD trains on). A request waits at most ``max_read_timeout`` for a full batch
and then returns what there is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import time
from typing import TYPE_CHECKING, Any

import structlog

import ops
from ops.sampling import BatchPlan
from roles.runtime.verdicts import DeadLetterStreak
from schemas import codec
from schemas.data import ExperienceGroup, TaskFeedback
from schemas.rpc import BatchReply, BatchRequest, batch_key
from storage.replay import ReplayError, ReplayStore

from .files import FileBuffer
from .pipeline import Pipeline

if TYPE_CHECKING:  # sqlalchemy is needed only when a config asks for the SQL store
    from storage.sql import SqlMirror

log = structlog.get_logger(__name__)

#: What a store write raises for one bad group (as opposed to a full disk, which is no reason
#: to quarantine anything).
_BAD_GROUP = (ReplayError, ValueError, struct.error, OverflowError)


def vocab_size(model_path: str | None) -> int | None:
    """Rows of the model's embedding (``vocab_size`` in its config.json): a token id at or past
    it stops the trainer. None when there is no such config (a GGUF file, say)."""
    try:
        with open(os.path.join(model_path or "", "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    n = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return n if isinstance(n, int) and n > 0 else None


def check_tokens(g: ExperienceGroup, vocab: int | None) -> None:
    """Raise ValueError naming the experience if a token id is outside the vocabulary."""
    if vocab is None:
        return
    for i, e in enumerate(g.experiences):
        for name in ("tokens", "chosen", "rejected"):
            a = getattr(e, name)
            if a is not None and len(a) and int(a.max()) >= vocab:
                raise ValueError(
                    f"ExperienceGroup.experiences[{i}].{name}: token id {int(a.max())} is past "
                    f"the model's vocabulary ({vocab})"
                )


class BufferService:
    def __init__(
        self,
        store: ReplayStore | None,
        pipeline: Pipeline,
        *,
        main_file: FileBuffer | None = None,
        aux: dict[str, FileBuffer] | None = None,
        sample_strategy: str = "default",
        sample_args: dict[str, Any] | None = None,
        max_read_timeout: float = 1800.0,
        vocab: int | None = None,
        run_id: str | None = None,
        mirror: SqlMirror | None = None,
    ) -> None:
        if store is None and main_file is None:
            raise ValueError("buffer: neither a replay store nor a file buffer to serve")
        self.store = store
        self.pipeline = pipeline
        self.main_file = main_file
        self.aux = aux or {}
        self._aux_used_up = False  # warned once
        self.strategy = sample_strategy
        self.args = dict(sample_args or {})
        self.plan_fn = ops.get("sample_strategy", sample_strategy)
        self.max_read_timeout = max_read_timeout
        self.vocab = vocab
        #: the run this buffer serves: another run's group is refused (runs that share a bus,
        #: a sweep's above all, never train on each other's experience)
        self.run_id = run_id
        #: the SQL experience store (``storage/sql.py``), given every group the store keeps
        self.mirror = mirror
        self.stored = 0
        self.groups_in = 0
        self.quarantined = 0
        #: groups dead-lettered in a row for one reason (roles/runtime/verdicts.py: the process loop
        #: ends the run once a step's worth of them adds up)
        self.streak = DeadLetterStreak()
        #: Set by the process loop once the explorer finished and every group on the stream
        #: is ingested: nothing more will come, so a batch request stops waiting.
        self.source_done = False
        #: set when an ingest stored experience (a batch request waiting for it wakes at once);
        #: ``loop`` is the event loop the batch requests wait on (the ingest runs in a thread)
        self.arrived = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        if self.plan(2, 0).expert and not self.aux:
            raise ValueError(
                f"algorithm.sample_strategy {sample_strategy!r} takes expert data, which needs "
                "buffer.trainer_input.auxiliary_buffers (e.g. an SFT dataset named sft_dataset)"
            )

    # -- ingest -------------------------------------------------------------------------------

    def ingest(self, groups: list[ExperienceGroup]) -> tuple[int, dict[int, Exception], list[TaskFeedback]]:
        """Run the pipeline and store the surviving groups in one transaction. Returns the
        number of experiences newly stored, by their index in ``groups`` the groups
        quarantined with their error (see the module doc), and when the pipeline has a
        ``pass_rate_calculator`` one :class:`TaskFeedback` per training group it ran through
        (kept or dropped) for the explorer's task selectors. Synchronous: call it from a
        thread."""
        keep: dict[int, ExperienceGroup] = {}
        bad: dict[int, Exception] = {}
        feedback: dict[int, TaskFeedback] = {}
        for i, g in enumerate(groups):
            self.groups_in += 1
            if g.is_eval:
                continue
            try:
                if self.run_id is not None and g.run_id != self.run_id:
                    raise ValueError(f"ExperienceGroup.run_id: {g.run_id!r} is another run's "
                                     f"(this buffer serves {self.run_id!r})")
                check_tokens(g, self.vocab)
                n = len(g.experiences)
                out, rate = self.pipeline.run(g)
                if out is not None:
                    out.validate()  # what the pipeline computed (advantages) must be finite too
                    keep[i] = out
                if self.pipeline.feeds_back and g.task_index is not None:
                    feedback[i] = TaskFeedback(g.group_id, g.taskset, g.task_index, rate, n,
                                               len(out.experiences) if out is not None else 0)
            except Exception as e:  # one group's problem: it must not stop the others
                bad[i] = e
        results = []
        if keep and self.store is not None:
            try:
                results.append(self.store.put_groups(list(keep.values())))
            except _BAD_GROUP:  # find the group the store refuses, store the others
                for i, g in keep.items():
                    try:
                        results.append(self.store.put_groups([g]))
                    except _BAD_GROUP as e:
                        bad[i] = e
        added = sum(r.experiences for r in results)
        self.stored += added
        self.quarantined += len(bad)
        if self.mirror is not None:  # what was newly stored, with the store's own encoding
            self.mirror.put([pair for r in results for pair in r.stored])
        if added:
            self.arrived_threadsafe()
        for i, g in enumerate(groups):  # in ingest order: what was stored, what was dead-lettered
            error = f"{type(bad[i]).__name__}: {bad[i]}" if i in bad else None
            self.streak = self.streak.after(stored=i in keep and i not in bad, dead_letter=error)
            if error is not None:
                log.warning("quarantined", group_id=g.group_id, task_id=g.task_id, error=error)
        return added, bad, [f for i, f in feedback.items() if i not in bad]

    def arrived_threadsafe(self) -> None:
        """Set :attr:`arrived` on its loop, from the ingest's thread or the loop itself (none
        yet: no batch request has ever waited, so there is nobody to wake)."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.arrived.set)

    # -- batches ------------------------------------------------------------------------------

    def plan(self, n: int, trainer_version: int) -> BatchPlan:
        """What a batch of ``n`` for a trainer at ``trainer_version`` is made of."""
        return self.plan_fn(n, trainer_version, **self.args)

    async def batch(self, req: BatchRequest) -> BatchReply:
        """Answer one batch request (see the module doc)."""
        self.loop = asyncio.get_running_loop()
        if self.main_file is not None:
            exps = await asyncio.to_thread(self.main_file.batch, req.step, req.n)
            return BatchReply(req.step, [codec.encode(e) for e in exps], [1] * len(exps), req.n,
                              exhausted=len(exps) < req.n)
        assert self.store is not None
        plan = self.plan(req.n, req.trainer_version)
        usual, expert, floor = plan.usual, plan.expert, plan.min_model_version
        key = self._batch_key(req.step)
        taken = await asyncio.to_thread(self.store.take_batch_encoded, key, 0)  # a retake?
        if not taken and usual > 0:
            timeout = self.max_read_timeout if req.timeout is None else min(req.timeout, self.max_read_timeout)
            deadline = time.monotonic() + timeout
            while (self.store.count_available(floor) < usual and time.monotonic() < deadline
                   and not self.source_done):
                self.arrived.clear()  # set by the ingest once groups are stored
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), min(0.2, max(deadline - time.monotonic(), 0.0)))
            taken = await asyncio.to_thread(
                self.store.take_batch_encoded, key, usual, min_model_version=floor
            )
        items = [t.data for t in taken]
        counts = [t.use_count for t in taken]
        if expert:
            aux = next(iter(self.aux.values()))
            exps = await asyncio.to_thread(aux.batch, req.step, expert)
            if len(exps) < expert and not self._aux_used_up:  # its total_epochs are over
                self._aux_used_up = True
                log.warning("auxiliary_buffer_used_up", buffer=aux.cfg.name, step=req.step,
                            note="its total_epochs are used up: batches go on without its rows")
            items += [codec.encode(e) for e in exps]
            counts += [1] * len(exps)
        exhausted = self.source_done and self.store.count_available(floor) == 0
        if len(items) < req.n:
            log.info("partial_batch", step=req.step, got=len(items), wanted=req.n, exhausted=exhausted)
        return BatchReply(req.step, items, counts, req.n, exhausted=exhausted)

    def _batch_key(self, step: int) -> str:
        """The store's key of step ``step``'s batch: ``step-N``, or ``step-N.k`` after the
        trainer rolled back past committed batches (it restarted from an older checkpoint
        than the one they were committed with, or from none). A committed batch is gone
        for good, so the rolled-back trainer gets a fresh one under the next free key; the
        same key again if it crashes once more before committing (a retake)."""
        assert self.store is not None
        base = key = batch_key(step)
        k = 0
        while self.store.batch_committed(key):
            k += 1
            key = f"{base}.{k}"
        if k:
            log.info("trainer_rolled_back", step=step, batch=key)
        return key

    def commit(self, upto: int) -> list[str]:
        """Commit every pending batch of a step <= ``upto`` (the trainer checkpointed them)."""
        if self.store is None:
            return []
        done = []
        for key in self.store.pending_batches():
            if key.startswith("step-") and int(key[5:].split(".")[0]) <= upto:
                self.store.commit_batch(key)
                done.append(key)
        return done
