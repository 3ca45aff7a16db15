"""The buffer role in-process against a real nats-server and LMDB: batches by request/reply,
partial batches after ``max_read_timeout``, exact retake of an uncommitted step, commit,
SFT file buffers and the ``mix`` strategy with an auxiliary SFT dataset."""

from __future__ import annotations

import asyncio
import json

import pytest

import bus
from roles.buffer.main import run_buffer
from roles.runtime.role import connected_context
from roles.trainer.main import fetch_batch
from schemas import codec
from schemas.config import TrinityConfig
from schemas.derive import derive
from schemas.rpc import BATCH_RPC, COMMIT_RPC, BatchRequest, Commit, experiences

from .helpers import groups


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from storage.tiny import build_tokenizer

    d = tmp_path_factory.mktemp("tok")
    build_tokenizer().save_pretrained(d)
    return d


def _sft_rows(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"{i}+1=?", "response": str(i + 1)}) + "\n")
    return path


def _cfg(tmp_path, nats_cfg, run_id, **kw) -> TrinityConfig:
    project, name = run_id.split(".", 1)
    # generous connect limits: a loaded CI machine can stall a connect for seconds
    nats = nats_cfg.model_copy(update={"connect_timeout": 10.0, "connect_wait": 30.0})
    base = dict(project=project, name=name, checkpoint_root_dir=str(tmp_path / "ckpt"), nats=nats)
    base.update(kw)
    cfg = TrinityConfig(**base)
    derive(cfg, {}, [])  # what the loader resolves for the roles (buffer.train_batch_size, ...)
    return cfg


async def _buffer(cfg, stop):
    async with connected_context(cfg, "buffer", stop) as ctx:
        return await run_buffer(ctx)


async def _with_buffer(cfg, body):
    stop = asyncio.Event()
    task = asyncio.create_task(_buffer(cfg, stop))
    nc = await bus.connect(cfg.nats, name="test-trainer")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 300  # the buffer loads a tokenizer first; slow on a busy machine
        while True:  # until the rpc endpoints answer
            try:
                await bus.request(nc, bus.names(cfg.run_id).rpc(COMMIT_RPC), codec.encode(Commit(0)), timeout=1)
                break
            except (bus.NoResponders, bus.RequestTimeout):
                if task.done() or loop.time() > deadline:
                    await task  # raises the buffer's error, if any
                    raise AssertionError("the buffer never answered") from None
                await asyncio.sleep(0.2)
        return await body(nc)
    finally:
        stop.set()
        await task
        await nc.close()


async def test_partial_batch_retake_and_commit(tmp_path, nats_cfg, run_id):
    cfg = _cfg(tmp_path, nats_cfg, run_id, algorithm={"algorithm_type": "grpo", "repeat_times": 4},
               buffer={"trainer_input": {"experience_buffer": {"name": "exp", "max_read_timeout": 1.0}}})

    async def body(nc):
        pub = bus.Publisher(nc, cfg.nats, cfg.run_id)
        for g in groups(cfg.run_id, 0, 1):
            await pub.publish_group(g)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first = await fetch_batch(nc, cfg.run_id, 1, 8, 0, 1.0)
        assert first.partial and len(first.items) == 4 and loop.time() - t0 >= 0.9
        exps = experiences(first)
        assert all(e.advantages is not None for e in exps)  # grpo advantages computed in the buffer
        again = await fetch_batch(nc, cfg.run_id, 1, 8, 0, 1.0)
        assert [e.id for e in experiences(again)] == [e.id for e in exps]
        await bus.request(nc, bus.names(cfg.run_id).rpc(COMMIT_RPC), codec.encode(Commit(1)), timeout=5)
        # asked again after the commit (a trainer that rolled back past it): a fresh batch,
        # of which none is ready yet, never the committed one
        assert (await fetch_batch(nc, cfg.run_id, 1, 8, 0, 1.0)).items == []
        for g in groups(cfg.run_id, 1, 2):
            await pub.publish_group(g)
        # a malformed request is refused with an error naming the record and field, and the
        # buffer goes on serving: nothing it holds is lost
        bad = codec.encode(BatchRequest(2, 8)).replace(b"\xa1n\x08", b"\xa1n\xa1x")
        with pytest.raises(bus.RemoteError, match="BatchRequest.n: expected int, got str"):
            await bus.request(nc, bus.names(cfg.run_id).rpc(BATCH_RPC), bad, timeout=5)
        with pytest.raises(bus.RemoteError, match="expected a Commit, got a BatchRequest"):
            await bus.request(nc, bus.names(cfg.run_id).rpc(COMMIT_RPC), codec.encode(BatchRequest(2, 8)), timeout=5)
        second = await fetch_batch(nc, cfg.run_id, 2, 8, 1, 5.0)
        assert not second.partial and {e.group_id for e in experiences(second)} == {"g1", "g2"}

    await _with_buffer(cfg, body)


