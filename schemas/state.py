"""The values of the run's KV keys (``schemas/keys.py`` says which key holds which).

One record per kind of value, written and read only through :func:`schemas.codec.encode_value`
and :func:`schemas.codec.decode_value`: a JSON object of the record's fields (so ``nats kv get
trinity_<run> <key>`` prints it readably), no envelope (the key names the record). A value of
the wrong shape (a field missing, a string where a number belongs, not JSON at all) is refused
at decode with an error naming the key and the field, and the reader treats the key as absent
(``bus/kv.py``): a hand-made ``nats kv put`` cannot end a role.

Why not the stream records' msgpack: these are few, small and read by people with the NATS CLI;
the stream records are many and carry arrays. Why dataclasses with ``validate()``, like
:mod:`schemas.data`: one way to write a record, checked by one codec. Timestamps (``ts``) are
``time.time()`` seconds of the writing host; readers compare them only with values the same
host wrote, or as "is it newer than what I saw".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schemas.config import SynchronizerConfig

EXIT_STATES = ("running", "done")
SYNC_METHODS = ("nccl", "checkpoint", "memory")


def _check(owner: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{owner}: {what}")


@dataclass(slots=True)
class ModelVersion:
    """``version.<role>``: the model version a role holds (the trainer after a step, an explorer
    after loading weights), and the explorer step it was reported at."""

    version: int
    ts: float
    step: int | None = None

    def validate(self) -> None:
        _check("ModelVersion.version", self.version >= 0, f"must be >= 0, got {self.version}")


@dataclass(slots=True)
class Heartbeat:
    """``heartbeat.<role>``: the role is alive (a beat every few seconds), with what it reports."""

    ts: float
    pid: int
    host: str
    step: int | None = None
    state: str | None = None
    model_version: int | None = None
    failed_tasks: int | None = None
    #: the buffer's: experiences stored, and ready to serve
    stored: int | None = None
    ready: int | None = None

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class Rendezvous:
    """``rendezvous.<group>``: where a weight broadcast group meets (the trainer is rank 0 and
    holds the TCP store at ``host:port``); ``ts`` tells a fresh group from an old one. Also
    what ``roles/weightsync/weights.py`` builds the group from, on both sides."""

    ts: float
    host: str
    port: int
    world_size: int
    backend: str
    group_name: str

    def validate(self) -> None:
        _check("Rendezvous.port", 0 < self.port < 65536, f"must be a TCP port, got {self.port}")
        _check("Rendezvous.world_size", self.world_size >= 2, f"must be >= 2, got {self.world_size}")
        _check("Rendezvous.backend", self.backend in ("gloo", "nccl"), f"gloo or nccl, got {self.backend!r}")

    def to_dict(self) -> dict[str, Any]:
        """What an engine's ``init_weight_group`` takes (a dict crosses into vLLM's worker
        processes as it is)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rendezvous:
        """The record back from :meth:`to_dict`'s dict, checked."""
        r = cls(**d)
        r.validate()
        return r


@dataclass(slots=True)
class Cursor:
    """``cursor.explorer``: where a restarted leading explorer resumes. ``reader`` is the
    taskset scheduler's state (every taskset's position and selector), ``done_from`` the task
    queue's first unacked sequence and ``feedback_from`` the first feedback not yet handed to
    the selectors (explore); ``batch`` the tasks of step ``step + 1`` while it runs (``[taskset,
    row, epoch, draw]`` each), so a restarted leader re-runs exactly those; ``episodes`` the
    API-serving explorer's count (serve)."""

    step: int
    reader: dict[str, Any] | None = None
    done_from: int | None = None
    episodes: int | None = None
    feedback_from: int | None = None
    batch: list[list[Any]] | None = None

    def validate(self) -> None:
        _check("Cursor.step", self.step >= 0, f"must be >= 0, got {self.step}")


@dataclass(slots=True)
class ExplorerFinished:
    """``finished.explorer``: the taskset is exhausted at ``step`` and every group was acked."""

    step: int
    ts: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class TrainerFinished:
    """``finished.trainer``: ``version`` is the last step, trained and offered."""

    version: int
    ts: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class ApiAddress:
    """``api.explorer``: where the explorer's OpenAI API listens, and the model name it serves."""

    url: str
    model: str

    def validate(self) -> None:
        _check("ApiAddress.url", self.url.startswith("http"), f"must be an http URL, got {self.url!r}")


@dataclass(slots=True)
class StageDone:
    """``run.done[.<mode>]``: the stage is complete, said by role ``by``."""

    by: str
    ts: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class RunFailure:
    """``run.failed``: the run cannot succeed and a restart cannot help; ``role`` found out
    why (``cause``, one line) at ``ts``. ``trinity run`` prints the cause as its last line and
    exits 1 (``roles/runtime/verdicts.py``)."""

    role: str
    cause: str
    ts: float

    def validate(self) -> None:
        _check("RunFailure.cause", bool(self.cause), "must say why the run failed")


