"""Model and dataset paths that may be Hugging Face hub ids, pointed at the hub cache.

Why below the roles (``runtime``): the config loader (:mod:`roles.runtime.config`) resolves
every id the cache holds, so each process and ``trinity config`` see local paths; the preflight
checks (:mod:`roles.launch.checks`) resolve what their command reads, downloading what the cache
lacks. One list of the fields (:func:`path_fields`) serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.algorithms import resolve
from schemas.config import TrinityConfig
from schemas.modes import MODES
from storage.hub import HubError, RepoType, offline
from storage.hub import resolve as resolve_hub_id


@dataclass
class PathField:
    """A config field naming a model or dataset that may be a hub id: where its resolved path
    is written back, and who reads it (no one: resolved for display only)."""

    key: str
    owner: object
    attr: str
    repo_type: RepoType
    readers: frozenset[str]


def uses_critic(cfg: TrinityConfig) -> bool:
    """Whether the trainer loads ``model.critic_model_path`` (a critic: GAE)."""
    try:
        return resolve(cfg.algorithm.algorithm_type).use_critic
    except ValueError:  # an unknown algorithm is reported by the config loader
        return False


def stage_prefix(stages: list[TrinityConfig], i: int) -> str:
    """The prefix of stage ``i``'s keys in messages (none for a config without stages)."""
    return f"stages[{i}] ({stages[i].name.rsplit('/', 1)[-1]})." if len(stages) > 1 else ""


def path_fields(cfg: TrinityConfig, first: bool, where: str = "") -> list[PathField]:
    """Every field of ``cfg`` that names a model or a dataset by path, hub ids allowed.

    Readers follow :func:`_inputs`: a later stage's models are its predecessor's checkpoint
    (``roles/launch/stages.py``), an external engine's ``model_path`` is a name on someone's server
    (never resolved), a taskset outside an exploring mode is not read."""
    none: frozenset[str] = frozenset()
    ei, ti = cfg.buffer.explorer_input, cfg.buffer.trainer_input
    explorer, buffer = frozenset({"explorer"}), frozenset({"buffer"})
    m = cfg.model
    out = [
        PathField(f"{where}model.model_path", m, "model_path", "model",
                  frozenset({"explorer", "trainer", "buffer"}) if first else none),
        PathField(f"{where}model.critic_model_path", m, "critic_model_path", "model",
                  frozenset({"trainer"}) if first and uses_critic(cfg) else none),
    ]
    rollout = cfg.explorer.rollout_model
    if rollout.engine_type != "external":
        out.append(PathField(f"{where}explorer.rollout_model.model_path", rollout, "model_path",
                             "model", explorer if first else none))
    for j, aux in enumerate(cfg.explorer.auxiliary_models):
        if aux.engine_type != "external":
            out.append(PathField(f"{where}explorer.auxiliary_models[{j}].model_path", aux, "model_path",
                                 "model", explorer if first else none))
    for path, ts in ei.training():
        out.append(PathField(f"{where}{path}.path", ts, "path", "dataset",
                             explorer if MODES[cfg.mode].reads_taskset else none))
    for j, ts in enumerate(ei.eval_tasksets):
        out.append(PathField(f"{where}buffer.explorer_input.eval_tasksets[{j}].path", ts, "path",
                             "dataset", explorer))
    eb = ti.experience_buffer
    if eb is not None and eb.storage_type == "file":
        out.append(PathField(f"{where}buffer.trainer_input.experience_buffer.path", eb, "path",
                             "dataset", buffer))
    for name, b in ti.auxiliary_buffers.items():
        out.append(PathField(f"{where}buffer.trainer_input.auxiliary_buffers.{name}.path", b, "path",
                             "dataset", buffer))
    return out


def resolve_hub_paths(
    stages: list[TrinityConfig], needs: frozenset[str] | None = None, *, download: bool = False
) -> tuple[list[str], set[str]]:
    """Point every path field that names a cached hub id at its snapshot folder, in place.

    ``needs`` None: every field of every config (the loader: what ``trinity config`` prints and
    every role process runs with). Otherwise only the fields an entry point reads (its
    :data:`NEEDS`), and ``download`` fetches those the cache lacks (``HF_HUB_OFFLINE``
    permitting). Returns ``(errors, keys)``: one line per failed download, and the config keys
    those failures cover (:func:`preflight` does not also call them missing). An id with no
    snapshot and no download is left as written: :func:`check_inputs` names it. One value is
    resolved once, so fields derived from ``model.model_path`` stay equal to it."""
    download = download and not offline()  # offline, an id not cached is "missing" (check_inputs)
    errors: list[str] = []
    failed: set[str] = set()
    done: dict[tuple[str, str], str | None] = {}
    for i, cfg in enumerate(stages):
        first = i == 0 or needs is None
        for f in path_fields(cfg, first, stage_prefix(stages, i) if needs is not None else ""):
            value = getattr(f.owner, f.attr)
            if not value or (needs is not None and not f.readers & needs):
                continue
            memo = (value, f.repo_type)
            if memo in done:
                if done[memo] is None and download:  # one download per id, one line per key
                    failed.add(f.key)
                    main = f.owner is cfg.model and f.attr == "model_path"
                    if main or f.repo_type != "model" or value != cfg.model.model_path:  # no copy
                        errors.append(f"{f.key}: {value}: the same download failed")
            else:
                try:
                    done[memo] = resolve_hub_id(value, f.key, f.repo_type, download=download)
                except HubError as e:
                    done[memo] = None
                    if download:
                        errors.append(str(e))
                        failed.add(f.key)
            resolved = done[memo]
            if resolved is not None and resolved != value:
                setattr(f.owner, f.attr, resolved)
    return errors, failed