async def test_sft_file_buffer_serves_fixed_slices(tmp_path, nats_cfg, run_id, tokenizer_dir):
    data = _sft_rows(tmp_path / "sft.jsonl", 6)
    cfg = _cfg(tmp_path, nats_cfg, run_id, model={"model_path": str(tokenizer_dir)},
               algorithm={"algorithm_type": "sft"},
               buffer={"train_batch_size": 2, "trainer_input": {"experience_buffer": {
                   "name": "sft", "storage_type": "file", "path": str(data),
                   "format": {"prompt_type": "plaintext", "prompt_key": "prompt", "response_key": "response"}}}})

    async def body(nc):
        b1 = experiences(await fetch_batch(nc, cfg.run_id, 1, 2, 0, 1.0))
        b2 = experiences(await fetch_batch(nc, cfg.run_id, 2, 2, 0, 1.0))
        assert [e.id for e in b1] == ["sft/0/0", "sft/0/1"] and [e.id for e in b2] == ["sft/0/2", "sft/0/3"]
        e = b1[0]
        assert e.response_length >= 1 and e.action_mask.all() and e.info["is_expert"]
        assert [x.id for x in experiences(await fetch_batch(nc, cfg.run_id, 1, 2, 0, 1.0))] == ["sft/0/0", "sft/0/1"]

    await _with_buffer(cfg, body)


async def test_mix_strategy_takes_expert_share_from_auxiliary_buffer(tmp_path, nats_cfg, run_id, tokenizer_dir):
    data = _sft_rows(tmp_path / "sft.jsonl", 8)
    cfg = _cfg(tmp_path, nats_cfg, run_id, model={"model_path": str(tokenizer_dir)},
               algorithm={"algorithm_type": "mix_chord", "repeat_times": 4,
                          "sample_strategy_args": {"expert_data_ratio": 0.5}},
               buffer={"trainer_input": {
                   "experience_buffer": {"name": "exp", "max_read_timeout": 5},
                   "auxiliary_buffers": {"sft_dataset": {
                       "name": "sft_dataset", "storage_type": "file", "path": str(data),
                       "format": {"prompt_type": "plaintext"}}}}})

    async def body(nc):
        pub = bus.Publisher(nc, cfg.nats, cfg.run_id)
        await pub.publish_group(groups(cfg.run_id, 0, 1)[0])
        exps = experiences(await fetch_batch(nc, cfg.run_id, 1, 8, 0, 5.0))
        expert = [e for e in exps if e.info.get("is_expert")]
        assert len(exps) == 8 and len(expert) == 4 and {e.group_id for e in exps if e not in expert} == {"g0"}

    await _with_buffer(cfg, body)


def test_a_file_buffers_own_total_epochs_bounds_its_rows(tmp_path, tokenizer_dir):
    """``total_epochs`` of a file buffer (Trinity-RFT's mix examples set it on their SFT
    dataset): the experience buffer's replaces ``buffer.total_epochs``; an auxiliary buffer
    without one repeats for as long as the trainer trains."""
    from roles.buffer.main import build_service

    data = _sft_rows(tmp_path / "sft.jsonl", 3)
    fmt = {"prompt_type": "plaintext", "prompt_key": "prompt", "response_key": "response"}

    def service(**eb):
        cfg = _cfg(tmp_path, TrinityConfig().nats, "p.r", model={"model_path": str(tokenizer_dir)},
                   algorithm={"algorithm_type": "mix_chord", "repeat_times": 2},
                   buffer={"train_batch_size": 2, "trainer_input": {
                       "experience_buffer": {"name": "exp"},
                       "auxiliary_buffers": {"sft_dataset": {"name": "sft_dataset", "storage_type": "file",
                                                             "path": str(data), "format": fmt, **eb}}}})
        return build_service(cfg).aux["sft_dataset"]

    assert len(service().batch(50, 2)) == 2  # no total_epochs: it goes on
    used_up = service(total_epochs=2)  # 6 rows in all: 3 steps of 2
    assert [len(used_up.batch(s, 2)) for s in (3, 4)] == [2, 0]
    sft = _cfg(tmp_path, TrinityConfig().nats, "p.s", model={"model_path": str(tokenizer_dir)},
               algorithm={"algorithm_type": "sft"},
               buffer={"train_batch_size": 2, "trainer_input": {"experience_buffer": {
                   "name": "sft", "storage_type": "file", "path": str(data), "format": fmt, "total_epochs": 2}}})
    main = build_service(sft).main_file
    assert [len(main.batch(s, 2)) for s in (3, 4)] == [2, 0]


def test_ingest_quarantines_each_bad_group_and_stores_the_others(tmp_path):
    """A group the pipeline makes invalid (NaN advantages), or with a token id past the
    vocabulary, comes back with its error; the good groups of the same fetch are stored."""
    import dataclasses

    import numpy as np

    from roles.buffer.pipeline import Pipeline
    from roles.buffer.service import BufferService
    from storage.replay import ReplayStore
    from tests.conftest import make_group

    def nan_advantages(g):
        if g.group_id != "nan":
            return g
        exps = [dataclasses.replace(e, advantages=np.full(e.response_length, np.nan, np.float32))
                for e in g.experiences]
        return dataclasses.replace(g, experiences=exps)

    pipeline = Pipeline(operators=[("nan", nan_advantages)])
    with ReplayStore(tmp_path / "r") as store:
        service = BufferService(store, pipeline, vocab=200_000)
        groups = [make_group(group_id=gid, n=2, tokens=16, prompt=4) for gid in ("ok", "nan", "vocab")]
        groups[2].experiences[1].tokens = groups[2].experiences[1].tokens.copy()
        groups[2].experiences[1].tokens[3] = 10**6
        added, bad, _ = service.ingest(groups)
        assert added == 2 and sorted(bad) == [1, 2]
        assert "experiences[0].advantages: holds NaN" in str(bad[1])
        assert "experiences[1].tokens: token id 1000000 is past the model's vocabulary" in str(bad[2])
        assert service.quarantined == 2 and store.count_ready() == 2
