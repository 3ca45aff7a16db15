"""Train engines behind one interface: log-probs of a batch, backward, optimizer step,
weights for a sync, save and load.

``TorchEngine`` is plain PyTorch (the CPU default; on a GPU it trains there too). The DeepSpeed ZeRO
engine (``deepspeed_engine.py``) has the same methods, so the step logic in ``step.py`` never
asks which one it drives.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from schemas.config import ModelConfig, OptimizerConfig
from storage import lora
from storage.hf_config import override_rope


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, scheduler: str, min_lr_ratio: float) -> float:
    """Multiplier of ``lr`` after ``step`` optimizer steps: linear warmup over
    ``warmup_steps``, then constant or cosine down to ``min_lr_ratio`` at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if scheduler == "cosine" and total_steps > warmup_steps:
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0


def warmup_steps(opt: OptimizerConfig, total_steps: int) -> int:
    return opt.lr_warmup_steps if opt.lr_warmup_steps >= 0 else int(opt.lr_warmup_steps_ratio * total_steps)


class TrainEngine(Protocol):
    """What the step logic (``step.py``) and the trainer loop drive: ``TorchEngine`` and
    ``DeepSpeedEngine`` both are one."""

    model: Any
    rank: int  # among the trainer's processes; 0 saves what is shared
    world_size: int

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Around a forward pass (not the backward): the dtype the engine computes in."""
    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        """Accumulate ``loss``'s gradients; ``last``: the micro-batch that ends this update."""
    def step(self) -> float: ...
    @property
    def lr(self) -> float: ...
    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]: ...
    def state_dict(self) -> dict[str, torch.Tensor]: ...
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...
    def optimizer_state(self) -> dict[str, Any]: ...
    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...
    def barrier(self) -> None: ...
    def close(self) -> None: ...


#: ``optimizer_type`` -> optimizer class. Both are decoupled-weight-decay Adam, as in
#: Trinity-RFT (whose "adam" is veRL's AdamW).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"adam": torch.optim.AdamW, "adamw": torch.optim.AdamW}


def make_optimizer(params: list[torch.nn.Parameter], opt: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer ``opt`` describes, over ``params`` (the trainable ones)."""
    return OPTIMIZERS[opt.optimizer_type](params, lr=opt.lr, betas=tuple(opt.betas),
                                          weight_decay=opt.weight_decay)


def config_overrides(m: ModelConfig) -> dict[str, Any]:
    """``model.rope_scaling`` / ``rope_theta``, for :func:`load_model`: they change the model
    config, so the checkpoints the trainer writes carry them too."""
    return {"rope_scaling": m.rope_scaling, "rope_theta": m.rope_theta}


def attn_implementation() -> str | None:
    """``flash_attention_2`` on a GPU where the ``flash_attn`` package (the ``flash_attn``
    extra) is installed, else None (transformers' default, SDPA). Why only then: FlashAttention
    kernels are CUDA-only and the package is an optional build; the trainer's GPU path casts
    the model to bf16 (DeepSpeed), which they need."""
    import importlib.util

    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return None


def train_device() -> torch.device:
    """Where this process trains: its first visible GPU (the device plan narrowed
    ``CUDA_VISIBLE_DEVICES`` to the trainer's), else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, gradient_checkpointing: bool = False,
               overrides: dict[str, Any] | None = None) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = override_rope(AutoConfig.from_pretrained(str(path)), **(overrides or {}))
    attn = attn_implementation()
    kw = {"attn_implementation": attn} if attn else {}
    model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=dtype, **kw)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


class TorchEngine:
    """One process, plain ``torch.optim.AdamW`` and ``LambdaLR``."""

    rank = 0
    world_size = 1

    def __init__(self, model: Any, opt: OptimizerConfig, *, total_steps: int, grad_clip: float,
                 compute_dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.model.train()
        self.grad_clip = grad_clip
        #: None: the parameters' dtype; bfloat16: the forward under torch.autocast (the weights,
        #: gradients and optimizer stay float32), see :func:`roles.trainer.main.compute_dtype`
        self.compute_dtype = compute_dtype
        self.optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], opt)
        ws = warmup_steps(opt, total_steps)
        sched = opt.lr_scheduler_type  # derive() folded the deprecated warmup_style in
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, total_steps=total_steps, warmup_steps=ws, scheduler=sched,
                                min_lr_ratio=opt.min_lr_ratio),
        )

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        dev = next(self.model.parameters()).device
        return self.model(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev)).logits

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(next(self.model.parameters()).device.type, dtype=self.compute_dtype)

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        loss.backward()  # gradients add up in .grad until step(), whatever ``last`` says

    def step(self) -> float:
        """Clip, step, schedule; returns the gradient norm before clipping. A non-finite norm
        skips the update (one bad batch must not destroy the weights)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else float("inf"))
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(norm)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What a weight sync sends: every parameter and buffer of the state dict (tied
        weights once), as stored; a LoRA model's merged weights (storage/lora.py)."""
        if lora.is_lora(self.model):
            yield from lora.merged_tensors(self.model)
            return
        seen: set[int] = set()
        for name, t in self.model.state_dict().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            yield name, t

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights a checkpoint's Hugging Face folder holds (a LoRA model's merged)."""
        return dict(lora.merged_tensors(self.model)) if lora.is_lora(self.model) else self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state, strict=False)

    def optimizer_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def barrier(self) -> None:
        """One process: nothing to wait for."""

    def close(self) -> None:
        """One process: no process group to take down."""
