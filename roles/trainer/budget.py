"""How many tokens a micro-batch holds when ``trainer.max_token_len_per_gpu`` is not set.

Why derive it: the old default (twice ``max_model_len``) split a GRPO step into many small
micro-batches, which cost a tiny model most of its step in per-forward overhead and split a
group's samples apart, so the prompt-once forward (:mod:`.prefix`) barely ran. A user should
not have to know the knob. So at start the trainer sizes its micro-batches to a share of the
memory free on its device (:func:`ops.memory.micro_batch_tokens`: the model's bytes per token,
after the gradients and optimizer state its first update allocates); the step then keeps each
group whole where it fits (:func:`.batch.micro_batches`).

The shares: on the CPU the rollout engine, the other roles and the page cache share the RAM
(and an engine may allocate after the trainer starts), so a quarter of what is available; on
a GPU the trainer's own, half of its free memory (the estimate is of the largest terms, not a
profile). ``trainer.max_token_len_per_gpu`` (or ``use_dynamic_bsz: false``) still decides
when set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ops.memory import GIB, micro_batch_tokens, step_allocations, token_parts
from roles.runtime.fit import model_shape, trainer_settings
from schemas.config import TrinityConfig

CPU_SHARE, GPU_SHARE = 0.25, 0.5
#: Above this a micro-batch gains nothing measurable (SmolLM2 on CPU: the same tokens/s from
#: 1k tokens up) and one bad estimate costs the most
MOST_TOKENS = 65536


@dataclass(frozen=True)
class Budget:
    tokens: int
    why: str  #: how it was derived, for the trainer's log
    per_token: float = 0.0  #: the estimate's bytes a token (0: not estimated)
    per_step: float = 0.0  #: bytes each step allocates besides its tokens: gradients, Adam's temporaries


def free_bytes(device: torch.device) -> int:
    """Memory free for this process's tensors on ``device``: the GPU's free memory, or the
    RAM the kernel reports available, within a cgroup's (container's) limit."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():  # macOS: what the OS has, unshared
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    avail = int(meminfo.read_text().split("MemAvailable:")[1].split()[0]) * 1024
    for limit, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap, now = Path(limit).read_text().strip(), int(Path(used).read_text())
        except (OSError, ValueError):
            continue
        if cap.isdigit():
            avail = min(avail, max(int(cap) - now, 0))
    return avail


def derive(cfg: TrinityConfig, device: torch.device, ranks: int = 1) -> Budget:
    """The token budget of a micro-batch for ``cfg``'s model on ``device`` (see the module doc);
    the old default, twice ``max_model_len``, where the model's shape cannot be read."""
    least = cfg.model.max_model_len or 4096
    m = model_shape(cfg.model.model_path)
    if isinstance(m, str):
        return Budget(2 * least, f"2 x max_model_len (the model's shape: {m})")
    # the PyTorch trainer checkpoints its layers on a GPU only (build_engine): on the CPU every
    # layer's activations are held
    s = trainer_settings(cfg, m, ranks)
    s = replace(s, gradient_checkpointing=s.gradient_checkpointing and device.type == "cuda")
    share = GPU_SHARE if device.type == "cuda" else CPU_SHARE
    free = free_bytes(device)
    tokens = micro_batch_tokens(m, s, free, share, least, MOST_TOKENS)
    per_token = sum(token_parts(m, s))
    return Budget(tokens, f"{share:.0%} of {free / GIB:.1f} GiB free on {device.type} after the optimizer's "
                          f"state, at {per_token / 1024:.0f} KiB a token (ops/memory.py)", per_token,
                  step_allocations(m, s) * GIB)
