"""The device plan (``roles/runtime/placement.py``): who gets which GPU, and the
``CUDA_VISIBLE_DEVICES`` each launched process really has.

Pure plans first, then real processes: ``trinity run --plan`` on the seed's gsm8k config, and
roles started alone as honcho starts them (the variable unset: each takes its share; set:
kept). ``tests/run/test_run_e2e.py`` checks the same under ``trinity run`` and
``tests/trainer/test_ranks.py`` under torchrun.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bus.server import free_port
from roles.runtime.placement import (
    PlanError,
    child_env,
    device_plan,
    subset,
    take_share,
    trainer_ranks,
    visible_devices,
)
from schemas.config import TrinityConfig

from .helpers import ROOT, tiny_run_config

GSM8K = ROOT / "examples" / "grpo_gsm8k" / "gsm8k.yaml"


def cfg(**kw) -> TrinityConfig:
    base: dict = {"mode": "both", "cluster": {"gpu_per_node": 2}}
    for k, v in kw.items():
        base[k] = v
    return TrinityConfig.model_validate(base)


def test_the_seed_split_puts_engine_and_trainer_on_different_gpus():
    plan = device_plan([cfg()])
    assert plan.gpus("explorer") == (0,) and plan.gpus("trainer") == (1,)
    assert visible_devices(plan, "explorer") == "0" and visible_devices(plan, "trainer") == "1"
    assert visible_devices(plan, "buffer") == "" and visible_devices(plan, "synchronizer") == ""
    assert plan.weight_sync_world == 2


def test_engines_tensor_parallel_and_auxiliary_models_each_get_their_own_gpus():
    c = cfg(cluster={"gpu_per_node": 8},
            explorer={"rollout_model": {"engine_num": 2, "tensor_parallel_size": 2},
                      "auxiliary_models": [{"model_path": "judge", "tensor_parallel_size": 1},
                                           {"model_path": "api", "engine_type": "external"}]})
    plan = device_plan([c])
    assert [p.gpus for p in plan.of("rollout engine")] == [(0, 1), (2, 3)]
    assert [p.gpus for p in plan.of("auxiliary 0 engine")] == [(4,)]
    assert plan.of("auxiliary 1 engine") == []  # an external API takes no GPU
    assert plan.gpus("trainer") == (5, 6, 7) and trainer_ranks(plan) == 3
    assert plan.weight_sync_world == 5  # trainer rank 0 + 2 engines x tp 2
    # what each engine sees inside the explorer process (positions in its devices)
    assert plan.engine_devices(plan.of("rollout engine")) == [(0, 1), (2, 3)]
    assert plan.engine_devices(plan.of("auxiliary 0 engine")) == [(4,)]
    # the launcher's own CUDA_VISIBLE_DEVICES is the node's GPUs: the plan indexes into it
    base = "8,9,10,11,12,13,14,15"
    assert visible_devices(plan, "explorer", base) == "8,9,10,11,12"
    assert visible_devices(plan, "trainer", base) == "13,14,15"
    assert subset((2, 3), "8,9,10,11,12") == "10,11"  # engine 1's own view when it starts


def test_stages_give_the_explorer_the_most_any_stage_needs_and_the_trainer_the_rest():
    sft = cfg(mode="train", cluster={"gpu_per_node": 4})
    grpo = cfg(mode="both", cluster={"gpu_per_node": 4}, explorer={"rollout_model": {"engine_num": 2}})
    plan = device_plan([sft, grpo])
    assert plan.gpus("explorer") == (0, 1) and plan.gpus("trainer") == (2, 3)
    assert device_plan([sft]).gpus("trainer") == (0, 1, 2, 3)  # train alone: every GPU
    bench = cfg(mode="bench", cluster={"gpu_per_node": 4})
    assert device_plan([bench]).gpus("explorer") == (0,) and device_plan([bench]).nodes("trainer") == []


def test_two_nodes_explorer_on_the_first_trainer_on_the_second():
    c = cfg(cluster={"gpu_per_node": 2, "node_num": 2}, explorer={"rollout_model": {"engine_num": 2}})
    plan = device_plan([c])
    assert plan.nodes("explorer") == [0] and plan.nodes("trainer") == [1]
    assert plan.gpus("trainer") == (0, 1) and trainer_ranks(plan) == 2
    # a trainer started alone on node 1 takes node 1's share
    assert child_env(plan, "trainer", {"TRINITY_NODE_RANK": "1"})["CUDA_VISIBLE_DEVICES"] == "0,1"
    spread = device_plan([cfg(cluster={"gpu_per_node": 2, "node_num": 2})])
    with pytest.raises(PlanError, match="cluster.node_num: the trainer's GPUs span nodes"):
        trainer_ranks(spread)


def test_plans_that_do_not_fit_are_refused_naming_the_fields():
    with pytest.raises(PlanError, match=r"cluster.gpu_per_node: 1 .*none to the trainer.*engine_num"):
        device_plan([cfg(cluster={"gpu_per_node": 1})])
    with pytest.raises(PlanError, match=r"explorer: 4 GPU\(s\).*tensor_parallel_size.*cluster.gpu_per_node: 2"):
        device_plan([cfg(explorer={"rollout_model": {"engine_num": 2, "tensor_parallel_size": 2}})])
    with pytest.raises(PlanError, match="sync_method: nccl cannot join two processes on one device"):
        device_plan([cfg(mode="colocate")])
    with pytest.raises(PlanError, match="mode: colocate runs the trainer and the engines on one node"):
        device_plan([cfg(mode="colocate", cluster={"gpu_per_node": 1, "node_num": 2},
                         synchronizer={"sync_method": "memory"})])
    with pytest.raises(PlanError, match="sync_method: memory needs the trainer and the rollout engines on one node"):
        device_plan([cfg(cluster={"gpu_per_node": 1, "node_num": 2}, synchronizer={"sync_method": "memory"})])
    with pytest.raises(PlanError, match="CUDA_VISIBLE_DEVICES=3 names 1 GPU"):
        visible_devices(device_plan([cfg()]), "trainer", "3")


def test_cpu_runs_leave_the_variable_alone(monkeypatch):
    plan = device_plan([cfg(cluster={"gpu_per_node": 0})])
    assert visible_devices(plan, "trainer") is None and trainer_ranks(plan) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert take_share(plan, "explorer") is None and "CUDA_VISIBLE_DEVICES" not in os.environ


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_") and k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run([sys.executable, "-m", "roles.cli", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_trinity_run_plan_on_the_seed_gsm8k_config_starts_nothing():
    r = _cli("run", "--config", str(GSM8K), "--plan", env={})
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.startswith("  ")}
    assert rows["explorer"][1:3] == ["0", "0"] and "rollout engine 0 (vllm, tp 1) on GPU 0" in r.stdout
    assert rows["trainer"][1:3] == ["0", "1"]
    assert rows["buffer"][2] == '""' and rows["synchronizer"][2] == '""'
    assert "weight sync: nccl group of 2" in r.stdout and "nats://127.0.0.1:4222" in r.stdout
    # the memory estimate needs the model's config: a hub id not downloaded says so (a local
    # model's lines: tests/roles/test_fit.py)
    assert "memory: not estimated ('Qwen/Qwen2.5-1.5B-Instruct' is not a local model folder)" in r.stdout
    bad = _cli("run", "--config", str(GSM8K), "--plan", "--set", "cluster.gpu_per_node=1", env={})
    assert bad.returncode == 2 and "cluster.gpu_per_node: 1" in bad.stderr
    # one GPU: trainer and engine both on GPU 0, the engine's share and the trainer's
    coloc = _cli("run", "--config", str(GSM8K), "--plan", "--set", "mode=colocate",
                 "--set", "cluster.gpu_per_node=1", env={})
    assert coloc.returncode == 0, coloc.stderr
    rows = {line.split()[0]: line for line in coloc.stdout.splitlines() if line.startswith("  ")}
    assert "rollout engine 0 (vllm, tp 1) on GPU 0" in rows["explorer"], coloc.stdout
    assert "on GPU 0" in rows["trainer"] and "memory the engines leave" in rows["trainer"], coloc.stdout
    assert "synchronizer.sync_method: memory" in coloc.stdout
    started = _cli("run", "--config", str(GSM8K), "--set", "mode=colocate", "--set", "cluster.gpu_per_node=1", env={})
    assert started.returncode == 2 and "engine_type: vllm" in started.stderr and "not wired yet" in started.stderr, started.stderr
    # the transformers engine colocates on a GPU: it frees each batch's cache for the trainer
    hf = _cli("run", "--config", str(GSM8K), "--plan", "--set", "mode=colocate", "--set", "cluster.gpu_per_node=1",
              "--set", "explorer.rollout_model.engine_type=transformers", env={})
    rows = {line.split()[0]: line for line in hf.stdout.splitlines() if line.startswith("  ")}
    assert hf.returncode == 0 and "frees each batch's cache" in rows["trainer"], hf.stdout + hf.stderr
    # upstream's 8-GPU layouts give the trainer several GPUs: one PyTorch process cannot use
    # them, refused before anything starts (it was refused by the trainer, the engine loading;
    # --plan draws the layout up for GPU nodes, and shows it)
    many = _cli("run", "--config", str(GSM8K), "--set", "cluster.gpu_per_node=4",
                "--set", "trainer.trainer_type=pytorch", env={})
    assert many.returncode == 2 and ("trainer.trainer_type: 'pytorch' trains in one process, but "
                                     "cluster.gpu_per_node gives the trainer 3 GPUs") in many.stderr, many.stderr


def _first_devices_line(role: str, cfg_path: Path, env: dict[str, str]) -> str:
    """Start ``role`` alone (as honcho does) and return its devices line; the role is stopped
    right after (no bus listens: it would only wait for one)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_") and k != "CUDA_VISIBLE_DEVICES"}
    p = subprocess.Popen([sys.executable, "-m", "roles.cli", role, "--config", str(cfg_path)], cwd=ROOT,
                         env={**base, "OMP_NUM_THREADS": "1", **env}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "CUDA_VISIBLE_DEVICES" in line:
                return line.strip()
        raise AssertionError(f"{role} printed no devices line (exit {p.wait()})")
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.mark.slow
def test_roles_started_alone_take_their_share_or_keep_a_given_one(tmp_path, tiny_model, arith):
    c = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(),
                        stages=False, extra={"cluster.gpu_per_node": 2, "nats.embedded": False})
    assert _first_devices_line("explorer", c, {}) == "trinity explorer: CUDA_VISIBLE_DEVICES='0' (device plan: trinity run --plan)"
    assert "CUDA_VISIBLE_DEVICES='1'" in _first_devices_line("trainer", c, {})
    assert "CUDA_VISIBLE_DEVICES=''" in _first_devices_line("buffer", c, {})
    assert "CUDA_VISIBLE_DEVICES='5'" in _first_devices_line("trainer", c, {"CUDA_VISIBLE_DEVICES": "5"})


def test_the_node_variable_is_no_config_value(tmp_path):
    from roles.runtime.placement import NODE_ENV
    from schemas.loader import NON_CONFIG_VARS

    assert NODE_ENV in NON_CONFIG_VARS  # a .env may hold it beside config values (honcho's does)
    (tmp_path / ".env").write_text(f"{NODE_ENV}=1\n")
    assert _cli("config", "--config", str(GSM8K), "--dotenv", str(tmp_path / ".env"), env={}).returncode == 0
