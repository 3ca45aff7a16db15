"""Checkpoints: HF folders that from_pretrained loads with identical logits, trainer shards,
latest files, pruning, meta json, and `trinity convert`."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from storage import checkpoints as ck
from storage.convert import convert_checkpoints, find_step_dirs


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for i in range(10):
        vocab[str(i)] = len(vocab)
    for w in ["+", "=", "what", "is"]:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tok = _tokenizer()
    cfg = Qwen2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=len(tok),
        tie_word_embeddings=True,
        max_position_embeddings=64,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.tensor([tok.encode("what is 3 + 4 = 7")])
    with torch.no_grad():
        logits = model(ids).logits
    return model, tok, ids, logits


def _logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return m(ids).logits


def test_save_hf_model_loads_with_identical_logits(tiny, tmp_path: Path) -> None:
    model, tok, ids, logits = tiny
    out = ck.save_hf_model(tmp_path / "hf", model=model, tokenizer=tok)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert (out / "tokenizer.json").is_file()
    assert ck.hf_weights_complete(out)
    assert torch.equal(_logits(out, ids), logits)
    # sharded above a size: index + several files, same logits
    sharded = ck.save_hf_model(
        tmp_path / "sharded", model=model, tokenizer=tok, max_shard_size="40KB"
    )
    index = json.loads((sharded / ck.WEIGHTS_INDEX_NAME).read_text())
    assert (
        len(set(index["weight_map"].values())) > 2 and not (sharded / "model.safetensors").exists()
    )
    assert ck.hf_weights_complete(sharded)
    assert torch.equal(_logits(sharded, ids), logits)
    # rewriting replaces the folder as a whole (no stale shards next to model.safetensors)
    ck.save_hf_model(sharded, model=model, tokenizer=tok)
    assert not list(sharded.glob("model-0*")) and (sharded / "model.safetensors").is_file()
    assert torch.equal(_logits(sharded, ids), logits)


def test_latest_meta_and_pruning(tmp_path: Path) -> None:
    job = ck.job_dir(tmp_path, "proj", "exp")
    assert ck.read_latest(job) is None and ck.read_meta(job, "trainer") is None
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    for step in (10, 20, 30, 40):
        ck.save_checkpoint(
            job,
            step,
            state_dict=sd,
            save_hf=False,
            trainer_state={"step": step},
            max_checkpoints_to_keep=2,
            trainer_meta={"latest_iteration": step},
        )
    assert ck.list_steps(job) == [30, 40]
    assert ck.read_latest(job, "checkpoint") == 40 and ck.read_latest(job, "state_dict") == 40
    assert (job / "latest_checkpointed_iteration.txt").read_text() == "40\n"
    assert ck.read_meta(job, "trainer") == {"latest_iteration": 40}
    ck.write_meta(job, "explorer", {"latest_iteration": 41})
    assert json.loads((job / "explorer_meta.json").read_text())["latest_iteration"] == 41
    loaded = ck.load_checkpoint(job)
    assert loaded.step == 40 and torch.equal(loaded.state_dict["w"], sd["w"])
    assert loaded.trainer_state == {"step": 40}
    # the latest steps are protected even when older than `keep` would allow
    ck.write_latest(job, 30, "checkpoint")
    (job / "global_step_50").mkdir()
    assert ck.prune_checkpoints(job, 1) == [] and ck.list_steps(job) == [30, 40, 50]
    assert not list(job.glob(".*tmp*")) and not list(job.glob(".trash*"))
    (job / "latest_checkpointed_iteration.txt").write_text("garbage")
    with pytest.raises(ck.CheckpointError, match="latest_checkpointed_iteration.txt"):
        ck.read_latest(job)


def test_trainer_shards_partition_and_merge(tiny, tmp_path: Path) -> None:
    model, *_ = tiny
    sd = model.state_dict()
    actor = tmp_path / "global_step_1" / "actor"
    for r in range(3):
        ck.save_model_shard(actor, sd, r, 3)
    merged = ck.load_model_shards(actor)
    assert set(merged) == set(sd) - {"lm_head.weight"}  # tied copy dropped
    assert all(torch.equal(merged[k], sd[k]) for k in merged)
    (actor / ck.shard_file_name(1, 3)).unlink()
    with pytest.raises(ck.CheckpointError, match="model_world_size_3_rank_1"):
        ck.load_model_shards(actor)


def test_trainer_state_and_rng_roundtrip(tiny, tmp_path: Path) -> None:
    model = copy.deepcopy(tiny[0])  # the step below must not change the shared model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[3, 4]])).logits.sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "step": 7, "rng": ck.capture_rng_state()}
    ck.save_trainer_state(tmp_path, state)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    loaded = ck.load_trainer_state(tmp_path)  # weights_only=True
    assert loaded["step"] == 7
    ck.restore_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt2.load_state_dict(loaded["optimizer"])


def test_convert_checkpoint_without_huggingface(tiny, tmp_path: Path) -> None:
    model, tok, ids, logits = tiny
    base = ck.save_hf_model(tmp_path / "base", model=model, tokenizer=tok)
    job = tmp_path / "ckpt" / "proj" / "exp"
    sd = model.state_dict()
    for step in (5, 10):
        actor = ck.actor_dir(job, step)
        for r in range(2):
            ck.save_model_shard(actor, sd, r, 2)
    # step 10 has a config-only huggingface folder (what the trainer writes with save_hf=False)
    model.config.save_pretrained(ck.hf_dir(job, 10))
    with pytest.raises(ck.CheckpointError, match="global_step_5/actor/huggingface: no config.json"):
        convert_checkpoints(tmp_path / "ckpt")
    results = convert_checkpoints(tmp_path / "ckpt", base_model_dir=base)
    assert [(r.step, r.status) for r in results] == [(5, "converted"), (10, "converted")]
    for step in (5, 10):
        assert torch.equal(_logits(ck.hf_dir(job, step), ids), logits)
    assert (ck.hf_dir(job, 5) / "tokenizer.json").is_file()  # copied from the base model
    # idempotent: complete ones are skipped; a path inside a step selects that step
    again = convert_checkpoints(ck.actor_dir(job, 10))
    assert [(r.step, r.status) for r in again] == [(10, "skipped")]
    assert find_step_dirs(job / "global_step_5" / "actor") == [(job / "global_step_5").resolve()]


def test_convert_refuses_wrong_base_model(tiny, tmp_path: Path) -> None:
    from transformers import Qwen2Config

    model, *_ = tiny
    other = Qwen2Config(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=17,
    )
    other.save_pretrained(tmp_path / "other")
    actor = tmp_path / "global_step_3" / "actor"
    ck.save_model_shard(actor, model.state_dict())
    with pytest.raises(ck.CheckpointError, match="do not match"):
        convert_checkpoints(actor, base_model_dir=tmp_path / "other")
    assert not (actor / "huggingface").exists()


def test_convert_finds_deepspeed_checkpoint(tiny, tmp_path: Path) -> None:
    """The DeepSpeed path on a ZeRO 2 folder in save_checkpoint's layout (written by hand,
    see ``zero_layout``; a real one needs deepspeed.initialize): found under ``actor/``
    through its ``latest`` file, read weights-only with the trainer's allow-list, wrapper
    prefixes stripped."""
    pytest.importorskip("deepspeed")
    from roles.trainer.deepspeed_engine import checkpoint_safe_globals

    from .zero_layout import model_params, write_zero_checkpoint

    model, tok, ids, logits = tiny
    actor = tmp_path / "job" / "global_step_2" / "actor"
    params, shared = model_params(model)
    write_zero_checkpoint(actor / "deepspeed", {"module." + k: v for k, v in params.items()},
                          stage=2, world=2, tag="global_step2",
                          shared={"module." + k: "module." + v for k, v in shared.items()})
    ck.save_hf_model(tmp_path / "base", model=model, tokenizer=tok)
    [res] = convert_checkpoints(tmp_path / "job", base_model_dir=tmp_path / "base",
                                allowed_globals=checkpoint_safe_globals())
    assert res.source == "deepspeed checkpoint deepspeed"
    assert torch.equal(_logits(res.hf_dir, ids), logits)


def test_checkpoint_sync_keeps_only_the_weights_a_reader_may_need(tiny, tmp_path: Path) -> None:
    # one weight-only folder per sync would be one full model per step for the whole run
    model, *_ = tiny
    job, sd = tmp_path / "job", model.state_dict()
    ck.save_checkpoint(job, 2, state_dict=sd, save_hf=False, trainer_state={"step": 2})
    for step in range(3, 8):
        ck.save_state_dict_checkpoint(job, step, state_dict=sd, config=model.config)
    # the full checkpoint stays (prune_checkpoints decides about it); of the weight-only
    # folders, the newest and the one before it (an explorer may still be loading it)
    assert ck.list_steps(job) == [2, 6, 7]
    assert ck.read_latest(job, "state_dict") == 7 and ck.read_latest(job, "checkpoint") == 2
    assert not list(job.glob(".trash*"))
