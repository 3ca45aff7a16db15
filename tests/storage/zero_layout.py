"""DeepSpeed ZeRO checkpoint folders written by hand, in the layout ``save_checkpoint`` writes
(checked against real ZeRO 1/2/3 checkpoints of deepspeed 0.19, and against DeepSpeed's own
reader ``zero_to_fp32`` in the tests): no ``deepspeed.initialize``, so a test takes
milliseconds. The DeepSpeed objects a real optimizer state holds (loss scaler, stage enum,
fragment addresses) are in it too, so loading needs the trainer's allow-list as for real."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch

DS_VERSION = "0.19.8"


def _ds_objects(stage: int):  # -> (loss scaler, stage enum, fragment_address class)
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return LossScaler(1.0), ZeroStageEnum(stage), fragment_address


def write_zero_checkpoint(
    folder: str | Path,
    params: dict[str, torch.Tensor],
    *,
    stage: int,
    world: int = 1,
    groups: int = 1,
    shared: dict[str, str] | None = None,
    buffers: dict[str, torch.Tensor] | None = None,
    tag: str = "global_step1",
    pad_first_param: int = 0,
) -> Path:
    """Write ``folder/latest`` and ``folder/<tag>/*_states.pt`` holding ``params`` (fp32
    master weights) split over ``groups`` param groups and ``world`` ranks. ``shared``: tied
    names (name -> the param it shares); ``pad_first_param``: a ZeRO 2 alignment padding
    after each group's first param (``param_alignment_paddings``). Returns the tag folder."""
    loss_scaler, stage_enum, fragment_address = _ds_objects(stage)
    shared = shared or {}
    buffers = buffers or {}
    names = list(params)
    per_group = math.ceil(len(names) / groups)
    group_names = [names[i : i + per_group] for i in range(0, len(names), per_group)]
    param_shapes = [OrderedDict((n, params[n].shape) for n in g) for g in group_names]
    tag_dir = Path(folder) / tag
    tag_dir.mkdir(parents=True, exist_ok=True)
    (Path(folder) / "latest").write_text(tag)
    module = OrderedDict((n, t.to(torch.bfloat16)) for n, t in params.items())
    module.update(buffers)
    model_state = {
        "module": module,
        "buffer_names": list(buffers),
        "optimizer": None,
        "param_shapes": param_shapes,
        "frozen_param_shapes": OrderedDict(),
        "shared_params": dict(shared),
        "frozen_param_fragments": OrderedDict(),
        "lr_scheduler": {"base_lrs": [1e-3], "last_epoch": 1, "_step_count": 2},
        "data_sampler": None,
        "random_ltd": None,
        "skipped_steps": 0,
        "global_steps": 1,
        "global_samples": 1,
        "dp_world_size": world,
        "mp_world_size": 1,
        "ds_config": {"train_micro_batch_size_per_gpu": 1},
        "ds_version": DS_VERSION,
    }
    if stage <= 2:
        torch.save(model_state, tag_dir / "mp_rank_00_model_states.pt")
        partitions: list[list[torch.Tensor]] = [[] for _ in range(world)]
        paddings, group_paddings, mappings = [], [], []
        for g in group_names:
            pieces, pads, mapping, offset = [], [], OrderedDict(), 0
            for i, n in enumerate(g):
                flat = params[n].reshape(-1).float()
                pad = pad_first_param if i == 0 else 0
                pieces += [flat, torch.zeros(pad)]
                pads.append(pad)
                mapping[n] = fragment_address(numel=flat.numel(), start=offset)
                offset += flat.numel() + pad
            align = 2 * world  # DeepSpeed aligns each flat group to 2 * world elements
            tail = align * math.ceil(offset / align) - offset
            full = torch.cat([*pieces, torch.zeros(tail)])
            size = full.numel() // world
            for r in range(world):
                partitions[r].append(full[r * size : (r + 1) * size].clone())
            paddings.append(pads)
            group_paddings.append(tail)
            mappings.append(mapping)
        for r in range(world):
            osd = {
                "loss_scaler": loss_scaler,
                "dynamic_loss_scale": False,
                "overflow": False,
                "clip_grad": 1.0,
                "base_optimizer_state": {"state": {}, "param_groups": []},
                "single_partition_of_fp32_groups": partitions[r],
                "zero_stage": stage_enum,
                "group_paddings": group_paddings,
                "param_alignment_paddings": paddings,
                "partition_count": [world] * len(group_names),
                "ds_version": DS_VERSION,
                "param_slice_mappings": mappings,
            }
            torch.save({"optimizer_state_dict": osd, "ds_config": {}, "ds_version": DS_VERSION},
                       tag_dir / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        return tag_dir
    flat_groups: list[list[torch.Tensor]] = [[] for _ in range(world)]
    for g in group_names:
        pieces: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for n in g:
            flat = params[n].reshape(-1).float()
            part = math.ceil(flat.numel() / world)
            padded = torch.cat([flat, torch.zeros(part * world - flat.numel())])
            for r in range(world):
                pieces[r].append(padded[r * part : (r + 1) * part])
        for r in range(world):
            flat_groups[r].append(torch.cat(pieces[r]))
    for r in range(world):
        torch.save(dict(model_state, module=OrderedDict(buffers)),
                   tag_dir / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        osd = {
            "zero_stage": stage_enum,
            "loss_scaler": loss_scaler,
            "dynamic_loss_scale": False,
            "overflow": False,
            "partition_count": world,
            "optimizer_state_dict": {"state": {}, "param_groups": []},
            "fp32_flat_groups": flat_groups[r],
        }
        torch.save({"optimizer_state_dict": osd, "ds_config": {}, "ds_version": DS_VERSION},
                   tag_dir / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return tag_dir


def model_params(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(params, shared)`` as DeepSpeed records a model: each parameter once, in order, and
    the state-dict names that alias one of them (tied embeddings)."""
    params: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}
    shared: dict[str, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            shared[n] = seen[id(p)]
        else:
            seen[id(p)] = n
            params[n] = p.detach().float().clone()
    return params, shared
