"""When a run must end non-zero although no role crashed: the cut-offs, as pure functions.

A run that cannot succeed used to end "done": a pipeline operator that fails on every group
(a ``stats_key`` no experience carries) dead-lettered every group, the explorer waited out
``sync_timeout`` for weights that never came, the trainer finished with nothing trained, and
``trinity run`` exited 0 with an accuracy in its summary. A sweep or a CI job learned nothing.
Three cut-offs, each decided here from what one role saw (no I/O, so each is tested alone):

* **buffer** (:class:`DeadLetterStreak`): a whole step's worth of groups
  (``buffer.batch_size``, at least 2: :func:`streak_limit`) dead-lettered by its pipeline one after the other, all for the same
  reason (numbers aside: ``experiences[3]`` and ``experiences[0]`` are one reason), and nothing
  stored in between. Every next group would meet the same fate. One bad message never ends a
  run: poison interleaved with good groups resets the count whenever a group is stored, and
  messages that fail for varied reasons never add up (each new reason starts a new count).
  Groups an operator drops on purpose (filters) and evaluation groups neither count nor reset.
* **trainer** (:func:`short_of_steps`): it finished (the buffer's input is exhausted) having
  trained fewer steps than ``total_steps``, or none at all when no total is set, and was not
  stopped (SIGTERM).
* **explorer** (:func:`nothing_trained`): its wait for weights timed out while nothing was
  trained (it holds version 0 and the trainer has trained no step): waiting on would only
  repeat the timeout.

The role raises :class:`RunFailed` with one line naming the cause; ``roles/launch/stages.py`` records
it as ``run.failed`` (:class:`schemas.state.RunFailure`) in the stage's KV bucket and the
process exits :data:`RUN_FAILED_EXIT`. ``trinity run`` does not restart a role that exits so
(the same experience would fail again): it stops every role, prints its summary and the cause
as its last line, and exits 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A role's exit code for "the run cannot succeed, a restart cannot help" (0 done, 1 an error
#: ``trinity run`` restarts, 2 the config or a pre-start check).
RUN_FAILED_EXIT = 3


class RunFailed(Exception):
    """The run cannot succeed; ``cause`` says why in one line (it becomes ``trinity run``'s
    last line, so it names what to fix)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def streak_limit(batch_size: int) -> int:
    """How many groups dead-lettered in a row end the run: a step's worth
    (``buffer.batch_size``), and never fewer than 2, so that one bad message never does."""
    return max(batch_size, 2)


def reason_key(reason: str) -> str:
    """What two dead-letter reasons are compared by: the text with every number replaced
    (an experience's index or a token id differ from group to group; the mistake does not)."""
    return re.sub(r"\d+", "#", reason)


@dataclass(frozen=True)
class DeadLetterStreak:
    """Groups dead-lettered one after the other for one reason, nothing stored in between:
    ``reason`` is the first one's (as the dead-letter stream has it), ``count`` how many."""

    reason: str | None = None
    count: int = 0

    def after(self, *, stored: bool = False, dead_letter: str | None = None) -> DeadLetterStreak:
        """The streak after one more group, in the order the buffer ingested them: stored
        (``stored``: the streak ends), dead-lettered with reason ``dead_letter`` (the same
        reason: one more; another: a new streak of one), or neither (an evaluation group, one
        an operator dropped: no change)."""
        if dead_letter is not None:
            if self.reason is not None and reason_key(self.reason) == reason_key(dead_letter):
                return DeadLetterStreak(self.reason, self.count + 1)
            return DeadLetterStreak(dead_letter, 1)
        if stored:
            return DeadLetterStreak()
        return self

    def cause(self, limit: int) -> str | None:
        """The run's failure once ``limit`` groups (a step's worth, ``buffer.batch_size``) are
        in the streak, naming the count and the first reason; None before that (and for a
        ``limit`` below 1)."""
        if limit < 1 or self.count < limit:
            return None
        return (f"the buffer's experience pipeline dead-lettered {self.count} groups in a row (a whole "
                f"step's worth) for the same reason, storing none in between: {self.reason}")


def short_of_steps(trained: int, total: int | None) -> str | None:
    """Why a trainer that finished (its input exhausted, not stopped) after ``trained`` steps
    failed the run, or None: fewer steps than ``total`` (``total_steps``), or none at all when
    no total was set."""
    if total is not None and trained < total:
        return (f"the trainer finished after {trained} of {total} steps (total_steps): its input ran out "
                "(a dataset's total_epochs, or experience the buffer dead-lettered or dropped)")
    if total is None and trained == 0:
        return ("the trainer finished without training a step: it got no input "
                "(see the buffer's dead letters and dropped groups)")
    return None


def nothing_trained(explorer_version: int, trainer_version: int | None) -> bool:
    """Whether a timed-out wait for weights means the run cannot go on: the explorer holds the
    starting weights (version 0) and the trainer has trained no step (its ``version.trainer``
    is absent or 0). A trainer that trained once, or a restarted one that resumed, is slow, not
    hopeless: the run goes on as ``on_timeout`` says."""
    return explorer_version == 0 and not trainer_version
