"""Sample strategies: how a training batch is composed (Trinity-RFT's ``sample_strategy``).

A strategy is a pure function of the batch request: given the batch size ``n`` and the
trainer's version, it returns a :class:`BatchPlan` (how many experiences come from the replay
store and from how old a model they may be, how many from the auxiliary, expert, buffer).
The buffer carries the plan out; keeping the choice a function of two numbers is what makes
a batch reproducible after a restart. Register another with
``@ops.registry.register("sample_strategy", "name")`` (keyword arguments after ``*`` are its
``algorithm.sample_strategy_args``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ops.registry import register


@dataclass(frozen=True)
class BatchPlan:
    usual: int
    """Experiences from the replay store."""
    expert: int = 0
    """Experiences from the first auxiliary buffer (``buffer.trainer_input.auxiliary_buffers``),
    marked ``info["is_expert"]``."""
    min_model_version: int | None = None
    """The oldest model version a stored experience may come from (None: any)."""


#: The data arguments of every strategy (the rest are its hyperparameters).
SAMPLE_DATA: tuple[str, ...] = ("n", "trainer_version")


def staleness_floor(trainer_version: int, max_staleness: int | float | None) -> int | None:
    """``max(trainer_version - max_staleness, 0)``, or None when staleness is not limited."""
    if max_staleness is None or math.isinf(max_staleness):
        return None
    return max(int(trainer_version - max_staleness), 0)


@register("sample_strategy", "warmup")  # Trinity-RFT's deprecated name, the same strategy
@register("sample_strategy", "default")
def default(n: int, trainer_version: int) -> BatchPlan:
    """The replay store's order (FIFO or priority), any model version."""
    return BatchPlan(n)


@register("sample_strategy", "staleness_control")
def staleness_control(n: int, trainer_version: int, *, max_staleness: float | None = None) -> BatchPlan:
    """No experience generated more than ``max_staleness`` versions before the trainer's."""
    return BatchPlan(n, min_model_version=staleness_floor(trainer_version, max_staleness))


@register("sample_strategy", "mix")
def mix(n: int, trainer_version: int, *, expert_data_ratio: float = 0.5) -> BatchPlan:
    """A share ``expert_data_ratio`` of the batch from the expert (SFT) buffer, as CHORD and
    Trinity-RFT's ``mix`` train on."""
    expert = int(round(n * expert_data_ratio))
    return BatchPlan(n - expert, expert)
