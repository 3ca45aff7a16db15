"""Checkpoints in the seeds' layout: Hugging Face folders, trainer shards, latest files, pruning.

Layout under ``<checkpoint_root_dir>/<project>/<name>`` (the *job dir*)::

    global_step_N/actor/huggingface/            config, tokenizer, model.safetensors
                                                (or model-0000k-of-0000n + index json)
    global_step_N/actor/model_world_size_W_rank_r.safetensors   trainer shards (disjoint tensors)
    global_step_N/actor/trainer_state.pt        optimizer, scheduler, step, rng (per rank if W>1)
    latest_checkpointed_iteration.txt           step of the newest complete checkpoint
    latest_state_dict_iteration.txt             step of the newest saved model weights
    explorer_meta.json, trainer_meta.json

Why these rules:

* Every file a reader trusts is written to a temporary name and ``os.replace``-d into place
  (and the folder fsync-ed), so a crash leaves either the old file or the new one, never half.
* A Hugging Face folder is assembled in a staging folder and renamed into place as a whole:
  ``huggingface/model.safetensors`` existing means the folder is complete, which is what
  ``trinity convert`` uses to skip finished checkpoints.
* The ``latest_*`` files are the commit points; they are written only after everything they
  point to is on disk. Pruning never deletes what they point to.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

LATEST_CHECKPOINT_FILE = "latest_checkpointed_iteration.txt"
LATEST_STATE_DICT_FILE = "latest_state_dict_iteration.txt"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TRAINER_STATE_NAME = "trainer_state.pt"
#: Same default as ``save_pretrained``: one file up to this size, shards above it.
DEFAULT_MAX_SHARD_SIZE = 5 * 1024**3

STEP_DIR_RE = re.compile(r"^global_step_(\d+)$")
#: Files that are weights (not copied between Hugging Face folders: they are rewritten).
_WEIGHT_FILE_RE = re.compile(r"(\.safetensors|\.bin|\.pt|\.pth|\.index\.json|\.gguf)$")

Role = Literal["explorer", "trainer"]
LatestKind = Literal["checkpoint", "state_dict"]


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or inconsistent; the message names the file."""


# --------------------------------------------------------------------------------------------
# paths
# --------------------------------------------------------------------------------------------


def job_dir(checkpoint_root_dir: str | Path, project: str, name: str) -> Path:
    """``<checkpoint_root_dir>/<project>/<name>``: everything of one run lives here."""
    return Path(checkpoint_root_dir) / project / name


def step_dir(job: str | Path, step: int) -> Path:
    return Path(job) / f"global_step_{step}"


def actor_dir(job: str | Path, step: int) -> Path:
    return step_dir(job, step) / "actor"


def hf_dir(job: str | Path, step: int) -> Path:
    """The Hugging Face folder of step ``step``: what vLLM, ``from_pretrained`` and the
    checkpoint sync method load."""
    return actor_dir(job, step) / "huggingface"


def step_of(path: str | Path) -> int | None:
    """N of the nearest ``global_step_N`` at or above ``path`` (``.../global_step_7/actor`` -> 7)."""
    for part in reversed(Path(path).parts):
        m = STEP_DIR_RE.match(part)
        if m:
            return int(m.group(1))
    return None


def list_steps(job: str | Path) -> list[int]:
    """Steps with a ``global_step_N`` folder in the job dir, ascending."""
    job = Path(job)
    if not job.is_dir():
        return []
    steps = []
    for p in job.iterdir():
        m = STEP_DIR_RE.match(p.name)
        if m and p.is_dir() and not p.is_symlink():
            steps.append(int(m.group(1)))
    return sorted(steps)


# --------------------------------------------------------------------------------------------
# atomic small files
# --------------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old content or the new, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _latest_path(job: str | Path, kind: LatestKind) -> Path:
    if kind == "checkpoint":
        return Path(job) / LATEST_CHECKPOINT_FILE
    if kind == "state_dict":
        return Path(job) / LATEST_STATE_DICT_FILE
    raise ValueError(f"kind: expected 'checkpoint' or 'state_dict', got {kind!r}")


def write_latest(job: str | Path, step: int, kind: LatestKind = "checkpoint") -> Path:
    """Record ``step`` in ``latest_checkpointed_iteration.txt`` (kind ``checkpoint``) or
    ``latest_state_dict_iteration.txt`` (kind ``state_dict``), atomically."""
    if step < 0:
        raise ValueError(f"step: must be >= 0, got {step}")
    return atomic_write_text(_latest_path(job, kind), f"{step}\n")


