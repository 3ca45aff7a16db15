"""Writes a veRL FSDP checkpoint as veRL's FSDP2 trainer does: each rank ``torch.save``s the
``state_dict()`` of a model sharded with torch's ``fully_shard`` (DTensors, one dimension of a
CPU device mesh) as ``actor/model_world_size_W_rank_r.pt``. Run as a script (two gloo ranks)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, base: str, actor: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    dist.init_process_group("gloo", init_method=f"file://{actor}/.store", rank=rank, world_size=world)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():  # weights the base model does not have: the conversion must carry them
        for p in model.parameters():
            p.add_(0.01)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch.save(model.state_dict(), Path(actor) / f"model_world_size_{world}_rank_{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    base, actor = sys.argv[1], sys.argv[2]
    Path(actor).mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank, args=(2, base, actor), nprocs=2)
    (Path(actor) / ".store").unlink(missing_ok=True)
