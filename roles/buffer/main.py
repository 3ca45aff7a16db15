"""``trinity buffer``: the buffer process loop.

Two concurrent jobs on one connection: a durable consumer that moves experience groups from
the bus into the replay store (ack after commit), and two request/reply endpoints the trainer
calls (``batch``, ``commit``). It runs until SIGTERM/SIGINT or a ``stop`` control message.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import nats
import structlog

import bus
from bus.rpc import Message
from roles.runtime.config import algorithm_spec
from roles.runtime.role import HEARTBEAT_S, RoleContext
from roles.runtime.verdicts import RunFailed, streak_limit
from schemas import codec, keys
from schemas.config import ExperienceBufferConfig, TrinityConfig
from schemas.data import ExperienceGroup, Metric
from schemas.rpc import BATCH_RPC, COMMIT_RPC, BatchRequest, Commit
from storage.replay import ReplayStore

from .files import FileBuffer
from .pipeline import Pipeline
from .service import BufferService, vocab_size

log = structlog.get_logger(__name__)


def build_service(cfg: TrinityConfig) -> BufferService:
    """The service a config describes: replay store (``storage_type: queue``) or a file
    dataset as the main trainer input, auxiliary file buffers, pipeline, sample strategy."""

    spec = algorithm_spec(cfg)
    eb = cfg.buffer.trainer_input.experience_buffer
    job = cfg.checkpoint_job_dir
    n = cfg.buffer.train_batch_size  # resolved by schemas/derive.py
    tokenizer = None

    def tok() -> Any:
        nonlocal tokenizer
        if tokenizer is None:
            from transformers import AutoTokenizer

            if not cfg.model.model_path:
                raise ValueError("model.model_path: needed to tokenize file buffers")
            tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_path)
        return tokenizer

    store = main_file = mirror = None
    max_len = cfg.model.max_model_len
    if eb is not None and eb.storage_type == "file":
        kind = "dpo" if spec.schema == "dpo" else "sft"
        main_file = FileBuffer(eb, tok(), batch_size=n, kind=kind,
                               total_epochs=eb.total_epochs or cfg.buffer.total_epochs, max_length=max_len)
    else:
        eb = eb or ExperienceBufferConfig(name="experience_buffer")
        store = ReplayStore.from_config(eb, os.path.join(job, "buffer", eb.name or "experience_buffer"))
        if eb.path and "://" in eb.path:  # storage_type sql, or a queue's database URL
            from storage.sql import SqlMirror

            mirror = SqlMirror(eb.path, store)
    aux = {
        name: FileBuffer(b, tok(), batch_size=n, kind="sft", total_epochs=b.total_epochs or 10**6,
                         max_length=max_len)
        for name, b in cfg.buffer.trainer_input.auxiliary_buffers.items()
    }
    pipeline = Pipeline.from_config(cfg.data_processor.experience_pipeline.operators, spec)
    return BufferService(
        store, pipeline, main_file=main_file, aux=aux, sample_strategy=spec.sample_strategy,
        sample_args=spec.sample_strategy_args,
        max_read_timeout=(eb.max_read_timeout if eb is not None else 1800.0),
        vocab=vocab_size(cfg.model.model_path), run_id=cfg.run_id, mirror=mirror,
    )


async def drained(consumer: bus.Consumer, state: bus.RunState) -> bool:
    """The explorer finished (its flag is set only after every publish was acked) and this
    consumer has nothing pending or unacked: every group it will ever get is ingested."""
    if not await state.get(keys.EXPLORER_FINISHED):
        return False
    info = await consumer.info()
    return info.num_pending == 0 and info.num_ack_pending == 0


#: Seconds between two rounds of :func:`tidy` (forgetting used-up records, trimming streams).
#: Why this often: what arrives between two trims rides on top of ``stream_keep`` in the
#: streams and in nats-server's block caches (its heap, measured with pprof): a minute at the
#: quickstart's pace (2.7 steps/s) was 2,600 experiences, 12 MB; ten seconds hold a sixth of
#: that. A round is ~30 API calls.
TIDY_S = 10.0
#: Groups forgotten per write transaction (the ingest waits for each): a round takes as many
#: as arrived since the last (~450 in the quickstart), one at most this many at a time.
FORGET_BATCH = 1000


async def tidy(cfg: TrinityConfig, service: BufferService, js: Any, state: bus.RunState) -> None:
    """Keep a long run flat: the replay store forgets used-up groups beyond
    ``keep_used_groups``, the run's streams drop what every consumer acknowledged beyond
    ``nats.stream_keep`` (from ``done`` and ``feedback``, nothing the leading explorer's cursor
    has yet to read)."""

    keep = (cfg.buffer.trainer_input.experience_buffer or ExperienceBufferConfig()).keep_used_groups
    forgotten = 0
    while service.store is not None:  # short transactions, until a round's worth is done
        n = await asyncio.to_thread(service.store.forget, keep, limit=FORGET_BATCH)
        forgotten += n
        if n < FORGET_BATCH:
            break
    cursor = await state.get(keys.EXPLORER_CURSOR)
    if cursor is None:  # no leader has started yet: it will read both from the start
        readers = {"done": 0, "feedback": 0}
    else:  # None: this leader does not read that stream
        readers = {kind: seq - 1 for kind, seq in (("done", cursor.done_from), ("feedback", cursor.feedback_from)) if seq}
    try:
        purged = await bus.trim_streams(js, cfg.run_id, cfg.nats.stream_keep, readers)
    except (bus.BusError, nats.errors.Error, asyncio.TimeoutError, OSError) as e:
        # best effort: a trim missed (a server restarting) is made up by the next round
        log.warning("trim_skipped", error=f"{type(e).__name__}: {e}")
        purged = {}
    if forgotten or purged:
        log.info("tidied", forgotten_groups=forgotten, purged=purged)


async def run_buffer(ctx: RoleContext) -> bool:
    """Serve until ``ctx.stop`` (set by the stage walker: SIGTERM, or the stage done); True:
    the buffer has no work of its own that could be left unfinished."""
    service = await asyncio.to_thread(build_service, ctx.cfg)  # tokenizer loads must not stall the loop
    try:
        ctx.beat.as_("buffer")
        await _serve(ctx, service)
    finally:
        if service.mirror is not None:
            await asyncio.to_thread(service.mirror.close)
        if service.store is not None:
            service.store.close()
    return True


async def _serve(ctx: RoleContext, service: BufferService) -> None:
    """The buffer's loop over its bus: the batch RPCs, the experience consumer, tidying and
    metrics until ``ctx.stop``."""
    cfg, nc, js, pub, state, stop, beat, log = ctx.cfg, ctx.nc, ctx.js, ctx.pub, ctx.state, ctx.stop, ctx.beat, ctx.log
    names = bus.names(cfg.run_id)

    async def on_batch(m: Message) -> bytes:
        req = codec.decode(m.data, BatchRequest)
        reply = await service.batch(req)
        log.info("batch_served", step=req.step, n=len(reply.items), wanted=req.n)
        return codec.encode(reply)

    async def on_commit(m: Message) -> bytes:
        req = codec.decode(m.data, Commit)
        done = await asyncio.to_thread(service.commit, req.upto)
        log.info("batches_committed", upto=req.upto, batches=len(done))
        return codec.encode(req)  # the acknowledgement: every step up to req.upto is committed

    subs = [await bus.serve(nc, names.rpc(BATCH_RPC), on_batch),
            await bus.serve(nc, names.rpc(COMMIT_RPC), on_commit)]
    consumer = None
    if service.store is not None:
        consumer = await bus.Consumer(nc, cfg.nats, cfg.run_id, "exp", "buffer", expect=ExperienceGroup).start()
    log.info("buffer_started", run=cfg.run_id, main="file" if service.main_file else "replay")
    last_report, last_tidy = 0.0, time.monotonic()
    try:
        while not stop.is_set():
            if consumer is None:
                await asyncio.sleep(0.5)
            else:
                items = await consumer.fetch(timeout=0.5)
                if items:
                    added, bad, feedback = await asyncio.to_thread(service.ingest, [d.obj for d in items])
                    for i, error in bad.items():  # to the dead-letter stream, never retried
                        await consumer.dead_letter(items[i].msgs, error)
                    # before the acks: a buffer killed in between re-sends them (same ids: dropped)
                    await asyncio.gather(*(pub.publish(f, "feedback") for f in feedback))
                    await consumer.ack([d for i, d in enumerate(items) if i not in bad])
                    log.debug("ingested", groups=len(items), experiences=added)
                    # a step's worth dead-lettered for one reason: every next group would be too
                    cause = service.streak.cause(streak_limit(cfg.buffer.batch_size))
                    if cause is not None:
                        raise RunFailed(cause)
                elif not service.source_done and await drained(consumer, state):
                    service.source_done = True
                    log.info("explorer_finished_and_drained", stored=service.stored)
            if time.monotonic() - last_tidy > TIDY_S:
                last_tidy = time.monotonic()
                await tidy(cfg, service, js, state)
            if time.monotonic() - last_report > HEARTBEAT_S:
                last_report = time.monotonic()
                ready = service.store.count_ready() if service.store is not None else 0
                beat.says(stored=service.stored, ready=ready)
                await pub.publish_event(Metric(role="buffer", step=0, kind="buffer", values={
                    "stored": float(service.stored), "ready": float(ready), "groups_in": float(service.groups_in),
                    "quarantined": float(service.quarantined),
                    "dead_letters": float(consumer.dead_letters if consumer else 0),
                    **{f"dropped/{k}": float(v) for k, v in service.pipeline.dropped.items()},
                    **service.pipeline.take_advantage_means(),
                    **(service.mirror.metrics() if service.mirror is not None else {})}))
    finally:
        for s in subs:
            await s.unsubscribe()
        if consumer is not None:
            await consumer.close()
