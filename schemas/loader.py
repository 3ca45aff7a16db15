"""Loading a configuration: sources, interpolation, validation, provenance.

Sources, highest precedence first:

1. explicit overrides (``trinity ... --set a.b=c``),
2. environment variables ``TRINITY_<SECTION>__<FIELD>`` (pydantic-settings' env source),
3. a ``.env`` file (pydantic-settings' dotenv source, same names),
4. a YAML file (``--config`` or ``TRINITY_CONFIG``), written for Trinity-RFT if you like:
   ``${oc.env:VAR,default}`` and ``${section.field}`` interpolation work,
5. the defaults in :mod:`schemas.config`.

Why layer by hand instead of letting ``BaseSettings()`` do it: ``trinity config --sources`` must
say where each value came from, and an error must name the source of the bad value. So each
source is read into a plain nested dict (using pydantic-settings' own env and dotenv readers),
merged with a record of who set each leaf, and validated once. The defaults the guide
describes as derived are then filled by :func:`schemas.derive.derive`.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import DotEnvSettingsSource, EnvSettingsSource

from schemas.config import (
    IGNORED_PATHS,
    IGNORED_QUIET_VALUES,
    RENAMED_VALUES,
    VERL_FIELDS,
    VLLM_ENGINE_PATHS,
    TrinityConfig,
)
from schemas.derive import DEFAULT, derive
from schemas.derive import DERIVED as DERIVED  # roles read the provenance labels from here
from schemas.redact import REDACTED, SECRET_KEY, redact_secrets, redact_url

CLI = "cli"


class ConfigError(ValueError):
    """A configuration that cannot be used. The message lists every problem, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))


@dataclass
class LoadedConfig:
    """A validated configuration plus where each value came from."""

    config: TrinityConfig
    sources: dict[str, str]
    """Dotted path of every value set by something other than the defaults -> its source."""
    warnings: list[str] = field(default_factory=list)
    stages: list[TrinityConfig] = field(default_factory=list)
    """One fully resolved config per stage (empty when the config has no stages)."""
    notes: list[str] = field(default_factory=list)
    """Defaults chosen by a rule the user should hear of (:func:`schemas.derive.derive`)."""

    def source_of(self, path: str) -> str:
        """Where the value at ``path`` came from (``default`` when nobody set it)."""
        return self.sources.get(path, DEFAULT)


# --------------------------------------------------------------------------------------------
# reading sources
# --------------------------------------------------------------------------------------------

