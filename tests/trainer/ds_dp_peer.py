"""One process of the data-parallel trainer test: ``python -m tests.trainer.ds_dp_peer CONFIG
OUT``. Rank 0 (or a lone process) leads: it trains three batches, checkpoints through the
followers, gathers the weights and stops them; other ranks follow. The leader writes the
weights and every step's metrics to ``OUT/world<N>.pt`` / ``.json``."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch


def batch(step: int) -> list:
    """Three groups of four, one experience eight times as long as the others: the split by
    tokens gives the rank with it fewer rows, so (one row per micro-batch) fewer
    micro-batches, and it runs weightless ones to keep up."""
    from tests.trainer.helpers import groups

    exps = [e for g in groups("t.dp", step * 3, 3, size=4, seed=7) for e in g.experiences]
    long = exps[1]
    long.tokens = np.concatenate([long.tokens] + [long.tokens[long.prompt_length:]] * 7)
    n = len(long.tokens) - long.prompt_length
    long.action_mask, long.logprobs = np.ones(n, bool), np.full(n, -3.0, np.float32)
    for e in exps[::5]:  # the policy's own log-probs for these: a collective forward under ZeRO-3
        e.logprobs = None
    return exps


def main(config: str, out: str) -> None:
    from roles.trainer.main import Trainer
    from tests.explorer.helpers import load

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tr = Trainer(load(config))
    if tr.dp is not None and not tr.dp.leader:
        assert tr.follow() is True
        tr.engine.close()
        return
    metrics = [tr.train(batch(step), step) for step in (1, 2, 3)]
    tr.save(final=False)
    params = {k: v.detach().float().cpu().clone() for k, v in tr.weights()}
    if tr.dp is not None:
        tr.stop_followers(True)
    torch.save(params, f"{out}/world{world}.pt")
    with open(f"{out}/world{world}.json", "w") as f:
        json.dump(metrics, f)
    tr.engine.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
