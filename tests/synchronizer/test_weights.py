"""Weight transport over gloo between two real processes: bit-exact, bucketed or not."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from bus.server import free_port
from roles.weightsync.weights import WeightReceiver, WeightSender, plan_buckets
from schemas.state import Rendezvous


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(64, 32, generator=g)
    return [
        ("embed.weight", torch.randn(50, 16, generator=g)),
        ("layer.0.w", big[:, :16].t()),  # non-contiguous view: must arrive as its values
        ("layer.0.b", torch.randn(7, generator=g)),
        ("norm.bf16", torch.randn(9, generator=g).to(torch.bfloat16)),
        ("count", torch.arange(5, dtype=torch.int64)),
        ("scalar", torch.tensor(3.5)),
    ]


def _receiver(rdv: dict, rank: int, q) -> None:
    r = WeightReceiver(Rendezvous.from_dict(rdv), rank, timeout=60)
    r.connect()
    for _ in range(2):
        version, named = r.receive()
        # raw bytes through the queue: shared tensor storage dies with this process
        q.put((version, [(n, str(t.dtype), list(t.shape), _raw(t)) for n, t in named]))


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_broadcast_to_two_receivers_is_bit_exact():
    """Version 7 goes tensor by tensor, version 8 in 1 MB buckets; both arrive bit for bit."""
    rdv = Rendezvous(0.0, "127.0.0.1", free_port(), 3, "gloo", "test")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(rdv.to_dict(), r, q)) for r in (1, 2)]
    sender = WeightSender(rdv, timeout=60)
    for p in procs:
        p.start()
    try:
        sender.connect()
        for version, bucket_bytes in ((7, 0), (8, 1 << 20)):
            sender.send(_tensors(), version, bucket_bytes=bucket_bytes)
        got = [q.get(timeout=60) for _ in range(4)]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert sorted(v for v, _ in got) == [7, 7, 8, 8]
    for _, named in got:
        assert [n for n, *_ in named] == [n for n, _ in _tensors()]
        for (_, dtype, shape, raw), (_, b) in zip(named, _tensors(), strict=True):
            assert dtype == str(b.dtype) and shape == list(b.shape)
            assert raw == _raw(b)  # bit for bit


def test_bucket_plan_groups_same_dtype_up_to_size():
    meta = [
        ("a", "float32", [4]),
        ("b", "float32", [4]),
        ("c", "bfloat16", [4]),
        ("d", "float32", [100]),
    ]
    assert plan_buckets(meta, 0) == [[0], [1], [2], [3]]
    assert plan_buckets(meta, 32) == [[0, 1], [2], [3]]
    assert plan_buckets(meta, 10_000) == [[0, 1], [2], [3]]


def test_receiver_rank_is_checked():
    with pytest.raises(ValueError, match="rank 0"):
        WeightReceiver(Rendezvous(0.0, "127.0.0.1", 1, 2, "gloo", "test"), 0)
