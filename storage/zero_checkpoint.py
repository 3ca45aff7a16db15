"""DeepSpeed ZeRO checkpoint folders read into one fp32 state dict, without unpickling code.

What ``deepspeed.utils.zero_to_fp32`` does, minus its ``torch.load(weights_only=False)``: that
runs any code a crafted ``*_model_states.pt`` names, and ``trinity convert`` reads folders that
people send each other. Here every file goes through
:func:`storage.checkpoints.load_torch_file` (weights-only, plus the few DeepSpeed classes the
caller allows), so such a file is refused, named, before anything in it runs.

The layout (one tag folder, e.g. ``global_step120/``, of a checkpoint folder with a ``latest``
file naming the tag)::

    mp_rank_00_model_states.pt                      ZeRO 1/2: param_shapes (per param group,
                                                    name -> shape), buffers in "module",
                                                    shared_params, frozen params
    zero_pp_rank_0_mp_rank_00_model_states.pt ...   ZeRO 3: one per rank (frozen fragments)
    *_optim_states.pt                               one per data-parallel rank: the fp32
                                                    master partitions ("optimizer_state_dict")

ZeRO 1/2 flatten each param group and split it into equal contiguous partitions, one per rank
(``single_partition_of_fp32_groups``): the group is the ranks' partitions concatenated, the
params laid end to end in ``param_shapes`` order. ZeRO 3 splits every param on its own into
``ceil(numel / world)`` elements per rank (the last padded) and lays each rank's pieces end to
end (``fp32_flat_groups``): a param is its piece from each rank, concatenated and cut to size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from storage.checkpoints import CheckpointError, load_torch_file

MODEL_STATES_GLOB = "*_model_states.pt"
OPTIM_STATES_GLOB = "*_optim_states.pt"


def _natural(p: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _files(folder: Path, pattern: str) -> list[Path]:
    files = sorted(folder.glob(pattern), key=_natural)
    if not files:
        raise CheckpointError(f"{folder}: no {pattern} files (not a DeepSpeed checkpoint folder)")
    return files


def tag_folder(checkpoint_dir: str | Path, tag: str | None = None) -> Path:
    """The folder holding the ``*_states.pt`` files: ``checkpoint_dir/tag``, the tag read from
    ``checkpoint_dir/latest`` when not given."""
    root = Path(checkpoint_dir)
    if tag is None:
        latest = root / "latest"
        if not latest.is_file():
            raise CheckpointError(f"{latest}: no such file (it names the checkpoint's tag folder)")
        tag = latest.read_text(encoding="utf-8", errors="replace").strip()
    folder = root / tag
    if not folder.is_dir() or folder.resolve().parent != root.resolve():
        raise CheckpointError(f"{root}: tag {tag!r} is not a folder of this checkpoint")
    return folder


def _get(d: Any, key: str, file: Path) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise CheckpointError(f"{file}: no {key!r}; not a DeepSpeed ZeRO checkpoint file")
    return d[key]


def load_zero_state_dict(
    checkpoint_dir: str | Path, tag: str | None = None, *, allowed_globals: Sequence[Any] = ()
) -> dict[str, torch.Tensor]:
    """The full fp32 state dict of a ZeRO 1, 2 or 3 checkpoint (see the module doc), the same
    tensors ``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`` returns.

    ``allowed_globals``: the DeepSpeed classes an optimizer state file holds (loss scaler,
    ZeRO stage enum, fragment addresses), as the trainer allows them when it resumes."""
    folder = tag_folder(checkpoint_dir, tag)
    model_files = _files(folder, MODEL_STATES_GLOB)
    optim_files = _files(folder, OPTIM_STATES_GLOB)
    models = [load_torch_file(f, allowed_globals=allowed_globals) for f in model_files]
    flat: list[list[torch.Tensor]] = []
    stage = world = paddings = None
    for f in optim_files:
        osd = _get(load_torch_file(f, allowed_globals=allowed_globals, mmap=True),
                   "optimizer_state_dict", f)
        if stage is None:
            stage = int(_get(osd, "zero_stage", f))
            counts = _get(osd, "partition_count", f)
            world = max(counts) if isinstance(counts, (list, tuple)) else int(counts)
            paddings = osd.get("param_alignment_paddings")
        key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
        groups = _get(osd, key, f)
        flat.append(list(groups) if isinstance(groups, (list, tuple)) else [groups])
    assert stage is not None and world is not None
    if world != len(optim_files):
        raise CheckpointError(
            f"{folder}: the optimizer states say {world} ranks but there are "
            f"{len(optim_files)} {OPTIM_STATES_GLOB} files (a rank's file is missing or stale)"
        )
    if stage not in (1, 2, 3):
        raise CheckpointError(f"{optim_files[0]}: unknown ZeRO stage {stage}")
    first = models[0]
    shapes = _get(first, "param_shapes", model_files[0])
    buffer_names = set(_get(first, "buffer_names", model_files[0]))
    module = first.get("module") or {}
    out: dict[str, torch.Tensor] = {
        k: (v.float() if v.is_floating_point() else v)
        for k, v in module.items()
        if k in buffer_names
    }
    frozen = first.get("frozen_param_shapes") or {}
    for name, shape in frozen.items():
        numel = math.prod(shape)
        if stage <= 2:
            out[name] = first["frozen_param_fragments"][name]
        else:
            pieces = [m["frozen_param_fragments"][name] for m in models]
            out[name] = torch.cat(pieces, 0).narrow(0, 0, numel).view(shape)
    if stage <= 2:
        _merge_zero2(out, shapes, flat, world, paddings, folder)
    else:
        _merge_zero3(out, shapes, flat, world, folder)
    for name, source in (first.get("shared_params") or {}).items():
        if source in out:
            out[name] = out[source]
    return out


def _merge_zero2(
    out: dict[str, torch.Tensor],
    shapes: list[dict[str, Any]],
    flat: list[list[torch.Tensor]],
    world: int,
    paddings: list[list[int]] | None,
    folder: Path,
) -> None:
    for g, group_shapes in enumerate(shapes):
        full = torch.cat([rank_groups[g] for rank_groups in flat], 0)
        offset = 0
        pads = paddings[g] if paddings is not None else None
        for i, (name, shape) in enumerate(group_shapes.items()):
            numel = math.prod(shape)
            if offset + numel > full.numel():
                raise _mismatch(folder, f"param group {g}", full.numel(), name)
            out[name] = full.narrow(0, offset, numel).view(shape).clone()
            offset += numel + (pads[i] if pads is not None else 0)
        align = 2 * world  # ZeRO 2 pads each group to a multiple of 2 * world
        if align * math.ceil(offset / align) != align * math.ceil(full.numel() / align):
            raise CheckpointError(
                f"{folder}: param group {g} holds {full.numel()} elements but its params take "
                f"{offset}: the model and optimizer states do not belong together"
            )


def _merge_zero3(
    out: dict[str, torch.Tensor],
    shapes: list[dict[str, Any]],
    flat: list[list[torch.Tensor]],
    world: int,
    folder: Path,
) -> None:
    per_rank = [torch.cat([t.reshape(-1) for t in groups], 0) for groups in flat]
    offset = 0
    for group_shapes in shapes:
        for name, shape in group_shapes.items():
            numel = math.prod(shape)
            part = math.ceil(numel / world)
            if offset + part > per_rank[0].numel():
                raise _mismatch(folder, "each rank", per_rank[0].numel(), name)
            pieces = [r.narrow(0, offset, part) for r in per_rank]
            out[name] = torch.cat(pieces, 0).narrow(0, 0, numel).view(shape).clone()
            offset += part
    if offset != per_rank[0].numel():
        raise CheckpointError(
            f"{folder}: each rank holds {per_rank[0].numel()} elements but the params take "
            f"{offset}: the model and optimizer states do not belong together"
        )


def _mismatch(folder: Path, where: str, have: int, name: str) -> CheckpointError:
    return CheckpointError(
        f"{folder}: {where} holds {have} elements, too few for the params up to {name!r}: the "
        "model and optimizer states do not belong together"
    )
