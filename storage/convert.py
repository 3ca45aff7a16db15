"""``trinity convert``: turn trainer checkpoints into Hugging Face folders.

The seeds' behaviour: ``--checkpoint-dir`` may be a job dir (every ``global_step_*`` below it,
found recursively, is converted), one ``global_step_N`` folder, or any path inside one
(``.../global_step_120/actor``). A step whose ``actor/huggingface/`` already holds complete
weights is skipped. A step without ``huggingface/config.json`` takes the config (and tokenizer)
of ``--base-model-dir``. Only the ``actor`` is converted.

Weights are read, in order of preference, from trainer shards
(``actor/model_world_size_W_rank_r.safetensors``) or a DeepSpeed ZeRO checkpoint folder under
``actor/`` (:mod:`storage.zero_checkpoint`: weights-only loads, never DeepSpeed's
``zero_to_fp32``, whose full unpickle runs any code a crafted ``*_model_states.pt`` names). The merged state dict is checked against a
model built from the config on the ``meta`` device, so a wrong base model fails with the names
of missing/unexpected tensors instead of producing a folder that loads with random weights.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from storage.checkpoints import (
    DEFAULT_MAX_SHARD_SIZE,
    STEP_DIR_RE,
    CheckpointError,
    find_model_shards,
    hf_weights_complete,
    load_model_shards,
    save_hf_model,
    step_of,
)
from storage.zero_checkpoint import load_zero_state_dict

log = logging.getLogger(__name__)

#: Prefixes that wrappers (DDP, DeepSpeed, FSDP, torch.compile) put in front of parameter names.
_WRAPPER_PREFIXES = ("module.", "_forward_module.", "_fsdp_wrapped_module.", "_orig_mod.")


@dataclass
class ConvertResult:
    """What happened to one ``global_step_N``."""

    step: int
    step_dir: Path
    hf_dir: Path
    status: Literal["converted", "skipped"]
    source: str


def find_step_dirs(checkpoint_dir: str | Path) -> list[Path]:
    """The ``global_step_*`` folders ``checkpoint_dir`` designates (see the module doc)."""
    path = Path(checkpoint_dir).expanduser().resolve()
    if not path.exists():
        raise CheckpointError(f"{path}: no such directory")
    for candidate in (path, *path.parents):
        if STEP_DIR_RE.match(candidate.name):
            return [candidate]
    found: list[Path] = []
    for root, dirs, _files in os.walk(path):
        keep = []
        for d in sorted(dirs):
            if d.startswith("."):
                continue
            if STEP_DIR_RE.match(d):
                found.append(Path(root) / d)
            else:
                keep.append(d)
        dirs[:] = keep  # do not descend into a global_step_* folder or hidden ones
    if not found:
        raise CheckpointError(f"{path}: no global_step_* folders found")
    return sorted(found, key=lambda p: (str(p.parent), step_of(p) or 0))


def _strip_wrappers(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state_dict.items():
        changed = True
        while changed:
            changed = False
            for p in _WRAPPER_PREFIXES:
                if k.startswith(p):
                    k, changed = k[len(p) :], True
        out[k] = v
    return out


def find_deepspeed_dir(actor: Path) -> tuple[Path, str | None] | None:
    """A DeepSpeed checkpoint under ``actor``: ``(folder, tag)`` for :func:`load_zero_state_dict`.

    Either a folder with a ``latest`` file (tag read from it), or a tag folder holding
    ``*_model_states.pt`` (its parent is the checkpoint folder, its name the tag)."""
    for root, dirs, files in os.walk(actor):
        dirs[:] = sorted(d for d in dirs if d != "huggingface" and not d.startswith("."))
        here = Path(root)
        if "latest" in files and any((here / d).is_dir() for d in dirs):
            return here, None
        if any(f.endswith("_model_states.pt") for f in files):
            return here.parent, here.name
    return None


def load_actor_state_dict(
    actor: Path, *, allowed_globals: Sequence[Any] = ()
) -> tuple[dict[str, torch.Tensor], str]:
    """The full state dict of an ``actor`` folder and a word on where it came from.

    ``allowed_globals``: the DeepSpeed classes a ZeRO optimizer state file may hold (the
    trainer's ``checkpoint_safe_globals()``; ``trinity convert`` passes them). Nothing else
    is unpickled: a file naming any other class or function is refused, naming the file."""
    if find_model_shards(actor):
        return _strip_wrappers(load_model_shards(actor)), "trainer shards"
    ds = find_deepspeed_dir(actor)
    if ds is not None:
        folder, tag = ds
        sd = load_zero_state_dict(folder, tag, allowed_globals=allowed_globals)
        return _strip_wrappers(sd), f"deepspeed checkpoint {folder.name}"
    if find_model_shards(actor, ".pt"):
        return _strip_wrappers(load_fsdp_shards(actor)), "veRL FSDP shards"
    raise CheckpointError(
        f"{actor}: no weights to convert (no model_world_size_*_rank_*.safetensors or .pt shards, "
        "no DeepSpeed checkpoint folder)"
    )


def load_fsdp_shards(actor: Path) -> dict[str, torch.Tensor]:
    """veRL's FSDP checkpoint as one full state dict. Each rank's file is ``torch.save`` of the
    model's sharded state dict: a DTensor per parameter, sharded along one dimension of a 1-D
    device mesh (FSDP), which the ranks' local pieces are concatenated along, in mesh order; a
    replicated one or a plain tensor is taken from rank 0. Loaded weights-only (tensors and
    torch's own DTensor types, nothing that runs code); an HSDP or tensor-parallel layout (a
    mesh of more dimensions) is refused, naming the tensor."""
    from torch.distributed.tensor import (
        DTensor,  # importing it lets a weights-only load read DTensors
    )

    files = find_model_shards(actor, ".pt")
    per_rank = []
    for f in files:
        try:
            per_rank.append(torch.load(f, map_location="cpu", weights_only=True))
        except Exception as e:  # noqa: BLE001 - a pickle naming anything else is refused here
            raise CheckpointError(f"{f}: not a weights-only FSDP shard ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0]})") from None
    out: dict[str, torch.Tensor] = {}
    for name, first in per_rank[0].items():
        pieces = [sd.get(name) for sd in per_rank]
        if any(p is None for p in pieces):
            raise CheckpointError(f"{files[0].parent}: tensor {name!r} is missing from some ranks' shards")
        if not isinstance(first, DTensor):
            if not isinstance(first, torch.Tensor):
                raise CheckpointError(f"{files[0]}: {name!r} is a {type(first).__name__}, not a tensor")
            out[name] = first
            continue
        mesh, (placement, *more) = first.device_mesh, first.placements
        if more or mesh.ndim != 1:
            raise CheckpointError(f"{files[0]}: {name!r} lies on a {mesh.ndim}-D device mesh {tuple(first.placements)} "
                                  "(HSDP or tensor parallel): only FSDP's 1-D sharding is converted")
        if placement.is_replicate():
            out[name] = first.to_local()
        elif placement.is_shard():
            order = mesh.mesh.flatten().tolist()  # mesh position -> the rank (file) holding it
            if sorted(order) != list(range(len(files))):
                raise CheckpointError(f"{files[0]}: {name!r}: its mesh {order} is not the {len(files)} ranks saved")
            dim = placement.dim  # type: ignore[attr-defined]
            out[name] = torch.cat([pieces[r].to_local() for r in order], dim=dim)
        else:
            raise CheckpointError(f"{files[0]}: {name!r} is {placement} (partial sums): not a saved state")
        if tuple(out[name].shape) != tuple(first.shape):
            raise CheckpointError(f"{actor}: {name!r} merges to {tuple(out[name].shape)}, its shards say "
                                  f"{tuple(first.shape)}")
    return out


def check_state_dict(state_dict: dict[str, torch.Tensor], config_dir: Path) -> None:
    """Raise naming the tensors when ``state_dict`` does not fit the model of ``config_dir``.

    The model is built on the ``meta`` device (no memory). Tied weights may be absent. A
    config transformers cannot build (custom code) skips the check with a warning."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.from_pretrained(str(config_dir))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as e:  # noqa: BLE001 - unknown architectures: convert without the check
        log.warning("cannot build %s to check tensor names (%s); skipping the check", config_dir, e)
        return
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = getattr(model, "_tied_weights_keys", None) or {}
    tied_names = set(tied) if isinstance(tied, dict) else set()
    if getattr(cfg, "tie_word_embeddings", False):
        tied_names.add("lm_head.weight")
    missing = sorted(set(expected) - set(state_dict) - tied_names)
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = sorted(
        k for k in set(expected) & set(state_dict) if tuple(state_dict[k].shape) != expected[k]
    )
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if wrong:
            parts.append(
                "shape mismatch "
                + ", ".join(
                    f"{k}: {tuple(state_dict[k].shape)} vs {expected[k]}" for k in wrong[:5]
                )
            )
        raise CheckpointError(
            f"weights do not match the model of {config_dir / 'config.json'}: " + "; ".join(parts)
        )


def convert_checkpoint(
    step_path: str | Path,
    base_model_dir: str | Path | None = None,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    check: bool = True,
    allowed_globals: Sequence[Any] = (),
) -> ConvertResult:
    """Convert one ``global_step_N`` folder (see :func:`convert_checkpoints`)."""
    step_path = Path(step_path)
    step = step_of(step_path)
    if step is None:
        raise CheckpointError(f"{step_path}: not a global_step_N folder")
    actor = step_path / "actor"
    hf = actor / "huggingface"
    if hf_weights_complete(hf):
        return ConvertResult(step, step_path, hf, "skipped", "already complete")
    if not actor.is_dir():
        raise CheckpointError(f"{actor}: no actor folder")
    base = Path(base_model_dir).expanduser() if base_model_dir else None
    if (hf / "config.json").is_file():
        config_dir = hf
    elif base is not None and (base / "config.json").is_file():
        config_dir = base
    elif base is not None:
        raise CheckpointError(f"{base}: --base-model-dir has no config.json")
    else:
        raise CheckpointError(
            f"{hf}: no config.json; pass --base-model-dir with the base model's folder"
        )
    state_dict, source = load_actor_state_dict(actor, allowed_globals=allowed_globals)
    if check:
        check_state_dict(state_dict, config_dir)
    sources = [p for p in (hf, base) if p is not None and p.is_dir()]
    save_hf_model(hf, state_dict=state_dict, files_from=sources, max_shard_size=max_shard_size)
    log.info("converted %s from %s", hf, source)
    return ConvertResult(step, step_path, hf, "converted", source)


def convert_checkpoints(
    checkpoint_dir: str | Path,
    base_model_dir: str | Path | None = None,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    allowed_globals: Sequence[Any] = (),
) -> list[ConvertResult]:
    """``trinity convert --checkpoint-dir DIR [--base-model-dir DIR]``.

    Converts every ``global_step_*`` that ``checkpoint_dir`` designates and returns one result
    per step (``converted`` or ``skipped``), in step order. The first failure raises, naming
    the folder; steps converted before it stay converted (each is written atomically).
    ``allowed_globals``: see :func:`load_actor_state_dict`."""
    return [
        convert_checkpoint(
            p, base_model_dir, max_shard_size=max_shard_size, allowed_globals=allowed_globals
        )
        for p in find_step_dirs(checkpoint_dir)
    ]
