"""GPU memory a trainer rank and a rollout engine need, estimated from the model's shape and
the settings, before anything starts: what ``trinity run --plan`` shows per process and GPU,
and what the start refuses when it cannot fit (Trinity-RFT's validator, which "checks GPU
memory usage and suggests configuration changes"; ``ignore_validator_suggestions`` lets a
run start anyway).

Pure arithmetic on bytes, so it is tested on numbers alone. The figures are estimates of the
largest terms (what decides whether a run fits), not a profile:

* weights: 2 bytes a parameter under bf16 (DeepSpeed keeps a bf16 copy; the float32 master
  copy is the optimizer's), 4 under float32; ZeRO-3 splits them over the ranks, and
  ``offload_param`` moves them to the CPU;
* gradients: the weights' dtype, of the trainable parameters; split from ZeRO-2;
* optimizer: Adam's two moments in float32, plus bf16's float32 master copy (12 or 8 bytes a
  trainable parameter); split from ZeRO-1, on the CPU under ``offload_optimizer``;
* activations: per token of a micro-batch, ~34 x hidden bytes per layer held for backward
  (Korthikanti et al. 2022, bf16, flash attention: no sequence-squared term; twice that in
  float32), or with gradient checkpointing one layer's worth plus each layer's input;
* logits: a micro-batch's tokens x vocabulary in float32, twice (values and their gradient);
* a reference model (KL) in the weights' dtype, whole on each rank (none with LoRA: the
  base model with its adapter off is the reference).

A LoRA run trains only the adapter (``trainable``): its gradients and optimizer are the
adapter's, the base weights stay frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
#: Bytes of activations held per token, per layer, per unit of hidden size (bf16, flash attention).
ACTIVATION_BYTES_PER_HIDDEN = 34


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model."""

    params: int
    hidden: int
    layers: int
    vocab: int
    kv_width: int  #: key + value width per token and layer: 2 x kv heads x head size


@dataclass(frozen=True)
class TrainerSettings:
    """The settings that decide a trainer rank's memory."""

    ranks: int = 1
    zero_stage: int = 2
    bf16: bool = True
    offload_param: bool = False
    offload_optimizer: bool = False
    gradient_checkpointing: bool = True
    micro_batch_tokens: int = 4096
    trainable: int | None = None  #: trainable parameters (a LoRA adapter's); None: all
    reference: bool = False


def trainer_parts(m: ModelShape, s: TrainerSettings) -> dict[str, float]:
    """GiB per trainer rank, by part (see the module doc)."""
    wb = 2 if s.bf16 else 4
    trainable = m.params if s.trainable is None else s.trainable
    shard = max(s.ranks, 1)
    weights = m.params * wb / (shard if s.zero_stage >= 3 else 1)
    if s.offload_param and s.zero_stage >= 3:
        weights = 0.0
    grads = trainable * wb / (shard if s.zero_stage >= 2 else 1)
    optimizer = 0.0 if s.offload_optimizer else trainable * (12 if s.bf16 else 8) / (shard if s.zero_stage >= 1 else 1)
    t = s.micro_batch_tokens
    acts, logits = token_parts(m, s)
    parts = {"weights": weights, "gradients": grads, "optimizer": optimizer, "activations": t * acts,
             "logits": t * logits}
    if s.reference and s.trainable is None:
        parts["reference"] = m.params * wb
    return {k: v / GIB for k, v in parts.items()}


def token_parts(m: ModelShape, s: TrainerSettings) -> tuple[float, float]:
    """Bytes one token of a micro-batch holds until its backward: (activations, logits).
    Float32 activations (the PyTorch trainer, ``bf16`` off) take twice bf16's bytes; the
    logits are float32 values and their gradient."""
    scale = 1 if s.bf16 else 2
    per_layer = m.hidden * ACTIVATION_BYTES_PER_HIDDEN * scale
    acts = per_layer + m.hidden * 2 * scale * m.layers if s.gradient_checkpointing else per_layer * m.layers
    return acts, m.vocab * 4 * 2


def update_temporaries(m: ModelShape, s: TrainerSettings) -> float:
    """GiB Adam's update allocates while it runs and frees after: about two float32 copies of
    the largest tensor, the embedding (SmolLM2 measured 216 MB a step; none for an adapter)."""
    return (2 * m.vocab * m.hidden * 4 if s.trainable is None else 0) / GIB


def step_allocations(m: ModelShape, s: TrainerSettings) -> float:
    """GiB every update allocates besides its micro-batches and frees after it: the gradients
    (set to None after each update, made again by the next backward) and
    :func:`update_temporaries`."""
    return trainer_parts(m, s)["gradients"] + update_temporaries(m, s)


def micro_batch_tokens(m: ModelShape, s: TrainerSettings, free_bytes: float, share: float,
                       least: int, most: int) -> int:
    """The tokens a micro-batch may hold: ``share`` of the memory free now (``free_bytes``,
    the model and any reference already loaded) less what an update still allocates (the
    optimizer's state, :func:`step_allocations`), over :func:`token_parts`' bytes per token;
    at least ``least`` (one whole sequence: a longer row goes alone anyway), at most ``most``."""
    to_come = (trainer_parts(m, s)["optimizer"] + step_allocations(m, s)) * GIB
    room = share * max(free_bytes - to_come, 0.0)
    return int(min(max(room // sum(token_parts(m, s)), least), most))


def engine_parts(m: ModelShape, dtype_bytes: int, sequences: int, max_model_len: int,
                 tensor_parallel: int = 1) -> dict[str, float]:
    """GiB per GPU of a transformers engine (it holds what it uses): its weights, and the KV
    cache of ``sequences`` at once of ``max_model_len`` tokens each."""
    tp = max(tensor_parallel, 1)
    kv = sequences * max_model_len * m.layers * m.kv_width * dtype_bytes
    return {"weights": m.params * dtype_bytes / tp / GIB, "kv cache": kv / tp / GIB}


def total(parts: dict[str, float]) -> float:
    return sum(parts.values())


def shown(parts: dict[str, float]) -> str:
    """``12.3 GiB (weights 2.0 + gradients 2.0 + ...)``: what the plan prints."""
    return f"{total(parts):.1f} GiB (" + " + ".join(f"{k} {v:.1f}" for k, v in parts.items() if v >= 0.05) + ")"
