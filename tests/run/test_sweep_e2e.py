"""``trinity sweep`` end to end: three LoRA runs through real processes (an embedded
nats-server, each run's buffer and synchronizer, one shared trainer and one shared explorer),
the shared trainer and then the shared explorer SIGKILLed mid-run. Every run finishes, trained on exactly its own
experience, each once; each sync moved its run's adapter alone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from bus.server import free_port
from roles.runtime.monitor import read_metrics
from tests.helpers import wait_for
from tests.studio.browser import Browser, find_chromium

from .helpers import (
    ROOT,
    running,
    steps_log,
    sweep_host_pid,
    tiny_run_config,
    trained_exactly_once,
    trinity,
)

pytestmark = pytest.mark.slow

STEPS, PER_STEP = 8, 12  # 24 train rows / batch 3, groups of 4
LORA = {"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"}
LRS = ("1e-4", "1e-3", "3e-3")


def test_a_sweep_shares_one_trainer_and_engine_and_survives_killed_hosts(tmp_path, tiny_model, arith):
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), name="s",
                          stages=False, extra={"model.lora_configs": [LORA], "trainer.save_interval": 3})
    root = tmp_path / "ckpt/t"
    jobs = {lr: root / f"s-lr{lr}" for lr in LRS}
    log = tmp_path / "sweep.log"
    with running("sweep", "--config", str(cfg), "--set", f"algorithm.optimizer.lr={','.join(LRS)}", log=log) as p:
        wait_for("a run at train step 4", lambda: any(e["step"] >= 4 for j in jobs.values() for e in steps_log(j)),
                 p, log=log)
        victim = next(steps_log(j)[-1]["pid"] for j in jobs.values() if steps_log(j))
        os.kill(victim, signal.SIGKILL)
        # then the shared engine's process, once the restarted trainer trained again
        wait_for("a step by the restarted trainer",
                 lambda: any(e["pid"] != victim for j in jobs.values() for e in steps_log(j)), p, log=log)
        os.kill(sweep_host_pid("explorer"), signal.SIGKILL)
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert "trainer* exited with -9; restart 1/2" in text
    assert "explorer* exited with -9; restart 1/2" in text
    # one trainer and one explorer process for all three runs; a buffer and a synchronizer each
    for lr in LRS:
        for role in ("buffer", "synchronizer"):
            assert f"trinity run: s-lr{lr}/{role} finished" in text
    assert text.count("trinity run: trainer* finished") == 1 and text.count("trinity run: explorer* finished") == 1
    pids = {e["pid"] for j in jobs.values() for e in steps_log(j)}
    assert len(pids) == 2, f"not one trainer process before the kill and one after: {pids}"
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    adapter = sum(8 * (m.in_features + m.out_features) * 4 for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and n != "lm_head")
    finals = {}
    for lr, job in jobs.items():
        trained_exactly_once(job, STEPS, PER_STEP)  # nothing lost, nothing trained twice
        assert {r for e in steps_log(job) for r in e["runs"]} == {f"t.s-lr{lr}"}, "another run's experience"
        events = [json.loads(x) for x in (job / "monitor/sync_events.jsonl").read_text().splitlines()]
        sent = [e["info"]["bytes"] for e in events if e["kind"] == "weights_sent"]
        assert sent and all(b == adapter for b in sent), (lr, sent, adapter)
        assert (job / f"global_step_{STEPS}/actor/adapter_model.safetensors").is_file()
        record = json.loads((job / "run.json").read_text())
        assert record["state"] == "done" and record["sweep"] == sorted(f"s-lr{x}" for x in LRS)
        evals = [r for r in read_metrics(job) if r["kind"] == "eval"]
        assert evals and evals[-1]["values"]["model_version"] == STEPS
        finals[lr] = (job / f"global_step_{STEPS}/actor/adapter_model.safetensors").read_bytes()
    assert len(set(finals.values())) == len(LRS), "two runs ended with the same adapter"
    sweep = json.loads((root / "s-sweep/sweep.json").read_text())
    assert [r["name"] for r in sweep["runs"]] == [f"s-lr{lr}" for lr in LRS]
    # a run of a sweep is an ordinary run: trinity convert reads it alone
    p = trinity("convert", "--checkpoint-dir", str(jobs["1e-3"]), "--base-model-dir", str(tiny_model))
    out = p.communicate(timeout=300)[0].decode()
    assert p.returncode == 0, out
    if find_chromium() is not None:  # the studio shows the sweep's runs side by side
        asyncio.run(_studio_compares(tmp_path / "ckpt", [f"t/s-lr{lr}" for lr in LRS]))


async def _studio_compares(root, keys):
    from tests.run.test_studio import _wait_http

    port = free_port()
    studio = subprocess.Popen([sys.executable, "-m", "roles.cli", "studio", "--port", str(port),
                               "--checkpoint-root", str(root), "--token", "sweep-test"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/"
        await _wait_http(base + "?token=sweep-test", studio)
        async with Browser() as b:
            await b.goto(base + "?token=sweep-test#/runs")
            await b.wait_for(f"document.querySelector('tr[data-job=\"{keys[0]}\"] .sweep-compare')")
            await b.click(f"tr[data-job='{keys[0]}'] .sweep-compare")
            await b.wait_for("document.querySelectorAll('#compare [data-title^=\"eval accuracy\"] polyline').length"
                             f" === {len(keys)}")
            legend = await b.js("document.querySelector('#compare [data-title^=\"eval accuracy\"] .legend').textContent")
            assert all(k in legend for k in keys), legend
            assert not [c for c in b.console if c.startswith(("exception", "error"))], b.console
    finally:
        studio.terminate()
        studio.wait(timeout=10)


def test_a_sweep_of_runs_that_cannot_share_fails_before_any_process(tmp_path, tiny_model, arith):
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), name="s",
                          stages=False)
    p = trinity("sweep", "--config", str(cfg), "--set", "algorithm.optimizer.lr=1e-4,1e-3")
    out = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 2, out
    assert "run s-lr1e-4: model.lora_configs" in out and "run s-lr1e-3: model.lora_configs" in out
    assert not (tmp_path / "ckpt").exists(), "a process started before the runs were checked"


def test_a_sweep_whose_runs_cannot_succeed_ends_with_exit_1_naming_the_run_and_cause(tmp_path, tiny_model, arith):
    """The stats_key typo of ``tests/run/test_honest_ends.py`` in a sweep: the run whose buffer
    finds out ends the sweep (exit 1), and the sweep's last line names that run and the cause."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), name="s",
                          stages=False, extra={"model.lora_configs": [LORA], "synchronizer.sync_timeout": 300,
                                               "data_processor.experience_pipeline.operators": [
                                                   {"name": "reward_shaping_mapper", "args": {"reward_shaping_configs": [
                                                       {"stats_key": "llm_quality_scor", "op_type": "ADD", "weight": 1.0}]}}]})
    p = trinity("sweep", "--config", str(cfg), "--set", "algorithm.optimizer.lr=1e-4,1e-3")
    out = p.communicate(timeout=240)[0].decode()
    last = out.rstrip().splitlines()[-1]
    assert p.returncode == 1, out[-4000:]
    assert last.startswith("trinity sweep: failed: s-lr1e-"), out[-4000:]
    assert "info['llm_quality_scor']: missing" in last, last