_INTERP = re.compile(r"\$\{([^${}]+)\}")


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but ``1e6`` and ``1.0e-5`` are floats: YAML 1.2 and OmegaConf
    (which Trinity-RFT's configs are written for) read them so, PyYAML's YAML 1.1 a string, which
    a free-form setting (``policy_loss_fn_args.clip_ratio_c: 1.0e6``) would keep."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """``text`` as YAML, with exponent floats as YAML 1.2 reads them (:class:`_YamlLoader`)."""
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (a SafeLoader)


def read_yaml(
    path: str | os.PathLike[str], environ: dict[str, str] | None = None
) -> dict[str, Any]:
    """Read a YAML config file and resolve its OmegaConf-style interpolations."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"config file {str(p)!r}: not found"])
    try:
        data = load_yaml(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError([f"config file {str(p)!r}: not valid YAML: {e}"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            [f"config file {str(p)!r}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8"]
        ) from None
    except OSError as e:
        raise ConfigError([f"config file {str(p)!r}: cannot read: {e.strerror or e}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"config file {str(p)!r}: top level must be a mapping, got {type(data).__name__}"]
        )
    data = _none_strings(data)
    return resolve_interpolations(data, origin=str(p), environ=environ)


def _none_strings(node: Any) -> Any:
    """Trinity-RFT's docs write ``None`` for null; YAML reads it as a string. Treat it as null."""
    if isinstance(node, dict):
        return {k: _none_strings(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_none_strings(v) for v in node]
    return None if node == "None" else node


def resolve_interpolations(
    data: dict[str, Any], origin: str = "config", environ: dict[str, str] | None = None
) -> dict[str, Any]:
    """Resolve ``${oc.env:VAR[,default]}`` and ``${a.b.c}`` the way OmegaConf does.

    A string that is exactly one interpolation takes the referenced value's type; interpolations
    inside a longer string are formatted into it. References are absolute dotted paths into the
    same file (``${model.model_path}``); cycles and missing keys are errors naming the key.
    """
    env = os.environ if environ is None else environ
    problems: list[str] = []
    resolving: set[str] = set()

    def lookup(ref: str, at: str) -> Any:
        node: Any = data
        for part in ref.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise KeyError(ref)
        if ref in resolving:
            raise RecursionError(ref)
        resolving.add(ref)
        try:
            return walk(node, ref)
        finally:
            resolving.discard(ref)

    def one(expr: str, at: str) -> Any:
        expr = expr.strip()
        if expr.startswith("oc.env:"):
            name, _, default = expr[len("oc.env:") :].partition(",")
            name = name.strip()
            if name in env:
                return env[name]
            if _:
                default = default.strip()
                if default in ("null", "None", "~"):
                    return None
                if len(default) >= 2 and default[0] == default[-1] and default[0] in "'\"":
                    return default[1:-1]
                return default
            raise LookupError(f"environment variable {name!r} is not set and has no default")
        if ":" in expr:
            raise LookupError(f"unsupported resolver in ${{{expr}}} (only oc.env is supported)")
        try:
            return lookup(expr, at)
        except KeyError:
            raise LookupError(f"${{{expr}}} refers to a key that is not in the file") from None
        except RecursionError:
            raise LookupError(f"${{{expr}}} is part of an interpolation cycle") from None

    def resolve_str(s: str, at: str) -> Any:
        m = _INTERP.fullmatch(s)
        if m:
            return one(m.group(1), at)
        return _INTERP.sub(lambda mm: "" if (v := one(mm.group(1), at)) is None else str(v), s)

    def walk(node: Any, at: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{at}.{k}" if at else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{at}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            try:
                return resolve_str(node, at)
            except LookupError as e:
                problems.append(f"{at}: {e} (in {origin})")
                return None
        return node

    out = walk(data, "")
    if problems:
        raise ConfigError(sorted(set(problems)))
    return out


def read_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """``TRINITY_<SECTION>__<FIELD>`` variables as a nested dict (pydantic-settings' reader)."""
    source = EnvSettingsSource(TrinityConfig)
    if environ is not None:
        source.env_vars = {k.lower(): v for k, v in environ.items()}
    return _plain(source())


#: ``TRINITY_*`` variables that are not config values: which file to load, and settings read
#: by the processes themselves. A ``.env`` may hold them (honcho's does) beside config values.
NON_CONFIG_VARS = (
    "TRINITY_CONFIG",
    "TRINITY_WEIGHT_SYNC_HOST",
    "TRINITY_PLUGIN_DIRS",
    "TRINITY_SUPERVISED",
    "TRINITY_SESSION_START",
    "TRINITY_NODE_RANK",
)


def read_dotenv(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``TRINITY_*`` config values of a ``.env`` file (missing file: nothing).

    Other variables in the file are for other programs (honcho exports them all) and are
    skipped, as are the :data:`NON_CONFIG_VARS`; an unknown ``TRINITY_`` name stays, so the
    validation names it."""
    if not Path(path).is_file():
        return {}
    try:
        values = _plain(DotEnvSettingsSource(TrinityConfig, env_file=Path(path))())
    except UnicodeDecodeError as e:
        raise ConfigError(
            [f"dotenv file {str(path)!r}: not UTF-8 text (byte {e.start}: {e.reason})"]
        ) from None
    skip = {v.lower() for v in NON_CONFIG_VARS}
    return {
        k: v
        for k, v in values.items()
        if k in TrinityConfig.model_fields or (k.startswith("trinity_") and k not in skip)
    }


def _plain(d: Any) -> Any:
    if isinstance(d, dict):
        return {str(k): _plain(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_plain(v) for v in d]
    return d


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> nested dict; values parse as YAML scalars/lists (``4``, ``[1,2]``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                [f"--set {item!r}: expected KEY=VALUE, e.g. algorithm.repeat_times=4"]
            )
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    [f"--set {item!r}: {part!r} is set both as a value and a section"]
                )
        node[parts[-1]] = _none_strings(value)
    return out


# --------------------------------------------------------------------------------------------
# merging with provenance
# --------------------------------------------------------------------------------------------


def _merge(
    base: dict[str, Any],
    top: dict[str, Any],
    source: str,
    sources: dict[str, str],
    prefix: str = "",
) -> None:
    """Deep-merge ``top`` into ``base`` in place, recording ``source`` for every leaf it sets.

    Lists are leaves: a list from a higher source replaces the lower one whole, as in OmegaConf;
    except where the higher source names items by index (``--set stages.1.mode=train``,
    ``explorer.auxiliary_models.0.tensor_parallel_size=1``): those items are merged into.
    """
    for key, value in top.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value and isinstance(base.get(key), list):
            _merge_items(base[key], value, source, sources, path)
        elif isinstance(value, dict) and isinstance(base.get(key), dict) and not _is_free_dict(path):
            _merge(base[key], value, source, sources, path)
        else:
            _replace(base, key, value, path, source, sources)


def _replace(container: Any, key: Any, value: Any, path: str, source: str, sources: dict[str, str]) -> None:
    """``container[key] = value`` whole: what was recorded under ``path`` goes, ``value``'s leaves
    are recorded with ``source``."""
    container[key] = copy.deepcopy(value)
    for p in list(sources):
        if p.startswith(path + ".") or p.startswith(path + "["):
            del sources[p]
    _record(value, path, source, sources)


def _merge_items(items: list[Any], top: dict[str, Any], source: str, sources: dict[str, str], path: str) -> None:
    """Merge ``{"0": ..., "2": ...}`` into the list's items of those indices."""
    for k, value in top.items():
        if not str(k).isdigit():
            raise ConfigError([f"{path}.{k}: {path} is a list; name an item by its index from 0 "
                               f"({path}.0.<field>)"])
        i = int(k)
        if i >= len(items):
            raise ConfigError([f"{path}.{k}: {path} has {len(items)} item(s) (indices from 0)"])
        if isinstance(value, dict) and isinstance(items[i], dict):
            _merge(items[i], value, source, sources, f"{path}[{i}]")
        else:
            _replace(items, i, value, f"{path}[{i}]", source, sources)


def _record(value: Any, path: str, source: str, sources: dict[str, str]) -> None:
    if isinstance(value, dict) and value and not _is_free_dict(path):
        for k, v in value.items():
            _record(v, f"{path}.{k}", source, sources)
    else:
        sources[path] = source


def _is_free_dict(path: str) -> bool:
    """Fields typed ``dict[str, Any]`` (args, env_vars): merged whole, recorded as one leaf."""
    last = re.sub(r"\[\d+\]$", "", path.rsplit(".", 1)[-1])
    return last.endswith("_args") or last in {
        "env_vars",
        "extra_engine_args",
        "rope_scaling",
        "args",
    }


# --------------------------------------------------------------------------------------------
# validation errors that say what is wrong
# --------------------------------------------------------------------------------------------


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(
    loc: tuple[Any, ...], root: type[BaseModel] = TrinityConfig
) -> type[BaseModel] | None:
    """The model class a location points into (to list its known fields for "did you mean")."""
    cls: Any = root
    for part in loc:
        if isinstance(part, int) or cls is None:
            continue
        if (
            not (isinstance(cls, type) and issubclass(cls, BaseModel))
            or part not in cls.model_fields
        ):
            if isinstance(cls, type) and issubclass(cls, BaseModel):
                return None
            continue
        cls = _unwrap(cls.model_fields[part].annotation)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Optional[X], list[X], dict[str, X] -> X (the model inside, if any)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            inner = _unwrap(arg)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
        return None
    if origin in (list, dict):
        return _unwrap(typing.get_args(tp)[-1])
    return tp


def _source_of_parent(path: str, sources: dict[str, str]) -> str | None:
    """Who set the nearest enclosing value (``a.b`` for ``a.b[1]``: lists are leaves)."""
    while True:
        parent = re.sub(r"(\[\d+\]|\.[^.\[]+)$", "", path)
        if parent == path or not parent:
            return None
        path = parent
        if path in sources:
            return sources[path]


def _explain(
    err: ValidationError,
    sources: dict[str, str],
    root: type[BaseModel] = TrinityConfig,
    prefix: str = "",
) -> list[str]:
    problems = []
    for e in err.errors():
        loc = tuple(
            p
            for p in e["loc"]
            if not (isinstance(p, str) and p.startswith(("function-", "literal[")))
        )
        path = _dotted(loc)
        full = f"{prefix}{path}" if not prefix or not path else f"{prefix}.{path}"
        src = (
            sources.get(full)
            or sources.get(path)
            or next((s for p, s in sources.items() if p.startswith((full + ".", full + "["))), None)
            or _source_of_parent(full, sources)
        )
        where = f" (from {src})" if src and src != DEFAULT else ""
        if e["type"] == "extra_forbidden":
            model = _model_at(loc[:-1], root)
            known = list(model.model_fields) if model else []
            guess = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            hint = f"; did you mean {_dotted((*loc[:-1], guess[0]))!r}?" if guess else ""
            if not guess and known:
                hint = f"; known keys here: {', '.join(known)}"
            problems.append(f"{full}: unknown key{where}{hint}")
        elif e["type"] == "missing":
            problems.append(f"{full}: required but not set")
        else:
            value = e.get("input")
            if isinstance(value, (dict, list)):
                shown = type(value).__name__
            elif SECRET_KEY.search(str(loc[-1]) if loc else ""):
                shown = REDACTED
            else:
                shown = repr(redact_url(value) if isinstance(value, str) else value)
            msg = e["msg"].removeprefix("Value error, ")
            why = ""
            if e["type"] == "literal_error" and len((e.get("ctx") or {}).get("expected", "").split(" or ")) == 1:
                # a setting with one value here (the rest not implemented): its docstring says why
                model = _model_at(loc[:-1], root)
                field = model.model_fields.get(str(loc[-1])) if model else None
                why = f" ({field.description.strip()})" if field is not None and field.description else ""
            problems.append(f"{full}: got {shown}{where}; expected {msg[0].lower() + msg[1:]}{why}")
    return problems


# --------------------------------------------------------------------------------------------
# the entry point
# --------------------------------------------------------------------------------------------


def _values_at(node: Any, parts: list[str], at: str = "") -> Iterator[tuple[dict[str, Any], str, str]]:
    """``(parent, key, dotted path)`` of every value at ``parts`` (a part ending in ``[]``:
    each item of that list)."""
    if not parts or not isinstance(node, dict):
        return
    key, each = (parts[0][:-2], True) if parts[0].endswith("[]") else (parts[0], False)
    if key not in node:
        return
    if each:
        if isinstance(node[key], list):
            for i, item in enumerate(node[key]):
                yield from _values_at(item, parts[1:], f"{at}{key}[{i}].")
    elif len(parts) == 1:
        yield node, key, at + key
    else:
        yield from _values_at(node[key], parts[1:], f"{at}{key}.")


def _rename_values(raw: dict[str, Any], warnings: list[str], prefix: str = "") -> None:
    """Read Trinity-RFT's older value names as today's (:data:`RENAMED_VALUES`, any ``vllm*``
    engine as ``vllm``), one warning each: its own loader still accepts them."""
    renames: dict[str, dict[str, str] | None] = {**dict.fromkeys(VLLM_ENGINE_PATHS), **RENAMED_VALUES}
    for dotted, names in renames.items():
        for parent, key, path in _values_at(raw, dotted.split(".")):
            old = parent[key]
            if not isinstance(old, str):
                continue
            new = ("vllm" if old.lower().startswith("vllm") else None) if names is None else names.get(old.lower())
            if new is not None and new != old:
                parent[key] = new
                warnings.append(f"{prefix}{path}: {old!r} is an older Trinity-RFT name; read as {new!r}")


def _read_verl(raw: dict[str, Any], sources: dict[str, str], warnings: list[str], prefix: str = "") -> None:
    """Move the veRL settings trinity has (:data:`VERL_FIELDS`) to trinity's fields, at the
    top level and inside ``trainer.trainer_config``.

    The first value set wins: trinity's own name, then the top level, then ``trainer_config``
    (in :data:`VERL_FIELDS` order); a later one that differs is named in a warning, since two
    values for one setting is a mistake the user should see. A null veRL value asks for
    nothing and is dropped."""
    for root in ((), ("trainer", "trainer_config")):
        for verl, native in VERL_FIELDS.items():
            if not root and verl == native:
                continue  # veRL's top-level trainer section is trinity's: the field is there
            path = [*root, *verl.split(".")]
            node: Any = raw
            for part in path[:-1]:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict) or path[-1] not in node:
                continue
            value = node.pop(path[-1])
            dotted = ".".join(path)
            _prune_empty(raw, path[:-1])
            origin = sources.pop(dotted, "file")
            if value is None:
                continue
            target: Any = raw
            *parents, leaf = native.split(".")
            for part in parents:
                target = target.setdefault(part, {})
            if leaf not in target:
                target[leaf] = value
                sources[native] = f"{origin} as {dotted}"
            elif target[leaf] != value:
                won = sources.get(native)
                warnings.append(f"{prefix}{dotted} ({value!r}, from {origin}) is overridden by {native} "
                                f"({target[leaf]!r}{f', from {won}' if won else ''})")


def _prune_empty(raw: dict[str, Any], path: list[str]) -> None:
    """Remove the dicts along ``path`` that are now empty, deepest first (a veRL section whose
    every key was read leaves nothing to warn about)."""
    for depth in range(len(path), 0, -1):
        parent: Any = raw
        for part in path[: depth - 1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and parent.get(path[depth - 1]) == {}:
            del parent[path[depth - 1]]


def _drop_ignored(
    raw: dict[str, Any], sources: dict[str, str], warnings: list[str], prefix: str = ""
) -> None:
    """Remove the :data:`IGNORED_PATHS` from ``raw``, warning once for each one set to
    something (not empty, not its :data:`IGNORED_QUIET_VALUES` value). Deepest paths first,
    so a key with its own reason inside an ignored section gets that reason, not the section's."""
    for dotted, why in sorted(IGNORED_PATHS.items(), key=lambda item: -item[0].count(".")):
        node: Any = raw
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and parts[-1] in node:
            value = node.pop(parts[-1])
            _prune_empty(raw, parts[:-1])
            quiet = dotted in IGNORED_QUIET_VALUES and value == IGNORED_QUIET_VALUES[dotted]
            if value not in (None, {}, [], "") and not quiet:
                where = sources.get(dotted) or next(
                    (s for p, s in sources.items() if p.startswith(dotted + ".")), ""
                )
                origin = f" (from {where})" if where else ""
                warnings.append(f"{prefix}{dotted} is ignored{origin}: {why}")
            for p in [p for p in sources if p == dotted or p.startswith(dotted + ".")]:
                del sources[p]


def _drop_empty_sections(raw: dict[str, Any], model: type[BaseModel], sources: dict[str, str], prefix: str = "") -> None:
    """Read a section left empty as not set: ``trainer:`` whose keys are all commented out
    (the guide's overview writes every section so) is null in YAML, and means "the defaults",
    not "a null section". So is an empty list (``eval_tasksets:``). A named entry of a dict
    of sections (``auxiliary_buffers: {sft:}``) becomes an entry with the defaults."""
    for key in list(raw):
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        path = f"{prefix}{key}"
        inner = _unwrap(field.annotation)
        origin = typing.get_origin(field.annotation)
        is_model = isinstance(inner, type) and issubclass(inner, BaseModel)
        if raw[key] is None and not field.is_required() and (is_model or origin is list):
            if field.default is not None or field.default_factory is not None:
                del raw[key]
                sources.pop(path, None)
            continue
        if not is_model:
            continue
        value = raw[key]
        if origin is dict and isinstance(value, dict):
            for name in list(value):
                if value[name] is None:
                    value[name] = {}
                elif isinstance(value[name], dict):
                    _drop_empty_sections(value[name], inner, sources, f"{path}.{name}.")
        elif origin is list and isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    _drop_empty_sections(item, inner, sources, f"{path}[{i}].")
        elif isinstance(value, dict):
            _drop_empty_sections(value, inner, sources, f"{path}.")


Resolver = Callable[[TrinityConfig, dict[str, str]], list[str]]

#: What Trinity-RFT's ``mix`` policy losses are told of the batch layout in their args (so each
#: part averages over its own rows across micro-batches); trinity's trainer counts the rows.
MIX_LAYOUT_ARGS = ("use_dynamic_bsz", "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ngpus_trainer",
                   "train_batch_size_usual", "train_batch_size_expert")


def _drop_mix_layout(raw: dict[str, Any], warnings: list[str], prefix: str) -> None:
    """Drop :data:`MIX_LAYOUT_ARGS` from a ``mix``/``mix_chord`` policy loss's args, with a warning."""
    alg = raw.get("algorithm")
    args = alg.get("policy_loss_fn_args") if isinstance(alg, dict) else None
    if not isinstance(args, dict) or (alg.get("policy_loss_fn") or alg.get("algorithm_type")) not in ("mix", "mix_chord"):
        return
    layout = [k for k in MIX_LAYOUT_ARGS if k in args]
    for k in layout:
        del args[k]
    if layout:
        warnings.append(
            f"{prefix}algorithm.policy_loss_fn_args: {', '.join(layout)} ignored: Trinity-RFT's mix losses "
            "read the batch layout from them; here the trainer counts each micro-batch's rollout and "
            "expert rows itself (each part is the mean over its rows of the whole mini-batch)"
        )


def _validate(
    raw: dict[str, Any],
    sources: dict[str, str],
    warnings: list[str],
    prefix: str = "",
    resolver: Resolver | None = None,
    notes: list[str] | None = None,
) -> TrinityConfig:
    _read_verl(raw, sources, warnings, prefix)
    tinker = (raw.get("model") or {}).get("tinker") if isinstance(raw.get("model"), dict) else None
    if isinstance(tinker, dict) and tinker.get("enable"):
        raise ConfigError([f"{prefix}model.tinker.enable: true: Tinker trains on Thinking Machines' remote "
                           "service, which trinity does not call; trinity trains in its own trainer process "
                           "(leave model.tinker out, or enable: false)"])
    _drop_ignored(raw, sources, warnings, prefix)
    _rename_values(raw, warnings, prefix)
    _drop_mix_layout(raw, warnings, prefix)
    _drop_empty_sections(raw, TrinityConfig, sources)
    try:
        cfg = TrinityConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_explain(e, sources, prefix=prefix.rstrip("."))) from None
    problems = resolver(cfg, sources) if resolver else []
    if problems:
        raise ConfigError([f"{prefix}{p}" for p in problems])
    problems = derive(cfg, sources, warnings, notes)
    if problems:
        raise ConfigError([f"{prefix}{p}" for p in problems])
    return cfg


def load_config(
    config_file: str | os.PathLike[str] | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    environ: dict[str, str] | None = None,
    dotenv_file: str | os.PathLike[str] | None = ".env",
    algorithm_resolver: Resolver | None = None,
) -> LoadedConfig:
    """Load, merge, validate and derive one experiment's configuration.

    ``algorithm_resolver`` fills the algorithm parts an ``algorithm_type`` implies (the roles
    pass one built on ``ops``; ``schemas`` itself knows no algorithms). It returns problems.

    ``config_file`` falls back to ``TRINITY_CONFIG`` (environment, then ``.env``). Raises
    :class:`ConfigError` naming every bad key or value with its source. Warnings (ignored
    Trinity-RFT sections, deprecated names) are returned, not printed: the caller logs them once.
    """
    env = dict(os.environ if environ is None else environ)
    dotenv = read_dotenv(dotenv_file) if dotenv_file else {}
    if config_file is None:
        config_file = env.get("TRINITY_CONFIG") or dotenv_value(dotenv_file, "TRINITY_CONFIG")

    sources: dict[str, str] = {}
    raw: dict[str, Any] = {}
    if config_file:
        _merge(raw, read_yaml(config_file, env), f"file {config_file}", sources)
    _merge(raw, dotenv, f".env {dotenv_file}", sources)
    env_layer = read_env(env)
    _merge_env(raw, env_layer, sources)
    _merge(raw, parse_overrides(list(overrides)), CLI, sources)

    warnings: list[str] = []
    notes: list[str] = []
    stage_raw = raw.pop("stages", None) or []
    base_raw = copy.deepcopy(raw)
    cfg = _validate(raw, sources, warnings, resolver=algorithm_resolver, notes=notes)

    stages: list[TrinityConfig] = []
    if stage_raw:
        if not isinstance(stage_raw, list):
            raise ConfigError(
                [f"stages: got {type(stage_raw).__name__}; expected a list of stages"]
            )
        cfg.stages = _validate_stage_list(stage_raw, sources)
        names = [s.stage_name for s in cfg.stages]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(
                [f"stages: stage_name {sorted(dup)[0]!r} is used twice; stage names must be unique"]
            )
        for i, stage in enumerate(cfg.stages):
            merged = copy.deepcopy(base_raw)
            stage_sources = dict(sources)
            _drop_parts_of_other_algorithm(merged, stage.algorithm, stage_sources)
            if i > 0:
                _drop_resume_settings(merged, stage_sources)
            for section in (
                "algorithm",
                "buffer",
                "explorer",
                "trainer",
                "synchronizer",
                "data_processor",
                "model",
            ):
                part = getattr(stage, section)
                if part:
                    _merge(
                        merged.setdefault(section, {}), part, f"stages[{i}]", stage_sources, section
                    )
            if stage.mode:
                merged["mode"] = stage.mode
            merged["name"] = f"{cfg.name}/{stage.stage_name}"
            # the next stage starts from this one's final HF checkpoint: a stage set to
            # ``save_hf_checkpoint: never`` before another is refused by roles/launch/checks.py
            # (check_stage_settings), never silently changed
            stages.append(
                _validate(merged, stage_sources, warnings, f"stages[{i}].", algorithm_resolver, notes)
            )
    return LoadedConfig(
        config=cfg, sources=sources, warnings=list(dict.fromkeys(warnings)), stages=stages,
        notes=list(dict.fromkeys(notes)),
    )


_ALGORITHM_PARTS = (
    "advantage_fn",
    "policy_loss_fn",
    "kl_penalty_fn",
    "kl_loss_fn",
    "entropy_loss_fn",
    "sample_strategy",
)


def _drop_parts_of_other_algorithm(
    merged: dict[str, Any], stage_alg: dict[str, Any] | None, sources: dict[str, str]
) -> None:
    """A stage that switches ``algorithm_type`` does not inherit the global algorithm's parts.

    GRPO's ``policy_loss_fn_args`` mean nothing to an SFT warmup stage; everything else
    (optimizer, repeat_times, ...) is still inherited.
    """
    glob = merged.get("algorithm") or {}
    if not stage_alg or "algorithm_type" not in stage_alg:
        return
    if stage_alg["algorithm_type"] == glob.get("algorithm_type", "ppo"):
        return
    for part in _ALGORITHM_PARTS:
        for key in (part, f"{part}_args"):
            glob.pop(key, None)
            for p in [
                p for p in sources if p == f"algorithm.{key}" or p.startswith(f"algorithm.{key}.")
            ]:
                del sources[p]
    glob.pop("loss_agg_mode", None)
    sources.pop("algorithm.loss_agg_mode", None)


#: Where the trainer's resume settings may be written (trinity's/veRL's top-level ``trainer``
#: section, veRL's inside ``trainer.trainer_config``).
_RESUME_SETTINGS = tuple(f"{section}.{key}" for section in ("trainer", "trainer.trainer_config.trainer")
                         for key in ("resume_mode", "resume_from_path"))


def _drop_resume_settings(merged: dict[str, Any], sources: dict[str, str]) -> None:
    """A stage after the first does not inherit the global ``trainer.resume_mode`` and
    ``resume_from_path``: it starts from the previous stage's weights, and resuming every
    stage from one checkpoint would throw them away. Its own ``trainer`` section may set them."""
    for dotted in _RESUME_SETTINGS:
        *parents, leaf = dotted.split(".")
        node: Any = merged
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
            sources.pop(dotted, None)


def _validate_stage_list(stage_raw: list[Any], sources: dict[str, str]) -> list[Any]:
    from schemas.config import StageConfig

    out, problems = [], []
    for i, item in enumerate(stage_raw):
        try:
            out.append(StageConfig.model_validate(item))
        except ValidationError as e:
            problems += _explain(e, sources, root=StageConfig, prefix=f"stages[{i}]")
    if problems:
        raise ConfigError(problems)
    return out


def _merge_env(raw: dict[str, Any], env_layer: dict[str, Any], sources: dict[str, str]) -> None:
    """Merge the env layer, naming the variable that set each leaf."""
    _merge(raw, env_layer, "env", sources)
    for path, src in sources.items():
        if src == "env":
            sources[path] = (
                "env TRINITY_" + "__".join(re.sub(r"\[\d+\]", "", path).split(".")).upper()
            )


def dotenv_value(path: str | os.PathLike[str] | None, key: str) -> str | None:
    """The value of ``key`` in the ``.env`` file at ``path`` (None: no file, or not there)."""
    if not path or not Path(path).is_file():
        return None
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        k, sep, v = line.strip().partition("=")
        if sep and k.strip().removeprefix("export ").strip() == key:
            return v.strip().strip("'\"") or None
    return None


# --------------------------------------------------------------------------------------------
# printing
# --------------------------------------------------------------------------------------------


def to_yaml(loaded: LoadedConfig, with_sources: bool = False, *, redact: bool = True) -> str:
    """The resolved configuration as YAML; with sources, each value is annotated with its origin.

    Secrets print as ``***`` (:func:`schemas.redact.redact_secrets`: tokens, passwords, API
    keys, the password in a URL) unless ``redact`` is false."""
    data = loaded.config.model_dump(mode="json")
    if redact:
        data = redact_secrets(data)
    if not with_sources:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    lines: list[str] = []
    _emit(data, "", 0, loaded, lines)
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    return (
        yaml.safe_dump(value, default_flow_style=True, width=10**6)
        .strip()
        .removesuffix("...")
        .strip()
    )


def _emit(
    node: Any,
    path: str,
    indent: int,
    loaded: LoadedConfig,
    lines: list[str],
    first_prefix: str | None = None,
) -> None:
    pad = " " * indent
    for i, (key, value) in enumerate(node.items()):
        lead = first_prefix if (first_prefix is not None and i == 0) else pad
        p = f"{path}.{key}" if path else key
        if isinstance(value, dict) and value and not _is_free_dict(p):
            lines.append(f"{lead}{key}:")
            _emit(value, p, indent + 2, loaded, lines)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(
                f"{lead}{key}:  # {loaded.source_of(p)}" if p in loaded.sources else f"{lead}{key}:"
            )
            for j, item in enumerate(value):
                _emit(item, f"{p}[{j}]", indent + 4, loaded, lines, first_prefix=f"{pad}  - ")
        else:
            lines.append(f"{lead}{key}: {_scalar(value)}  # {loaded.source_of(p)}")
