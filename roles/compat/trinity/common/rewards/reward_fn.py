"""Trinity-RFT's ``RewardFn``: a class built with the taskset's ``reward_fn_args`` and called
with ``response`` and ``truth``, returning named scores.

Ours are plain functions (``ops.rewards``: ``fn(response, truth, *, prompt, **options)``); each
side is shown to the other by a small adapter: :func:`as_our_reward` (a registered class, for
our workflows and the config check) and :func:`as_reward_class` (a built-in, for a plugin
workflow's ``task.reward_fn``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ops.rewards import call_reward


class RewardFn:
    """Base of a reward class: ``__init__(**reward_fn_args)``, ``__call__(response, truth, ...)
    -> dict[str, float]``."""

    def __init__(self, **kwargs: Any) -> None:
        pass

    def __call__(self, **kwargs: Any) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__}: implement __call__")


def scores(owner: str, out: Any) -> dict[str, float]:
    """A reward class's result as named scores: a dict of numbers (a bare number is ``reward``)."""
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return {"reward": float(out)}
    if isinstance(out, dict) and all(isinstance(v, (int, float)) for v in out.values()):
        return {str(k): float(v) for k, v in out.items()}
    raise TypeError(f"{owner}: returned {out!r}, not a dict of named scores (dict[str, float])")


def as_our_reward(name: str, cls: type, owner: str) -> Callable[..., dict[str, float]]:
    """The reward class as one of our reward functions: built with the options, called as
    upstream's workflows call it (``response=``, ``truth=``)."""

    def reward(response: str, truth: Any, *, prompt: str | None = None, **options: Any) -> dict[str, float]:
        return scores(owner, cls(**options)(response=response, truth=truth))

    reward.__name__ = name
    reward.__doc__ = f"{owner} (a Trinity-RFT reward class)"
    reward.reward_class = cls  # type: ignore[attr-defined]
    return reward


class _Ours(RewardFn):
    fn: Callable[..., dict[str, float]]

    def __init__(self, **options: Any) -> None:
        self.options = options

    def __call__(self, response: str = "", truth: Any = None, prompt: str | None = None,
                 response_token: Any = None, **kwargs: Any) -> dict[str, float]:
        """``response_token`` (upstream's workflows pass the response's token ids) is the
        response length for a reward that takes one (DAPO's overlong penalty)."""
        length = None if response_token is None else len(response_token)
        return call_reward(type(self).fn, response, truth, prompt=prompt, response_length=length,
                           options={**self.options, **kwargs})


def as_reward_class(name: str, fn: Callable[..., Any]) -> type[RewardFn]:
    """One of our reward functions as a reward class (the one a registered class was made from
    gives that class back)."""
    cls = getattr(fn, "reward_class", None)
    if cls is not None:
        return cls
    return type(name, (_Ours,), {"fn": staticmethod(fn), "__doc__": fn.__doc__})
