"""The buffer's pass rates, back to the leading explorer's task selectors.

The buffer publishes one :class:`TaskFeedback` per training group its pipeline ran when the
pipeline has a ``pass_rate_calculator`` (``trinity.<run>.feedback``). The leader tails that
stream and hands what arrived to the selectors just before it picks a step's tasks, never in
between, and saves in its cursor the sequence after the last one handed over: a restarted
leader restores the selectors as they were and reads on from there, so every pass rate counts
exactly once whatever is killed when (a buffer that dies between publishing a feedback and
acking its group re-sends it under the same id, which the stream drops).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from typing import Any

import structlog

import bus
from schemas import codec
from schemas.data import TaskFeedback
from storage.scheduler import TaskScheduler

log = structlog.get_logger(__name__)


class FeedbackInbox:
    """Feedback delivered but not yet handed to the selectors, and where to resume."""

    def __init__(self, js: Any, run_id: str, track_kept: bool = False) -> None:
        self.pending: list[tuple[int, TaskFeedback]] = []
        self.applied_to = 0
        self.applied = 0  # handed over since start (a metric)
        #: group id -> experiences the pipeline kept (0: dropped), for filling a step
        self.kept: dict[str, int] = {}
        self.track_kept = track_kept
        self.tail = bus.StreamTail(js, run_id, "feedback", self._on_msg)

    def start(self, from_seq: int) -> None:
        self.applied_to = max(1, from_seq) - 1
        self.tail.start(from_seq)

    async def close(self) -> None:
        await self.tail.close()

    @property
    def next_seq(self) -> int:
        """Where a restarted leader reads on: the cursor's ``feedback_from``."""
        return self.applied_to + 1

    def _on_msg(self, msg: Any) -> None:
        seq = msg.metadata.sequence.stream
        try:
            fb = codec.decode(msg.data, TaskFeedback)
            self.pending.append((seq, fb))
            if self.track_kept:
                self.kept[fb.group_id] = fb.kept
        except codec.CodecError as e:  # one unreadable report must not stop the run
            log.error("feedback_unreadable", seq=seq, error=str(e))
            self.pending.append((seq, None))  # type: ignore[arg-type]

    def apply(self, scheduler: TaskScheduler) -> int:
        """Hand every pending pass rate to its taskset's selector; the number handed over."""
        by_set: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        n = 0
        for seq, fb in self.pending:
            self.applied_to = max(self.applied_to, seq)
            if fb is None or fb.pass_rate is None:
                continue
            by_set[fb.taskset][0].append(fb.index)
            by_set[fb.taskset][1].append(fb.pass_rate)
            n += 1
        self.pending.clear()
        for name, (indices, values) in by_set.items():
            if not scheduler.feedback(name, indices, values):
                log.warning("feedback_for_unknown_taskset_ignored", taskset=name, rows=len(indices))
        self.applied += n
        return n

    async def fates(self, group_ids: list[str], timeout: float) -> dict[str, int]:
        """Experiences kept of each group in ``group_ids``, once the buffer has reported them
        all or ``timeout`` seconds passed (a group not reported by then is missing)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(g not in self.kept for g in group_ids) and loop.time() < deadline:
            self.tail.arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.tail.arrived.wait(), 0.5)
        return {g: self.kept.pop(g) for g in group_ids if g in self.kept}
