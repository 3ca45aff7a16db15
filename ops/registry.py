"""Name -> function maps, one per kind of algorithm part.

Configs name parts by string (``advantage_fn: grpo``); this module turns the string into the
function. It is deliberately tiny: one dict per kind, ``register`` to add a name, ``get`` to
look one up. A researcher adds a part by decorating a function::

    from ops.registry import register

    @register("advantage_fn", "my_baseline")
    def my_baseline(*, action_mask, rewards=None, **_unused): ...

and then names it in the config, from a file in ``TRINITY_PLUGIN_DIRS`` (which every trinity
process imports before it reads the config) or by its import path: ``policy_loss_fn:
my_pkg.losses:my_loss`` imports ``my_pkg.losses`` and registers ``my_loss`` under that string.
Nothing else is discovered behind the user's back; the built-in parts are registered when
``ops`` is imported.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import annotated_types

F = TypeVar("F", bound=Callable[..., Any])

KINDS: tuple[str, ...] = (
    "advantage_fn",
    "policy_loss_fn",
    "kl_fn",
    "entropy_loss_fn",
    "reward_fn",
    "sample_strategy",
)

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}


def _kind_map(kind: str) -> dict[str, Callable[..., Any]]:
    if kind not in _REGISTRY:
        raise ValueError(f"unknown part kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    return _REGISTRY[kind]


def register(kind: str, name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator: make ``fn`` available as ``name`` for ``kind``.

    Registering a name twice is an error unless ``replace=True``, so a typo cannot silently
    shadow a built-in part.
    """
    parts = _kind_map(kind)

    def decorator(fn: F) -> F:
        if name in parts and parts[name] is not fn and not replace:
            raise ValueError(f"{kind} {name!r} is already registered (pass replace=True)")
        parts[name] = fn
        return fn

    return decorator


def unregister(kind: str, name: str) -> None:
    """Remove ``name`` from ``kind`` (for tests and interactive experiments)."""
    _kind_map(kind).pop(name, None)


#: Trinity-RFT's parts that are not here for a reason, per (kind, name): naming one is refused
#: with it (``roles/tools/upstream.py``'s table shows them).
REFUSED: dict[tuple[str, str], str] = {
    ("advantage_fn", "clipv"): "reads a per-token signal ('necs') that only upstream's example veRL actor "
                               "computes (examples/entropy/clipv_dp_actor.py), not its trainer",
    ("advantage_fn", "cod"): "Connect-the-Dots (its main branch): reads fields only its own CoD workflows write "
                             "(exp_type, task_rewards); not built yet",
    **{("reward_fn", name): "calls the OpenJudge package's LLM graders (py-openjudge, not a dependency here) on a "
                            "judge API; not wired yet: a judge on an auxiliary model trains through "
                            "rubric_judge_workflow or math_ruler_workflow"
       for name in ("openjudge_reward", "trajectory_accuracy_grader_reward", "openjudge_trajectory_accuracy_reward",
                    "openjudge_multi_grader_reward")},
}


def get(kind: str, name: str) -> Callable[..., Any]:
    """Return the function registered as ``name``, or importable as ``module:function`` (then
    registered under that name); ``ValueError`` lists the valid names."""
    parts = _kind_map(kind)
    if name not in parts and ":" in name:
        parts[name] = _import(kind, name)
    if name not in parts and (kind, name) in REFUSED:
        raise ValueError(f"{kind} {name!r} (Trinity-RFT's) is not available here: {REFUSED[kind, name]}")
    if name not in parts:
        raise ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(parts))} "
                         "(or module.path:function)")
    return parts[name]


def _import(kind: str, name: str) -> Callable[..., Any]:
    module, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{kind} {name!r}: cannot import {attr!r} from {module!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"{kind} {name!r}: {fn!r} is not callable")
    return fn


def parts(kind: str) -> dict[str, Callable[..., Any]]:
    """The live name -> function map for ``kind`` (what ``register`` writes to)."""
    return _kind_map(kind)


def names(kind: str) -> list[str]:
    """Registered names for ``kind``, sorted."""
    return sorted(_kind_map(kind))


def bad_values(fn: Callable[..., Any], args: dict[str, Any]) -> list[str]:
    """One line per argument in ``args`` whose value breaks what ``fn``'s signature declares:
    a ``Literal`` it is not one of, or an ``Annotated`` bound of annotated-types (``Gt``,
    ``Ge``, ``Lt``, ``Le``, ``Interval``; NaN breaks every bound). A part states its valid values
    once, in its signature, and a config is checked against them before anything starts."""
    hints = get_type_hints(fn, include_extras=True)
    out = []
    for name, value in args.items():
        hint = hints.get(name)
        choices = get_origin(hint) in (Union, types.UnionType) and get_args(hint) or (hint,)
        if value is None and type(None) in choices:
            continue
        for choice in choices:
            if get_origin(choice) is Literal and value not in get_args(choice):
                out.append(f"{name}: {value!r} is not one of {', '.join(map(repr, get_args(choice)))}")
            if get_origin(choice) is Annotated:
                out += [f"{name}: {value!r} {why}" for why in _broken_bounds(value, choice.__metadata__)]
    return out


def _broken_bounds(value: Any, metadata: tuple[Any, ...]) -> list[str]:
    bounds = [b for m in metadata for b in (m if isinstance(m, annotated_types.GroupedMetadata) else [m])]
    tests = {annotated_types.Gt: ("gt", ">", lambda v, b: v > b), annotated_types.Ge: ("ge", ">=", lambda v, b: v >= b),
             annotated_types.Lt: ("lt", "<", lambda v, b: v < b), annotated_types.Le: ("le", "<=", lambda v, b: v <= b)}
    out = []
    for bound in bounds:
        if type(bound) in tests:
            attr, sign, ok = tests[type(bound)]
            limit = getattr(bound, attr)
            try:
                if not ok(value, limit):
                    out.append(f"must be {sign} {limit}")
            except TypeError:
                out.append(f"is not a number (must be {sign} {limit})")
    return out
