"""Weight transport: trainer rank 0 broadcasts named tensors to every rollout engine worker.

One torch.distributed group joins the trainer (rank 0) and each engine's workers (ranks 1..N):
NCCL on GPU, gloo on CPU. The group is created once per run from a rendezvous address the
trainer publishes in the run's KV bucket, and reused for every sync.

Why not ``init_process_group``: a vLLM worker already owns the default group (its tensor
parallel group), so both sides build a standalone group from a ``TCPStore``. Why not NATS:
weights are hundreds of MB to GB; JetStream moves ~200 MB/s here, a broadcast several GB/s.

Protocol of one sync (no control round trip per tensor): rank 0 broadcasts a fixed-size
header (length of the metadata), then the metadata (a :class:`schemas.data.WeightsHeader`
through the codec: version, names, dtypes, shapes, bucket size), then the tensors bucket by bucket. A bucket is either one tensor sent as it is or
several same-dtype tensors copied into one flat buffer (faster on NCCL; on CPU per-tensor
broadcast measured faster, so gloo defaults to no bucketing). Tensors are always copied into
contiguous memory before sending: never a view into a sharded (ZeRO) parameter.

Pitfall from NOTES.md: the receiver must follow the sender's names (tied weights make the two
sides' parameter lists differ), so the metadata, not the receiver's model, drives receiving.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

import torch
import torch.distributed as dist

from schemas import codec
from schemas.data import WeightsHeader
from schemas.state import Rendezvous

HEADER_NUMEL = 1  # int64: byte length of the encoded WeightsHeader


def _group(
    store: dist.Store, rank: int, world_size: int, backend: str, timeout: float
) -> dist.ProcessGroup:
    """A standalone process group over ``store`` (does not touch the default group)."""
    td = datetime.timedelta(seconds=timeout)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, td)
    if backend == "nccl":  # GPU nodes; exercised only by the GPU tests
        _check_own_gpu(store, rank, world_size, td)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = td
        return dist.ProcessGroupNCCL(store, rank, world_size, opts)
    raise ValueError(f"weight sync backend {backend!r}: expected 'gloo' or 'nccl'")


def _check_own_gpu(
    store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta
) -> None:
    """Raise, naming the ranks and the way out, if another rank of the group is on this
    rank's GPU. NCCL refuses that ("Duplicate GPU detected"), but only inside the first
    broadcast, as an "invalid usage" error that says nothing of trainer or engines; a
    trainer and a vLLM engine sharing one GPU is the usual way to get there (seen on a
    one-GPU H100 node). Each rank posts its GPU's UUID in the rendezvous store and reads
    the others'."""
    mine = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    store.set(f"gpu_uuid/{rank}", mine)
    keys = [f"gpu_uuid/{r}" for r in range(world_size)]
    store.wait(keys, timeout)
    shared = [r for r in range(world_size) if r != rank and store.get(keys[r]).decode() == mine]
    if shared:
        raise RuntimeError(
            f"weight sync over nccl: rank {rank} shares GPU {mine} with rank(s) {shared} "
            f"(rank 0 is the trainer, the others rollout engine workers). NCCL needs each "
            f"rank of the group on its own GPU: give the trainer and the explorer different "
            f"GPUs (CUDA_VISIBLE_DEVICES), or set synchronizer.sync_method: checkpoint"
        )


def _device(backend: str) -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )


def plan_buckets(meta: list[tuple[str, str, list[int]]], bucket_bytes: int) -> list[list[int]]:
    """Group consecutive same-dtype tensors into buckets of at most ``bucket_bytes``.

    ``bucket_bytes <= 0`` means one tensor per bucket. Pure, so both sides compute the same
    plan from the metadata alone.
    """
    buckets: list[list[int]] = []
    size = 0
    for i, (_, dtype, shape) in enumerate(meta):
        nbytes = _numel(shape) * _itemsize(dtype)
        if (
            bucket_bytes > 0
            and buckets
            and meta[buckets[-1][0]][1] == dtype
            and size + nbytes <= bucket_bytes
        ):
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


