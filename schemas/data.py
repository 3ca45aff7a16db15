"""The messages that flow between roles: Task, Experience, ExperienceGroup, SyncEvent, Metric,
the task queue's TaskOrder/TaskDone, the trainer-buffer RPC's BatchRequest/BatchReply/Commit,
and the header of a weight broadcast (WeightsHeader). The run's KV values are in :mod:`schemas.state`.

They are plain ``@dataclass(slots=True)`` classes rather than pydantic models because the hot
path (an explorer publishing thousands of experiences a second, a buffer decoding them) must
not pay for per-field validation machinery; :mod:`schemas.codec` checks field types once, on
the wire boundary, and then calls :meth:`validate` for the cross-field rules.

Arrays are ``numpy.ndarray`` (or ``torch.Tensor``, e.g. bfloat16 teacher logprobs). numpy
arrays that come out of :func:`schemas.codec.decode` are read-only; use ``np.array(a)`` when a
writable copy is needed.

The classes use ``eq=False`` (identity equality) because a generated ``__eq__`` would compare
arrays element-wise and raise on truth-testing the result.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Version of the wire layout of every schema below. Bump it when a field changes meaning or
#: type; the codec rejects messages of any other version instead of misreading them. Version 3
#: is version 1's layout again (every array inline, see schemas.codec), so both are read;
#: version 2 (an array table per message) is not.
SCHEMA_VERSION = 3

#: Longest experience or group id, in UTF-8 bytes: ids are keys of the replay store, and LMDB
#: refuses keys over 511 bytes.
MAX_ID_BYTES = 480
#: Model versions are stored as signed 64-bit integers.
MAX_VERSION = 2**63 - 1

#: An array field's type: a numpy array, or a torch tensor (bfloat16, float8: what numpy
#: lacks). ``Any`` to msgspec, which leaves array fields to schemas.codec.
Array = Any


def _kind(a: Any) -> str:
    """numpy-style dtype kind ('b', 'i', 'u', 'f', 'c') of a numpy array or torch tensor."""
    dt = a.dtype
    if isinstance(dt, np.dtype):
        return dt.kind
    # torch.dtype: no numpy kind, derive it from the dtype's own predicates.
    if dt.is_complex:
        return "c"
    if dt.is_floating_point:
        return "f"
    name = str(dt)
    if name == "torch.bool":
        return "b"
    return "u" if name.startswith("torch.uint") else "i"


def _check_vector(
    owner: str, name: str, a: Any, kinds: str, length: int | None, max_ndim: int = 1
) -> None:
    """Raise ValueError naming ``owner.name`` unless ``a`` is an array with the given kinds,
    ``1 <= ndim <= max_ndim`` and (when ``length`` is given) ``len(a) == length``."""
    shape = tuple(a.shape)
    if not 1 <= len(shape) <= max_ndim:
        dims = "1-D" if max_ndim == 1 else f"1-D to {max_ndim}-D"
        raise ValueError(f"{owner}.{name}: expected a {dims} array, got shape {shape}")
    k = _kind(a)
    if k not in kinds:
        want = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
        expected = " or ".join(want[c] for c in kinds)
        raise ValueError(f"{owner}.{name}: expected {expected} dtype, got {a.dtype}")
    if length is not None and shape[0] != length:
        raise ValueError(
            f"{owner}.{name}: length {shape[0]} != response length {length} "
            f"(len(tokens) - prompt_length)"
        )


def _check_id(owner: str, name: str, value: str, required: bool) -> None:
    """An id the replay store can key by: non-empty (where ``required``), at most
    MAX_ID_BYTES of UTF-8."""
    if required and not value:
        raise ValueError(f"{owner}.{name}: must not be empty")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ID_BYTES:
        raise ValueError(f"{owner}.{name}: {size} bytes, longer than {MAX_ID_BYTES}")


def _check_version(owner: str, version: int) -> None:
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"{owner}.model_version: must be in [0, 2**63), got {version}")


def _check_finite(owner: str, name: str, a: Any) -> None:
    """NaN or infinity in a reward, log-prob or advantage would void a whole training step."""
    finite = np.isfinite(a).all() if isinstance(a, np.ndarray) else a.isfinite().all()
    if not finite:
        raise ValueError(f"{owner}.{name}: holds NaN or infinite values")


@dataclass(slots=True, eq=False)
class Task:
    """One row of a taskset, resolved to what a workflow needs to run it.

    ``raw`` is the dataset row as read (plain data: str/int/float/bool/bytes/None, lists and
    str-keyed dicts); ``format`` records the format keys (prompt_key, response_key, ...) it was
    read with, so a workflow can find the prompt and the reference answer in ``raw``.
    """

    task_id: str
    raw: dict[str, Any]
    workflow: str
    reward_fn: str | None = None
    rollout_args: dict[str, Any] = field(default_factory=dict)
    workflow_args: dict[str, Any] = field(default_factory=dict)
    reward_fn_args: dict[str, Any] = field(default_factory=dict)
    repeat_times: int = 1
    is_eval: bool = False
    taskset: str = ""
    index: int = 0
    epoch: int = 0
    format: dict[str, Any] = field(default_factory=dict)
    #: position of the task in its taskset's stream (rows handed out before it): unlike
    #: ``(index, epoch)`` never the same for two tasks of a run, even when a selector draws a
    #: row twice in an epoch; the group id is built from it
    draw: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the field if the task cannot be run as given."""
        if self.repeat_times < 1:
            raise ValueError(f"Task.repeat_times: must be >= 1, got {self.repeat_times}")
        if self.index < 0:
            raise ValueError(f"Task.index: must be >= 0, got {self.index}")
        if self.epoch < 0:
            raise ValueError(f"Task.epoch: must be >= 0, got {self.epoch}")


