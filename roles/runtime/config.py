"""How a role process gets its configuration: the loader, the algorithm's parts, warnings once.

Roles call :func:`load` with their parsed CLI arguments; it reads the same sources as
``trinity config`` (so what you print is what runs), fills the algorithm parts that
``algorithm_type`` implies from :mod:`ops.algorithms` (so a wrong part name fails before any
process starts), points hub ids (``model_path: Org/Name``, ``path: Org/Dataset@rev``) at their
snapshots in the Hugging Face cache (``roles/launch/checks.py``: every process runs on, and
``trinity config`` prints, local paths), and prints each warning about ignored Trinity-RFT
sections once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ops.advantages import GROUP_ADVANTAGE_FNS
from ops.algorithms import CONFIG_FIELDS, AlgorithmSpec, resolve
from roles.runtime.hub_paths import resolve_hub_paths
from roles.runtime.plugins import (
    PLUGIN_DIRS_ENV,
    PluginError,
    importable_working_dir,
    load_plugin_dirs,
)
from schemas.config import TrinityConfig
from schemas.loader import DEFAULT, DERIVED, ConfigError, LoadedConfig, dotenv_value, load_config
from schemas.modes import MODES


def resolve_algorithm(cfg: TrinityConfig, sources: dict[str, str]) -> list[str]:
    """Fill unset ``algorithm.*`` parts from ``algorithm_type``'s defaults; return problems.

    ``repeat_times`` counts as set only when a source set it: the config default (1) must not
    override an algorithm whose default group size is larger.
    """
    alg = cfg.algorithm
    overrides = {f: getattr(alg, f) for f in CONFIG_FIELDS if f != "repeat_times"}
    user_repeat = sources.get("algorithm.repeat_times", DEFAULT) not in (DEFAULT, DERIVED)
    if user_repeat:
        overrides["repeat_times"] = alg.repeat_times
    try:
        spec = resolve(alg.algorithm_type, **overrides)
    except ValueError as e:
        return [str(e)]
    for f in CONFIG_FIELDS:
        value = getattr(spec, f)
        if f == "repeat_times" and user_repeat:
            continue
        if getattr(alg, f) is None or (f == "repeat_times" and value != alg.repeat_times):
            setattr(alg, f, value)
            sources[f"algorithm.{f}"] = DERIVED
    if spec.policy_loss_fn == "m2po" and not alg.bypass_old_logprobs:
        return ["algorithm.bypass_old_logprobs: false; policy_loss_fn 'm2po' takes the rollout engine's "
                "log-probs as the old ones (its second moment is of the behaviour policy's ratio), as "
                "Trinity-RFT's does: set it true or leave it unset"]
    if spec.use_teacher and not cfg.explorer.auxiliary_models and MODES[cfg.mode].makes_experience:
        return [f"explorer.auxiliary_models: algorithm {alg.algorithm_type!r} (advantage_fn {spec.advantage_fn!r}) "
                "learns from a teacher's log-probs of the student's samples: list the teacher as "
                "auxiliary model 0 (model_path, engine_type vllm or transformers)"]
    return serve_problems(cfg, sources, user_repeat)


def algorithm_spec(cfg: TrinityConfig) -> AlgorithmSpec:
    """The resolved algorithm of a loaded config (every part filled in by :func:`load`)."""
    alg = cfg.algorithm
    return resolve(alg.algorithm_type, **{f: getattr(alg, f) for f in CONFIG_FIELDS if f != "repeat_times"})


def serve_problems(cfg: TrinityConfig, sources: dict[str, str], user_repeat: bool) -> list[str]:
    """``mode: serve`` publishes every rewarded episode as its own group of one rollout: an
    advantage that compares rollouts within a group would make every advantage 0 (nothing
    learned, silently), and ``repeat_times`` counts one rollout per episode."""
    if not MODES[cfg.mode].serves_api:
        return []

    alg = cfg.algorithm
    if alg.advantage_fn in GROUP_ADVANTAGE_FNS:
        return [f"algorithm.advantage_fn: {alg.advantage_fn!r} compares rollouts of one task, but "
                "mode serve makes each episode its own group (every advantage would be 0); use a "
                "batch baseline: algorithm_type reinforceplusplus, or ppo (critic)"]
    if user_repeat and alg.repeat_times != 1:
        return [f"algorithm.repeat_times: {alg.repeat_times}; mode serve has one rollout per "
                "episode (set 1 or leave it unset)"]
    if alg.repeat_times != 1:
        alg.repeat_times = 1
        sources["algorithm.repeat_times"] = DERIVED
    return []


#: Set by ``trinity run`` in the environment of the role processes it starts.
SUPERVISED_ENV = "TRINITY_SUPERVISED"
#: Set by ``trinity run`` too: when its session started (``time.time()``). A role process it
#: restarts counts its peers' exit markers from then, not from its own start: they may have
#: said "done" before it came back (``roles/launch/stages.py``).
SESSION_START_ENV = "TRINITY_SESSION_START"


def session_start() -> float:
    """When this session of the run started: ``trinity run``'s start for the processes it
    supervises, this process's own start otherwise (honcho restarts nothing)."""
    return float(os.environ.get(SESSION_START_ENV) or time.time())


def load(args: argparse.Namespace, *, quiet: bool = False) -> LoadedConfig:
    """Load the configuration named by ``--config``/``--set``/``--dotenv`` (and the env),
    after importing the plugin folders (``roles/runtime/plugins.py``): the names it checks include
    theirs."""
    dotenv = getattr(args, "dotenv", ".env")
    dirs = [os.environ.get(PLUGIN_DIRS_ENV) or dotenv_value(dotenv, PLUGIN_DIRS_ENV) or "",
            getattr(args, "plugin_dir", None) or ""]  # trinity debug --plugin-dir
    importable_working_dir()
    try:
        load_plugin_dirs(os.pathsep.join(d for d in dirs if d))
    except PluginError as e:
        raise ConfigError([str(e)]) from e
    loaded = load_config(
        getattr(args, "config", None),
        getattr(args, "overrides", []) or [],
        dotenv_file=dotenv,
        algorithm_resolver=resolve_algorithm,
    )
    # From the cache only: an id not cached stays as written, and the checks of the command
    # that reads it download it or name it (printing a config must not fetch gigabytes).
    resolve_hub_paths([loaded.config, *loaded.stages])
    # a role started by ``trinity run`` stays quiet: the supervisor printed them once already
    if not quiet and not os.environ.get(SUPERVISED_ENV):
        for w in loaded.warnings:
            print(f"warning: {w}", file=sys.stderr)
        for note in loaded.notes:
            print(f"note: {note}", file=sys.stderr)
    return loaded
