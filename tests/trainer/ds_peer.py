"""One rank of the DeepSpeed engine test: ``python -m tests.trainer.ds_peer MODEL STAGE OUT``
(RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* in the environment). Trains two steps on this rank's
share of a fixed batch and writes a checksum of every parameter."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch


def main(model_dir: str, stage: int, out: str) -> None:
    from ops.algorithms import resolve
    from roles.trainer.deepspeed_engine import DeepSpeedEngine
    from roles.trainer.engine import load_model
    from roles.trainer.step import StepRunner
    from schemas.config import OptimizerConfig
    from schemas.data import Experience

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = load_model(model_dir)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    eng = DeepSpeedEngine(model, OptimizerConfig(lr=1e-2), total_steps=4, grad_clip=1.0, zero_stage=stage)
    runner = StepRunner(eng, resolve("grpo", kl_loss_fn="none"), max_token_len=40)
    rng = np.random.default_rng(rank)
    metrics = []
    for step in (1, 2):
        exps = [Experience(id=f"{rank}/{step}/{i}", task_id="t", group_id="g", run_id="r",
                           tokens=rng.integers(4, 60, 12, dtype=np.int32), prompt_length=4,
                           action_mask=np.ones(8, bool), reward=float(i % 2),
                           advantages=np.full(8, 1.0 if i % 2 else -1.0, np.float32)) for i in range(4)]
        metrics.append(runner.run(exps, step))
    after = dict(eng.named_tensors())
    moved = max(float((after[k].float().cpu() - before[k].float()).abs().max()) for k in after)
    sums = {k: float(v.double().sum()) for k, v in after.items()}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"world": world, "moved": moved, "sums": sums, "grad_norm": metrics[-1]["grad_norm"],
                   "micro_batches": metrics[-1]["micro_batches"]}, f)
    eng.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