def group_id(task: Task) -> str:
    """The id of the group a training task's rollouts make: ``<task_id>@<draw>``.

    Deterministic, so the task at the same position of its taskset's stream is the same group
    (a group re-published after a restart de-duplicates on the bus), and a row a selector
    draws twice makes two groups. The one place the format lives: the explorer names its
    groups with it, and whoever checks a run's groups (``bench/chaos.py``) names the groups
    it expects with it, so the two cannot drift apart again (the bench once expected
    ``<task_id>@<epoch>`` and called 899 of 900 groups lost)."""
    return f"{task.task_id}@{task.draw}"


@dataclass(slots=True, eq=False)
class Experience:
    """One rollout: prompt + response tokens and everything the trainer needs about them.

    ``tokens`` holds prompt then response (int32 by convention; any integer dtype is accepted);
    every per-token array (``logprobs``, ``action_mask``, ``token_level_reward``,
    ``advantages``, ``returns``, ``teacher_logprobs``) has one entry per *response* token.
    Multi-turn rollouts put the whole conversation after the prompt and zero the
    ``action_mask`` on environment/tool tokens, so the loss ignores what the model did not say.
    DPO experiences carry the shared prompt in ``tokens`` and the two responses in
    ``chosen`` / ``rejected``.
    """

    id: str
    task_id: str
    group_id: str
    run_id: str
    tokens: Array
    prompt_length: int
    logprobs: Array | None = None
    action_mask: Array | None = None
    reward: float | None = None
    token_level_reward: Array | None = None
    advantages: Array | None = None
    returns: Array | None = None
    model_version: int = 0
    prompt_truncated: bool = False
    response_truncated: bool = False
    messages: list[dict[str, Any]] | None = None
    prompt_text: str | None = None
    response_text: str | None = None
    chosen: Array | None = None
    rejected: Array | None = None
    teacher_logprobs: Array | None = None
    info: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    #: the episode (rollout) of its task this experience is a turn of, when a workflow gives
    #: one experience per turn (step-wise agents); None: the experience is a whole episode
    episode: int | None = None

    @property
    def episode_key(self) -> tuple[str, int | str]:
        """``(group_id, episode)``: the episode this experience belongs to. A step-wise
        rollout's turns share one; any other experience is an episode of its own."""
        return self.group_id, self.id if self.episode is None else self.episode

    @property
    def advantage_group(self) -> str:
        """The rollouts a group baseline compares this one with: its group's, or the part of
        the group its workflow named (``info["subgroup"]``: trainable RULER returns its judge's
        replies beside the answers they judge, each kind rewarded against its own kind)."""
        sub = self.info.get("subgroup")
        return self.group_id if sub is None else f"{self.group_id}/{sub}"

    @property
    def response_length(self) -> int:
        """Number of response tokens: ``len(tokens) - prompt_length``."""
        return len(self.tokens) - self.prompt_length

    def validate(self, owner: str = "Experience") -> None:
        """Raise ValueError naming the field if the arrays disagree in shape or kind.

        ``owner`` prefixes the field name in the message (an ExperienceGroup passes
        ``experiences[i]`` so the error says which experience is wrong).
        """
        _check_id(owner, "id", self.id, required=False)
        _check_id(owner, "group_id", self.group_id, required=False)
        _check_vector(owner, "tokens", self.tokens, "iu", None)
        n = len(self.tokens)
        if n and self.tokens.min() < 0:
            raise ValueError(f"{owner}.tokens: negative token id {int(self.tokens.min())}")
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError(f"{owner}.reward: must be finite, got {self.reward}")
        if not 0 <= self.prompt_length <= n:
            raise ValueError(
                f"{owner}.prompt_length: {self.prompt_length} is outside [0, len(tokens)={n}]"
            )
        r = n - self.prompt_length
        if self.logprobs is not None:
            _check_vector(owner, "logprobs", self.logprobs, "f", r)
        if self.action_mask is not None:
            _check_vector(owner, "action_mask", self.action_mask, "b", r)
        if self.token_level_reward is not None:
            _check_vector(owner, "token_level_reward", self.token_level_reward, "f", r)
        if self.advantages is not None:
            _check_vector(owner, "advantages", self.advantages, "f", r)
        if self.returns is not None:
            _check_vector(owner, "returns", self.returns, "f", r)
        if self.teacher_logprobs is not None:
            # 2-D allows top-k teacher distributions: (response_length, k).
            _check_vector(owner, "teacher_logprobs", self.teacher_logprobs, "f", r, max_ndim=2)
        if (self.chosen is None) != (self.rejected is None):
            missing = "rejected" if self.rejected is None else "chosen"
            raise ValueError(f"{owner}.{missing}: DPO needs both chosen and rejected")
        if self.chosen is not None:
            _check_vector(owner, "chosen", self.chosen, "iu", None)
            _check_vector(owner, "rejected", self.rejected, "iu", None)
            for name in ("chosen", "rejected"):
                a = getattr(self, name)
                if len(a) and a.min() < 0:
                    raise ValueError(f"{owner}.{name}: negative token id {int(a.min())}")
        for name in ("logprobs", "token_level_reward", "advantages", "returns"):
            a = getattr(self, name)
            if a is not None:
                _check_finite(owner, name, a)
        _check_version(owner, self.model_version)


