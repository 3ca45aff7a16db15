"""LoRA in the trainer: only the adapter learns and has optimizer state, the reference model is
the base with the adapter off, the weights a sync or checkpoint carries are the merged model,
the adapter is saved in PEFT layout and a resumed trainer continues exactly; bad settings fail
naming the field."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from roles.launch.checks import check_lora
from storage import checkpoints as ckpt

from .test_updates import _batch, _cfg

LORA = {"lora_configs": [{"lora_rank": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "up_proj"]}]}


def _trainer(tmp_path, tiny_model, **kw):
    from roles.trainer.main import Trainer

    return Trainer(_cfg(tmp_path, tiny_model, model={**LORA, **kw.pop("model", {})}, **kw))


@pytest.mark.slow
def test_only_the_adapter_learns_and_the_reference_is_the_base(tmp_path, tiny_model):
    tr = _trainer(tmp_path, tiny_model, algorithm={"kl_loss_fn": "low_var_kl"})
    model = tr.engine.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    n_state = len(tr.engine.optimizer.param_groups[0]["params"])
    assert n_state == len(trainable)  # Adam moments for the adapter only
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    m = tr.train(_batch(), 1)
    assert torch.isfinite(torch.tensor(m["loss"]))
    # the base weights did not move; B moved off 0, so the merged model differs from the base
    merged = dict(tr.engine.named_tensors())
    assert set(merged) == set(frozen) - {"lm_head.weight"} or set(merged) == set(frozen)
    for name in ("model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"):
        assert torch.equal(merged[name], frozen[name])
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], frozen["model.layers.0.self_attn.q_proj.weight"])
    # the merged weights are what peft's own merge computes, and they load as a plain model
    base.load_state_dict(merged, strict=False)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        ours = base(input_ids=ids).logits
        theirs = model(input_ids=ids).logits
        ref = tr.runner.ref(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        torch.testing.assert_close(ref, plain(input_ids=ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_a_resumed_lora_trainer_continues_exactly(tmp_path, tiny_model):
    a = _trainer(tmp_path / "a", tiny_model, trainer={"save_hf_checkpoint": "always"})
    a.train(_batch(), 1)
    a.save(final=False)
    actor = ckpt.actor_dir(a.job, 1)
    assert (actor / "adapter_config.json").is_file() and (actor / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(ckpt.hf_dir(a.job, 1))  # the merged model loads as is
    torch.testing.assert_close(merged.state_dict()["model.layers.1.self_attn.v_proj.weight"],
                               dict(a.engine.named_tensors())["model.layers.1.self_attn.v_proj.weight"])
    a.train(_batch(), 2)
    b = _trainer(tmp_path / "a", tiny_model, trainer={"save_hf_checkpoint": "always"})  # same job: resumes
    assert b.step == 1
    b.train(_batch(), 2)
    sa, sb = dict(a.engine.model.named_parameters()), dict(b.engine.model.named_parameters())
    for name, p in sa.items():
        if p.requires_grad:
            assert torch.equal(p, sb[name]), name


def test_bad_lora_settings_name_the_field(tmp_path, tiny_model):
    cfg = _cfg(tmp_path, tiny_model, model={"lora_configs": [{"target_modules": ["qq_proj"]}]})
    (problem,) = check_lora(cfg, "")
    assert "model.lora_configs[0].target_modules" in problem and "q_proj" in problem
    cfg = _cfg(tmp_path, tiny_model, model={"lora_configs": [{"path": str(tmp_path)}]},
               trainer={"trainer_type": "deepspeed", "deepspeed": {"zero_stage": 3}})
    problems = check_lora(cfg, "")
    assert any("zero_stage" in p for p in problems) and any("lora_configs[0].path" in p for p in problems)
    from schemas.loader import ConfigError

    with pytest.raises((ConfigError, ValueError), match="lora_rank"):
        _cfg(tmp_path, tiny_model, model={"lora_configs": [{"lora_rank": 0}]})


@pytest.mark.slow
def test_an_adapter_of_another_model_fails_naming_the_path(tmp_path, tiny_model):
    from storage.tiny import build_tiny_model

    wide = build_tiny_model(tmp_path / "wide", hidden_size=256, num_attention_heads=8)
    other = _trainer(tmp_path / "w", wide)
    other.engine.model.save_pretrained(str(tmp_path / "adapter"))
    from storage.lora import LoraError

    with pytest.raises(LoraError, match=r"lora_configs\[0\].path"):
        _trainer(tmp_path / "x", tiny_model, model={"lora_configs": [{**LORA["lora_configs"][0], "path": str(tmp_path / "adapter")}]})


@pytest.mark.slow
def test_ppo_with_lora_and_convert_of_a_lora_checkpoint(tmp_path, tiny_model):
    # PPO: the actor trains an adapter, the critic (a value model of its own) stays whole
    tr = _trainer(tmp_path, tiny_model, algorithm={"algorithm_type": "ppo", "kl_loss_fn": "none"},
                  trainer={"critic_warmup": 0})
    m = tr.train(_batch(), 1)
    assert torch.isfinite(torch.tensor(m["loss"])) and any(k.startswith("critic") or k.startswith("vf") for k in m)
    assert all(p.requires_grad for p in tr.runner.critic.engine.model.parameters())
    # a LoRA checkpoint without a Hugging Face folder: trinity convert writes the merged model
    tr.save(final=False)
    from storage.convert import convert_checkpoints

    (r,) = convert_checkpoints(tr.job)
    merged = AutoModelForCausalLM.from_pretrained(r.hf_dir)
    want = dict(tr.engine.named_tensors())
    for name, t in merged.state_dict().items():
        if name in want:
            torch.testing.assert_close(t, want[name])
