"""Will a run fit its GPUs? :mod:`ops.memory`'s estimate for each GPU process of the device
plan: ``trinity run --plan`` prints it, and the start refuses a plan whose trainer or
engines would not fit a GPU of this machine, naming settings that would (unless
``ignore_validator_suggestions: true``: then it warns and starts).

The model's shape is read from its ``config.json`` (the parameters counted on the meta
device: nothing is loaded); a model that cannot be read (a hub id not downloaded yet) is
left unestimated, and says so."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from ops.memory import ModelShape, TrainerSettings, engine_parts, shown, total, trainer_parts
from roles.runtime.config import algorithm_spec
from roles.runtime.placement import DevicePlan
from schemas.config import TrinityConfig
from schemas.modes import MODES

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
#: (node, GPU) -> what uses it: (what, its estimate in GiB by part, or a vLLM engine's share of the GPU)
GpuUse = dict[tuple[int, int], list[tuple[str, "dict[str, float] | float"]]]


def model_shape(path: str) -> ModelShape | str:
    """The shape of the model at ``path``, or why it cannot be read."""
    if not path or not Path(path).is_dir():
        return f"{path!r} is not a local model folder"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError) as e:
        return f"{path}: {e}"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    return ModelShape(params=sum(p.numel() for p in model.parameters()), hidden=text.hidden_size,
                      layers=text.num_hidden_layers, vocab=text.vocab_size, kv_width=2 * kv * head_dim)


def _lora_trainable(m: ModelShape, cfg: TrinityConfig) -> int | None:
    """The adapter's parameters (rank x (in + out) of each adapted matrix; ``all-linear``: the
    attention and MLP matrices of every layer, approximated from the shape), None without LoRA."""
    if not cfg.model.lora_configs:
        return None
    r = cfg.model.lora_configs[0].lora_rank
    per_layer = r * (4 * 2 * m.hidden + 3 * (m.hidden + 4 * m.hidden))  # q,k,v,o and gate,up,down (~4x)
    return per_layer * m.layers


def trainer_settings(cfg: TrinityConfig, m: ModelShape, ranks: int) -> TrainerSettings:
    t, d = cfg.trainer, cfg.trainer.deepspeed
    # unset, the trainer sizes its micro-batches at start to what its memory holds
    # (roles/trainer/budget.py): the least it needs is one whole sequence
    tokens = (t.max_token_len_per_gpu or (cfg.model.max_model_len or 4096)) if t.use_dynamic_bsz \
        else t.micro_batch_size_per_gpu * (cfg.model.max_model_len or 4096)
    pytorch = t.trainer_type == "pytorch"
    spec = algorithm_spec(cfg)
    return TrainerSettings(ranks=ranks, zero_stage=0 if pytorch else d.zero_stage, bf16=d.bf16 and not pytorch,
                           offload_param=d.offload_param and not pytorch,
                           offload_optimizer=d.offload_optimizer and not pytorch,
                           gradient_checkpointing=d.gradient_checkpointing, micro_batch_tokens=tokens,
                           trainable=_lora_trainable(m, cfg), reference=spec.use_reference)


def trainer_ranks_of(plan: DevicePlan) -> int:
    return sum(len(p.gpus) for p in plan.placements if p.process == "trainer") or 1


def per_gpu(plan: DevicePlan, stages: Sequence[TrinityConfig], m: ModelShape) -> GpuUse:
    """What uses each GPU of ``plan``, for a model of shape ``m``."""
    cfg = stages[0]
    trains = [s for s in stages if MODES[s.mode].trains]
    ranks = trainer_ranks_of(plan)
    # the stage that needs the most: the trainer process lives through every stage
    trainer = max((trainer_parts(m, trainer_settings(s, m, ranks)) for s in trains), key=total) if trains else None
    r = cfg.explorer.rollout_model
    out: GpuUse = {}
    for p in plan.placements:
        for g in p.gpus:
            if p.process == "trainer" and trainer is not None:
                out.setdefault((p.node, g), []).append(("trainer rank", trainer))
            elif p.what.startswith("rollout engine"):
                if r.engine_type == "vllm":
                    out.setdefault((p.node, g), []).append((p.what, r.gpu_memory_utilization))
                else:
                    seqs = cfg.explorer.runner_per_model * cfg.algorithm.repeat_times
                    parts = engine_parts(m, _DTYPE_BYTES.get(r.dtype, 2), seqs,
                                         r.max_model_len or cfg.model.max_model_len or 4096, r.tensor_parallel_size)
                    out.setdefault((p.node, g), []).append((p.what, parts))
    return out


def _users(users: list[tuple[str, dict[str, float] | float]]) -> str:
    return "; ".join(f"{what} {v:.0%} of the GPU (gpu_memory_utilization)" if isinstance(v, float)
                     else f"{what} {shown(v)}" for what, v in users)


def describe_memory(plan: DevicePlan, stages: Sequence[TrinityConfig], gpu_gib: float | None) -> list[str]:
    """The plan's memory lines: each GPU's processes with their estimates."""
    if plan.gpu_per_node == 0:
        return []
    m = model_shape(stages[0].model.model_path)
    if isinstance(m, str):
        return [f"memory: not estimated ({m})"]
    size = f" of {gpu_gib:.0f} GiB (this machine's GPU 0)" if gpu_gib else ""
    return [f"memory per GPU (estimated, ops/memory.py){size}:",
            *(f"  node {node} GPU {g}: {_users(users)}" for (node, g), users in sorted(per_gpu(plan, stages, m).items()))]


#: Changes that shrink a trainer rank's memory, tried one at a time for the refusal's advice:
#: (what to set, the settings it changes)
_REMEDIES: tuple[tuple[str, dict], ...] = (
    ("trainer.deepspeed.gradient_checkpointing: true", {"gradient_checkpointing": True}),
    ("trainer.deepspeed.offload_optimizer: true", {"offload_optimizer": True}),
    ("trainer.deepspeed.zero_stage: 3 with offload_param: true", {"zero_stage": 3, "offload_param": True}),
)


def fit_problems(plan: DevicePlan, stages: Sequence[TrinityConfig], gpu_gib: float) -> list[str]:
    """Each GPU whose processes' estimates exceed ``gpu_gib``, with the settings that would fit."""
    m = model_shape(stages[0].model.model_path)
    if isinstance(m, str):
        return []
    base = [trainer_settings(s, m, trainer_ranks_of(plan)) for s in stages if MODES[s.mode].trains]
    tokens = max((b.micro_batch_tokens for b in base), default=0)
    changes = [*_REMEDIES, *([(f"trainer.max_token_len_per_gpu: {tokens // 4}", {"micro_batch_tokens": tokens // 4})]
                             if tokens > 512 else [])]
    out = []
    for (node, g), users in sorted(per_gpu(plan, stages, m).items()):
        share = sum(v for _, v in users if isinstance(v, float))  # vLLM's fixed share
        left = gpu_gib * (1 - share)
        need = sum(total(v) for _, v in users if isinstance(v, dict))
        if need <= left:
            continue
        others = need - sum(total(v) for w, v in users if w == "trainer rank" and isinstance(v, dict))
        advice = [text for text, change in changes
                  if base and others + max(total(trainer_parts(m, dataclasses.replace(b, **change))) for b in base) <= left]
        if share:
            advice.append("a lower explorer.rollout_model.gpu_memory_utilization")
        room = f"{left:.1f} GiB" + (f" ({1 - share:.0%} of {gpu_gib:.0f} GiB beside the engines' share)" if share else "")
        out.append(f"node {node} GPU {g}: the estimate is {need:.1f} GiB, {room} is there ({_users(users)}); "
                   + ("would fit with: " + ", or ".join(advice) if advice else "no single setting here makes it fit: "
                      "a smaller model, LoRA (model.lora_configs), or more GPUs")
                   + " (ignore_validator_suggestions: true starts it anyway)")
    return out