@dataclass(slots=True, eq=False)
class ExperienceGroup:
    """All rollouts of one task (the GRPO group): they travel together so group advantages can
    be computed the moment the group arrives."""

    group_id: str
    task_id: str
    run_id: str
    model_version: int = 0
    experiences: list[Experience] = field(default_factory=list)
    is_eval: bool = False
    taskset: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    #: the task's row in its taskset (``Task.index``): where selector feedback goes
    task_index: int | None = None

    @property
    def reward_mean(self) -> float | None:
        """Mean reward of the experiences that have one; None when none has."""
        rewards = [e.reward for e in self.experiences if e.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def token_count(self) -> int:
        """Total tokens (prompt + response) over the group: what a batch budget counts."""
        return sum(len(e.tokens) for e in self.experiences)

    def msg_id(self) -> str:
        """Deterministic id for ``Nats-Msg-Id``: the same group re-published (a retry after a
        crash) gets the same id, so JetStream drops the duplicate. Built from identity only
        (run, group, version), never from the wall clock or the content bytes; so two
        different groups must never share a group id (a task's is :func:`group_id`),
        or the second is dropped as a duplicate. Ids too long or odd for a header get a hash
        of the whole id appended (bus.publish.id_header), never cut short."""
        return f"{self.run_id}/{self.group_id}/v{self.model_version}"

    def validate(self) -> None:
        """Validate every experience and that they all belong to this group (ids agree and
        are unique). Raises ValueError naming ``experiences[i].field``."""
        _check_id("ExperienceGroup", "group_id", self.group_id, required=True)
        seen: set[str] = set()
        for i, e in enumerate(self.experiences):
            owner = f"ExperienceGroup.experiences[{i}]"
            e.validate(owner)
            _check_id(owner, "id", e.id, required=True)
            for name in ("group_id", "task_id", "run_id"):
                mine, theirs = getattr(self, name), getattr(e, name)
                if theirs != mine:
                    raise ValueError(f"{owner}.{name}: {theirs!r} != the group's {mine!r}")
            if e.id in seen:
                raise ValueError(f"{owner}.id: duplicate experience id {e.id!r}")
            seen.add(e.id)
        _check_version("ExperienceGroup", self.model_version)


@dataclass(slots=True, eq=False)
class SyncEvent:
    """One step of a weight synchronization, published by trainer, explorer or synchronizer.

    ``kind`` is e.g. "request", "ready", "weights_sent", "loaded", "timeout", "failed";
    ``method`` is "nccl" (a torch.distributed broadcast; gloo on CPU) or "checkpoint".
    ``rendezvous`` ("host:port") is where the broadcast process group meets; ``missing`` lists
    the roles that did not answer (for "timeout").
    """

    kind: str
    model_version: int
    method: str = "nccl"
    step: int = 0
    source: str = ""
    checkpoint_path: str | None = None
    rendezvous: str | None = None
    missing: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)

    def validate(self) -> None:
        """Raise ValueError naming the field if the event is not meaningful."""
        if not self.kind:
            raise ValueError("SyncEvent.kind: must not be empty")
        if self.model_version < 0:
            raise ValueError(f"SyncEvent.model_version: must be >= 0, got {self.model_version}")
        if self.step < 0:
            raise ValueError(f"SyncEvent.step: must be >= 0, got {self.step}")


