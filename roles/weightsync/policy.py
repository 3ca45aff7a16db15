"""When weights move: pure functions of steps and the ``synchronizer`` settings.

Versions are trainer steps: the trainer's model after step N is version N; the initial model
is version 0. Explorer steps count from 0 (the step about to run).

* ``fixed``: the explorer's step ``s`` must run on version ``required_version(s, I, offset)``;
  the trainer offers its weights after every ``I`` steps and waits for the explorer to take
  them. ``sync_offset`` lets the explorer run that many steps ahead on older weights, so
  rollout and training overlap.
* ``trainer_driven``: the trainer offers every ``trainer_sync_interval`` steps; the explorer
  takes the newest offer at its next step boundary and never waits for one.
* ``explorer_driven``: every ``explorer_sync_interval`` steps (after the offset) the explorer
  asks for the trainer's current weights; the trainer answers after its current step.
"""

from __future__ import annotations


def required_version(explorer_step: int, interval: int, offset: int = 0) -> int:
    """Oldest model version explorer step ``explorer_step`` may run on under ``fixed``."""
    if interval < 1:
        raise ValueError(f"synchronizer.sync_interval: must be >= 1, got {interval}")
    if explorer_step < offset + interval:
        return 0
    return ((explorer_step - offset) // interval) * interval


def trainer_offers(step: int, interval: int, style: str) -> bool:
    """Does the trainer offer its weights right after step ``step``?"""
    if style == "explorer_driven" or step <= 0:
        return False
    return step % interval == 0


def explorer_requests(explorer_step: int, interval: int, offset: int, style: str) -> bool:
    """Under ``explorer_driven``: does the explorer ask for weights before ``explorer_step``?"""
    if style != "explorer_driven" or explorer_step <= offset:
        return False
    return (explorer_step - offset) % interval == 0