def read_latest(job: str | Path, kind: LatestKind = "checkpoint") -> int | None:
    """The step a latest file records, or None when there is none yet."""
    path = _latest_path(job, kind)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: expected a step number, got {text!r}") from e


def _meta_path(job: str | Path, role: Role) -> Path:
    if role not in ("explorer", "trainer"):
        raise ValueError(f"role: expected 'explorer' or 'trainer', got {role!r}")
    return Path(job) / f"{role}_meta.json"


def write_meta(job: str | Path, role: Role, meta: Mapping[str, Any]) -> Path:
    """Write ``explorer_meta.json`` / ``trainer_meta.json`` (the role's resume point) atomically."""
    return atomic_write_json(_meta_path(job, role), dict(meta))


def read_meta(job: str | Path, role: Role) -> dict[str, Any] | None:
    path = _meta_path(job, role)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}") from e


# --------------------------------------------------------------------------------------------
# safetensors files, sharded like save_pretrained
# --------------------------------------------------------------------------------------------


def parse_size(size: int | str) -> int:
    """``5000000``, ``"500MB"``, ``"5GB"``, ``"2GiB"`` -> bytes (``save_pretrained`` notation)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)?\s*", size.upper())
    if not m:
        raise ValueError(f"max_shard_size: cannot parse {size!r} (e.g. '5GB', '500MB', 10**9)")
    mult = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    mult |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    return int(float(m.group(1)) * mult[m.group(2) or ""])


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def dedupe_shared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop tensors that are the same memory as an earlier one (tied embeddings), keeping the
    first name, as ``save_pretrained`` does; other overlapping views are cloned.

    safetensors refuses shared storage, and the loader re-ties what the config says is tied."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    storages: set[int] = set()
    for name, t in state_dict.items():
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.numel() == 0:
            out[name] = t.contiguous()
            continue
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen:
            continue
        seen[key] = name
        if ptr in storages or not t.is_contiguous():
            t = t.contiguous().clone()
        storages.add(ptr)
        out[name] = t
    return out


def shard_plan(sizes: Mapping[str, int], max_shard_size: int) -> list[list[str]]:
    """Split tensors (in order) into files of at most ``max_shard_size`` bytes; a tensor bigger
    than the limit gets a file of its own. The same rule as ``save_pretrained``."""
    shards: list[list[str]] = [[]]
    current = 0
    for name, size in sizes.items():
        if shards[-1] and current + size > max_shard_size:
            shards.append([])
            current = 0
        shards[-1].append(name)
        current += size
    return shards


def save_safetensors(
    state_dict: Mapping[str, torch.Tensor],
    out_dir: str | Path,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> list[Path]:
    """Write ``model.safetensors``, or ``model-0000k-of-0000n.safetensors`` shards plus
    ``model.safetensors.index.json`` above ``max_shard_size``: what ``from_pretrained`` reads.

    The single file or the index is written last, through a rename: its presence means every
    shard it lists is complete."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = dedupe_shared(state_dict)
    limit = parse_size(max_shard_size)
    plan = shard_plan({k: _nbytes(v) for k, v in tensors.items()}, limit)
    meta = {"format": "pt"}
    if len(plan) == 1:
        tmp = out / f".{WEIGHTS_NAME}.tmp-{os.getpid()}"
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, out / WEIGHTS_NAME)
        _fsync_dir(out)
        return [out / WEIGHTS_NAME]
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    n = len(plan)
    for i, names in enumerate(plan, start=1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        tmp = out / f".{fname}.tmp-{os.getpid()}"
        save_file({k: tensors[k] for k in names}, str(tmp), metadata=meta)
        os.replace(tmp, out / fname)
        written.append(out / fname)
        weight_map.update({k: fname for k in names})
    total = sum(_nbytes(t) for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    written.append(atomic_write_json(out / WEIGHTS_INDEX_NAME, index))
    return written


def hf_weights_complete(folder: str | Path) -> bool:
    """True when ``folder`` holds ``model.safetensors``, or an index whose shards all exist."""
    folder = Path(folder)
    if (folder / WEIGHTS_NAME).is_file():
        return True
    index = folder / WEIGHTS_INDEX_NAME
    if not index.is_file():
        return False
    try:
        files = set(json.loads(index.read_text())["weight_map"].values())
    except (json.JSONDecodeError, KeyError, TypeError):
        return False
    return all((folder / f).is_file() for f in files)


def load_safetensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face folder (single file or index + shards)."""
    folder = Path(folder)
    if (folder / WEIGHTS_NAME).is_file():
        files = [folder / WEIGHTS_NAME]
    elif (folder / WEIGHTS_INDEX_NAME).is_file():
        index = json.loads((folder / WEIGHTS_INDEX_NAME).read_text())
        files = [folder / f for f in sorted(set(index["weight_map"].values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{folder / WEIGHTS_INDEX_NAME}: shard files missing: {missing}")
    else:
        raise CheckpointError(f"{folder}: neither {WEIGHTS_NAME} nor {WEIGHTS_INDEX_NAME} found")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                out[k] = sf.get_tensor(k)
    return out


# --------------------------------------------------------------------------------------------
# Hugging Face folders
# --------------------------------------------------------------------------------------------


def _copy_support_files(src: Path, dst: Path) -> None:
    """Copy config/tokenizer/template files of ``src`` that ``dst`` lacks (never weights)."""
    if not src.is_dir():
        return
    for p in src.iterdir():
        if p.is_file() and not _WEIGHT_FILE_RE.search(p.name) and not (dst / p.name).exists():
            shutil.copy2(p, dst / p.name)


def save_hf_model(
    out_dir: str | Path,
    *,
    model: Any = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    config: Any = None,
    tokenizer: Any = None,
    generation_config: Any = None,
    files_from: Iterable[str | Path] = (),
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write a complete Hugging Face model folder at ``out_dir``, atomically as a whole.

    Weights come from ``state_dict`` (e.g. a ZeRO-gathered one) or ``model.state_dict()``;
    ``config``/``generation_config`` default to the model's. ``files_from`` folders supply
    missing non-weight files (tokenizer, chat template, a base model's config). The folder is
    built beside ``out_dir`` and renamed into place, replacing any previous content."""
    out = Path(out_dir)
    if state_dict is None:
        if model is None:
            raise ValueError("save_hf_model: pass model or state_dict")
        state_dict = model.state_dict()
    if model is not None:
        config = config if config is not None else getattr(model, "config", None)
        if generation_config is None and getattr(model, "can_generate", lambda: False)():
            generation_config = getattr(model, "generation_config", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.staging-{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        save_safetensors(state_dict, staging, max_shard_size)
        if config is not None:
            config.save_pretrained(staging)
        if generation_config is not None:
            generation_config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        for src in files_from:
            _copy_support_files(Path(src), staging)
        if not (staging / "config.json").is_file():
            raise CheckpointError(
                f"{out}: no config.json (pass config, a model, or files_from with one)"
            )
        for f in staging.iterdir():
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(staging)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            if old.exists():
                shutil.rmtree(old)
            os.replace(out, old)
        os.replace(staging, out)
        _fsync_dir(out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


# --------------------------------------------------------------------------------------------
# trainer shards and trainer state
# --------------------------------------------------------------------------------------------


def shard_file_name(rank: int, world_size: int) -> str:
    return f"model_world_size_{world_size}_rank_{rank}.safetensors"


def partition_tensors(sizes: Mapping[str, int], world_size: int) -> list[list[str]]:
    """Assign whole tensors to ranks, balancing bytes (largest first to the lightest rank).

    Deterministic from names and sizes, so every rank computes the same plan and writes its
    own disjoint part of a gathered state dict."""
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    loads = [0] * world_size
    parts: list[list[str]] = [[] for _ in range(world_size)]
    for name in sorted(sizes, key=lambda k: (-sizes[k], k)):
        r = min(range(world_size), key=lambda i: (loads[i], i))
        parts[r].append(name)
        loads[r] += sizes[name]
    order = {k: i for i, k in enumerate(sizes)}
    return [sorted(p, key=order.__getitem__) for p in parts]


def save_model_shard(
    actor: str | Path,
    state_dict: Mapping[str, torch.Tensor],
    rank: int = 0,
    world_size: int = 1,
    *,
    names: Iterable[str] | None = None,
) -> Path:
    """Write this rank's tensors to ``actor/model_world_size_W_rank_r.safetensors``.

    ``names`` selects the tensors; by default the rank's part of :func:`partition_tensors`
    over the whole ``state_dict``. ``trinity convert`` merges the shards into
    ``huggingface/``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} outside [0, world_size={world_size})")
    tensors = dedupe_shared(state_dict)
    if names is None:
        names = partition_tensors({k: _nbytes(v) for k, v in tensors.items()}, world_size)[rank]
    part = {k: tensors[k] for k in names if k in tensors}
    actor = Path(actor)
    actor.mkdir(parents=True, exist_ok=True)
    dst = actor / shard_file_name(rank, world_size)
    tmp = actor / f".{dst.name}.tmp-{os.getpid()}"
    save_file(
        part, str(tmp), metadata={"format": "pt", "rank": str(rank), "world_size": str(world_size)}
    )
    os.replace(tmp, dst)
    _fsync_dir(actor)
    return dst


def find_model_shards(actor: str | Path, suffix: str = ".safetensors") -> list[Path]:
    """The ``model_world_size_W_rank_r<suffix>`` files of ``actor`` (all ranks of one world
    size), rank order: the trainer's shards, or veRL's FSDP ones with ``suffix=".pt"``."""
    actor = Path(actor)
    if not actor.is_dir():
        return []
    pattern = re.compile(r"^model_world_size_(\d+)_rank_(\d+)" + re.escape(suffix) + "$")
    by_ws: dict[int, dict[int, Path]] = {}
    for p in actor.iterdir():
        m = pattern.match(p.name)
        if m:
            by_ws.setdefault(int(m.group(1)), {})[int(m.group(2))] = p
    if not by_ws:
        return []
    if len(by_ws) > 1:
        raise CheckpointError(f"{actor}: {suffix} shards of several world sizes {sorted(by_ws)}")
    ws, ranks = next(iter(by_ws.items()))
    missing = [f"model_world_size_{ws}_rank_{r}{suffix}" for r in range(ws) if r not in ranks]
    if missing:
        raise CheckpointError(f"{actor}: missing shards {missing}")
    return [ranks[r] for r in range(ws)]


def load_model_shards(actor: str | Path) -> dict[str, torch.Tensor]:
    """Merge ``model_world_size_W_rank_*.safetensors`` into one state dict (each tensor must
    come from exactly one rank)."""
    files = find_model_shards(actor)
    if not files:
        raise CheckpointError(f"{actor}: no model_world_size_*_rank_*.safetensors shards")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118
                if k in out:
                    raise CheckpointError(f"{f}: tensor {k!r} also in another rank's shard")
                out[k] = sf.get_tensor(k)
    return out


def trainer_state_name(rank: int = 0, world_size: int = 1) -> str:
    if world_size == 1:
        return TRAINER_STATE_NAME
    return f"trainer_state_world_size_{world_size}_rank_{rank}.pt"


def saved_trainer_states(actor: str | Path) -> list[str]:
    """The trainer state files in an actor folder, one per rank that saved it: what a
    trainer of another size names when it refuses the checkpoint."""
    return sorted(p.name for p in Path(actor).glob("trainer_state*.pt"))


def save_trainer_state(
    actor: str | Path, state: Mapping[str, Any], rank: int = 0, world_size: int = 1
) -> Path:
    """``torch.save`` the trainer's own state (optimizer, scheduler, step, rng) atomically.

    Keep values to tensors, numbers, strings, lists, tuples and dicts (see
    :func:`capture_rng_state`): then loading needs no pickle of arbitrary classes."""
    dst = Path(actor) / trainer_state_name(rank, world_size)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    torch.save(dict(state), tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dst)
    _fsync_dir(dst.parent)
    return dst


def load_torch_file(
    path: str | Path, *, allowed_globals: Sequence[Any] = (), mmap: bool = False
) -> Any:
    """``torch.load`` a ``.pt`` file the only way trinity does: ``weights_only=True``.

    A checkpoint may come from anyone (``trinity convert`` on a folder someone sent you), and
    a full unpickle runs whatever code the pickle names. Weights-only loading rebuilds tensors,
    numbers, strings and containers only, plus the classes in ``allowed_globals`` (DeepSpeed's
    few checkpoint classes, which callers pass; any ``torch.serialization.safe_globals``
    context around the call counts too). Anything else fails with :class:`CheckpointError`
    naming the file and the global that was refused, before any of it runs."""
    path = Path(path)
    try:
        with torch.serialization.safe_globals(list(allowed_globals)):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        m = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"global {m.group(1)}" if m else str(e).strip().splitlines()[-1][:200]
        raise CheckpointError(
            f"{path}: refused to load ({what} is not allowed): the file holds pickled code or "
            "objects other than tensors and plain data, and trinity never unpickles those "
            "(torch.load weights_only=True)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable torch checkpoint: {e}") from e


def load_trainer_state(
    actor: str | Path, rank: int = 0, world_size: int = 1
) -> dict[str, Any]:
    """Load what :func:`save_trainer_state` wrote, weights-only (see :func:`load_torch_file`;
    the caller's ``torch.serialization.safe_globals`` allows DeepSpeed's optimizer classes)."""
    path = Path(actor) / trainer_state_name(rank, world_size)
    if not path.is_file():
        raise CheckpointError(f"{path}: no trainer state")
    return load_torch_file(path)


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states as weights-only-loadable values."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"]).astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------------------------
# whole checkpoints
# --------------------------------------------------------------------------------------------


def prune_checkpoints(job: str | Path, keep: int, protect: Iterable[int] = ()) -> list[int]:
    """Delete the oldest ``global_step_*`` folders so that ``keep`` remain (0 keeps all).

    The steps the latest files name are never deleted, nor ``protect``. A folder is renamed to
    a hidden trash name before removal, so a crash mid-delete never leaves a half folder that
    looks like a checkpoint."""
    job = Path(job)
    for stale in job.glob(".trash-global_step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep <= 0:
        return []
    steps = list_steps(job)
    keep_set = set(protect)
    for kind in ("checkpoint", "state_dict"):
        latest = read_latest(job, kind)  # type: ignore[arg-type]
        if latest is not None:
            keep_set.add(latest)
    return _delete_steps(job, [s for s in steps[: max(0, len(steps) - keep)] if s not in keep_set])


def _delete_steps(job: Path, steps: list[int]) -> list[int]:
    """Delete ``global_step_N`` folders through a hidden trash name (see prune_checkpoints)."""
    for s in steps:
        trash = job / f".trash-global_step_{s}-{os.getpid()}"
        os.replace(step_dir(job, s), trash)
        shutil.rmtree(trash, ignore_errors=True)
    if steps:
        _fsync_dir(job)
    return steps


#: Weight-only folders a checkpoint sync keeps: the newest, and the one before it, which an
#: explorer that began loading it before the newest was offered may still be reading.
STATE_DICTS_KEPT = 2


def prune_state_dicts(job: str | Path, keep: int = STATE_DICTS_KEPT) -> list[int]:
    """Delete the weight-only folders (a checkpoint sync's hand-offs: no trainer state) but
    the newest ``keep``; full checkpoints are :func:`prune_checkpoints`' business. Without
    this, checkpoint sync wrote one full model per sync for the whole run."""
    job = Path(job)
    protect = {read_latest(job, "checkpoint")}
    weight_only = [s for s in list_steps(job)
                   if s not in protect and not saved_trainer_states(actor_dir(job, s))]
    return _delete_steps(job, weight_only[: max(0, len(weight_only) - keep)])


def commit_checkpoint(job: str | Path, step: int, max_checkpoints_to_keep: int = 0) -> list[int]:
    """Make step ``step`` the latest checkpoint (after every rank finished writing it), then
    prune. Returns the deleted steps."""
    write_latest(job, step, "checkpoint")
    prev = read_latest(job, "state_dict")
    if prev is None or prev < step:
        write_latest(job, step, "state_dict")
    return prune_checkpoints(job, max_checkpoints_to_keep)


def save_checkpoint(
    job: str | Path,
    step: int,
    *,
    state_dict: Mapping[str, torch.Tensor],
    config: Any = None,
    tokenizer: Any = None,
    trainer_state: Mapping[str, Any] | None = None,
    save_hf: bool = True,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    max_checkpoints_to_keep: int = 0,
    trainer_meta: Mapping[str, Any] | None = None,
    world_size: int = 1,
) -> Path:
    """Save one checkpoint's full weights and rank 0's trainer state, and commit it; returns
    ``global_step_N/actor``.

    With ``save_hf`` the weights go to ``huggingface/`` only; without, to a trainer shard, with
    config and tokenizer still written to ``huggingface/`` so that ``trinity convert`` needs no
    base model. With ``world_size`` > 1 the other ranks must have written their own trainer
    state (:func:`save_trainer_state`) before rank 0 calls this: it commits the step."""
    actor = actor_dir(job, step)
    actor.mkdir(parents=True, exist_ok=True)
    if save_hf:
        save_hf_model(
            actor / "huggingface",
            state_dict=state_dict,
            config=config,
            tokenizer=tokenizer,
            max_shard_size=max_shard_size,
        )
    else:
        save_model_shard(actor, state_dict, 0, 1)
        if config is not None or tokenizer is not None:
            hf = actor / "huggingface"
            hf.mkdir(exist_ok=True)
            if config is not None:
                config.save_pretrained(hf)
            if tokenizer is not None:
                tokenizer.save_pretrained(hf)
    if trainer_state is not None:
        save_trainer_state(actor, trainer_state, 0, world_size)
    if trainer_meta is not None:
        write_meta(job, "trainer", trainer_meta)
    commit_checkpoint(job, step, max_checkpoints_to_keep)
    return actor


def save_state_dict_checkpoint(
    job: str | Path,
    step: int,
    *,
    state_dict: Mapping[str, torch.Tensor],
    config: Any = None,
    tokenizer: Any = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Save only the weights of step ``step`` as a Hugging Face folder and record it in
    ``latest_state_dict_iteration.txt``: the checkpoint sync method's hand-off to the explorer."""
    out = save_hf_model(
        hf_dir(job, step),
        state_dict=state_dict,
        config=config,
        tokenizer=tokenizer,
        max_shard_size=max_shard_size,
    )
    prev = read_latest(job, "state_dict")
    if prev is None or prev < step:
        write_latest(job, step, "state_dict")
    prune_state_dicts(job)
    return out


ResumeMode = Literal["auto", "disable", "resume_path"]


def resume_point(
    job: str | Path, mode: ResumeMode, resume_from_path: str = "", session: float | None = None
) -> tuple[Path, int] | None:
    """The checkpoint a starting trainer loads, as (the job dir holding it, its step); None:
    start from the model at step 0.

    ``mode`` is ``trainer.resume_mode``: ``auto`` the job's latest committed checkpoint (None
    when there is none), ``disable`` none, ``resume_path`` the ``global_step_N`` folder
    ``resume_from_path`` names (CheckpointError if it is not one, or has no ``actor/``).

    Why ``session``: a trainer that ``trinity run`` restarts after a crash must go on from
    where it got, not go back to the model or to ``resume_from_path`` and redo (or lose) the
    steps since: the modes choose where a run starts. So when the job's latest checkpoint was
    committed by this session (``trainer_meta.json`` names the session and that step, see
    :func:`roles.runtime.config.session_start`), it is resumed in every mode. The step must match
    too: the meta file is written just before the commit, and a crash between the two leaves
    a meta of this session beside a latest checkpoint of an older run."""
    job = Path(job)
    own = read_latest(job, "checkpoint")
    if own is not None and session is not None:
        meta = read_meta(job, "trainer") or {}
        if meta.get("session") == session and meta.get("latest_iteration") == own:
            return job, own
    if mode == "auto":
        return (job, own) if own is not None else None
    if mode == "disable":
        return None
    if mode != "resume_path":
        raise ValueError(f"mode: expected 'auto', 'disable' or 'resume_path', got {mode!r}")
    path = Path(resume_from_path).expanduser()
    m = STEP_DIR_RE.match(path.name)
    if not m:
        raise CheckpointError(f"trainer.resume_from_path: {resume_from_path!r} is not a global_step_N folder")
    if not (path / "actor").is_dir():
        raise CheckpointError(f"trainer.resume_from_path: {path}: no actor/ checkpoint folder in it")
    return path.parent, int(m.group(1))


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` found for one step."""

    step: int
    actor_dir: Path
    state_dict: dict[str, torch.Tensor]
    trainer_state: dict[str, Any] | None


def load_checkpoint(
    job: str | Path, step: int | None = None, *, rank: int = 0, world_size: int = 1
) -> LoadedCheckpoint | None:
    """Load step ``step`` (default: the latest committed one; None when there is none).

    Weights come from the trainer shards when present, else from ``huggingface/``."""
    if step is None:
        step = read_latest(job, "checkpoint")
        if step is None:
            return None
    actor = actor_dir(job, step)
    if not actor.is_dir():
        raise CheckpointError(f"{actor}: checkpoint folder missing")
    if find_model_shards(actor):
        sd = load_model_shards(actor)
    else:
        sd = load_safetensors(actor / "huggingface")
    state_path = actor / trainer_state_name(rank, world_size)
    state = load_trainer_state(actor, rank, world_size) if state_path.is_file() else None
    return LoadedCheckpoint(step=step, actor_dir=actor, state_dict=sd, trainer_state=state)
