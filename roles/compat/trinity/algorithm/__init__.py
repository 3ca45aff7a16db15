"""Trinity-RFT's algorithm registries: an advantage class, a policy loss class or an algorithm
type registered with ``ADVANTAGE_FN`` / ``POLICY_LOSS_FN`` / ``ALGORITHM_TYPE`` becomes one of
ours (``ops.registry``, ``ops.algorithms``) and is named in a config as a built-in is.

KL, entropy-loss and sample-strategy classes have no adapter yet: importing ``KL_FN``,
``ENTROPY_LOSS_FN`` or ``SAMPLE_STRATEGY`` (or their base classes) says what to use instead.
"""

from __future__ import annotations

from typing import Any

from ops.algorithms import ALGORITHM_DEFAULTS, register_algorithm
from ops.registry import parts, register
from trinity.algorithm.advantage_fn import AdvantageFn, GroupAdvantage, as_our_advantage
from trinity.algorithm.algorithm import AlgorithmType
from trinity.algorithm.policy_loss_fn import PolicyLossFn, as_our_policy_loss
from trinity.utils.registry import Registry, where


def _part(kind: str, adapt: Any, base: type) -> Registry:
    def install(name: str, cls: type, force: bool) -> None:
        register(kind, name, replace=force)(adapt(name, cls, f"{kind} {name!r} ({where(cls)})"))

    def check(cls: type) -> str | None:
        return None if isinstance(cls, type) and issubclass(cls, base) else f"is not a {base.__name__} subclass"

    return Registry(kind, install, lambda: parts(kind), check)


ADVANTAGE_FN = _part("advantage_fn", as_our_advantage, AdvantageFn)
POLICY_LOSS_FN = _part("policy_loss_fn", as_our_policy_loss, PolicyLossFn)

#: the parts an algorithm type's default_config may name, and their args
_CONFIG_KEYS = ("repeat_times", "advantage_fn", "policy_loss_fn", "kl_penalty_fn", "kl_loss_fn", "entropy_loss_fn",
                "sample_strategy", "loss_agg_mode", "advantage_fn_args", "policy_loss_fn_args")


def _install_algorithm(name: str, cls: type, force: bool) -> None:
    config = dict(cls.default_config())
    unknown = sorted(set(config) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"algorithm_type {name!r} ({where(cls)}): default_config keys {unknown} are not "
                         f"supported here (supported: {', '.join(_CONFIG_KEYS)})")
    if cls.use_critic != (config.get("advantage_fn") == "ppo"):
        raise ValueError(f"algorithm_type {name!r} ({where(cls)}): use_critic={cls.use_critic}, but here a "
                         "critic is trained exactly when advantage_fn is 'ppo' (GAE)")
    register_algorithm(name, replace=force, schema=cls.schema, **config)


ALGORITHM_TYPE = Registry("algorithm", _install_algorithm, lambda: ALGORITHM_DEFAULTS,
                          lambda cls: None if isinstance(cls, type) and issubclass(cls, AlgorithmType)
                          else "is not an AlgorithmType subclass")

_NOT_YET = {
    "KL_FN": "kl_fn", "KLFn": "kl_fn", "ENTROPY_LOSS_FN": "entropy_loss_fn", "EntropyLossFn": "entropy_loss_fn",
    "SAMPLE_STRATEGY": "sample_strategy", "SampleStrategy": "sample_strategy",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_YET:
        kind = _NOT_YET[name]
        raise ImportError(f"trinity.algorithm.{name}: Trinity-RFT's {kind} classes have no adapter here yet; "
                          f"register a function with ops.registry.register({kind!r}, 'name') in a plugin file "
                          "(docs/algorithms.md lists each kind's arguments)")
    raise AttributeError(f"module 'trinity.algorithm' has no attribute {name!r}")


__all__ = ["ADVANTAGE_FN", "ALGORITHM_TYPE", "POLICY_LOSS_FN", "AdvantageFn", "AlgorithmType", "GroupAdvantage",
           "PolicyLossFn"]
