"""DeepSpeed ZeRO train engine (stages 1-3, bf16, gradient checkpointing, multi-process under
the DeepSpeed launcher or torchrun), with the same methods as :class:`TorchEngine`.

Why ``torch.optim.AdamW`` passed in (with ``zero_allow_untested_optimizer``) rather than named
in the DeepSpeed config: a named AdamW becomes FusedAdam/DeepSpeedCPUAdam, which JIT-compile
for minutes on first use; the torch optimizer compiles nothing and ZeRO still partitions its
state. On CPU DeepSpeed picks its CPU accelerator and gloo by itself (NOTES.md).

Micro-batches: one ``backward`` per micro-batch with the accumulation boundary set only on the
last, then one ``step``, so a step's micro-batch count may vary (dynamic batch size).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from schemas.config import OptimizerConfig, TrinityConfig
from storage import lora

from .engine import config_overrides, load_model, lr_factor, make_optimizer, warmup_steps


def launcher_env() -> None:
    """DeepSpeed needs the launcher's variables even for one process: default them."""
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def checkpoint_safe_globals() -> list[Any]:
    """The DeepSpeed classes a ZeRO optimizer's ``state_dict`` holds (loss scaler, stage
    enum, fragment addresses). Trainer state is loaded with ``weights_only`` (no arbitrary
    pickles), so these few are allowed by name when the engine is DeepSpeed."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def ds_config(*, zero_stage: int, bf16: bool, grad_clip: float, offload_optimizer: bool = False,
              offload_param: bool = False) -> dict[str, Any]:
    """The DeepSpeed config dict (pure)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"trainer.deepspeed.zero_stage: expected 0-3, got {zero_stage}")
    zero: dict[str, Any] = {"stage": zero_stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if offload_param and zero_stage == 3:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": grad_clip if grad_clip > 0 else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": bool(bf16)},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedEngine:
    def __init__(self, model: Any, opt: OptimizerConfig, *, total_steps: int, grad_clip: float,
                 zero_stage: int = 2, bf16: bool = False, offload_optimizer: bool = False,
                 offload_param: bool = False) -> None:
        import deepspeed

        launcher_env()
        self.zero_stage = zero_stage
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], opt)
        ws = warmup_steps(opt, total_steps)
        sched = opt.lr_scheduler_type  # derive() folded the deprecated warmup_style in
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_factor(s, total_steps=total_steps, warmup_steps=ws, scheduler=sched,
                                           min_lr_ratio=opt.min_lr_ratio))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler,
            config=ds_config(zero_stage=zero_stage, bf16=bf16, grad_clip=grad_clip,
                             offload_optimizer=offload_optimizer, offload_param=offload_param),
        )
        self.model = self.engine.module
        self.model.train()
        self._pending = 0

    @classmethod
    def from_config(cls, cfg: TrinityConfig, model_path: str, *, total_steps: int) -> DeepSpeedEngine:
        d = cfg.trainer.deepspeed
        bf16 = d.bf16 and torch.cuda.is_available()  # the CPU accelerator trains in float32
        model = load_model(model_path, dtype=torch.float32, gradient_checkpointing=d.gradient_checkpointing,
                           overrides=config_overrides(cfg.model))
        if cfg.model.lora_configs:  # ZeRO 0-2 (config check): merged weights need whole tensors
            model = lora.wrap(model, cfg.model.lora_configs[0])
        return cls(model, cfg.algorithm.optimizer, total_steps=total_steps, grad_clip=cfg.trainer.grad_clip,
                   zero_stage=d.zero_stage, bf16=bf16, offload_optimizer=d.offload_optimizer,
                   offload_param=d.offload_param)

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        dev = self.engine.device
        # bf16 on a GPU, as the model made them: the log-prob and entropy helpers upcast a
        # block of rows at a time (ops.logits). A float32 copy here cost 4.6 GiB per 8k-token
        # micro-batch of a 152k vocabulary, kept alive until backward.
        return self.engine(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev)).logits

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # its bf16 setting made the model bfloat16 itself

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _full_state(self) -> dict[str, torch.Tensor]:
        if lora.is_lora(self.model):
            return dict(lora.merged_tensors(self.model))
        if self.zero_stage == 3:
            import deepspeed

            params = list(self.model.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return self.model.state_dict()

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors, copied out of ZeRO-3 partitions (never a view into a shard)."""
        seen: set[int] = set()
        for name, t in self._full_state().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            yield name, t

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._full_state()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Full weights into the model (ZeRO-3: gathered, written by rank 0, re-partitioned)."""
        if self.zero_stage == 3:
            import deepspeed

            params = list(self.model.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                self.model.load_state_dict(state, strict=False)
        else:
            self.model.load_state_dict(state, strict=False)

    @property
    def rank(self) -> int:
        """This process's rank among the trainer's processes (0 alone)."""
        return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0

    @property
    def world_size(self) -> int:
        return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1

    def barrier(self) -> None:
        """Wait for every trainer process (nothing to wait for alone)."""
        if self.world_size > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """Take down the process group DeepSpeed started, after the last collective. Why: a
        process that exits with gloo's worker threads still alive dies in interpreter teardown
        (SIGABRT, "terminate called without an active exception"; pytorch#190489), which turns
        a finished run into a failed exit code. The barrier first: a rank that tears its pairs
        down while a peer still finishes the last collective's sends aborts that peer the same
        way (seen once in CI, ZeRO-3 over two ranks). Only on a clean end: after an error another
        rank may still be inside a collective, and the process exits anyway."""
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    def optimizer_state(self) -> dict[str, Any]:
        """This rank's optimizer state: under ZeRO its partition only (each rank saves its own)."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`optimizer_state` returned. A ZeRO optimizer takes a list of
        per-rank states and, with ``load_from_fp32_weights``, its fp32 master partition from
        the state too (the weights it steps, which the module's weights are a copy of)."""
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        if isinstance(self.optimizer, DeepSpeedZeroOptimizer | DeepSpeedZeroOptimizer_Stage3):
            # The list is indexed by data-parallel rank and each rank reads only its own entry
            # (every rank saved its own partition): the others' partitions are not loaded.
            per_rank: list[Any] = [None] * self.engine.dp_world_size
            per_rank[torch.distributed.get_rank(group=self.optimizer.dp_process_group)] = state["optimizer"]
            self.optimizer.load_state_dict(per_rank, load_from_fp32_weights=True)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
