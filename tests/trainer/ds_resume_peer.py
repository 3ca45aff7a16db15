"""One process of the DeepSpeed resume test: ``python -m tests.trainer.ds_resume_peer CONFIG
OUT first|resumed``. ``first`` trains steps 1-2, checkpoints, trains step 3; ``resumed`` is
a new trainer that resumes from that checkpoint and trains step 3 on the same batch. Each
writes its parameters after step 3 and the step's metrics. Under a launcher's ``RANK`` and
``WORLD_SIZE`` every rank does so on its own data (files suffixed ``_rank<r>``)."""

from __future__ import annotations

import json
import os
import sys

import torch


def main(config: str, out: str, mode: str) -> None:
    from roles.trainer.main import Trainer
    from tests.explorer.helpers import load
    from tests.trainer.helpers import groups

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

    def batch(step: int) -> list:  # each rank its own data, as data parallelism gives it
        return [e for g in groups("t.ds", step * 2 + 100 * rank, 2, size=4) for e in g.experiences]

    tr = Trainer(load(config))
    if mode == "first":
        for step in (1, 2):
            tr.train(batch(step), step)
        tr.save(final=False)
    assert tr.step == 2, tr.step
    metrics = tr.train(batch(3), 3)
    params = {k: v.detach().float().cpu() for k, v in tr.engine.named_tensors()}
    tag = mode if world == 1 else f"{mode}_rank{rank}"
    torch.save(params, f"{out}/{tag}.pt")
    with open(f"{out}/{tag}.json", "w") as f:
        json.dump({k: metrics[k] for k in ("loss", "grad_norm", "lr")}, f)
    tr.engine.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
