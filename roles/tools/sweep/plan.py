"""What a sweep is: the runs ``--set KEY=V1,V2,...`` makes, and whether they can share.

Pure functions, no I/O: :func:`expand` turns the command line's overrides into runs (one per
combination of the swept values, each an ordinary run with its own ``name``, so its own job
folder and bus namespace), :func:`check_shared` says what keeps loaded runs from sharing
one trainer and one rollout engine, naming the field.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field

from schemas.config import NAME_PART, TrinityConfig


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep."""

    name: str  #: its ``name`` (job folder ``<checkpoint_root_dir>/<project>/<name>``)
    slot: str  #: its adapter's name in the shared engine (a Python identifier, as peft wants)
    #: the ``--set`` values that make it: the sweep's fixed ones, its swept values, its name
    overrides: list[str] = field(default_factory=list)
    #: the swept values alone, key -> value (what sets it apart from its siblings)
    choices: dict[str, str] = field(default_factory=dict)


def split_values(value: str) -> list[str]:
    """``1e-5,3e-5`` -> ``["1e-5", "3e-5"]``; commas inside brackets, braces or quotes do
    not split (``[a,b]`` is one list value)."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return [*out, cur]


#: The longest tag of one choice in a run's name; a longer one is cut and made unique by a hash.
LABEL_MAX = 24


def _label(key: str, value: str) -> str:
    """A short, path-safe tag of one choice: ``algorithm.optimizer.lr=1e-5`` -> ``lr1e-5``."""
    return re.sub(r"[^A-Za-z0-9.\-]+", "_", key.rsplit(".", 1)[-1] + value).strip("_")


def labels(key: str, values: list[str]) -> list[str]:
    """One tag per value of ``key``, all different: the plain tag when the values' tags are
    short and distinct, else each cut to :data:`LABEL_MAX` with a hash of its value (``a b``
    and ``a/b`` both read ``a_b``, and two runs with one name would be merged)."""
    plain = [_label(key, v) for v in values]
    if len(set(plain)) == len(plain) and all(NAME_PART.fullmatch(t) and len(t) <= LABEL_MAX for t in plain):
        return plain
    return [f"{t[:LABEL_MAX - 7].replace('.', '_')}-{hashlib.sha1(v.encode()).hexdigest()[:6]}".lstrip("-")
            for t, v in zip(plain, values, strict=True)]


def split_sets(overrides: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``--set`` values as (the fixed ones, every run gets them; the swept ones, as key and
    values): a value with a comma outside brackets and quotes is swept."""
    fixed, swept = [], []
    for o in overrides:
        key, sep, value = o.partition("=")
        if not sep:
            raise ValueError(f"--set {o!r}: expected KEY=VALUE")
        if key.strip() == "name":
            raise ValueError("--set name=...: a sweep names its runs itself (<name>-<choice>)")
        values = split_values(value)
        if len(values) > 1:
            if any(not v.strip() for v in values):
                raise ValueError(f"--set {o!r}: value {[v.strip() for v in values].index('') + 1} is empty")
            if len(set(values)) != len(values):
                raise ValueError(f"--set {o!r}: a value appears twice")
            if key.strip() in (k for k, _ in swept):
                raise ValueError(f"--set {o!r}: {key.strip()} is swept twice; give all its values in one --set")
            swept.append((key.strip(), values))
        else:
            fixed.append(o)
    return fixed, swept


def expand(base_name: str, overrides: list[str]) -> list[SweepRun]:
    """The runs of ``overrides``: each ``KEY=V1,V2`` is swept, every other one is fixed; the
    runs are every combination, in order. Fewer than two runs is not a sweep."""
    fixed, swept = split_sets(overrides)
    if not swept:
        raise ValueError("trinity sweep: no swept value; give one as --set KEY=V1,V2[,...]")
    tags = {k: dict(zip(vs, labels(k, vs), strict=True)) for k, vs in swept}
    runs = []
    for i, combo in enumerate(itertools.product(*(vs for _, vs in swept))):
        choices = {k: v for (k, _), v in zip(swept, combo, strict=True)}
        name = "-".join([base_name, *(tags[k][v] for k, v in choices.items())])
        runs.append(SweepRun(name, f"run{i}", [*fixed, *(f"{k}={v}" for k, v in choices.items()), f"name={name}"],
                             choices))
    return runs


def check_shared(cfgs: dict[str, TrinityConfig]) -> list[str]:
    """Why these runs (by name) cannot share one trainer and one rollout engine; [] when they
    can. Each must be a one-stage LoRA run that explores and trains (``mode: both``) with the
    transformers engine and the PyTorch trainer, its adapter moved by broadcast
    (``sync_method: nccl``), and all must have the same base model and engine settings."""
    problems: list[str] = []
    for name, c in cfgs.items():
        where = f"run {name}:"
        if not c.model.lora_configs:
            problems.append(f"{where} model.lora_configs: a sweep shares the base model between LoRA runs; set one adapter")
        if c.stages:
            problems.append(f"{where} stages: a sweep runs one-stage experiments (give each stage's model as model_path)")
        if c.mode != "both":
            problems.append(f"{where} mode: {c.mode!r}; a sweep's runs explore and train (mode both)")
        if c.synchronizer.sync_method != "nccl":
            problems.append(f"{where} synchronizer.sync_method: {c.synchronizer.sync_method!r}; a shared engine takes "
                            "each run's adapter by broadcast (nccl, gloo on CPU)")
        if c.explorer.rollout_model.engine_type != "transformers":
            problems.append(f"{where} explorer.rollout_model.engine_type: {c.explorer.rollout_model.engine_type!r}; "
                            "only the transformers engine is shared by a sweep's runs so far")
        if c.trainer.trainer_type not in ("pytorch", "auto"):
            problems.append(f"{where} trainer.trainer_type: {c.trainer.trainer_type!r}; a sweep's shared trainer is "
                            "the PyTorch one (DeepSpeed engines cannot share one base yet)")
    first_name, first = next(iter(cfgs.items()))
    same = {
        "model.model_path": lambda c: c.model.model_path,
        "explorer.rollout_model": lambda c: c.explorer.rollout_model.model_dump(exclude={"seed"}),
        "nats.url": lambda c: c.nats.url,
        "cluster": lambda c: c.cluster.model_dump(),
    }
    for name, c in list(cfgs.items())[1:]:
        for key, get in same.items():
            if get(c) != get(first):
                problems.append(f"run {name}: {key} differs from run {first_name}'s; the runs of a sweep share "
                                "one base model and one rollout engine, so they must agree on it")
    serving = {n: c.explorer.openai_api.port for n, c in cfgs.items()
               if c.explorer.rollout_model.enable_openai_api and c.explorer.openai_api.port}
    if len(set(serving.values())) < len(serving):
        problems.append(f"explorer.openai_api.port: runs {', '.join(serving)} serve their OpenAI API on the same port "
                        f"from one process; set 0 (each a free port) or one port per run")
    ids = [c.run_id for c in cfgs.values()]
    if len(set(ids)) != len(ids):
        problems.append("the runs' names give the same run id twice: " + ", ".join(ids))
    return problems
