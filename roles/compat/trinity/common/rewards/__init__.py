"""Trinity-RFT's reward registry: ``@REWARD_FUNCTIONS.register_module("name")`` on a
:class:`RewardFn` makes ``name`` a reward function here (``ops.registry``'s ``reward_fn``), so
``default_reward_fn_type: name`` works with our workflows and plugin workflows alike."""

from __future__ import annotations

from ops.registry import parts, register
from trinity.common.rewards.reward_fn import RewardFn, as_our_reward, as_reward_class
from trinity.utils.registry import Registry, where


def _install(name: str, cls: type, force: bool) -> None:
    register("reward_fn", name, replace=force)(as_our_reward(name, cls, f"reward_fn {name!r} ({where(cls)})"))


def _check(cls: type) -> str | None:
    if not (isinstance(cls, type) and any("__call__" in vars(k) for k in cls.__mro__[:-1])):
        return "is not a reward class (a RewardFn subclass)"
    return None


REWARD_FUNCTIONS = Registry("reward_functions", _install, lambda: parts("reward_fn"), _check, as_reward_class)

__all__ = ["REWARD_FUNCTIONS", "RewardFn"]
