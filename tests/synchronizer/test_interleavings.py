"""The weight sync's interleavings, scripted against a real nats-server: the real trainer and
explorer clients (``roles/weightsync/client.py``) over the real KV records and a real gloo
broadcast, each event put where a whole run only reaches it by chance.

What stands in: the trainer's model is a few named tensors (:class:`Weights`), an engine a real
:class:`WeightReceiver` keeping what it receives (:class:`Engine`); the protocol under test
does not look inside either. An explorer "killed" mid-sync is a real process, SIGKILLed.

Each test says what went wrong before in whole runs; each asserts by events (the version
loaded, no ``sync_timeout`` logged), with ``asyncio.wait_for`` as a hang guard only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
import torch

import bus
from roles.weightsync.client import ExplorerSyncClient, TrainerSyncClient
from roles.weightsync.weights import WeightReceiver
from schemas import keys
from schemas.config import NatsConfig, TrinityConfig
from schemas.state import Formed, Offer, Rendezvous

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: sync_timeout: each scripted event must resolve well inside it (a timeout is the failure)
TIMEOUT = 30.0
#: the hang guard of a test's waits
GUARD = 2 * TIMEOUT


class Weights:
    """The trainer's side: its step and the tensors it sends (each filled with the step)."""

    def __init__(self) -> None:
        self.step = 0
        self.tensors = {"layer.w": torch.zeros(8, 4), "layer.b": torch.zeros(4)}

    def train(self) -> None:
        self.step += 1
        for t in self.tensors.values():
            t.fill_(float(self.step))

    def sync_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.tensors.items())


class Engine:
    """An engine's side of a broadcast: one rank, what it received last."""

    tensor_parallel_size = 1

    def __init__(self) -> None:
        self.version = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self._rx: WeightReceiver | None = None

    async def init_weight_group(self, rdv: dict[str, Any], rank_offset: int, timeout: float) -> None:
        rx = WeightReceiver(Rendezvous.from_dict(rdv), rank_offset, timeout)
        await asyncio.to_thread(rx.connect)
        self._rx = rx

    async def receive_weights(self) -> int:
        assert self._rx is not None
        self.version, named = await asyncio.to_thread(self._rx.receive)
        self.tensors = dict(named)
        return self.version

    def holds(self, version: int) -> bool:
        return self.version == version and all(bool((t == version).all()) for t in self.tensors.values())


def _cfg(nats_cfg: NatsConfig, run_id: str) -> TrinityConfig:
    project, name = run_id.split(".", 1)
    return TrinityConfig(project=project, name=name, nats=nats_cfg,
                         synchronizer={"sync_method": "nccl", "sync_interval": 1, "sync_timeout": TIMEOUT})


async def _side(cfg: TrinityConfig, cls: type, name: str) -> Any:
    """A client of ``cls`` on its own connection (as in its own process)."""
    nc = await bus.connect(cfg.nats, name=name)
    js = bus.jetstream(nc, cfg.nats)
    await bus.ensure_streams(js, cfg.nats, cfg.run_id)
    state = await bus.RunState.open(js, cfg.run_id)
    return cls(cfg, nc, state, bus.Publisher(nc, cfg.nats, cfg.run_id))


async def _trainer_at_version_1(cfg: TrinityConfig) -> tuple[TrainerSyncClient, Weights]:
    """A trainer side that started (a predecessor's offer and rendezvous cleared) and holds
    version 1 (one step trained, or a checkpoint of it loaded)."""
    trainer = await _side(cfg, TrainerSyncClient, "trainer")
    weights = Weights()
    weights.train()
    await trainer.start()
    return trainer, weights


async def _close(*sides: Any) -> None:
    for s in sides:
        await s.nc.close()


def _said(p: subprocess.Popen, what: bytes) -> None:
    """Return once process ``p`` printed the line ``what`` (its log lines go by)."""
    for line in p.stdout:
        if line.strip() == what:
            return
    raise AssertionError(f"the process ended (rc {p.wait()}) without saying {what!r}")