@dataclass(slots=True, eq=False)
class Metric:
    """A set of scalar values a role reports for one step (train loss, rollout reward, ...)."""

    role: str
    step: int
    kind: str
    values: dict[str, float]
    taskset: str | None = None
    created_at: float = field(default_factory=time.time)

    def validate(self) -> None:
        """Raise ValueError naming the field if the metric cannot be logged."""
        if not self.kind:
            raise ValueError("Metric.kind: must not be empty")


def _check_slot(owner: str, step: int, index: int) -> None:
    """A queued task's place: explorer step ``step`` (from 1), task ``index`` (from 0)."""
    if step < 1:
        raise ValueError(f"{owner}.step: must be >= 1, got {step}")
    if index < 0:
        raise ValueError(f"{owner}.index: must be >= 0, got {index}")


@dataclass(slots=True, eq=False)
class TaskOrder:
    """One task of an explorer step on the run's task queue (``trinity.<run>.tasks``), taken
    by whichever explorer process is free. ``min_version``: the model version the step runs
    on (an explorer holding older weights loads newer ones before it runs the task)."""

    step: int
    index: int
    task: Task
    min_version: int = 0

    def msg_id(self) -> str:
        """A step's task is queued once, however often its leader re-sends it."""
        return f"task:{self.step}:{self.index}"

    def validate(self) -> None:
        _check_slot("TaskOrder", self.step, self.index)
        _check_version("TaskOrder", self.min_version)
        self.task.validate()


@dataclass(slots=True, eq=False)
class TaskDone:
    """What became of a :class:`TaskOrder` (``trinity.<run>.done``), for the leading explorer's
    step accounting and rollout metrics: the error, or per experience the few scalars those
    metrics read (``rollouts``: plain dicts; the group itself went to ``exp``)."""

    step: int
    index: int
    task_id: str
    explorer: str
    error: str | None = None
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def msg_id(self) -> str:
        return f"done:{self.step}:{self.index}"

    def validate(self) -> None:
        _check_slot("TaskDone", self.step, self.index)


