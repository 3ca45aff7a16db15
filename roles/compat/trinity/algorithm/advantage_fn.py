"""Trinity-RFT's ``AdvantageFn`` and ``GroupAdvantage``, and the adapter that makes a registered
one of ours (``ops.advantages``' data in, an ``AdvantageResult`` out).

Upstream's advantage works on a list of its Experiences: it reads ``reward``,
``action_mask`` and ``eid`` (which task, which run) and sets ``advantages`` and ``returns``.
The adapter builds that list from the batch our trainer hands an advantage function, and
stacks what the class set back into tensors. Such a part runs in the trainer, on the whole
batch, as upstream's ``compute_in_trainer`` parts do.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ops.advantages import AdvantageResult
from trinity.common.experience import EID, Experience, group_by


class AdvantageFn:
    """Base of an advantage class: ``__call__(exps) -> (exps, metrics)``."""

    def __init__(self, **kwargs: Any) -> None:
        pass

    def __call__(self, exps: list[Experience], **kwargs: Any) -> tuple[list[Experience], dict]:
        raise NotImplementedError(f"{type(self).__name__}: implement __call__")

    @classmethod
    def default_args(cls) -> dict:
        return {}

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return True


class GroupAdvantage(AdvantageFn):
    """Advantages group by group: ``group_experiences`` then ``calculate_group_advantage``."""

    def group_experiences(self, exps: list[Experience]) -> dict[str, list[Experience]]:
        return group_by(exps, "task")

    def calculate_group_advantage(self, group_id: str, exps: list[Experience]) -> tuple[list[Experience], dict]:
        raise NotImplementedError(f"{type(self).__name__}: implement calculate_group_advantage")

    def __call__(self, exps: list[Experience], **kwargs: Any) -> tuple[list[Experience], dict]:
        metrics: dict[str, list[float]] = {}
        for gid, group in self.group_experiences(exps).items():
            _, m = self.calculate_group_advantage(gid, group)
            for k, v in m.items():
                metrics.setdefault(k, []).append(float(v))
        return exps, {f"group_advantages/{k}/mean": sum(v) / len(v) for k, v in metrics.items()}


def construct(cls: type, args: dict[str, Any]) -> Any:
    """``cls`` built as upstream builds a part: its ``default_args()`` under the config's args,
    each given only when its ``__init__`` takes it."""
    merged = {**(cls.default_args() if hasattr(cls, "default_args") else {}), **args}
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(args) - set(params))
        if unknown:
            raise TypeError(f"{cls.__qualname__}: takes no argument(s) {unknown}")
        merged = {k: v for k, v in merged.items() if k in params}
    return cls(**merged)


def with_settings(fn: Callable[..., Any], cls: type) -> Callable[..., Any]:
    """``fn`` with ``cls.__init__``'s settings shown as its keyword-only hyperparameters (their
    defaults from ``default_args()``): what ``ops.algorithms`` reads to check a config's
    ``*_args`` and to pass ``loss_agg_mode`` on."""
    sig = inspect.signature(fn)
    data = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    defaults = cls.default_args() if hasattr(cls, "default_args") else {}
    init = inspect.signature(cls.__init__).parameters
    settings = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(n, p.default))
                for n, p in init.items() if n not in ("self", "backend") and n not in sig.parameters
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    rest = [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)] \
        if any(p.kind is p.VAR_KEYWORD for p in init.values()) else []
    fn.__signature__ = sig.replace(parameters=data + settings + rest)  # type: ignore[attr-defined]
    return fn


def as_our_advantage(name: str, cls: type, owner: str) -> Callable[..., AdvantageResult]:
    """The advantage class as one of our advantage functions (see the module doc)."""

    def advantage(*, action_mask: Tensor, rewards: Tensor | None = None, group_ids: Any = None,
                  episode_ids: Any = None, **args: Any) -> AdvantageResult:
        if rewards is None:
            raise ValueError(f"{owner}: needs rewards")
        mask = action_mask.bool()
        r = rewards.sum(-1) if rewards.dim() == 2 else rewards
        batch, width = mask.shape
        ids = [str(g) for g in group_ids] if group_ids is not None else ["0"] * batch
        runs = list(episode_ids) if episode_ids is not None else list(range(batch))
        exps = [Experience(eid=EID(task=ids[i], run=int(runs[i]) if str(runs[i]).isdigit() else i),
                           tokens=torch.zeros(width + 1, dtype=torch.int32), prompt_length=1,
                           action_mask=mask[i], reward=float(r[i])) for i in range(batch)]
        row = {id(e): i for i, e in enumerate(exps)}
        out, metrics = construct(cls, args)(exps)
        adv = torch.zeros(batch, width, dtype=torch.float32)
        ret = torch.zeros(batch, width, dtype=torch.float32)
        keep = torch.zeros(batch, dtype=torch.bool)
        for e in out:
            i = row.get(id(e))
            if i is None:
                raise TypeError(f"{owner}: returned an experience it was not given")
            if e.advantages is None:
                raise ValueError(f"{owner}: set no advantages on experience {i}")
            adv[i] = torch.as_tensor(e.advantages, dtype=torch.float32) * mask[i]
            ret[i] = torch.as_tensor(e.returns if e.returns is not None else e.advantages, dtype=torch.float32) * mask[i]
            keep[i] = True  # an experience it leaves out is dropped, as upstream drops it
        return AdvantageResult(adv, ret, keep, {k: float(v) for k, v in metrics.items()})

    advantage.__name__ = name
    advantage.__doc__ = f"{owner} (a Trinity-RFT advantage class)"
    return with_settings(advantage, cls)
