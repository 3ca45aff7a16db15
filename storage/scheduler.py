"""The taskset scheduler: one step's tasks from several tasksets, mixed by weight, resumably.

Each taskset keeps its own reader (cursor, selector, epochs); the scheduler decides how many
of a step's ``batch_size`` tasks each one gives. Shares follow the weights exactly over time:
every step each taskset earns ``batch_size * w_i / sum(w)`` credit and gives the whole part
of it, the remainders going to the largest fractions, so 0.7/0.3 over 10-task steps is
7/3 every step and 0.75/0.25 over 10 is 8/2, 7/3, 8/2, ... The allocation is a pure function of
the weights and the saved credits: a step's tasks follow from the seed and the cursor alone.

A taskset whose epochs are spent leaves the mix and the others fill its share; the run ends
when fewer than ``batch_size`` tasks are left in all (Trinity-RFT drops the last partial
batch too) or after ``total_steps`` steps. With one taskset this is exactly its reader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from schemas.data import Task
from storage.datafiles import TasksetError
from storage.tasksets import TaskReader

Weight = Callable[[int], float]


def schedule(points: Sequence[tuple[int, float]]) -> Weight:
    """A weight over steps: linear between ``(step, weight)`` points, flat outside them."""
    xs = np.array([p[0] for p in points], dtype=np.float64)
    ys = np.array([p[1] for p in points], dtype=np.float64)
    order = np.argsort(xs, kind="stable")
    xs, ys = xs[order], ys[order]
    return lambda step: float(np.interp(step, xs, ys))


def allocate(n: int, weights: Sequence[float], credits: Sequence[float],
             room: Sequence[int]) -> tuple[list[int], list[float]]:
    """How many of ``n`` tasks each taskset gives, and the credits after: pure, for the test.

    ``room`` caps each taskset (what its reader has left); a capped taskset's share goes to
    the others by their weights. Raises ValueError when no taskset with room has weight."""
    k = len(weights)
    got, credit = [0] * k, list(credits)
    left = n
    while left > 0:
        open_ = [i for i in range(k) if room[i] - got[i] > 0 and weights[i] > 0]
        if not open_:
            raise ValueError("no taskset with tasks left has a weight above 0")
        total = sum(weights[i] for i in open_)
        for i in open_:
            credit[i] += left * weights[i] / total
        whole = {i: min(int(np.floor(credit[i] + 1e-9)), room[i] - got[i]) for i in open_}
        gave = sum(whole.values())
        if gave > left:  # floating error can promise one more than there is
            top = max(whole, key=lambda i: (whole[i], -i))
            whole[top] -= gave - left
        for i in open_:
            got[i] += whole[i]
            credit[i] -= whole[i]
        left -= sum(whole.values())
        for i in sorted(open_, key=lambda i: (-credit[i], i)):
            if left == 0:
                break
            if room[i] - got[i] > 0:
                got[i] += 1
                credit[i] -= 1
                left -= 1
    return got, credit


class TaskScheduler:
    """Steps of tasks from ``readers`` (each with ``drop_last=False``: the scheduler cuts whole
    steps). ``weights[i](step)`` is reader i's weight at a step."""

    def __init__(self, readers: Sequence[TaskReader], weights: Sequence[Weight], batch_size: int,
                 total_steps: int | None = None) -> None:
        if not readers:
            raise TasksetError("buffer.explorer_input.tasksets: no training taskset")
        names = [r.name for r in readers]
        if len(set(names)) != len(names):
            raise TasksetError(f"buffer.explorer_input.tasksets: names must be unique, got {names}")
        self.readers = list(readers)
        self.weights = list(weights)
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.step = 0  # steps cut so far
        self.credits = [0.0] * len(readers)
        self.by_name = {r.name: r for r in self.readers}

    @property
    def exhausted(self) -> bool:
        if self.total_steps is not None and self.step >= self.total_steps:
            return True
        return sum(r.remaining for r in self.readers) < self.batch_size

    def counts(self, n: int | None = None) -> tuple[list[int], list[float]]:
        """Tasks per taskset in the next ``n`` (a step's) and the credits after (no state change)."""
        w = [max(0.0, f(self.step)) for f in self.weights]
        try:
            return allocate(self.batch_size if n is None else n, w, self.credits, [r.remaining for r in self.readers])
        except ValueError as e:
            raise TasksetError(f"buffer.explorer_input.tasksets: at step {self.step}: {e}") from e

    def next_batch(self) -> list[Task]:
        """The next step's tasks, taskset by taskset; ``[]`` once exhausted."""
        if self.exhausted:
            return []
        tasks = self._take(self.batch_size)
        self.step += 1
        return tasks

    def more(self, n: int) -> list[Task]:
        """``n`` more tasks for the current step (to replace dropped groups), mixed by the
        same weights; fewer when the tasksets run out."""
        n = min(n, sum(r.remaining for r in self.readers))
        return self._take(n) if n > 0 else []

    def _take(self, n: int) -> list[Task]:
        got, self.credits = self.counts(n)
        tasks: list[Task] = []
        for reader, k in zip(self.readers, got, strict=True):
            if k:
                tasks += reader.read_batch(k)
        return tasks

    def rebuild(self, picks: Sequence[Sequence[Any]]) -> list[Task]:
        """Tasks from ``[taskset, row, epoch, draw]`` picks (a step saved in flight)."""
        out = []
        for name, row, epoch, draw in picks:
            reader = self.by_name.get(name)
            if reader is None or not 0 <= row < reader.dataset_size:
                raise TasksetError(f"cursor.explorer: saved step names {name}/{row}, which the tasksets lack")
            out.append(reader.make(int(row), int(epoch), int(draw)))
        return out

    @staticmethod
    def picks(tasks: Sequence[Task]) -> list[list[Any]]:
        """What :meth:`rebuild` needs to make ``tasks`` again."""
        return [[t.taskset, t.index, t.epoch, t.draw] for t in tasks]

    def feedback(self, taskset: str, indices: Sequence[int], values: Sequence[float]) -> bool:
        """Per-row mean rewards for a taskset's selector; False if no such taskset."""
        reader = self.by_name.get(taskset)
        if reader is None:
            return False
        reader.update(indices, values)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "credits": list(self.credits),
                "tasksets": {r.name: r.state_dict() for r in self.readers}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; a cursor saved by a single-taskset run before tasksets were mixed (a
        reader's own state) loads into the one reader."""
        if "tasksets" not in state:
            if len(self.readers) != 1:
                raise TasksetError("cursor.explorer: saved for one taskset; the config now mixes several")
            self.readers[0].load_state_dict(state)
            return
        missing = set(self.by_name) - set(state["tasksets"])
        if missing:
            raise TasksetError(f"cursor.explorer: no saved position for taskset(s) {sorted(missing)}; "
                               "a taskset added to a run cannot resume it")
        for r in self.readers:
            r.load_state_dict(state["tasksets"][r.name])
        self.step = int(state["step"])
        self.credits = [float(c) for c in state["credits"]]

    def metrics(self) -> dict[str, float]:
        """Per taskset: rows handed out so far, pass rates an adaptive selector has taken in,
        and the invalid rows ``skip_invalid_rows`` skipped (when it skipped any)."""
        out = {}
        for r in self.readers:
            out[f"{r.name}/drawn"] = float(r.offset)
            if r.rowset is not None and r.rowset.skipped:
                out[f"{r.name}/skipped_rows"] = float(r.rowset.skipped)
            updates = getattr(r.selector, "updates", None)
            if updates is not None:
                out[f"{r.name}/selector_updates"] = float(updates)
        return out

    @property
    def offset(self) -> int:
        """Tasks handed out so far, over all tasksets (for logs)."""
        return sum(r.offset for r in self.readers)


def scheduler_from_config(cfg: Any, reads_prompt: Callable[[str | None], bool] | None = None) -> TaskScheduler:
    """The scheduler of a (derived) :class:`schemas.config.TrinityConfig`'s training tasksets.
    ``reads_prompt(workflow name)``: whether that workflow needs the rows' prompt column (the
    explorer asks its workflow registry; None: every one does)."""
    ei, buf = cfg.buffer.explorer_input, cfg.buffer
    training = ei.training()
    if not training:
        raise TasksetError("buffer.explorer_input.taskset: not set; the explorer has nothing to run")
    readers, weights = [], []
    # filled steps (dynamic sampling) draw up to batch_size more tasks a round: with
    # total_steps the readers must not run dry before the steps do
    per_step = 1 + cfg.data_processor.experience_pipeline.fill_rounds()
    for _, ts in training:
        reader = TaskReader.from_config(
            ts, batch_size=buf.batch_size, total_epochs=buf.total_epochs,
            total_steps=None if buf.total_steps is None else buf.total_steps * per_step,
            default_workflow_type=ei.default_workflow_type, default_reward_fn_type=ei.default_reward_fn_type,
            repeat_times=cfg.algorithm.repeat_times,
            prompt=reads_prompt is None or reads_prompt(ts.default_workflow_type))
        if len(training) > 1:
            reader.drop_last = False  # the scheduler cuts whole steps from all of them
        readers.append(reader)
        points, weight = getattr(ts, "weight_schedule", []), getattr(ts, "weight", None)  # tasksets[] only
        if points:
            weights.append(schedule([(p.step, p.weight) for p in points]))
        else:
            w = float(reader.dataset_size if weight is None else weight)
            weights.append(lambda step, w=w: w)
    return TaskScheduler(readers, weights, buf.batch_size, buf.total_steps)
