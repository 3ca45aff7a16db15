"""A sweep's shared process runs every run's role as a task of its own: one that fails is
logged and the others finish (real nats-server, real stage walk)."""

from __future__ import annotations

import asyncio

import bus
from schemas import keys
from schemas.config import TrinityConfig


def _cfg(tmp_path, name, nats_cfg) -> TrinityConfig:
    return TrinityConfig(project="t", name=name, mode="both", checkpoint_root_dir=str(tmp_path), nats=nats_cfg)


async def test_a_failing_run_leaves_the_others_running(tmp_path, nats_cfg):
    from roles.tools.sweep.host import run_one

    a, b = _cfg(tmp_path, "sweep-a", nats_cfg), _cfg(tmp_path, "sweep-b", nats_cfg)
    nc = await bus.connect(nats_cfg)
    js = bus.jetstream(nc, nats_cfg)
    for c in (a, b):
        await bus.delete_run(js, c.run_id)
    b_ran = asyncio.Event()

    async def broken(ctx):
        raise RuntimeError("run a's explorer broke")

    async def fine(ctx):
        await asyncio.sleep(0.5)  # still working when a fails
        b_ran.set()
        return True

    terminate = asyncio.Event()
    codes = await asyncio.gather(run_one("explorer", a, broken, terminate), run_one("explorer", b, fine, terminate))
    assert codes == [1, 0] and b_ran.is_set()
    done = {}
    for c in (a, b):
        state = await bus.RunState.open(js, c.run_id, nats_cfg.replicas)
        done[c.name] = bool(await state.get(keys.run_done("both")))
    assert done == {"sweep-a": False, "sweep-b": True}
    await nc.close()