class WeightSender:
    """Rank 0 (the trainer). ``connect()`` blocks until every engine worker has joined."""

    def __init__(self, rdv: Rendezvous, timeout: float = 600.0) -> None:
        self.rdv = rdv
        self.timeout = timeout
        self.store = dist.TCPStore(
            rdv.host,
            rdv.port,
            rdv.world_size,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )
        self.pg: dist.ProcessGroup | None = None

    def connect(self) -> None:
        self.pg = _group(self.store, 0, self.rdv.world_size, self.rdv.backend, self.timeout)

    def send(
        self, named: Iterable[tuple[str, torch.Tensor]], version: int, bucket_bytes: int = 0
    ) -> int:
        """Broadcast ``named`` tensors as model ``version``; returns bytes sent."""
        if self.pg is None:
            raise RuntimeError("WeightSender.send before connect()")
        dev = _device(self.rdv.backend)
        tensors = [(n, t.detach()) for n, t in named]
        meta = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in tensors]
        body = codec.encode(WeightsHeader(int(version), [m[0] for m in meta], [m[1] for m in meta],
                                          [m[2] for m in meta], max(int(bucket_bytes), 0)))
        self.pg.broadcast(torch.tensor([len(body)], dtype=torch.int64, device=dev), 0).wait()
        self.pg.broadcast(torch.frombuffer(bytearray(body), dtype=torch.uint8).to(dev), 0).wait()
        sent = 0
        for bucket in plan_buckets(meta, bucket_bytes):
            if len(bucket) == 1:
                buf = tensors[bucket[0]][1].to(dev).contiguous()  # sent synchronously
            else:
                buf = torch.cat([tensors[i][1].to(dev).reshape(-1) for i in bucket])
            self.pg.broadcast(buf, 0).wait()
            sent += buf.numel() * buf.element_size()
        return sent


class WeightReceiver:
    """One engine worker (rank >= 1). ``receive()`` returns (version, named tensors)."""

    def __init__(self, rdv: Rendezvous, rank: int, timeout: float = 600.0) -> None:
        if not 0 < rank < rdv.world_size:
            raise ValueError(f"weight receiver rank {rank}: expected 1..{rdv.world_size - 1}")
        self.rdv = rdv
        self.rank = rank
        self.timeout = timeout
        self.pg: dist.ProcessGroup | None = None

    def connect(self) -> None:
        store = dist.TCPStore(
            self.rdv.host,
            self.rdv.port,
            self.rdv.world_size,
            is_master=False,
            timeout=datetime.timedelta(seconds=self.timeout),
        )
        self.pg = _group(store, self.rank, self.rdv.world_size, self.rdv.backend, self.timeout)

    def receive(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        if self.pg is None:
            raise RuntimeError("WeightReceiver.receive before connect()")
        dev = _device(self.rdv.backend)
        n = torch.zeros(1, dtype=torch.int64, device=dev)
        self.pg.broadcast(n, 0).wait()
        raw = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
        self.pg.broadcast(raw, 0).wait()
        head = codec.decode(bytes(raw.cpu().numpy()), WeightsHeader)
        meta = list(zip(head.names, head.dtypes, head.shapes, strict=True))
        out: list[tuple[str, torch.Tensor]] = []
        for bucket in plan_buckets(meta, head.bucket_bytes):
            dtype = getattr(torch, meta[bucket[0]][1])
            numels = [_numel(meta[i][2]) for i in bucket]
            buf = torch.empty(sum(numels), dtype=dtype, device=dev)
            self.pg.broadcast(buf, 0).wait()
            offset = 0
            for i, k in zip(bucket, numels, strict=True):
                out.append((meta[i][0], buf[offset : offset + k].view(meta[i][2])))
                offset += k
        return head.version, out
