"""Several explorer processes share one run through the task queue (``roles/explorer/queue.py``):
every task's group is stored once and trained once, whoever ran it; an explorer joins
mid-run and another is SIGKILLed mid-step (its tasks come back to the others); ``honcho start
-c explorer=2`` runs the Procfile with two; an explorer of another config is refused before
it takes a task."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bus
from roles.explorer.lease import JOIN_KEY, LEADER_KEY
from schemas.config import NatsConfig
from schemas.state import JoinSettings, Leader
from tests.explorer.helpers import read_groups
from tests.helpers import wait_for

from .helpers import ROOT, steps_log, tiny_run_config, trained_exactly_once, trinity

pytestmark = pytest.mark.slow

TASKS, BATCH, REPEAT = 48, 3, 4
STEPS = TASKS // BATCH
RUNNERS = 1  # explorer.runner_per_model in _config, one engine: the tasks an explorer runs at once
PLUGINS = {"TRINITY_PLUGIN_DIRS": str(Path(__file__).parent / "plugins")}


@pytest.fixture(scope="module")
def arith48(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.tiny import build_arithmetic_taskset

    return build_arithmetic_taskset(tmp_path_factory.mktemp("arith48"), n_train=TASKS, n_eval=6)


@pytest.fixture(scope="module")
def arith96(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twice the tasks, for the test whose explorers join one after the other: each must
    run tasks before the run ends, however fast this machine's steps are."""
    from storage.tiny import build_arithmetic_taskset

    return build_arithmetic_taskset(tmp_path_factory.mktemp("arith96"), n_train=2 * TASKS, n_eval=6)


def _ran_a_task(url: str, run_id: str, pid: int) -> bool:
    """Has explorer process ``pid`` run a task of the run yet (a notice on its done stream)?"""
    done = asyncio.run(read_groups(NatsConfig(url=url), run_id, expect=0, timeout=1.0, kind="done"))
    return any(_pid_of(d.explorer) == pid for d in done)


def _config(tmp_path: Path, model: Path, data: Path, url: str, **extra) -> Path:
    return tiny_run_config(tmp_path / "c.yaml", model=model, data=data, port=0, stages=False, extra={
        "nats.url": url, "nats.embedded": False, "nats.ack_wait": 5,
        "synchronizer.sync_method": "checkpoint", "explorer.runner_per_model": RUNNERS,
        "explorer.eval_on_startup": False,
        "buffer.explorer_input.default_workflow_type": "slow_math_workflow", **extra})


def _who_ran(url: str, run_id: str, tasks: int = TASKS) -> dict[tuple[int, int], str]:
    """``(step, index) -> explorer`` from the run's ``done`` stream (one notice per task)."""
    done = asyncio.run(read_groups(NatsConfig(url=url), run_id, expect=tasks, kind="done"))
    return {(d.step, d.index): d.explorer for d in done}


def _stored_once(url: str, run_id: str, tasks: int = TASKS, rerun_at_most: int = 0) -> None:
    """Every task's group is on the exp stream, once. ``rerun_at_most``: an explorer killed
    between publishing a group and acking its task has that task run again elsewhere, at a
    later model version, so the stream holds the group twice (another ``Nats-Msg-Id``); the
    buffer keeps the first (``trained_exactly_once`` checks that). At most one per task the
    killed explorer was running."""
    groups = asyncio.run(read_groups(NatsConfig(url=url), run_id, expect=tasks))
    ids = [g.group_id for g in groups]
    assert len(set(ids)) == tasks, f"{len(set(ids))} distinct groups, {tasks} tasks"
    assert len(ids) - tasks <= rerun_at_most, f"{len(ids)} groups for {tasks} tasks (at most {rerun_at_most} re-run)"


