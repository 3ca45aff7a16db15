"""What each ``mode`` of a stage runs, reads and syncs: one table, read by every role.

Trinity-RFT's modes: ``both`` (explore and train together), ``train`` (train on stored data),
``explore`` (roll out into the experience stream), ``bench`` (evaluate checkpoints), ``serve``
(an OpenAI API whose episodes are trained on), ``colocate`` (both on the same devices, weights
through shared memory; on GPUs planned, not started yet). Why one table: the roles, the pre-start checks and the device plan each
asked "does this mode explore?" with their own inline tuple of mode names, and the tuples
disagreed at the edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: How the explorer's engines get newer weights in a mode. ``live``: the trainer of the same
#: stage offers them after its steps (NCCL/gloo broadcast or checkpoints: the synchronizer's
#: plan). ``watch``: it loads the checkpoints a ``train`` run beside it writes. ``each``: it
#: evaluates every saved checkpoint in turn (bench). ``none``: no explorer runs.
WeightSource = Literal["live", "watch", "each", "none"]


@dataclass(frozen=True)
class Mode:
    """One mode: the role processes its stage runs and what they do in it."""

    name: str
    roles: tuple[str, ...]
    """The role processes the stage runs (the others idle through it)."""
    finisher: str
    """The role whose completion completes the stage."""
    weights: WeightSource
    """How the explorer's engines get newer weights (see :data:`WeightSource`)."""
    reads_taskset: bool
    """The explorer rolls out the training taskset (``buffer.explorer_input.taskset``)."""
    makes_experience: bool
    """Experience for training is produced (rollouts, or the API's rewarded episodes): a
    teacher model scores it where the algorithm has one."""
    serves_api: bool = False
    """The explorer's OpenAI API is the source of episodes (it is always on)."""
    own_done_key: bool = False
    """The stage ends on ``run.done.<mode>`` rather than ``run.done``: a ``train`` and an
    ``explore`` run go side by side on one job, and a ``bench`` evaluates a finished job."""

    @property
    def explores(self) -> bool:
        """An explorer process runs."""
        return "explorer" in self.roles

    @property
    def trains(self) -> bool:
        """A trainer process runs (it also resumes from checkpoints and writes them)."""
        return "trainer" in self.roles

    @property
    def stores_experience(self) -> bool:
        """Experience flows through the buffer's pipeline (its operators run), now or later:
        every mode but ``bench``."""
        return self.makes_experience or self.trains


_ALL = ("buffer", "synchronizer", "trainer", "explorer")

MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("both", _ALL, "explorer", "live", reads_taskset=True, makes_experience=True),
    Mode("colocate", _ALL, "explorer", "live", reads_taskset=True, makes_experience=True),
    Mode("train", ("buffer", "trainer"), "trainer", "none", reads_taskset=False, makes_experience=False,
         own_done_key=True),
    Mode("explore", ("explorer",), "explorer", "watch", reads_taskset=True, makes_experience=True,
         own_done_key=True),
    Mode("bench", ("explorer",), "explorer", "each", reads_taskset=False, makes_experience=False,
         own_done_key=True),
    Mode("serve", _ALL, "explorer", "live", reads_taskset=False, makes_experience=True, serves_api=True),
)}