@dataclass(slots=True)
class ExitMarker:
    """``exit.<process>``: a role process is ``running`` or ``done``. An explorer's marker has
    a ``lease`` (seconds after ``ts``): it counts only while renewed (roles/launch/stages.py)."""

    state: str
    ts: float
    pid: int
    lease: float | None = None

    def validate(self) -> None:
        _check("ExitMarker.state", self.state in EXIT_STATES, f"one of {EXIT_STATES}, got {self.state!r}")


@dataclass(slots=True)
class Leader:
    """``explorer.leader``: the explorer process that leads the run, until ``until`` unless it
    renews (taken and renewed by compare-and-swap, roles/explorer/lease.py)."""

    name: str
    pid: int
    host: str
    until: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class Owner:
    """``run.owner``: the ``trinity run`` (or ``trinity sweep``) that owns the run, until
    ``until`` unless it renews (roles/launch/owner.py). ``job_dir`` tells two jobs whose names give
    one run id apart."""

    pid: int
    host: str
    job_dir: str
    until: float
    command: str = ""

    def validate(self) -> None:
        _check("Owner.pid", self.pid > 0, f"a process id, got {self.pid}")


@dataclass(slots=True)
class JoinSettings:
    """``explorer.config``: the settings (dotted config path -> value) an explorer that joins
    the run must share with the leader (roles/explorer/lease.py, join_fingerprint)."""

    settings: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """``sync.plan``: the synchronizer settings both sides of a weight sync read, resolved once
    (roles/weightsync/policy.py says what they mean); stored for ``trinity inspect``."""

    method: str
    style: str
    explorer_interval: int
    trainer_interval: int
    offset: int
    timeout: float
    on_timeout: str
    group_name: str

    @classmethod
    def from_config(cls, s: SynchronizerConfig) -> SyncPlan:
        return cls(
            method=s.sync_method,
            style=s.sync_style,
            explorer_interval=s.explorer_sync_interval or s.sync_interval,
            trainer_interval=s.trainer_sync_interval or s.sync_interval,
            offset=s.sync_offset,
            timeout=float(s.sync_timeout),
            on_timeout=s.on_timeout,
            group_name=s.group_name,
        )

    def validate(self) -> None:
        _check("SyncPlan.method", self.method in SYNC_METHODS, f"one of {SYNC_METHODS}, got {self.method!r}")


@dataclass(slots=True)
class Offer:
    """``sync.offer``: weights of ``version`` are ready, as an HF folder at ``path``
    (``checkpoint``), in the trainer's shared-memory file at ``path`` (``memory``), or over the
    broadcast group (``nccl``: gloo on CPU). ``seq`` counts the
    trainer's offers; ``ts`` tells one offer from another (an explorer marks one whose load failed)."""

    version: int
    method: str
    seq: int
    ts: float
    path: str | None = None

    def validate(self) -> None:
        _check("Offer.method", self.method in SYNC_METHODS, f"one of {SYNC_METHODS}, got {self.method!r}")
        _check("Offer.path", self.method == "nccl" or bool(self.path), f"a {self.method} offer needs a path")


@dataclass(slots=True)
class Join:
    """``sync.join``: the leading explorer's engines are about to receive ``version``."""

    version: int
    ts: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class Want:
    """``sync.want`` (explorer_driven): the explorer at ``step`` asks for the current weights."""

    step: int
    ts: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class Hello:
    """``sync.hello``: a (re)started leading explorer holding ``version`` asks for a broadcast
    group formed after it started."""

    ts: float
    version: int

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class Formed:
    """``sync.formed``: the trainer's current broadcast group (``host:port``) was complete at ``at``."""

    group: str
    at: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class Pull:
    """``sync.pull.<explorer>``: an explorer that does not lead needs the trainer's current
    weights, for its ``workers`` engine ranks, over its own group (the one whose rendezvous
    ``ts`` is ``group_ts``; None: it holds none)."""

    workers: int
    ts: float
    group_ts: float | None = None

    def validate(self) -> None:
        _check("Pull.workers", self.workers >= 1, f"must be >= 1, got {self.workers}")


@dataclass(slots=True)
class Pulls:
    """``sync.pulls``: bumped with every pull, so the trainer reads one key per step to know of any."""

    ts: float

    def validate(self) -> None:
        pass


@dataclass(slots=True)
class Serving:
    """``sync.serving.<explorer>``: the trainer answers the pull of ``pull`` (its ``ts``): it
    sends ``version`` over the group whose rendezvous ``ts`` is ``group_ts``."""

    pull: float
    group_ts: float
    version: int
    ts: float

    def validate(self) -> None:
        pass


#: Every KV record type (schemas/keys.py maps keys to them; codec.encode_value refuses others).
RECORDS: tuple[type, ...] = (
    ModelVersion, Heartbeat, Rendezvous, Cursor, ExplorerFinished, TrainerFinished, ApiAddress,
    StageDone, RunFailure, ExitMarker, Leader, Owner, JoinSettings, SyncPlan, Offer, Join, Want, Hello,
    Formed, Pull, Pulls, Serving,
)