def _pid_of(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def test_an_explorer_joins_mid_run_and_another_is_killed_mid_step(tmp_path, tiny_model, arith96, nats_server_factory):
    tasks = 2 * TASKS
    server = nats_server_factory()
    # 1.5 s a task (sleep, no CPU): the run outlasts the late explorer's start under load
    cfg = _config(tmp_path, tiny_model, arith96, server.url, **{"buffer.explorer_input.taskset.workflow_args.delay": 1.5})
    job = tmp_path / "ckpt/t/r"
    log = tmp_path / "run.log"
    run = trinity("run", "--config", str(cfg), log=log, env_extra=PLUGINS)
    helpers: list[subprocess.Popen] = []
    try:
        wait_for("train step 1", lambda: any(e["step"] >= 1 for e in steps_log(job)), run, log=log)
        helpers.append(trinity("explorer", "--config", str(cfg), log=tmp_path / "a.log", env_extra=PLUGINS))
        # each joins before the next step of the test. The second starts once the first has run
        # a task, not later: a start took 54 s under the suite's load (imports), longer than
        # the 28 steps left after step 4, and the run ended before it joined (2026-11-28)
        wait_for("the first to join runs a task", lambda: _ran_a_task(server.url, "t.r", helpers[0].pid), run, log=log)
        launched = max(e["step"] for e in steps_log(job))
        helpers.append(trinity("explorer", "--config", str(cfg), log=tmp_path / "b.log", env_extra=PLUGINS))
        wait_for("the second to join runs a task", lambda: _ran_a_task(server.url, "t.r", helpers[1].pid), run, log=log)
        now = max(e["step"] for e in steps_log(job))
        wait_for(f"train step {now + 1}", lambda: any(e["step"] >= now + 1 for e in steps_log(job)), run, log=log)
        assert helpers[0].poll() is None, (tmp_path / "a.log").read_text()[-3000:]
        helpers[0].send_signal(signal.SIGKILL)  # mid-step: tasks are always running
        run.wait(timeout=600)
        for h in helpers[1:]:
            h.wait(timeout=120)
    finally:
        for p in [run, *helpers]:
            if p.poll() is None:
                p.kill()
    assert run.returncode == 0, log.read_text()[-4000:]
    assert helpers[1].returncode == 0, (tmp_path / "b.log").read_text()[-4000:]
    trained_exactly_once(job, tasks // BATCH, BATCH * REPEAT)
    _stored_once(server.url, "t.r", tasks, rerun_at_most=RUNNERS)
    ran = _who_ran(server.url, "t.r", tasks)
    assert len(ran) == tasks
    pids = {_pid_of(n) for n in ran.values()}
    assert helpers[0].pid in pids and helpers[1].pid in pids and len(pids) == 3, pids
    late = [s for (s, _), n in ran.items() if _pid_of(n) == helpers[1].pid]
    assert min(late) >= launched, f"the explorer started after train step {launched} ran tasks of steps before it"


def test_honcho_start_with_two_explorers(tmp_path, tiny_model, arith48):
    """The Procfile with ``-c explorer=2`` (its own NATS server, as on a node): both explorers
    take tasks, every process ends ``rc=0``, every group is trained once."""
    from bus.server import free_port

    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    cfg = _config(tmp_path, tiny_model, arith48, url, **{"nats.embedded": True})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    bin_dir = str(Path(sys.executable).parent)
    env.update(PATH=bin_dir + os.pathsep + env.get("PATH", ""), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               TRINITY_CONFIG=str(cfg), TRINITY_CHECKPOINT_ROOT_DIR=str(tmp_path / "ckpt"), TRINITY_NATS__URL=url,
               **PLUGINS)
    (tmp_path / ".env").write_text("")
    r = subprocess.run([os.path.join(bin_dir, "honcho"), "-f", str(ROOT / "Procfile"), "-d", str(tmp_path),
                        "start", "-c", "explorer=2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    rcs = re.findall(r"\| ([\w.]+) stopped \(rc=(-?\d+)\)", out)
    assert sorted(n for n, _ in rcs) == ["buffer.1", "explorer.1", "explorer.2", "nats.1", "synchronizer.1",
                                        "trainer.1"], out[-6000:]
    assert all(rc == "0" for _, rc in rcs), out[-6000:]
    trained_exactly_once(tmp_path / "ckpt/t/r", STEPS, BATCH * REPEAT)
    for who in ("explorer.1", "explorer.2"):  # each one published groups
        lines = [line for line in out.splitlines() if re.match(rf"\S+ {re.escape(who)}\s+\|", line)]
        done = [int(m.group(1)) for line in lines if (m := re.search(r"explorer_done .*published=(\d+)", line))]
        assert done and done[-1] > 0, f"{who} published nothing:\n" + "\n".join(lines[-30:])


async def _lead_elsewhere(url: str, run_id: str, fingerprint: dict) -> None:
    """Make the run look led by a live explorer of another host, with ``fingerprint``."""
    cfg = NatsConfig(url=url)
    nc = await bus.connect(cfg, name="fake-leader")
    try:
        js = bus.jetstream(nc, cfg)
        await bus.ensure_streams(js, cfg, run_id)
        state = await bus.RunState.open(js, run_id)
        await state.put(LEADER_KEY, Leader("explorer-elsewhere-1", 1, "elsewhere", time.time() + 3600))
        await state.put(JOIN_KEY, JoinSettings(fingerprint))
    finally:
        await nc.close()


def test_an_explorer_of_another_config_is_refused(tmp_path, tiny_model, arith48, nats_server_factory):
    from roles.explorer.lease import join_fingerprint
    from tests.explorer.helpers import load

    server = nats_server_factory()
    cfg = _config(tmp_path, tiny_model, arith48, server.url)
    theirs = join_fingerprint(load(cfg))
    theirs["model.model_path"] = "/models/another"
    asyncio.run(_lead_elsewhere(server.url, "t.r", theirs))
    p = trinity("explorer", "--config", str(cfg), env_extra=PLUGINS)
    out = p.communicate(timeout=300)[0].decode()
    assert p.returncode != 0
    assert f"model.model_path: this explorer has '{tiny_model}', the leading explorer of run t.r has " \
           "'/models/another'" in out, out[-3000:]
    assert asyncio.run(read_groups(NatsConfig(url=server.url), "t.r", expect=0, timeout=1)) == []
    assert asyncio.run(read_groups(NatsConfig(url=server.url), "t.r", expect=0, timeout=1, kind="done")) == []


async def _versions(url: str, run_id: str) -> dict[str, int]:
    cfg = NatsConfig(url=url)
    nc = await bus.connect(cfg, name="versions")
    try:
        state = await bus.RunState.open(bus.jetstream(nc, cfg), run_id)
        return {k.removeprefix("version."): v.version for k, v in (await state.with_prefix("version.")).items()}
    finally:
        await nc.close()


def test_an_explorer_joins_a_run_under_a_weight_broadcast(tmp_path, tiny_model, arith48, nats_server_factory):
    """``sync_method: nccl`` (gloo on CPU): the leader takes every broadcast; an explorer that
    joins mid-run pulls the trainer's weights over a group of its own before it runs tasks
    that need them. Every group is stored and trained once."""
    server = nats_server_factory()
    # 1.5 s a task (sleep, no CPU): the run outlasts the joining explorer's start under load (it
    # ran no task once in the suite: the run ended first, 2026-11-29)
    cfg = _config(tmp_path, tiny_model, arith48, server.url, **{
        "synchronizer.sync_method": "nccl", "buffer.explorer_input.taskset.workflow_args.delay": 1.5})
    job = tmp_path / "ckpt/t/r"
    log, helper_log = tmp_path / "run.log", tmp_path / "helper.log"
    run = trinity("run", "--config", str(cfg), log=log, env_extra=PLUGINS)
    helper = None
    try:
        wait_for("train step 1", lambda: any(e["step"] >= 1 for e in steps_log(job)), run, log=log)
        helper = trinity("explorer", "--config", str(cfg), log=helper_log, env_extra=PLUGINS)
        run.wait(timeout=600)
        helper.wait(timeout=120)
    finally:
        for p in (run, helper):
            if p is not None and p.poll() is None:
                p.kill()
    out, helper_out = log.read_text(), helper_log.read_text()
    assert run.returncode == 0, out[-4000:]
    assert helper.returncode == 0, helper_out[-4000:]
    try:
        trained_exactly_once(job, STEPS, BATCH * REPEAT)
    except AssertionError as e:  # a step trained short: say which wait ran out, and where
        notable = re.compile(r"warn|error|partial_batch|timed_out|helper_sync|weights_(sent|loaded)|\bstep\b")
        lines = [f"{who}: {line[:240]}" for who, text in (("run", out), ("helper", helper_out))
                 for line in text.splitlines()[-400:] if notable.search(line)]
        raise AssertionError(f"{e}\n" + "\n".join(lines)) from None
    _stored_once(server.url, "t.r")
    name = next(n for n in set(_who_ran(server.url, "t.r").values()) if _pid_of(n) == helper.pid)
    pulled = [int(re.search(r"version=(\d+)", line).group(1)) for line in helper_out.splitlines()
              if "weights_loaded" in line and "method=nccl" in line]
    assert pulled and pulled[0] >= 1, helper_out[-4000:]  # its first task already ran on trained weights
    assert re.search(rf"weights_sent\s.*explorer={re.escape(name)}", out), out[-4000:]
    assert asyncio.run(_versions(server.url, "t.r"))[name] == pulled[-1]
