"""Trinity-RFT's experience operators: an ``ExperienceOperator`` registered with
``EXPERIENCE_OPERATORS.register_module`` becomes one of the buffer's pipeline operators
(``roles.buffer.pipeline.OPERATORS``), named in ``data_processor.experience_pipeline.operators``
as a built-in is. Here an operator sees one task's group at a time (the buffer stores groups as
they arrive), not a whole explore step. ``ExperienceOperatorV1`` (asynchronous, with auxiliary
models) has no adapter yet and is refused, saying so."""

from __future__ import annotations

from typing import Any

from roles.buffer.pipeline import OPERATORS
from schemas.data import ExperienceGroup
from trinity.algorithm.advantage_fn import construct, with_settings
from trinity.common.experience import Experience, from_ours
from trinity.utils.registry import Registry, where

__all__ = ["EXPERIENCE_OPERATORS", "ExperienceOperator", "ExperienceOperatorV1"]


class ExperienceOperator:
    """Base of an operator: ``process(exps) -> (exps, metrics)``; it may drop experiences and
    change their ``reward``, ``info`` and ``metrics``."""

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict]:
        raise NotImplementedError(f"{type(self).__name__}: implement process()")

    def close(self) -> None:
        pass


class ExperienceOperatorV1:
    """Upstream's asynchronous operator with auxiliary models: not supported here yet."""


def as_our_operator(name: str, cls: type, owner: str) -> Any:
    def operator(group: ExperienceGroup, **args: Any) -> ExperienceGroup | None:
        theirs = [from_ours(e) for e in group.experiences]
        ours = {id(t): e for t, e in zip(theirs, group.experiences, strict=True)}
        kept, metrics = construct(cls, args).process(theirs)
        out = []
        for t in kept:
            e = ours.get(id(t))
            if e is None:
                raise TypeError(f"{owner}: returned an experience it was not given (it may drop or change them)")
            e.reward = None if t.reward is None else float(t.reward)
            e.info.update(t.info)
            e.info.update({k: float(v) for k, v in t.metrics.items() if isinstance(v, (int, float))})
            out.append(e)
        group.metrics.update({f"{name}/{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        group.experiences = out
        return group if out else None

    operator.__name__ = name
    operator.__doc__ = f"{owner} (a Trinity-RFT experience operator)"
    return with_settings(operator, cls)  # its settings checked as a built-in operator's are


def _install(name: str, cls: type, force: bool) -> None:
    OPERATORS[name] = as_our_operator(name, cls, f"experience operator {name!r} ({where(cls)})")


def _check(cls: type) -> str | None:
    if isinstance(cls, type) and issubclass(cls, ExperienceOperatorV1):
        return ("is an ExperienceOperatorV1 (asynchronous, with auxiliary models), which has no adapter here "
                "yet; write it as an ExperienceOperator (process(exps) -> (exps, metrics))")
    if isinstance(cls, type) and issubclass(cls, ExperienceOperator):
        return None
    return "is not an ExperienceOperator subclass"


EXPERIENCE_OPERATORS = Registry("experience_operators", _install, lambda: OPERATORS, _check)