@dataclass(slots=True, eq=False)
class TaskFeedback:
    """What the buffer's pipeline made of one training group (``trinity.<run>.feedback``), for
    the leading explorer's task selectors: the group's pass rate (``pass_rate_calculator``) and
    how many of its experiences were kept (0: an operator dropped the group)."""

    group_id: str
    taskset: str
    index: int
    pass_rate: float | None = None
    experiences: int = 0
    kept: int = 0

    def msg_id(self) -> str:
        return f"feedback:{self.group_id}"

    def validate(self) -> None:
        _check_id("TaskFeedback", "group_id", self.group_id, required=True)
        if self.index < 0:
            raise ValueError(f"TaskFeedback.index: must be >= 0, got {self.index}")
        if self.pass_rate is not None and not math.isfinite(self.pass_rate):
            raise ValueError(f"TaskFeedback.pass_rate: must be finite, got {self.pass_rate}")


@dataclass(slots=True, eq=False)
class BatchRequest:
    """The trainer asks the buffer for train step ``step``'s batch of ``n`` experiences
    (``trinity.<run>.rpc.batch``). ``trainer_version``: the weights the trainer holds (staleness
    limits); ``timeout``: how long the buffer may wait for enough experience (None: its own
    default)."""

    step: int
    n: int
    trainer_version: int = 0
    timeout: float | None = None

    def validate(self) -> None:
        if self.step < 1 or self.n < 1:
            raise ValueError(f"BatchRequest: step {self.step} and n {self.n} must be >= 1")
        if self.timeout is not None and not (math.isfinite(self.timeout) and self.timeout >= 0):
            raise ValueError(f"BatchRequest.timeout: must be a finite number >= 0, got {self.timeout}")


@dataclass(slots=True, eq=False)
class BatchReply:
    """The buffer's answer to a :class:`BatchRequest`: the step's experiences, each as its stored
    codec bytes (the buffer does not re-encode them), with how often each has been served."""

    step: int
    items: list[bytes]
    use_counts: list[int]
    requested: int
    #: No more experience will come (the explorer finished and everything is served, or a
    #: dataset's epochs are done): the trainer trains on what it got and finishes.
    exhausted: bool = False

    @property
    def partial(self) -> bool:
        return len(self.items) < self.requested

    def validate(self) -> None:
        if len(self.items) != len(self.use_counts):
            raise ValueError(f"BatchReply.use_counts: {len(self.use_counts)} counts for {len(self.items)} items")


@dataclass(slots=True, eq=False)
class Commit:
    """The trainer tells the buffer that every step up to ``upto`` is checkpointed
    (``trinity.<run>.rpc.commit``): those batches can never be asked for again."""

    upto: int

    def validate(self) -> None:
        if self.upto < 0:
            raise ValueError(f"Commit.upto: must be >= 0, got {self.upto}")


@dataclass(slots=True, eq=False)
class WeightsHeader:
    """What a weight broadcast sends first (roles/weightsync/weights.py): the model version,
    then each tensor's name, dtype (torch's name: ``"bfloat16"``) and shape, in the order the
    tensors follow, packed into buckets of at most ``bucket_bytes`` (0: one per tensor). Both
    sides plan the buckets from this header alone."""

    version: int
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    bucket_bytes: int = 0

    def validate(self) -> None:
        _check_version("WeightsHeader", self.version)
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(f"WeightsHeader: {len(self.names)} names, {len(self.dtypes)} dtypes and "
                             f"{len(self.shapes)} shapes: one of each per tensor")
        for name, shape in zip(self.names, self.shapes, strict=True):
            if any(d < 0 for d in shape):
                raise ValueError(f"WeightsHeader.shapes: {name} has a negative dim {shape}")
        if self.bucket_bytes < 0:
            raise ValueError(f"WeightsHeader.bucket_bytes: must be >= 0, got {self.bucket_bytes}")


#: Wire name of each schema. Experience is also encodable on its own (e.g. in the replay store).
SCHEMAS: dict[str, type] = {
    "task": Task,
    "experience": Experience,
    "experience_group": ExperienceGroup,
    "sync_event": SyncEvent,
    "metric": Metric,
    "task_order": TaskOrder,
    "task_done": TaskDone,
    "task_feedback": TaskFeedback,
    "batch_request": BatchRequest,
    "batch_reply": BatchReply,
    "commit": Commit,
    "weights_header": WeightsHeader,
}
