"""Crashes a run must survive: the embedded nats-server killed mid-run (``trinity run``
starts it again on the same store; the roles reconnect without using up their restarts)."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from bus.server import free_port
from tests.helpers import wait_for

from .helpers import nats_server_pid, role_pid, running, steps_log, tiny_run_config
from .test_run_e2e import _trained_exactly_once

pytestmark = pytest.mark.slow


def test_run_survives_a_killed_nats_server(tmp_path, tiny_model, arith):
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(),
                          stages=False)
    job, store = tmp_path / "ckpt/t/r", tmp_path / "ckpt/nats"
    log = tmp_path / "run.log"
    with running("run", "--config", str(cfg), log=log) as p:
        wait_for("train step 2", lambda: any(e["step"] >= 2 for e in steps_log(job)), p, log=log)
        first = nats_server_pid(store)
        assert first is not None, "no embedded nats-server found"
        os.kill(first, signal.SIGKILL)
        wait_for("a new nats-server", lambda: nats_server_pid(store) not in (None, first), p, log=log)
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert "nats-server exited with -9; restart 1/2" in text
    for role in ("buffer", "synchronizer", "trainer", "explorer"):
        assert f"{role} exited with" not in text, f"{role} was restarted: {text[-4000:]}"
    _trained_exactly_once(job)


def test_roles_ride_out_a_server_gone_for_a_minute(tmp_path, tiny_model, arith,
                                                   nats_server_factory):
    """An external server (an operator's) is down for 60 s mid-run: every KV round trip,
    publish and request waits it out; no role dies, none is restarted."""
    server = nats_server_factory()
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=server.port,
                          stages=False)
    job, log = tmp_path / "ckpt/t/r", tmp_path / "run.log"
    with running("run", "--config", str(cfg), log=log) as p:
        wait_for("train step 2", lambda: any(e["step"] >= 2 for e in steps_log(job)), p, log=log)
        server.proc.kill()
        server.proc.wait()
        time.sleep(60)
        assert p.poll() is None, log.read_text()[-4000:]
        server.proc = None
        server.start()
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert "restart" not in text and "Traceback" not in text, text[-4000:]
    _trained_exactly_once(job)


def stalls(log: str) -> list[str]:
    """The waits that ran out in a run's ``log``: a weight sync that hit ``sync_timeout``, a
    request nobody answered in time, a rendezvous never set. Why not the wall time since a kill:
    a busy machine (the suite's parallel workers) slows a restart without any wait running out."""
    return [line for line in log.splitlines()
            if any(w in line for w in ("sync_timeout", "no reply on", "not set within"))]


def test_a_trainer_that_rolled_back_resumes_without_a_sync_stall(tmp_path, tiny_model, arith):
    """The trainer restarts with no checkpoint (step 0) while the explorer is steps ahead and
    the batches it trained are committed (never served again). Before, the explorer waited
    for a version the trainer could not reach without new experience, and the trainer
    waited for that experience: one step per sync_timeout. Now the explorer sees the
    trainer is behind by more than a sync interval and goes on (loading what it offers)."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(),
                          stages=False, extra={"trainer.save_interval": 2,
                                               "synchronizer.sync_timeout": 60})
    job, log = tmp_path / "ckpt/t/r", tmp_path / "run.log"
    with running("run", "--config", str(cfg), log=log) as p:
        wait_for("train step 4", lambda: any(e["step"] >= 4 for e in steps_log(job)), p, log=log)
        victim = steps_log(job)[-1]["pid"]
        os.kill(victim, signal.SIGSTOP)  # hold it while its checkpoints disappear
        for d in job.glob("global_step_*"):
            shutil.rmtree(d)
        for f in job.glob("latest_*"):
            f.unlink()
        os.kill(victim, signal.SIGKILL)
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert "trainer exited with -9; restart 1/2" in text
    after = [e for e in steps_log(job) if e["pid"] != victim]
    assert after and after[0]["step"] == 1, "the restarted trainer did not start from step 0"
    # no wait ran out anywhere after the rollback (sync_timeout is 60 s)
    assert not stalls(text.split("trainer exited with -9")[-1]), text[-4000:]
    ids = [i for e in after for i in e["ids"]]
    assert len(ids) == len(set(ids)), "the restarted trainer trained an experience twice"


@pytest.mark.parametrize("role", ["explorer", "trainer", "buffer", "synchronizer"])
def test_a_killed_role_costs_seconds_not_a_sync_timeout(tmp_path, tiny_model, arith, role):
    """Before, a restarted explorer joined the broadcast group of its dead predecessor, and a
    restarted trainer offered weights the explorer neither held nor wanted yet: either way
    both sides waited for sync_timeout. Now the explorer says hello and the trainer answers
    with a fresh group (also while it waits for a batch), and the explorer takes the
    trainer's newest weights on the way to the version it needs. A buffer killed while it
    served a batch request cost the request's timeout; the trainer now asks again once the
    buffer's heartbeat shows a new process."""
    _kill_mid_run(tmp_path, tiny_model, arith, role, {"synchronizer.sync_timeout": 120})


@pytest.mark.parametrize("role", ["trainer", "explorer"])
def test_colocated_memory_sync_trains_and_a_killed_side_costs_seconds(tmp_path, tiny_model, arith, role):
    """``mode: colocate`` on CPU with ``sync_method: memory`` (its default there): a killed
    trainer takes its memory files with it (the explorer's load of its last offer fails at
    once, reported, and the restarted trainer offers afresh); a restarted explorer loads the
    trainer's current offer."""
    text = _kill_mid_run(tmp_path, tiny_model, arith, role,
                         {"synchronizer.sync_timeout": 120, "synchronizer.sync_method": "memory", "mode": "colocate"})
    assert "method=memory" in text and "method=nccl" not in text, text[-4000:]


def _kill_mid_run(tmp_path, tiny_model, arith, role: str, extra: dict) -> str:
    """SIGKILL ``role`` after train step 3 of a run with ``extra`` settings: the run ends well,
    no wait ran out after the kill, every experience trained once. The run's log."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(),
                          stages=False, extra=extra)
    job, log = tmp_path / "ckpt/t/r", tmp_path / "run.log"
    with running("run", "--config", str(cfg), log=log) as p:
        wait_for("train step 3", lambda: any(e["step"] >= 3 for e in steps_log(job)), p, log=log)
        victim = role_pid(role, cfg)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert f"{role} exited with -9; restart 1/2" in text
    # (a sync the kill interrupts fails at once, "connection reset": that is no stall)
    assert not stalls(text.split(f"{role} exited with -9")[-1]), text[-4000:]
    # the restarted role counts its peers' "done" from the session's start, not its own: they
    # may have finished before it came back (it waited FINISH_WAIT for them before)
    assert "exit_without_them" not in text, text[-4000:]
    _trained_exactly_once(job)
    return text


FAILING_LOSS = '''
"""A policy loss with a bug that shows once, mid-run: a KeyError at train step 3."""
from pathlib import Path

from ops.policy_losses import ppo_policy_loss
from ops.registry import register


@register("policy_loss_fn", "ppo_failing_once")
def ppo_failing_once(logprob, old_logprob, advantages, action_mask, *, ref_logprob=None, expert_mask=None,
                     global_step=0, clip_range=0.2):
    mark = Path(__file__).with_name("failed_once")
    if global_step == 3 and not mark.exists():
        mark.touch()
        raise KeyError("version")
    return ppo_policy_loss(logprob, old_logprob, advantages, action_mask, ref_logprob=ref_logprob,
                           expert_mask=expert_mask, global_step=global_step, clip_range=clip_range)
'''

#: What a hand-made ``nats kv put`` or another program might leave in a key: no JSON, the
#: wrong shape, a field of the wrong type.
JUNK = (b"\xff not json", b"{}", b'{"version": "7", "ts": "now"}', b"[1, 2]")


async def _spoil_every_key(url: str, run_id: str) -> list[str]:
    """Overwrite every key of the run's bucket with junk, once; the keys spoiled."""
    import bus
    from schemas.config import NatsConfig

    cfg = NatsConfig(url=url)
    nc = await bus.connect(cfg, name="spoiler")
    try:
        state = await bus.RunState.open(bus.jetstream(nc, cfg), run_id)
        spoiled = await state.keys()
        for i, key in enumerate(spoiled):
            await state.kv.put(key, JUNK[i % len(JUNK)])
        return spoiled
    finally:
        await nc.close()


def test_junk_in_every_kv_key_is_skipped_and_a_role_that_raises_is_restarted(tmp_path, tiny_model, arith):
    """The error taxonomy in one live run (one run, as each costs a minute of the suite).

    At train step 2 every KV key of the run is overwritten with junk: each reader logs the key
    and field and reads it as absent until the key's next write; no role dies of it (a
    malformed value once raised a KeyError that ended the run as a "config error"). A spoiled
    offer costs at most one sync_timeout (each side waits for the other's record, then goes
    on), so the test sets it short. At step 3 a user's policy loss raises a KeyError, once: no
    config error either: the trainer logs its traceback and exits 1, ``trinity run`` restarts
    it, it resumes from its last checkpoint. The run exits 0, every step trained once."""
    import asyncio

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "failing_loss.py").write_text(FAILING_LOSS)
    port = free_port()
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=port, stages=False,
                          extra={"synchronizer.sync_timeout": 20, "algorithm.policy_loss_fn": "ppo_failing_once"})
    job, log = tmp_path / "ckpt/t/r", tmp_path / "run.log"
    with running("run", "--config", str(cfg), log=log, env_extra={"TRINITY_PLUGIN_DIRS": str(plugins)}) as p:
        wait_for("train step 2", lambda: any(e["step"] >= 2 for e in steps_log(job)), p, log=log)
        spoiled = asyncio.run(_spoil_every_key(f"nats://127.0.0.1:{port}", "t.r"))
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    for key in ("sync.offer", "version.trainer", "explorer.leader", "heartbeat.buffer"):
        assert key in spoiled, spoiled
    assert "kv_malformed" in text, text[-4000:]
    assert (plugins / "failed_once").exists(), "the loss never failed: the test proves nothing"
    assert "trainer exited with 1; restart 1/2" in text, text[-4000:]
    assert "KeyError: 'version'" in text, text[-4000:]
    for role in ("buffer", "synchronizer", "explorer"):
        assert f"{role} exited with" not in text, f"{role} was restarted: {text[-4000:]}"
    _trained_exactly_once(job)
