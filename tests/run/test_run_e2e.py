"""``trinity run`` end to end: real processes, an embedded nats-server it starts itself, the
tiny model (HF engine, to keep CI short; the quickstart runs the same path on vLLM)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from bus.server import free_port
from roles.runtime.monitor import read_metrics
from tests.helpers import wait_for

from .helpers import run_to_end, running, steps_log, tiny_run_config, trained_exactly_once, trinity

pytestmark = pytest.mark.slow

# 24 train rows / batch 3 = 8 steps of 3 groups x 4 experiences
STEPS, PER_STEP = 8, 12


def _trained_exactly_once(job: Path) -> dict[int, list[str]]:
    return trained_exactly_once(job, STEPS, PER_STEP)


def test_run_two_stages_all_roles_exit_0(tmp_path, tiny_model, arith):
    # two "GPUs" on this CPU machine: the device plan's CUDA_VISIBLE_DEVICES reaches each
    # process (harmless without CUDA), the engine on GPU 0 and the trainer on GPU 1
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(),
                          extra={"cluster.gpu_per_node": 2, "explorer.eval_interval": 4})
    p = trinity("run", "--config", str(cfg))
    out, _ = p.communicate(timeout=900)
    text = out.decode()
    assert p.returncode == 0, text[-4000:]
    for role in ("buffer", "synchronizer", "trainer", "explorer"):
        assert f"trinity run: {role} finished" in text
    for role, gpus in (("explorer", "0"), ("trainer", "1"), ("buffer", ""), ("synchronizer", "")):
        assert f"{role:>12} | trinity {role}: CUDA_VISIBLE_DEVICES={gpus!r}" in text
    assert "embedded nats-server" in text
    sft, grpo = tmp_path / "ckpt/t/r/sft", tmp_path / "ckpt/t/r/grpo"
    # the SFT stage ran 2 steps and left a HF folder; the GRPO stage started from it
    assert (sft / "global_step_2/actor/huggingface/model.safetensors").exists()
    assert f"model={sft}/global_step_2/actor/huggingface" in text
    _trained_exactly_once(grpo)
    hf = grpo / f"global_step_{STEPS}/actor/huggingface"
    AutoModelForCausalLM.from_pretrained(hf)  # the final folder loads with transformers
    # metrics: jsonl always, tensorboard by default; the summary reports start and end evals
    assert (grpo / "monitor/metrics.jsonl").exists()
    assert list((grpo / "monitor/tensorboard/trainer").glob("events.out.tfevents.*"))
    assert "eval accuracy" in text
    assert "grpo             start step 0" in text and f"grpo             end   step {STEPS}" in text
    # evaluated at startup, every 4 steps, and once at the end: on the final weights, not
    # also on the ones before them (step 8 is a multiple of eval_interval)
    evals = [r for r in read_metrics(grpo) if r["kind"] == "eval"]
    assert [(r["step"], bool(r["values"].get("final"))) for r in evals] == [(0, False), (4, False), (STEPS, True)]


def test_run_survives_a_sigkilled_trainer(tmp_path, tiny_model, arith):
    # PPO here (GRPO is the other test's), so the critic's resume is checked end to end too
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(),
                          stages=False, extra={"trainer.save_interval": 3, "algorithm.algorithm_type": "ppo",
                                               "critic.optim.lr": 1e-3})
    job = tmp_path / "ckpt/t/r"
    log = tmp_path / "run.log"
    with running("run", "--config", str(cfg), log=log) as p:
        wait_for("train step 4", lambda: any(e["step"] >= 4 for e in steps_log(job)), p, log=log)
        victim = steps_log(job)[-1]["pid"]
        os.kill(victim, signal.SIGKILL)
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert "trainer exited with -9; restart 1/2" in text
    entries = steps_log(job)
    assert len({e["pid"] for e in entries}) == 2, "the restarted trainer did not train"
    _trained_exactly_once(job)


def test_config_errors_fail_before_any_process(tmp_path, tiny_model, arith):
    bad_key = tiny_run_config(tmp_path / "a.yaml", model=tiny_model, data=arith, port=free_port(),
                              extra={"trainer.save_intervall": 3})
    p = trinity("run", "--config", str(bad_key))
    out = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 2 and "save_intervall" in out and "save_interval" in out
    missing = tiny_run_config(tmp_path / "b.yaml", model=tiny_model, data=tmp_path / "nowhere",
                              port=free_port(), name="m")
    p = trinity("run", "--config", str(missing))
    out = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 2, out
    assert "buffer.explorer_input.taskset.path" in out and str(tmp_path / "nowhere") in out
    assert not (tmp_path / "ckpt").exists(), "a process started before the config was checked"


def test_four_engines_behind_the_openai_api_load_every_broadcast(tmp_path, tiny_model, arith):
    """Trinity-RFT's configs run 2-4 rollout engines with the OpenAI API on: each engine's load
    of one broadcast took the API's weight gate alone while the broadcast needed them all, so
    every sync timed out and the run ended on its first weights (exit 0)."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False,
                          extra={"explorer.rollout_model.engine_num": 4, "explorer.rollout_model.enable_openai_api": True,
                                 "buffer.total_steps": 3, "explorer.eval_interval": 0})
    rc, out = run_to_end(cfg, tmp_path / "run.log", timeout=600)
    assert rc == 0, out[-3000:]
    assert "sync_timeout" not in out and "final_weights_missing" not in out, out[-3000:]
    assert out.count("weights_loaded") == 3 and "end   step 3    weights v3" in out, out[-3000:]