def _timeouts(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] in ("sync_timeout", "helper_sync_failed")]


def _path(logs: list[dict[str, Any]], machine: str) -> list[str]:
    """The moves ``machine`` (``roles/weightsync/states.py``) took, as ``move->state``."""
    return [f"{e['move']}->{e['after']}" for e in logs if e["event"] == "sync_state" and e["machine"] == machine]


# --------------------------------------------------------------------------------------------

JOIN_AND_HANG = """
import asyncio, sys
import bus
from roles.weightsync.weights import WeightReceiver
from schemas.config import NatsConfig

async def main(url, run_id, group):
    cfg = NatsConfig(url=url)
    nc = await bus.connect(cfg, name="doomed-explorer")
    state = await bus.RunState.open(bus.jetstream(nc, cfg), run_id)
    rdv = await state.wait_rendezvous(group, 60)
    rx = WeightReceiver(rdv, 1, 60)
    await asyncio.to_thread(rx.connect)
    print("joined", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_an_explorer_killed_between_offer_and_join_is_replaced_without_a_timeout(nats_cfg, run_id):
    """The trainer offers version 1; an explorer joins its broadcast group and is SIGKILLed
    before it says it takes the offer. Its restarted successor must not join the dead one's
    group (it would wait ``sync_timeout``): it says hello, the trainer drops the group and sends
    version 1 over a fresh one. (Both sides waited out ``sync_timeout`` before the hello.)"""
    cfg = _cfg(nats_cfg, run_id)
    trainer, weights = await _trainer_at_version_1(cfg)
    with structlog.testing.capture_logs() as logs:
        offering = asyncio.create_task(trainer.after_step(1, weights))
        doomed = subprocess.Popen([sys.executable, "-c", JOIN_AND_HANG, nats_cfg.url, run_id, cfg.synchronizer.group_name],
                                  cwd=ROOT, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            await asyncio.wait_for(asyncio.to_thread(_said, doomed, b"joined"), GUARD)
            formed = await trainer.state.wait(lambda: trainer.state.get(keys.SYNC_FORMED), GUARD)
            assert isinstance(formed, Formed)  # the group is complete: the trainer waits for the join
        finally:
            doomed.send_signal(signal.SIGKILL)
            doomed.wait()
        explorer = await _side(cfg, ExplorerSyncClient, "explorer")
        engine = Engine()
        version = await asyncio.wait_for(explorer.before_step(1, [engine]), GUARD)
        await asyncio.wait_for(offering, GUARD)
    assert version == 1 and engine.holds(1)
    assert any(e["event"] == "explorer_hello" for e in logs), logs
    assert _path(logs, "trainer") == ["form->forming", "connected->formed", "hello->none",
                                      "form->forming", "connected->formed"]
    assert _path(logs, "explorer") == ["hello->asked", "joined->joined"]
    assert not _timeouts(logs), _timeouts(logs)
    await _close(trainer, explorer)


async def test_a_stale_rendezvous_is_not_joined(nats_cfg, run_id):
    """A previous trainer's records are left in KV (its offer, rendezvous and formed group, at a
    port nobody listens on). An explorer that starts must not join that group; a new trainer
    clears them at start, answers the explorer's hello while it waits for a batch, and the
    explorer takes version 1 over a fresh group."""
    cfg = _cfg(nats_cfg, run_id)
    explorer = await _side(cfg, ExplorerSyncClient, "explorer")
    old = time.time() - 3600
    group = cfg.synchronizer.group_name
    await explorer.state.put(keys.SYNC_OFFER, Offer(1, "nccl", 1, old))
    await explorer.state.set_rendezvous(Rendezvous(old, "127.0.0.1", 9, 2, "gloo", group))
    await explorer.state.put(keys.SYNC_FORMED, Formed("127.0.0.1:9", old))
    engine = Engine()
    with structlog.testing.capture_logs() as logs:
        loading = asyncio.create_task(explorer.before_step(1, [engine]))
        hello = await explorer.state.wait(lambda: explorer.state.get(keys.SYNC_HELLO), GUARD)
        assert hello is not None and not loading.done()  # it asked instead of joining port 9
        trainer, weights = await _trainer_at_version_1(cfg)  # a restarted one, from a checkpoint
        while not loading.done():  # what the trainer does while it waits for a batch
            await trainer.serve_explorers(weights)
            await asyncio.sleep(0.2)
        version = await asyncio.wait_for(loading, GUARD)
    assert version == 1 and engine.holds(1)
    assert _path(logs, "explorer") == ["hello->asked", "joined->joined"]
    assert _path(logs, "trainer") == ["form->forming", "connected->formed"]
    assert not _timeouts(logs), _timeouts(logs)
    await _close(trainer, explorer)


async def test_a_helper_that_joins_mid_sync_gets_a_group_of_its_own(nats_cfg, run_id):
    """The trainer offers version 1 and waits for the leading explorer; meanwhile an explorer
    that does not lead joins the run and pulls. The trainer answers the pull over the helper's
    own group while it waits, and then serves the leader over the leader's group: neither
    waits for the other, and the helper's group never touches the leader's."""
    cfg = _cfg(nats_cfg, run_id)
    trainer, weights = await _trainer_at_version_1(cfg)
    with structlog.testing.capture_logs() as logs:
        offering = asyncio.create_task(trainer.after_step(1, weights))
        await trainer.state.wait(lambda: trainer.state.get(keys.SYNC_OFFER), GUARD)
        helper = await _side(cfg, ExplorerSyncClient, "helper")
        helper.assist("explorer-helper")
        helper_engine = Engine()
        assert await asyncio.wait_for(helper.catch_up([helper_engine], 1), GUARD) == 1
        assert not offering.done()  # the leader has not joined yet
        leader = await _side(cfg, ExplorerSyncClient, "leader")
        leader_engine = Engine()
        assert await asyncio.wait_for(leader.before_step(1, [leader_engine]), GUARD) == 1
        await asyncio.wait_for(offering, GUARD)
    assert helper_engine.holds(1) and leader_engine.holds(1)
    assert set(trainer.weights.helpers) == {"explorer-helper"}
    assert trainer.weights.helpers["explorer-helper"][0] is not trainer.weights.sender
    assert _path(logs, "helper") == ["joined->joined"]
    assert _path(logs, "explorer") == ["joined->joined"]
    assert _path(logs, "trainer") == ["form->forming", "connected->formed"]
    assert not _timeouts(logs), _timeouts(logs)
    await _close(trainer, helper, leader)


async def test_a_pull_lost_with_its_trainer_is_served_by_the_next(nats_cfg, run_id):
    """A helper pulls; the trainer that would have answered dies before it reads the pull. The
    restarted trainer knows nothing of it (its count of pulls starts at 0), yet its first look
    at ``sync.pulls`` finds the pull and answers it: the helper gets the weights within its wait,
    not after ``sync_timeout`` and a second pull."""
    cfg = _cfg(nats_cfg, run_id)
    helper = await _side(cfg, ExplorerSyncClient, "helper")
    helper.assist("explorer-helper")
    engine = Engine()
    with structlog.testing.capture_logs() as logs:
        pulling = asyncio.create_task(helper.catch_up([engine], 1))
        await helper.state.wait(lambda: helper.state.get(keys.SYNC_PULL_PREFIX + "explorer-helper"), GUARD)
        trainer, weights = await _trainer_at_version_1(cfg)  # the restarted one
        await asyncio.wait_for(trainer.weights.serve_pulls(weights), GUARD)
        assert await asyncio.wait_for(pulling, GUARD) == 1
    assert engine.holds(1)
    assert not _timeouts(logs), _timeouts(logs)
    await _close(trainer, helper)
