"""Tasksets and datasets as streams of work: format keys, epoch order, cursors, readers.

The rows come from :mod:`storage.datafiles` (finding a dataset's files, reading them, checking
required keys); this module decides what becomes of them:

* :func:`task_required_keys` / :func:`dataset_required_keys` say which keys a row must carry
  under a taskset's ``format``, and :func:`format_row` turns an SFT/DPO row into chat messages
  (:class:`FormattedRow`).
* :class:`DatasetReader` hands rows out in batches in sequential, shuffled (seeded, per epoch) or
  random order, over epochs or up to ``total_steps``, with a cursor that can be saved and
  restored so that a resumed run neither repeats nor skips a row. :class:`TaskReader` turns
  each row into a :class:`schemas.data.Task`.

Why apart from :mod:`storage.datafiles`: where rows come from does not depend on what they are
used for; this is the part the roles use, and it changes with the config's format and selector
settings, not with file formats.

The order depends only on ``(seed, epoch, dataset size)``, so the cursor is a single offset:
restoring needs nothing but the offset (and checks that the dataset size did not change).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import numpy as np

from schemas.data import Task
from storage.datafiles import (
    RequiredKey,
    RowSet,
    TasksetError,
    check_rows,
    load_rows,
    resolve_data_files,
)
from storage.selectors import OrderSelector, RowSelector, make_selector

if TYPE_CHECKING:
    from schemas.config import ExperienceBufferConfig, FormatConfig, TasksetConfig

Selector = Literal["sequential", "shuffle", "random", "offline_easy2hard"]
T = TypeVar("T")
log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# format keys
# --------------------------------------------------------------------------------------------


def task_required_keys(
    fmt: FormatConfig, feature_keys: Sequence[str] = (), prompt: bool = True
) -> Callable[[dict[str, Any]], list[RequiredKey]]:
    """Keys a task row must carry, decided from the dataset's first row.

    The prompt column is ``messages_key`` when ``prompt_type`` is ``messages`` *and* the data has
    that column, else ``prompt_key``: the seeds' task configs set only ``prompt_key`` and leave
    ``prompt_type`` at its default, and must keep working. A ``prompt_key`` value must be a
    string and a ``messages_key`` value chat messages: a list or a number would reach the model
    as its Python text. ``response_key`` (the reference answer, any value) is required when the
    data has that column, so one row without an answer fails instead of scoring zero forever;
    ``system_prompt_key`` (a string) when set; the selector's ``feature_keys`` (finite numbers)
    when it reads them (:func:`selector_features`). ``prompt=False``: the taskset's workflow
    writes its own prompt (an environment's, from the row's other columns), none is required."""

    def decide(first: dict[str, Any]) -> list[RequiredKey]:
        keys: list[RequiredKey] = []
        if prompt and fmt.prompt_type == "messages" and fmt.messages_key in first:
            keys.append(RequiredKey(fmt.messages_key, "format.messages_key", "messages"))
        elif prompt:
            keys.append(RequiredKey(fmt.prompt_key, "format.prompt_key", "text"))
        if fmt.response_key in first:
            keys.append(RequiredKey(fmt.response_key, "format.response_key"))
        if fmt.system_prompt_key:
            keys.append(RequiredKey(fmt.system_prompt_key, "format.system_prompt_key", "text"))
        keys += [RequiredKey(k, "task_selector.feature_keys", "number") for k in feature_keys]
        return keys

    return decide


def selector_features(cfg: TasksetConfig) -> list[str]:
    """The columns the taskset's selector reads from every row (none for plain orders)."""
    sel = cfg.data_selector if cfg.data_selector is not None else cfg.task_selector
    return list(sel.feature_keys) if sel.selector_type in ("offline_easy2hard", "difficulty_based") else []


_warned: set[str] = set()


def warn_skipped(name: str, rowset: RowSet) -> None:
    """One warning per dataset and process when ``skip_invalid_rows`` dropped rows: how many,
    and where the first was (eval readers are built again at every evaluation)."""
    if not rowset.skipped:
        return
    line = (f"{name}: skipped {rowset.skipped} invalid row(s) of {rowset.skipped + rowset.count} "
            f"(skip_invalid_rows); the first: {rowset.skipped_examples[0]}")
    if line not in _warned:
        _warned.add(line)
        log.warning(line)