def test_train_mode_saves_every_save_interval_and_prunes(tmp_path, tiny_model, arith):
    # mode train: no explorer, so no weight sync writes a folder per step; the checkpoints are
    # the save_interval ones (3, 6) and the last (7), pruned to max_checkpoints_to_keep
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer", "system_prompt": ""}
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False, extra={
        "mode": "train", "algorithm.algorithm_type": "sft", "synchronizer.sync_method": "checkpoint",
        "trainer.save_interval": 3, "trainer.max_checkpoints_to_keep": 2,
        "buffer.train_batch_size": 4, "buffer.total_steps": 7, "buffer.total_epochs": 10,
        "buffer.trainer_input.experience_buffer": {"name": "sft", "storage_type": "file", "path": str(arith),
                                                   "split": "train", "format": fmt}})
    rc, text = run_to_end(cfg, tmp_path / "run.log", timeout=600)
    assert rc == 0, text[-4000:]
    job = tmp_path / "ckpt/t/r"
    assert [e["step"] for e in steps_log(job)][-1] == 7
    assert sorted(int(d.name.rsplit("_", 1)[1]) for d in job.glob("global_step_*")) == [6, 7]
    assert (job / "latest_checkpointed_iteration.txt").read_text().strip() == "7"
    assert "weights_ready" not in text and "explorer" not in {line.split(":")[0] for line in text.splitlines()}


@pytest.mark.parametrize("engine,sync_method", [("transformers", "nccl"), ("vllm", "nccl"),
                                                 ("transformers", "checkpoint"), ("transformers", "memory")])
def test_lora_run_syncs_only_the_adapter_and_saves_both_layouts(tmp_path, tiny_model, arith, engine, sync_method):
    # a broadcast, or shared memory, moves the adapter alone (the transformers engine wraps
    # its model in it, vLLM serves it as a LoRA request); a checkpoint sync (as an external
    # engine) gets the merged model, with one warning
    if engine == "vllm":
        pytest.importorskip("vllm")
    lora = {"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"}
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False,
                          extra={"model.lora_configs": [lora], "algorithm.optimizer.lr": 3e-3,
                                 "buffer.total_steps": 3, "trainer.save_interval": 0,
                                 "synchronizer.sync_method": sync_method,
                                 "explorer.rollout_model.engine_type": engine})
    rc, text = run_to_end(cfg, tmp_path / "run.log", timeout=600)
    assert rc == 0, text[-4000:]
    job = tmp_path / "ckpt/t/r"
    actor = job / "global_step_3/actor"
    assert (actor / "adapter_config.json").is_file() and (actor / "adapter_model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(actor / "huggingface")  # the merged model
    events = [json.loads(x) for x in (job / "monitor/sync_events.jsonl").read_text().splitlines()]
    if sync_method == "checkpoint":
        assert "lora_merged_sync" in text
        assert [e["model_version"] for e in events if e["kind"] == "loaded"] == [1, 2, 3]
        return
    moved = "weights_ready" if sync_method == "memory" else "weights_sent"
    sent = [e["info"]["bytes"] for e in events if e["kind"] == moved]
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    full = sum(t.numel() * 4 for t in model.state_dict().values())
    # rank 8 on every linear layer of a 2-layer, 128-wide model: A (8 x in) and B (out x 8)
    adapter = sum(8 * (m.in_features + m.out_features) * 4 for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and n != "lm_head")
    assert sent and all(b == adapter for b in sent), (sent, adapter, full)
    assert "lora_merged_sync" not in text
