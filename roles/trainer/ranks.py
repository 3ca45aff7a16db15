"""Several trainer processes: data parallelism under ``torchrun`` or the DeepSpeed launcher.

Why one leader: the trainer's bus conversation (batch requests, commits, metrics, KV, the
sync client) stays one conversation, as with one process. Rank 0 holds it and tells the other
ranks what to do over a gloo group of their own: the Trainer's collective methods (train this
batch, save, gather the weights) and stop. Every rank gets the whole batch and trains on its
share of the rows (:func:`shard_rows`); DeepSpeed averages the gradients across ranks.

Why every rank runs the same number of micro-batches (:meth:`DataParallel.max`): ZeRO-2 and
ZeRO-3 reduce gradients (ZeRO-3 also gathers parameters) inside every backward/forward, so
a rank with one micro-batch fewer would leave the others waiting forever. The short ones run
extra micro-batches with weight zero.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# Followers wait on the leader while it waits for data, which may take long in a slow run. A
# leader that dies closes its sockets, which fails the followers' wait at once; this bound is
# only for a leader that hangs.
CONTROL_TIMEOUT = timedelta(days=7)

STOP = "stop"


def shard_rows(lengths: Sequence[int], rank: int, world: int, pair: bool = False,
               balance: bool = True) -> list[int]:
    """The rows of a batch this rank trains on, in batch order (pure: every rank computes the
    same split). With ``balance`` (``trainer.balance_batch``) rows go largest first to the
    rank with the fewest tokens so far, so ranks finish their micro-batches at about the same
    time; without, each rank takes a contiguous block of rows. ``pair`` keeps rows 2k and
    2k+1 on one rank (DPO's chosen and rejected). A rank gets nothing when there are fewer
    rows than ranks."""
    unit = 2 if pair else 1
    units = [list(range(i, min(i + unit, len(lengths)))) for i in range(0, len(lengths), unit)]
    if not balance:
        per, extra = divmod(len(units), world)
        start = rank * per + min(rank, extra)
        return [i for u in units[start:start + per + (rank < extra)] for i in u]
    loads = [0] * world
    mine: list[int] = []
    for u in sorted(units, key=lambda u: -sum(lengths[i] for i in u)):  # stable: ties keep order
        r = min(range(world), key=lambda i: (loads[i], i))
        loads[r] += sum(lengths[i] for i in u)
        if r == rank:
            mine += u
    return sorted(mine)


class DataParallel:
    """The trainer ranks' control group (gloo, also on GPU: commands and metrics are small
    Python objects on the CPU) and the few collectives a step needs."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError("several trainer processes need torch.distributed (the DeepSpeed engine starts it)")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def command(self, name: str, *args: Any) -> None:
        """Leader: tell every follower to call ``name(*args)``."""
        dist.broadcast_object_list([(name, args)], src=0, group=self.group)

    def receive(self) -> tuple[str, tuple]:
        """Follower: wait for the leader's next command."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def max(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor added up (rows each rank filled, zeros elsewhere: the whole)."""
        out = t.detach().cpu().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out.to(t.device)

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out


def exec_ranks(n: int, argv: Sequence[str]) -> None:
    """Replace this process by ``torchrun`` running ``n`` trainer processes with ``argv``
    (``trainer --config ...``). Why exec: the process keeps its pid, so the supervisor's and
    honcho's signals reach torchrun, which passes them on to every rank. Each rank then has
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and inherits ``CUDA_VISIBLE_DEVICES``, which the
    launcher already narrowed to the trainer's GPUs (``roles/runtime/placement.py``): rank i uses
    the i-th of them."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", "roles.cli", *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(sys.executable, cmd, dict(os.environ))