def dataset_required_keys(
    fmt: FormatConfig, kind: Literal["sft", "dpo"] = "sft"
) -> list[RequiredKey]:
    """Keys an SFT or DPO row must carry under ``fmt`` (``prompt_type`` decides which)."""
    keys: list[RequiredKey] = []
    if fmt.prompt_type == "messages":
        keys.append(RequiredKey(fmt.messages_key, "format.messages_key", "messages_or_json"))
    else:
        keys.append(RequiredKey(fmt.prompt_key, "format.prompt_key", "text"))
        if kind == "sft":
            keys.append(RequiredKey(fmt.response_key, "format.response_key"))
        if fmt.system_prompt_key:
            keys.append(RequiredKey(fmt.system_prompt_key, "format.system_prompt_key", "text"))
    if kind == "dpo":
        pair = "messages_or_json" if fmt.prompt_type == "messages" else "any"
        keys += [
            RequiredKey(fmt.chosen_key, "format.chosen_key", pair),
            RequiredKey(fmt.rejected_key, "format.rejected_key", pair),
        ]
    return keys


def _json_field(value: Any, key: str) -> Any:
    """Lists of dicts are often stored as JSON strings (so arrow schemas stay uniform)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise TasksetError(f"key {key!r}: expected a list or a JSON string of one: {e}") from e
    return value


@dataclass
class FormattedRow:
    """A dataset row as chat messages: what SFT/DPO tokenization starts from."""

    messages: list[dict[str, Any]]
    chosen: list[dict[str, Any]] | None = None
    rejected: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


def format_row(
    row: dict[str, Any], fmt: FormatConfig, kind: Literal["sft", "dpo"] = "sft"
) -> FormattedRow:
    """Apply the format keys to one row, as Trinity-RFT's SFT/DPO formatters do (minus the
    tokenizer, which belongs to the trainer).

    plaintext: ``[system?, user(prompt_key), assistant(response_key)]`` for SFT, the prompt part
    plus ``chosen``/``rejected`` as one assistant message each for DPO; the system message comes
    from ``system_prompt_key`` (per row) or else ``system_prompt``. messages: ``messages_key``
    (and ``chosen_key``/``rejected_key`` message lists). ``tools_key`` is optional in both."""
    tools = row.get(fmt.tools_key)
    tools = _json_field(tools, fmt.tools_key) if tools is not None else None
    if fmt.prompt_type == "messages":
        messages = _json_field(row[fmt.messages_key], fmt.messages_key)
        if kind == "dpo":
            chosen = _json_field(row[fmt.chosen_key], fmt.chosen_key)
            rejected = _json_field(row[fmt.rejected_key], fmt.rejected_key)
            return FormattedRow(list(messages), list(chosen), list(rejected), tools)
        return FormattedRow(list(messages), tools=tools)
    messages = []
    if fmt.system_prompt_key and row.get(fmt.system_prompt_key) is not None:
        messages.append({"role": "system", "content": row[fmt.system_prompt_key]})
    elif fmt.system_prompt:  # "" means none, as in the explorer's workflows
        messages.append({"role": "system", "content": fmt.system_prompt})
    messages.append({"role": "user", "content": row[fmt.prompt_key]})
    if kind == "dpo":
        return FormattedRow(
            messages,
            chosen=[{"role": "assistant", "content": row[fmt.chosen_key]}],
            rejected=[{"role": "assistant", "content": row[fmt.rejected_key]}],
            tools=tools,
        )
    messages.append({"role": "assistant", "content": row[fmt.response_key]})
    return FormattedRow(messages, tools=tools)


# --------------------------------------------------------------------------------------------
# order, epochs, cursor
# --------------------------------------------------------------------------------------------


def epoch_order(selector: Selector, size: int, seed: int, epoch: int) -> np.ndarray:
    """Row indices of one epoch of an order selector: a pure function of ``(selector, size,
    seed, epoch)``, which is why a cursor of one integer is enough to resume."""
    return OrderSelector(selector, size, seed).order(epoch)


@dataclass(frozen=True)
class DatasetCursor:
    """Where a reader stands: ``offset`` rows handed out since the start (over all epochs).

    ``epoch`` and ``index`` (position inside that epoch's order) follow from it."""

    offset: int
    dataset_size: int

    @property
    def epoch(self) -> int:
        return self.offset // self.dataset_size if self.dataset_size else 0

    @property
    def index(self) -> int:
        return self.offset % self.dataset_size if self.dataset_size else 0


class DatasetReader(Generic[T]):
    """Hands out rows (or what ``transform`` makes of them) in batches, resumably.

    Training readers (``drop_last=True``) return only full batches, like Trinity-RFT; eval
    readers return the last partial batch. The stream runs over ``total_epochs`` epochs, or for
    exactly ``total_steps * batch_size`` rows when ``total_steps`` is set (epochs repeat as
    needed). Batches may span an epoch boundary. An exhausted reader returns ``[]``, not
    StopIteration, because a StopIteration raised inside a coroutine becomes a RuntimeError.
    """

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        *,
        batch_size: int,
        transform: Callable[[int, dict[str, Any], int], T],
        total_epochs: int = 1,
        total_steps: int | None = None,
        selector: Selector | RowSelector = "sequential",
        seed: int = 42,
        offset: int = 0,
        drop_last: bool = True,
        name: str = "",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        if total_epochs < 1:
            raise ValueError(f"total_epochs: must be >= 1, got {total_epochs}")
        if total_steps is not None and total_steps < 0:
            raise ValueError(f"total_steps: must be >= 0, got {total_steps}")
        self.rows = rows
        self.name = name
        self.batch_size = batch_size
        self.transform = transform
        #: chooses the rows of each stream position (``storage/selectors.py``)
        self.selector: RowSelector = (OrderSelector(selector, len(rows), seed) if isinstance(selector, str)
                                      else selector)
        self.seed = seed
        self.drop_last = drop_last
        self.total_samples = (
            batch_size * total_steps if total_steps is not None else len(rows) * total_epochs
        )
        if len(rows) == 0 and total_steps:
            raise TasksetError(f"{name or 'dataset'}: no rows, cannot run {total_steps} steps")
        self.offset = 0
        self.seek(offset)

    # -- cursor ------------------------------------------------------------------------------

    @property
    def dataset_size(self) -> int:
        return len(self.rows)

    @property
    def cursor(self) -> DatasetCursor:
        return DatasetCursor(self.offset, self.dataset_size)

    def seek(self, offset: int) -> None:
        """Continue from ``offset`` rows handed out (e.g. ``TasksetConfig.index`` on resume)."""
        if offset < 0:
            raise ValueError(f"offset: must be >= 0, got {offset}")
        self.offset = offset

    def state_dict(self) -> dict[str, Any]:
        """What to checkpoint; :meth:`load_state_dict` refuses a different dataset or order."""
        return {
            "name": self.name,
            "offset": self.offset,
            "epoch": self.cursor.epoch,
            "index": self.cursor.index,
            "dataset_size": self.dataset_size,
            "selector": self.selector.kind,
            "seed": self.seed,
            "selector_state": self.selector.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a cursor. A changed dataset size, selector or seed would silently reorder the
        rows (repeating some, skipping others), so it is an error naming the field."""
        for key, mine in (
            ("dataset_size", self.dataset_size),
            ("selector", self.selector.kind),
            ("seed", self.seed),
        ):
            if key in state and state[key] != mine:
                raise TasksetError(
                    f"{self.name or 'dataset'}: saved cursor has {key}={state[key]!r} but the "
                    f"reader has {mine!r}; resuming would repeat or skip rows"
                )
        self.selector.load_state_dict(state.get("selector_state") or {})
        self.seek(int(state["offset"]))

    # -- reading -----------------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        return max(0, self.total_samples - self.offset)

    @property
    def exhausted(self) -> bool:
        return self.remaining == 0 or (self.drop_last and self.remaining < self.batch_size)

    def __len__(self) -> int:
        """Number of batches the whole stream yields (from offset 0)."""
        full, rest = divmod(self.total_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def peek(self, n: int | None = None) -> list[tuple[int, int, int]]:
        """``(row_index, epoch, draw)`` of the next batch, without moving the cursor; ``draw`` is
        the stream position (unique, unlike the row when a selector draws a row twice)."""
        n = self.batch_size if n is None else n
        take = min(n, self.remaining)
        if take == 0 or (self.drop_last and take < n):
            return []
        rows = self.selector.pick(self.offset, take)
        size = max(self.dataset_size, 1)
        return [(r, off // size, off) for r, off in zip(rows, range(self.offset, self.offset + take), strict=True)]

    def peek_indices(self, n: int | None = None) -> list[tuple[int, int]]:
        """``(row_index, epoch)`` of the next batch, without moving the cursor."""
        return [(i, epoch) for i, epoch, _ in self.peek(n)]

    def make(self, index: int, epoch: int, draw: int) -> T:
        """The item of row ``index`` handed out at stream position ``draw``."""
        return self.transform(index, self.rows[index], epoch)

    def read_batch(self, n: int | None = None) -> list[T]:
        """The next batch (``batch_size`` unless ``n``), advancing the cursor; ``[]`` at the end."""
        picked = self.peek(n)
        items = [self.make(i, epoch, draw) for i, epoch, draw in picked]
        self.offset += len(picked)
        return items

    def update(self, indices: Sequence[int], values: Sequence[float]) -> None:
        """Feedback for the selector (per-row mean rewards; only adaptive selectors use it)."""
        self.selector.update(indices, values)

    def __iter__(self) -> Iterator[list[T]]:
        while batch := self.read_batch():
            yield batch

    def select(self, indices: Sequence[int], epoch: int = 0) -> list[T]:
        """Items for explicit row indices (no cursor movement): re-running given tasks."""
        out = []
        for i in indices:
            if not 0 <= i < self.dataset_size:
                raise IndexError(
                    f"{self.name or 'dataset'}: row index {i} outside [0, {self.dataset_size})"
                )
            out.append(self.transform(i, self.rows[i], epoch))
        return out


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """Everything a Task gets besides its row: the taskset's settings, resolved."""

    taskset: str
    workflow: str | None
    reward_fn: str | None = None
    rollout_args: dict[str, Any] = field(default_factory=dict)
    workflow_args: dict[str, Any] = field(default_factory=dict)
    reward_fn_args: dict[str, Any] = field(default_factory=dict)
    repeat_times: int = 1
    is_eval: bool = False
    format: dict[str, Any] = field(default_factory=dict)
    workflow_key: str = ""
    reward_fn_key: str = ""

    def make_task(self, index: int, row: dict[str, Any], epoch: int, draw: int | None = None) -> Task:
        """The Task for row ``index``; ``task_id`` is ``<taskset>/<index>``, stable across runs
        and epochs, and ``draw`` its position in the taskset's stream (None: ``index``), so a
        re-published task deduplicates on the bus."""
        workflow = (row.get(self.workflow_key) if self.workflow_key else None) or self.workflow
        if not workflow:
            raise TasksetError(
                f"taskset {self.taskset!r}: row {index} has no workflow: set "
                f"default_workflow_type (or format.workflow_key and a column of that name)"
            )
        reward_fn = (row.get(self.reward_fn_key) if self.reward_fn_key else None) or self.reward_fn
        return Task(
            task_id=f"{self.taskset}/{index}",
            raw=row,
            workflow=str(workflow),
            reward_fn=reward_fn,
            rollout_args=dict(self.rollout_args),
            workflow_args=dict(self.workflow_args),
            reward_fn_args=dict(self.reward_fn_args),
            repeat_times=self.repeat_times,
            is_eval=self.is_eval,
            taskset=self.taskset,
            index=index,
            epoch=epoch,
            draw=index if draw is None else draw,
            format=dict(self.format),
        )


class TaskReader(DatasetReader[Task]):
    """A :class:`DatasetReader` of :class:`schemas.data.Task` built from a taskset config."""

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        spec: TaskSpec,
        *,
        rowset: RowSet | None = None,
        **kwargs: Any,
    ) -> None:
        self.spec = spec
        #: How the rows were read (files, skipped-row count), when known.
        self.rowset = rowset
        kwargs.setdefault("name", spec.taskset)
        kwargs.setdefault("drop_last", not spec.is_eval)
        super().__init__(rows, transform=spec.make_task, **kwargs)

    def make(self, index: int, epoch: int, draw: int) -> Task:
        return self.spec.make_task(index, self.rows[index], epoch, draw)

    @classmethod
    def from_config(
        cls,
        cfg: TasksetConfig,
        *,
        batch_size: int,
        total_epochs: int = 1,
        total_steps: int | None = None,
        is_eval: bool = False,
        default_workflow_type: str | None = None,
        default_reward_fn_type: str | None = None,
        repeat_times: int | None = None,
        prompt: bool = True,
    ) -> TaskReader:
        """Read the taskset ``cfg`` describes. Eval readers run one epoch and keep the last
        partial batch; the ``default_*`` and ``repeat_times`` arguments fill what the taskset
        leaves unset (the explorer_input defaults, ``algorithm.repeat_times``); ``prompt``:
        whether its workflow reads the prompt column (:func:`task_required_keys`)."""
        if not cfg.path:
            raise TasksetError(f"taskset {cfg.name!r}: path is not set")
        files = resolve_data_files(cfg.path, cfg.subset_name, cfg.split)
        rowset = load_rows(files, task_required_keys(cfg.format, selector_features(cfg), prompt),
                           skip_invalid_rows=cfg.skip_invalid_rows)
        sel = cfg.data_selector if cfg.data_selector is not None else cfg.task_selector
        name = cfg.name or Path(cfg.path).name
        warn_skipped(f"taskset {name!r}", rowset)
        selector = make_selector(sel.selector_type, rowset.rows, seed=sel.seed, feature_keys=sel.feature_keys,
                                 kwargs=sel.kwargs, where=f"taskset {name!r}: task_selector")
        spec = TaskSpec(
            taskset=name,
            workflow=cfg.default_workflow_type or default_workflow_type,
            reward_fn=cfg.default_reward_fn_type or default_reward_fn_type,
            rollout_args=cfg.rollout_args.model_dump(exclude_none=True),
            workflow_args=dict(cfg.workflow_args),
            reward_fn_args=dict(cfg.reward_fn_args),
            repeat_times=cfg.repeat_times or repeat_times or 1,
            is_eval=is_eval,
            format=cfg.format.model_dump(),
            workflow_key=cfg.format.workflow_key,
            reward_fn_key=cfg.format.reward_fn_key,
        )
        return cls(
            rowset.rows,
            spec,
            batch_size=batch_size,
            total_epochs=1 if is_eval else total_epochs,
            total_steps=None if is_eval else total_steps,
            selector=selector,
            seed=sel.seed,
            offset=cfg.index,
            rowset=rowset,
        )


def dataset_reader_from_config(
    cfg: ExperienceBufferConfig,
    *,
    batch_size: int,
    kind: Literal["sft", "dpo"] = "sft",
    total_epochs: int = 1,
    total_steps: int | None = None,
) -> DatasetReader[FormattedRow]:
    """A reader of an SFT/DPO dataset (``storage_type: file``) yielding :class:`FormattedRow`."""
    if not cfg.path:
        raise TasksetError(f"buffer {cfg.name!r}: path is not set")
    files = resolve_data_files(cfg.path, cfg.subset_name, cfg.split)
    rowset = load_rows(
        files, dataset_required_keys(cfg.format, kind), skip_invalid_rows=cfg.skip_invalid_rows
    )
    warn_skipped(f"buffer {cfg.name!r}", rowset)
    fmt = cfg.format

    def transform(index: int, row: dict[str, Any], epoch: int) -> FormattedRow:
        try:
            return format_row(row, fmt, kind)
        except TasksetError as e:
            raise TasksetError(f"buffer {cfg.name!r}: row {index}: {e}") from e

    return DatasetReader(
        rowset.rows,
        batch_size=batch_size,
        transform=transform,
        total_epochs=total_epochs,
        total_steps=total_steps,
        selector=cfg.data_selector.selector_type,
        seed=cfg.data_selector.seed,
        name=cfg.name,
    )


def check_taskset(cfg: TasksetConfig, prompt: bool = True) -> RowSet:
    """Raise :class:`TasksetError` when the taskset ``cfg`` describes cannot be read: no path,
    no files for its split, no (valid) rows, or a row (any of them: one streamed pass) that is
    not a JSON object, lacks the prompt key (or a present answer column's key, or the
    selector's ``feature_keys``) or holds a value of the wrong kind, named by file and line.
    What :meth:`TaskReader.from_config` would find, without keeping the rows. Returns the
    counts. The selector's settings are checked apart from the data
    (:func:`storage.selectors.check_selector_config`)."""
    if not cfg.path:
        raise TasksetError("path is not set")
    files = resolve_data_files(cfg.path, cfg.subset_name, cfg.split)
    return check_rows(files, task_required_keys(cfg.format, selector_features(cfg), prompt),
                      skip_invalid_rows=cfg.skip_invalid_rows)


def check_dataset(cfg: ExperienceBufferConfig, kind: Literal["sft", "dpo"] = "sft") -> RowSet:
    """:func:`check_taskset` for an SFT/DPO dataset (``storage_type: file``)."""
    if not cfg.path:
        raise TasksetError("path is not set")
    files = resolve_data_files(cfg.path, cfg.subset_name, cfg.split)
    return check_rows(
        files, dataset_required_keys(cfg.format, kind), skip_invalid_rows=cfg.skip_invalid_rows
    )
