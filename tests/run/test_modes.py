"""The modes as the seeds' guide defines them, through real ``trinity run`` processes: a
``train`` run and an ``explore`` run side by side on one job (``sync_method: checkpoint``:
the explorer loads the trainer's checkpoints as they appear), then ``bench`` over that job's
checkpoints (every one, or only the newest with ``bench_on_latest_checkpoint``)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from roles.explorer.checkpoint_watch import newest_weights
from storage import checkpoints as ckpt

from .helpers import tiny_run_config, trained_exactly_once, trinity

pytestmark = pytest.mark.slow

PLUGINS = {"TRINITY_PLUGIN_DIRS": str(Path(__file__).parent / "plugins")}
# 24 train rows / batch 3 = 8 steps of 3 groups x 4 experiences
STEPS, PER_STEP = 8, 12


def _config(path: Path, model: Path, data: Path, url: str, mode: str, **extra) -> Path:
    return tiny_run_config(path, model=model, data=data, port=0, stages=False, extra={
        "mode": mode, "nats.url": url, "nats.embedded": False,
        "synchronizer.sync_method": "checkpoint", "synchronizer.sync_interval": 1,
        # rollout-bound steps (0.3 s a task, one at a time): the trainer keeps up, so the
        # explorer finds its checkpoints while it still explores
        "explorer.runner_per_model": 1, "explorer.eval_interval": 0,
        "buffer.explorer_input.default_workflow_type": "slow_math_workflow", **extra})


def _records(job: Path, kind: str) -> list[dict]:
    f = job / "monitor" / "metrics.jsonl"
    return [r for r in map(json.loads, f.read_text().splitlines()) if r["kind"] == kind]


def test_train_and_explore_side_by_side_then_bench_over_the_checkpoints(tmp_path, tiny_model, arith, nats_server):
    url = nats_server.url
    train = _config(tmp_path / "train.yaml", tiny_model, arith, url, "train")
    explore = _config(tmp_path / "explore.yaml", tiny_model, arith, url, "explore")
    job = tmp_path / "ckpt" / "t" / "r"
    train_log, explore_log = tmp_path / "train.log", tmp_path / "explore.log"
    # the train run first: a run that finds no job folder clears the run's old bus state
    t = trinity("run", "--config", str(train), log=train_log, env_extra=PLUGINS)
    deadline = time.monotonic() + 120
    while not (job / "log").exists():
        assert t.poll() is None and time.monotonic() < deadline, train_log.read_text()[-3000:]
        time.sleep(0.2)
    e = trinity("run", "--config", str(explore), log=explore_log, env_extra=PLUGINS)
    try:
        assert e.wait(600) == 0, explore_log.read_text()[-4000:]
        assert t.wait(600) == 0, train_log.read_text()[-4000:]
    finally:
        for p in (t, e):
            if p.poll() is None:
                p.kill()
    text_t, text_e = train_log.read_text(), explore_log.read_text()
    # the train run ran the buffer and the trainer, the explore run the explorer alone
    assert "trinity run: trainer finished" in text_t and "trinity run: buffer finished" in text_t
    assert "explorer" not in {line.split("|")[0].strip() for line in text_t.splitlines() if "|" in line}
    assert "trinity run: explorer finished" in text_e and "buffer" not in text_e.split("trinity run: explorer")[0]
    # every experience the explorer made was trained exactly once, by the other run's trainer
    trained_exactly_once(job, STEPS, PER_STEP)
    # the explorer loaded the trainer's checkpoints while it explored: later rollouts ran on
    # trained weights (it never waited for them: versions may skip)
    assert "checkpoint_loaded" in text_e, text_e[-3000:]
    versions = [int(r["values"]["model_version"]) for r in _records(job, "rollout")]
    assert versions[0] == 0 and max(versions) >= 1, versions
    assert versions == sorted(versions)

    # bench over the job's checkpoints: the model, then every checkpoint with HF weights
    with_weights = [s for s in ckpt.list_steps(job) if ckpt.hf_weights_complete(ckpt.hf_dir(job, s))]
    assert with_weights and with_weights[-1] == STEPS and newest_weights(job)[0] == STEPS
    before = len(_records(job, "eval"))
    bench = _config(tmp_path / "bench.yaml", tiny_model, arith, url, "bench")
    p = trinity("run", "--config", str(bench), log=tmp_path / "bench.log", env_extra=PLUGINS)
    assert p.wait(600) == 0, (tmp_path / "bench.log").read_text()[-4000:]
    evals = _records(job, "eval")[before:]
    assert [r["step"] for r in evals] == [0, *with_weights]
    assert [int(r["values"]["model_version"]) for r in evals] == [0, *with_weights]
    assert evals[-1]["values"].get("final")

    # only the newest, on a copy of the job under another name (a finished bench is not rerun)
    shutil.copytree(job, tmp_path / "ckpt" / "t" / "r2")
    (tmp_path / "ckpt" / "t" / "r2" / "monitor" / "metrics.jsonl").unlink()
    p = trinity("run", "--config", str(bench), "--set", "name=r2", "--set", "explorer.bench_on_latest_checkpoint=true",
                log=tmp_path / "bench2.log", env_extra=PLUGINS)
    assert p.wait(600) == 0, (tmp_path / "bench2.log").read_text()[-4000:]
    assert [r["step"] for r in _records(tmp_path / "ckpt" / "t" / "r2", "eval")] == [STEPS]
