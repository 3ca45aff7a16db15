"""One rank of the NCCL weight-sync test: ``python -m tests.trainer.nccl_peer RANK PORT OUT``.

Rank 0 (the trainer) broadcasts a few tensors as version 1; rank 1 (an engine worker)
receives them. Each rank takes GPU ``rank % device_count``: its own GPU when there are two,
the same one when there is one. Each writes what it sent or received to ``OUT/rank<r>.pt``,
or the error it stopped with to ``OUT/error<r>.txt``."""

from __future__ import annotations

import sys

import torch


def main(rank: int, port: int, out: str) -> None:
    from roles.weightsync.weights import WeightReceiver, WeightSender
    from schemas.state import Rendezvous

    torch.cuda.set_device(rank % torch.cuda.device_count())
    rdv = Rendezvous(0.0, "127.0.0.1", port, 2, "nccl", "nccl-peer")
    try:
        if rank == 0:
            g = torch.Generator().manual_seed(0)
            named = [("embed.weight", torch.randn(1000, 64, generator=g).to(torch.bfloat16)),
                     ("norm.weight", torch.randn(64, generator=g))]
            side = WeightSender(rdv, timeout=60)
            side.connect()
            side.send([(n, t.cuda()) for n, t in named], 1)
            torch.save({"version": 1, **dict(named)}, f"{out}/rank0.pt")
        else:
            side = WeightReceiver(rdv, rank, timeout=60)
            side.connect()
            version, named = side.receive()
            torch.cuda.synchronize()
            torch.save({"version": version, **{n: t.cpu() for n, t in named}}, f"{out}/rank1.pt")
    except Exception as e:
        with open(f"{out}/error{rank}.txt", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
