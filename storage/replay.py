"""The replay store: experience groups in LMDB, handed out FIFO or by priority.

Why LMDB: one file, transactions that survive a SIGKILL (copy-on-write B-trees; a commit either
happened or did not), readers in other processes that never block the writer, and no server.

What is stored (each a named sub-database of one environment)::

    payload   exp id   -> codec bytes of the Experience (decoded only when handed out)
    index     exp id   -> fixed 61-byte record: order, seq, model_version, use_count, pending,
                          state, priority, last_used, ready_at, size
    groups    group id -> msgpack [codec bytes of the group header, [exp ids]]
    ready     sortable(-priority) + order -> exp id     (what can be handed out, best first)
    cooling   sortable(ready_at) + order  -> exp id     (used, waiting reuse_cooldown_time)
    versions  model_version             -> number of ready experiences of that version
    batches   batch key -> msgpack {ids, use counts, committed}
    stored    order -> b"g" + group id, or b"e" + exp id (a loose experience): what was stored,
              oldest first, for :meth:`ReplayStore.forget`
    meta      format version, order counter, sampling policy

Why records outlive their payloads, and for how long: a used-up experience's payload is freed
when the batch that trained on it is committed, but its index record and its group's record
stay, because they are how a redelivered or re-published group is recognised and skipped.
They are needed only while such a copy can still arrive (the groups in flight, a few steps'
worth), so :meth:`ReplayStore.forget` drops the records of used-up groups beyond the newest
``keep_groups`` stored: without it the store grew by ~250 bytes for every experience ever
stored (455 MB after a 30-minute run).

Modes follow the seeds' experience buffer:

* ``fifo`` (``replay_buffer.enable: false``, the ``queue``): every experience is handed out
  once, oldest first. ``capacity`` is not enforced by eviction here (that would drop unused
  experience); the buffer role applies back-pressure with :meth:`ReplayStore.count_ready`.
* ``priority`` (``replay_buffer.enable: true``): highest priority first, ties oldest first.
  ``linear_decay``: ``model_version - decay * use_count``; ``decay_limit_randomization``
  (alias ``linear_decay_use_count_control_randomization``): the same plus Gaussian noise of
  std ``sigma``, and an experience goes back for reuse only while ``use_count <
  use_count_limit``. After a use an experience waits ``reuse_cooldown_time`` seconds before it
  can be handed out again (None: never reused). At ``capacity`` ready experiences, a new or
  returning one replaces the lowest-priority (oldest among equals) if its priority is not
  lower, else it is dropped, as in Trinity-RFT's ``AsyncPriorityQueue``.

Staleness (``staleness_control``, ``max_staleness``): a take with ``min_model_version``
never returns an older experience, and retires the older ones it meets (state ``stale``),
because the trainer's floor only rises.

Every take updates use counts, states and (for :meth:`ReplayStore.take_batch`) the batch
record in the same write transaction that selects the experiences, so a restart continues
exactly where the last commit left off, and a trainer that crashed after taking batch k gets
exactly batch k again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import lmdb
import msgpack

from schemas.codec import decode, encode
from schemas.data import MAX_ID_BYTES, Experience, ExperienceGroup

if TYPE_CHECKING:
    from schemas.config import ExperienceBufferConfig

FORMAT = b"trinity-replay/1"
#: Committed batch records :meth:`ReplayStore.forget` keeps (the newest).
KEEP_BATCHES = 1000
Mode = Literal["fifo", "priority"]
_MAX_KEY = MAX_ID_BYTES  # what validate() allows; LMDB refuses keys over 511 bytes


class ReplayError(RuntimeError):
    """The replay store cannot do what was asked; the message says which id/key/field."""


class State(IntEnum):
    """Where an experience stands. Only ``READY`` (and ``COOLING`` once due) can be handed out."""

    READY = 0
    COOLING = 1
    CONSUMED = 2
    STALE = 3
    EVICTED = 4


# --------------------------------------------------------------------------------------------
# priority functions
# --------------------------------------------------------------------------------------------

_PRIORITY_DEFAULTS: dict[str, dict[str, float]] = {
    "linear_decay": {"decay": 2.0},
    "decay_limit_randomization": {"decay": 2.0, "use_count_limit": 3, "sigma": 0.0},
}
_PRIORITY_ALIASES = {"linear_decay_use_count_control_randomization": "decay_limit_randomization"}


def _gauss(seed: int, exp_id: str, use_count: int) -> float:
    """Standard normal noise that is a pure function of (seed, id, use count), so a restarted
    store computes the same priorities as the one that crashed."""
    h = hashlib.blake2b(f"{seed}\0{exp_id}\0{use_count}".encode(), digest_size=16).digest()
    a, b = struct.unpack("<QQ", h)
    u1 = (a + 1) / 2.0**64  # (0, 1]
    u2 = b / 2.0**64
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@dataclass(frozen=True)
class PriorityFn:
    """``priority_fn`` with its ``priority_fn_args`` resolved against Trinity-RFT's defaults."""

    name: str = "linear_decay"
    decay: float = 2.0
    use_count_limit: int = 0
    sigma: float = 0.0
    seed: int = 0

    @classmethod
    def from_args(
        cls, name: str, args: Mapping[str, Any] | None = None, seed: int = 0
    ) -> PriorityFn:
        """Build from config names; an unknown function or argument is an error naming it."""
        canon = _PRIORITY_ALIASES.get(name, name)
        if canon not in _PRIORITY_DEFAULTS:
            known = sorted([*_PRIORITY_DEFAULTS, *_PRIORITY_ALIASES])
            raise ReplayError(f"replay_buffer.priority_fn: unknown {name!r}; known: {known}")
        merged = dict(_PRIORITY_DEFAULTS[canon])
        for k, v in (args or {}).items():
            if k not in merged:
                raise ReplayError(
                    f"replay_buffer.priority_fn_args.{k}: not an argument of {canon} "
                    f"({', '.join(sorted(merged))})"
                )
            merged[k] = v
        return cls(
            name=canon,
            decay=float(merged["decay"]),
            use_count_limit=int(merged.get("use_count_limit", 0)),
            sigma=float(merged.get("sigma", 0.0)),
            seed=seed,
        )

    def priority(self, model_version: int, use_count: int, exp_id: str) -> float:
        p = float(model_version) - self.decay * use_count
        if self.sigma > 0.0:
            p += self.sigma * _gauss(self.seed, exp_id, use_count)
        return p

    def reusable(self, use_count: int) -> bool:
        """May an experience used ``use_count`` times go back into the store?"""
        return self.use_count_limit <= 0 or use_count < self.use_count_limit

    def signature(self) -> bytes:
        return msgpack.packb([self.name, self.decay, self.use_count_limit, self.sigma, self.seed])


# --------------------------------------------------------------------------------------------
# records and keys
# --------------------------------------------------------------------------------------------

_REC = struct.Struct("<QQqIIBdddI")
_U64 = struct.Struct(">Q")


def _fkey(x: float) -> bytes:
    """8 bytes whose byte order is the numeric order of ``x`` (IEEE-754 sign/bit flip)."""
    (u,) = _U64.unpack(struct.pack(">d", x))
    u = u ^ 0xFFFFFFFFFFFFFFFF if u >> 63 else u | (1 << 63)
    return _U64.pack(u)


def _unfkey(b: bytes) -> float:
    (u,) = _U64.unpack(b[:8])
    u = u ^ (1 << 63) if u >> 63 else u ^ 0xFFFFFFFFFFFFFFFF
    return struct.unpack(">d", _U64.pack(u))[0]


def _vkey(version: int) -> bytes:
    return _U64.pack(version + (1 << 63))


class _Rec:
    __slots__ = (
        "order",
        "seq",
        "model_version",
        "use_count",
        "pending",
        "state",
        "priority",
        "last_used",
        "ready_at",
        "size",
    )

    def __init__(
        self,
        order: int,
        seq: int,
        model_version: int,
        use_count: int,
        pending: int,
        state: int,
        priority: float,
        last_used: float,
        ready_at: float,
        size: int,
    ) -> None:
        self.order = order
        self.seq = seq
        self.model_version = model_version
        self.use_count = use_count
        self.pending = pending
        self.state = state
        self.priority = priority
        self.last_used = last_used
        self.ready_at = ready_at
        self.size = size

    @classmethod
    def unpack(cls, raw: bytes) -> _Rec:
        return cls(*_REC.unpack(raw))

    def pack(self) -> bytes:
        return _REC.pack(
            self.order,
            self.seq,
            self.model_version,
            self.use_count,
            self.pending,
            int(self.state),
            self.priority,
            self.last_used,
            self.ready_at,
            self.size,
        )

    def in_use(self) -> bool:
        """Still in circulation: ready, cooling, or held by an uncommitted batch."""
        return self.state in (State.READY, State.COOLING) or self.pending > 0

    def ready_key(self) -> bytes:
        return _fkey(-self.priority) + _U64.pack(self.order)

    def cooling_key(self) -> bytes:
        return _fkey(self.ready_at) + _U64.pack(self.order)


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


class Taken(NamedTuple):
    """One handed-out experience in its stored (codec) bytes, with its use count after this
    take: what the buffer role can forward over the bus without decoding and re-encoding."""

    id: str
    use_count: int
    data: bytes


@dataclass
class PutResult:
    """What :meth:`ReplayStore.put_groups` did."""

    groups: int = 0
    experiences: int = 0
    duplicates: int = 0
    evicted: int = 0
    bytes: int = 0
    #: each experience newly stored, with its encoding (what the SQL store writes as is)
    stored: list[tuple[Experience, bytes]] = field(default_factory=list)


@dataclass
class ReplayStats:
    """Counts by state and by model version, and bytes, for monitoring."""

    mode: str
    by_state: dict[str, int]
    by_model_version: dict[int, dict[str, int]]
    payload_bytes: int
    experiences: int
    groups: int
    pending_batches: int
    committed_batches: int
    map_size: int
    file_bytes: int
    policy: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------------


class ReplayStore:
    """LMDB-backed experience store (see the module doc for the semantics).

    One process writes (the buffer role); other processes may open the same path with
    ``readonly=True`` for stats and counts. Methods are synchronous and short; call them from
    a thread (``asyncio.to_thread``) in async code if a take must not block the loop.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        mode: Mode = "fifo",
        capacity: int = 10000,
        reuse_cooldown_time: float | None = None,
        priority_fn: str = "linear_decay",
        priority_fn_args: Mapping[str, Any] | None = None,
        seed: int = 0,
        readonly: bool = False,
        map_size: int = 256 << 20,
        sync: bool = True,
    ) -> None:
        if mode not in ("fifo", "priority"):
            raise ReplayError(f"mode: expected 'fifo' or 'priority', got {mode!r}")
        if capacity < 0:
            raise ReplayError(f"capacity: must be >= 0, got {capacity}")
        if reuse_cooldown_time is not None and reuse_cooldown_time < 0:
            raise ReplayError(
                f"replay_buffer.reuse_cooldown_time: must be >= 0, got {reuse_cooldown_time}"
            )
        self.path = Path(path)
        self.mode: Mode = mode
        self.capacity = capacity
        self.reuse_cooldown_time = reuse_cooldown_time
        self.priority_fn = PriorityFn.from_args(priority_fn, priority_fn_args, seed)
        self.readonly = readonly
        self._lock = threading.RLock()
        if readonly:
            if not (self.path / "data.mdb").is_file():
                raise ReplayError(f"{self.path}: no replay store here (nothing written yet)")
        else:
            self.path.mkdir(parents=True, exist_ok=True)
        self.env = lmdb.open(
            str(self.path),
            map_size=map_size,
            max_dbs=16,
            subdir=True,
            lock=True,
            readonly=readonly,
            sync=sync,
            metasync=sync,
            readahead=False,
            meminit=False,
            max_readers=256,
        )
        names = ("meta", "payload", "index", "groups", "ready", "cooling", "versions", "batches", "stored")
        try:
            self._db = {n: self.env.open_db(n.encode(), create=not readonly) for n in names}
        except lmdb.Error as e:
            self.env.close()
            raise ReplayError(f"{self.path}: not a replay store or not initialized ({e})") from e
        if not readonly:
            self._write(self._init_meta)
        else:
            fmt, policy = self._read(
                lambda txn: (
                    txn.get(b"format", db=self._db["meta"]),
                    txn.get(b"policy", db=self._db["meta"]),
                )
            )
            if fmt != FORMAT:
                raise ReplayError(f"{self.path}: format {fmt!r}, this build reads {FORMAT!r}")
            self._adopt_policy(policy or b"fifo")

    @classmethod
    def from_config(
        cls, cfg: ExperienceBufferConfig, default_path: str | Path, **kwargs: Any
    ) -> ReplayStore:
        """Open the store an ``experience_buffer`` config (``storage_type: queue``) describes.

        ``cfg.path`` is used when it names a folder; seed configs often hold a
        ``sqlite:///x.db`` URL or a json file there (Trinity-RFT's backup), which is ignored in
        favour of ``default_path`` (the role passes ``<job dir>/buffer/<name>``)."""
        if cfg.storage_type not in ("queue", "sql"):  # sql: a queue mirrored to a database
            raise ReplayError(
                f"buffer {cfg.name!r}: storage_type {cfg.storage_type!r} is not a replay store"
            )
        path: str | Path = default_path
        if cfg.path and "://" not in cfg.path and not cfg.path.endswith((".db", ".json", ".jsonl")):
            path = cfg.path
        rb = cfg.replay_buffer
        return cls(
            path,
            mode="priority" if rb.enable else "fifo",
            capacity=cfg.capacity,
            reuse_cooldown_time=rb.reuse_cooldown_time,
            priority_fn=rb.priority_fn,
            priority_fn_args=rb.priority_fn_args,
            **kwargs,
        )

    # -- plumbing ----------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self.env.close()

    def __enter__(self) -> ReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _policy(self) -> bytes:
        if self.mode == "fifo":
            return b"fifo"
        return b"priority:" + self.priority_fn.signature()

    def _adopt_policy(self, policy: bytes) -> None:
        """A reader reports the writer's policy, whatever it was opened with."""
        if policy == b"fifo":
            self.mode = "fifo"
            return
        name, decay, limit, sigma, seed = msgpack.unpackb(policy[len(b"priority:") :])
        self.mode = "priority"
        self.priority_fn = PriorityFn(name, decay, limit, sigma, seed)

    def _init_meta(self, txn: lmdb.Transaction) -> None:
        meta = self._db["meta"]
        fmt = txn.get(b"format", db=meta)
        if fmt is None:
            txn.put(b"format", FORMAT, db=meta)
            txn.put(b"next_order", _U64.pack(0), db=meta)
        elif fmt != FORMAT:
            raise ReplayError(f"{self.path}: format {fmt!r}, this build reads {FORMAT!r}")
        policy = self._policy()
        if txn.get(b"policy", db=meta) != policy:
            self._rekey(txn)
            txn.put(b"policy", policy, db=meta)

    def _rekey(self, txn: lmdb.Transaction) -> None:
        """Re-sort the ready index when the store is reopened with another mode or priority
        function (e.g. a config change between runs): every key is a function of the policy."""
        ready, index = self._db["ready"], self._db["index"]
        entries = list(txn.cursor(db=ready).iternext(keys=False, values=True))
        txn.drop(ready, delete=False)
        for exp_id in entries:
            rec = _Rec.unpack(txn.get(exp_id, db=index))
            rec.priority = self._priority(rec, exp_id.decode())
            txn.put(rec.ready_key(), exp_id, db=ready)
            txn.put(exp_id, rec.pack(), db=index)

    def _grow(self) -> None:
        info = self.env.info()
        self.env.set_mapsize(info["map_size"] * 2)

    def _write(self, fn: Any) -> Any:
        """Run ``fn(txn)`` in one write transaction; on a full map, double it and retry.

        ``fn`` must have no effect outside the transaction (it may run more than once)."""
        if self.readonly:
            raise ReplayError(f"{self.path}: opened readonly")
        with self._lock:
            while True:
                try:
                    with self.env.begin(write=True) as txn:
                        # counters touched many times per transaction are kept in memory
                        # and written once, at the end of the transaction
                        self._w_order: int | None = None
                        self._w_vdelta: dict[int, int] = {}
                        result = fn(txn)
                        self._flush_counters(txn)
                        return result
                except lmdb.MapFullError:
                    self._grow()
                except lmdb.MapResizedError:
                    self.env.set_mapsize(0)  # another process grew it: adopt its size

    def _read(self, fn: Any) -> Any:
        with self._lock:
            while True:
                try:
                    with self.env.begin(write=False) as txn:
                        return fn(txn)
                except lmdb.MapResizedError:
                    self.env.set_mapsize(0)

    def _next_order(self, txn: lmdb.Transaction) -> int:
        if self._w_order is None:
            self._w_order = _U64.unpack(txn.get(b"next_order", db=self._db["meta"]))[0]
        order = self._w_order
        self._w_order += 1
        return order

    def _flush_counters(self, txn: lmdb.Transaction) -> None:
        if self._w_order is not None:
            txn.put(b"next_order", _U64.pack(self._w_order), db=self._db["meta"])
        db = self._db["versions"]
        for version, delta in self._w_vdelta.items():
            if delta == 0:
                continue
            key = _vkey(version)
            raw = txn.get(key, db=db)
            n = (_U64.unpack(raw)[0] if raw else 0) + delta
            if n > 0:
                txn.put(key, _U64.pack(n), db=db)
            elif raw is not None:
                txn.delete(key, db=db)

    def _priority(self, rec: _Rec, exp_id: str) -> float:
        if self.mode == "fifo":
            return 0.0
        return self.priority_fn.priority(rec.model_version, rec.use_count, exp_id)

    def _bump_version(self, txn: lmdb.Transaction, version: int, delta: int) -> None:
        """Count ready experiences per model version (applied at the end of the write)."""
        self._w_vdelta[version] = self._w_vdelta.get(version, 0) + delta

    def _retire(self, txn: lmdb.Transaction, exp_id: bytes, rec: _Rec, state: State) -> None:
        """Move an experience out of circulation; drop its payload unless a batch holds it."""
        rec.state = state
        if rec.pending == 0:
            txn.delete(exp_id, db=self._db["payload"])
        txn.put(exp_id, rec.pack(), db=self._db["index"])

    def _insert_ready(self, txn: lmdb.Transaction, exp_id: bytes, rec: _Rec) -> int:
        """Put an experience into the ready index under the capacity rule; returns how many
        experiences were evicted (the incoming one included, if it lost)."""
        ready = self._db["ready"]
        rec.priority = self._priority(rec, exp_id.decode())
        evicted = 0
        if self.mode == "priority" and self.capacity > 0:
            while txn.stat(ready)["entries"] >= self.capacity:
                cur = txn.cursor(db=ready)
                cur.last()
                lowest_prefix = cur.key()[:8]
                lowest = -_unfkey(lowest_prefix)
                if lowest > rec.priority:
                    self._retire(txn, exp_id, rec, State.EVICTED)
                    return evicted + 1
                cur.set_range(lowest_prefix)  # oldest among the lowest priority
                victim_id = cur.value()
                cur.delete()
                victim = _Rec.unpack(txn.get(victim_id, db=self._db["index"]))
                self._bump_version(txn, victim.model_version, -1)
                self._retire(txn, victim_id, victim, State.EVICTED)
                evicted += 1
        rec.order = self._next_order(txn)
        rec.state = State.READY
        txn.put(rec.ready_key(), exp_id, db=ready)
        txn.put(exp_id, rec.pack(), db=self._db["index"])
        self._bump_version(txn, rec.model_version, 1)
        return evicted

    # -- writing -----------------------------------------------------------------------------

    def put_groups(self, groups: Iterable[ExperienceGroup], now: float | None = None) -> PutResult:
        """Store groups (and their experiences) in ONE transaction; ids already present are
        skipped, so a redelivered message is harmless. Encoding happens before the
        transaction, so the write lock is held only for the puts."""
        prepared = []
        for g in groups:
            gid = _key(g.group_id, "ExperienceGroup.group_id")
            header = encode(dataclasses.replace(g, experiences=[]))
            exps = []
            for i, e in enumerate(g.experiences):
                eid = _key(e.id, f"ExperienceGroup.experiences[{i}].id")
                exps.append((eid, e.model_version, encode(e), e))
            prepared.append((gid, header, exps))
        return self._write(lambda txn: self._put_prepared(txn, prepared, now))

    def put_experiences(
        self, experiences: Iterable[Experience], now: float | None = None
    ) -> PutResult:
        """Store loose experiences (no group record), one transaction; duplicates skipped."""
        prepared = [(_key(e.id, "Experience.id"), e.model_version, encode(e), e) for e in experiences]
        return self._write(lambda txn: self._put_prepared(txn, [(None, None, prepared)], now))

    def _put_prepared(self, txn: lmdb.Transaction, prepared: list, now: float | None) -> PutResult:
        res = PutResult()
        t = time.time() if now is None else now
        index, payload, groups = self._db["index"], self._db["payload"], self._db["groups"]
        stored = self._db["stored"]
        for gid, header, exps in prepared:
            if gid is not None:
                if txn.get(gid, db=groups) is not None:
                    res.duplicates += 1
                    continue
                ids = [eid.decode() for eid, _, _, _ in exps]
                txn.put(gid, msgpack.packb([header, ids]), db=groups)
                txn.put(_U64.pack(self._next_order(txn)), b"g" + gid, db=stored)
                res.groups += 1
            for eid, version, data, exp in exps:
                if txn.get(eid, db=index) is not None:
                    res.duplicates += 1 if gid is None else 0
                    continue
                if gid is None:
                    txn.put(_U64.pack(self._next_order(txn)), b"e" + eid, db=stored)
                txn.put(eid, data, db=payload)
                order = self._next_order(txn)
                rec = _Rec(order, order, version, 0, 0, State.READY, 0.0, t, t, len(data))
                res.evicted += self._insert_ready(txn, eid, rec)
                res.experiences += 1
                res.bytes += len(data)
                res.stored.append((exp, data))
        return res

    # -- forgetting --------------------------------------------------------------------------

    def forget(self, keep_groups: int, *, limit: int = 2000, keep_batches: int = KEEP_BATCHES) -> int:
        """Drop the records of used-up groups beyond the newest ``keep_groups`` stored (see
        the module doc), at most ``limit`` per call so the write lock is held briefly; returns
        how many groups (or loose experiences) were forgotten. A group with an experience still
        in circulation (ready, cooling, or in an uncommitted batch) is kept and looked at again
        ``keep_groups`` groups later. Committed batch records beyond the newest
        ``keep_batches`` go too: a trainer that rolls back past one gets a fresh batch under its
        key, as it would under the ``.k`` key that record made the buffer choose.
        ``keep_groups < 0`` forgets nothing."""
        if keep_groups < 0:
            return 0

        def fn(txn: lmdb.Transaction) -> int:
            stored, index, groups = self._db["stored"], self._db["index"], self._db["groups"]
            over = txn.stat(stored)["entries"] - keep_groups
            forgotten = looked = 0
            moved = _U64.pack(self._next_order(txn))  # entries from here on were moved by this call
            cur = txn.cursor(db=stored)
            while over > 0 and looked < limit and cur.first() and cur.key() < moved:
                looked += 1
                entry = cur.value()
                cur.delete()
                key = entry[1:]
                if entry[:1] == b"g":
                    raw = txn.get(key, db=groups)
                    ids = [i.encode() for i in msgpack.unpackb(raw)[1]] if raw is not None else []
                else:
                    ids = [key]
                recs = [txn.get(e, db=index) for e in ids]
                if any(r is not None and _Rec.unpack(r).in_use() for r in recs):
                    txn.put(_U64.pack(self._next_order(txn)), entry, db=stored)  # look again later
                    continue
                for e in ids:
                    txn.delete(e, db=index)
                    txn.delete(e, db=self._db["payload"])
                if entry[:1] == b"g":
                    txn.delete(key, db=groups)
                forgotten += 1
                over -= 1
            self._forget_batches(txn, keep_batches)
            return forgotten

        return self._write(fn)

    def _forget_batches(self, txn: lmdb.Transaction, keep: int) -> None:
        batches = self._db["batches"]
        if txn.stat(batches)["entries"] <= keep:
            return
        committed = []
        for k, v in txn.cursor(db=batches):
            rec = msgpack.unpackb(v)
            if rec["committed"]:
                committed.append((rec["created_at"], k))
        committed.sort()
        for _, k in committed[: max(0, len(committed) - keep)]:
            txn.delete(k, db=batches)

    # -- taking ------------------------------------------------------------------------------

    def _promote_due(self, txn: lmdb.Transaction, now: float) -> None:
        """Cooling experiences whose cooldown is over go back to the ready index."""
        cooling, index = self._db["cooling"], self._db["index"]
        due = []
        cur = txn.cursor(db=cooling)
        if cur.first():
            limit = _fkey(now)
            for key, exp_id in cur:
                if key[:8] > limit:
                    break
                due.append((key, exp_id))
        for key, exp_id in due:
            txn.delete(key, db=cooling)
            rec = _Rec.unpack(txn.get(exp_id, db=index))
            self._insert_ready(txn, exp_id, rec)

    def _select(
        self, txn: lmdb.Transaction, n: int, min_model_version: int | None, now: float, batch: bool
    ) -> list[Taken]:
        """Pick up to ``n`` experiences, update their records, return them as stored."""
        if self.mode == "priority" and self.reuse_cooldown_time is not None:
            self._promote_due(txn, now)
        ready, index, payload = self._db["ready"], self._db["index"], self._db["payload"]
        picked: list[tuple[bytes, bytes, _Rec]] = []
        stale: list[tuple[bytes, bytes, _Rec]] = []
        for key, exp_id in txn.cursor(db=ready):
            if len(picked) >= n:
                break
            rec = _Rec.unpack(txn.get(exp_id, db=index))
            if min_model_version is not None and rec.model_version < min_model_version:
                stale.append((key, exp_id, rec))
            else:
                picked.append((key, exp_id, rec))
        for key, exp_id, rec in stale:
            txn.delete(key, db=ready)
            self._bump_version(txn, rec.model_version, -1)
            self._retire(txn, exp_id, rec, State.STALE)
        out = []
        for key, exp_id, rec in picked:
            data = txn.get(exp_id, db=payload)
            if data is None:
                raise ReplayError(f"{self.path}: experience {exp_id.decode()!r} has no payload")
            txn.delete(key, db=ready)
            self._bump_version(txn, rec.model_version, -1)
            rec.use_count += 1
            rec.last_used = now
            if batch:
                rec.pending += 1
            reuse = (
                self.mode == "priority"
                and self.reuse_cooldown_time is not None
                and self.priority_fn.reusable(rec.use_count)
            )
            if reuse:
                rec.state = State.COOLING
                rec.ready_at = now + float(self.reuse_cooldown_time or 0.0)
                rec.order = self._next_order(txn)
                txn.put(rec.cooling_key(), exp_id, db=self._db["cooling"])
                txn.put(exp_id, rec.pack(), db=index)
            else:
                self._retire(txn, exp_id, rec, State.CONSUMED)
            out.append(Taken(exp_id.decode(), rec.use_count, data))
        return out

    @staticmethod
    def decode_taken(items: Sequence[Taken]) -> list[Experience]:
        """Decode taken experiences, recording ``info["use_count"]`` as Trinity-RFT does."""
        exps = []
        for item in items:
            e = decode(item.data, expect=Experience)
            e.info["use_count"] = item.use_count
            exps.append(e)
        return exps

    def sample(
        self, n: int, *, min_model_version: int | None = None, now: float | None = None
    ) -> list[Experience]:
        """Hand out up to ``n`` experiences (fewer when fewer are available) and record the
        use, in one transaction. Not repeatable: use :meth:`take_batch` for exact resume."""
        t = time.time() if now is None else now
        items = self._write(lambda txn: self._select(txn, n, min_model_version, t, batch=False))
        return self.decode_taken(items)

    def take_batch(
        self,
        batch_key: str,
        n: int,
        *,
        min_model_version: int | None = None,
        now: float | None = None,
    ) -> list[Experience]:
        """Hand out batch ``batch_key`` (e.g. the train step): the same experiences every time
        it is asked for until :meth:`commit_batch`, a fresh selection of up to ``n`` the first
        time. Selection, use counts and the batch record commit together, so a trainer that
        crashed after taking batch k and before training it gets exactly batch k again. An
        empty selection is not recorded (ask again when more experience arrived)."""
        taken = self.take_batch_encoded(batch_key, n, min_model_version=min_model_version, now=now)
        return self.decode_taken(taken)

    def take_batch_encoded(
        self,
        batch_key: str,
        n: int,
        *,
        min_model_version: int | None = None,
        now: float | None = None,
    ) -> list[Taken]:
        """:meth:`take_batch` without decoding: the stored codec bytes of each experience."""
        key = _key(batch_key, "batch_key")
        t = time.time() if now is None else now
        batches = self._db["batches"]

        def fn(txn: lmdb.Transaction) -> list[Taken]:
            raw = txn.get(key, db=batches)
            if raw is not None:
                rec = msgpack.unpackb(raw)
                if rec["committed"]:
                    raise ReplayError(f"batch {batch_key!r} was already committed")
                out = []
                for eid, uc in zip(rec["ids"], rec["use_counts"], strict=True):
                    data = txn.get(eid.encode(), db=self._db["payload"])
                    if data is None:
                        raise ReplayError(
                            f"batch {batch_key!r}: experience {eid!r} lost its payload"
                        )
                    out.append(Taken(eid, uc, data))
                return out
            items = self._select(txn, n, min_model_version, t, batch=True)
            if items:
                record = {
                    "ids": [i.id for i in items],
                    "use_counts": [i.use_count for i in items],
                    "committed": False,
                    "created_at": t,
                }
                txn.put(key, msgpack.packb(record), db=batches)
            return items

        return self._write(fn)

    def commit_batch(self, batch_key: str) -> None:
        """Mark batch ``batch_key`` as trained for good (call it once the training that used it
        is durable, e.g. checkpointed): it can no longer be taken again, and payloads of its
        experiences that will not be reused are freed. Committing twice is a no-op."""
        key = _key(batch_key, "batch_key")

        def fn(txn: lmdb.Transaction) -> None:
            raw = txn.get(key, db=self._db["batches"])
            if raw is None:
                raise ReplayError(f"batch {batch_key!r}: no such batch")
            rec = msgpack.unpackb(raw)
            if rec["committed"]:
                return
            for eid in rec["ids"]:
                self._unpin(txn, eid.encode())
            done = {"committed": True, "n": len(rec["ids"]), "created_at": rec["created_at"]}
            txn.put(key, msgpack.packb(done), db=self._db["batches"])

        self._write(fn)

    def _unpin(self, txn: lmdb.Transaction, exp_id: bytes) -> _Rec | None:
        raw = txn.get(exp_id, db=self._db["index"])
        if raw is None:
            return None
        rec = _Rec.unpack(raw)
        rec.pending = max(0, rec.pending - 1)
        if rec.pending == 0 and rec.state in (State.CONSUMED, State.STALE, State.EVICTED):
            txn.delete(exp_id, db=self._db["payload"])
        txn.put(exp_id, rec.pack(), db=self._db["index"])
        return rec

    def release_batch(self, batch_key: str) -> int:
        """Give an uncommitted batch back (the trainer will not train on it): its experiences
        lose that use and return to the ready index. Returns how many returned."""
        key = _key(batch_key, "batch_key")

        def fn(txn: lmdb.Transaction) -> int:
            raw = txn.get(key, db=self._db["batches"])
            if raw is None:
                raise ReplayError(f"batch {batch_key!r}: no such batch")
            rec = msgpack.unpackb(raw)
            if rec["committed"]:
                raise ReplayError(f"batch {batch_key!r} was already committed")
            back = 0
            index, payload = self._db["index"], self._db["payload"]
            for eid in rec["ids"]:
                e = eid.encode()
                raw_rec = txn.get(e, db=index)
                if raw_rec is None:
                    continue
                r = _Rec.unpack(raw_rec)
                r.pending = max(0, r.pending - 1)
                live = r.state in (State.READY, State.COOLING, State.CONSUMED)
                if not live or txn.get(e, db=payload) is None:
                    if r.pending == 0:
                        txn.delete(e, db=payload)
                    txn.put(e, r.pack(), db=index)
                    continue
                if r.state == State.COOLING:
                    txn.delete(r.cooling_key(), db=self._db["cooling"])
                elif r.state == State.READY:  # cooled down and back already: re-sort it
                    txn.delete(r.ready_key(), db=self._db["ready"])
                    self._bump_version(txn, r.model_version, -1)
                r.use_count = max(0, r.use_count - 1)
                self._insert_ready(txn, e, r)
                back += 1
            txn.delete(key, db=self._db["batches"])
            return back

        return self._write(fn)

    def batch_committed(self, batch_key: str) -> bool | None:
        """True once batch ``batch_key`` was committed, False while it is taken and pending,
        None if it was never taken."""
        key = _key(batch_key, "batch_key")

        def fn(txn: lmdb.Transaction) -> bool | None:
            raw = txn.get(key, db=self._db["batches"])
            return None if raw is None else bool(msgpack.unpackb(raw)["committed"])

        return self._read(fn)

    def pending_batches(self) -> list[str]:
        """Keys of batches taken but not committed (what a restarted trainer may ask again)."""

        def fn(txn: lmdb.Transaction) -> list[str]:
            out = []
            for k, v in txn.cursor(db=self._db["batches"]):
                if not msgpack.unpackb(v)["committed"]:
                    out.append(k.decode())
            return out

        return self._read(fn)

    # -- reading -----------------------------------------------------------------------------

    def count_available(
        self, min_model_version: int | None = None, now: float | None = None
    ) -> int:
        """How many experiences a take at ``now`` could return: ready ones of at least
        ``min_model_version`` plus cooled-down ones. Cheap (reads counters), so the buffer role
        can poll it while waiting ``max_read_timeout`` for a full batch."""
        t = time.time() if now is None else now

        def fn(txn: lmdb.Transaction) -> int:
            total = 0
            cur = txn.cursor(db=self._db["versions"])
            found = (
                cur.first()
                if min_model_version is None
                else cur.set_range(_vkey(min_model_version))
            )
            if found:
                for _, v in cur:
                    total += _U64.unpack(v)[0]
            if txn.stat(self._db["cooling"])["entries"]:  # only a writer with cooldown fills it
                limit = _fkey(t)
                for key, exp_id in txn.cursor(db=self._db["cooling"]):
                    if key[:8] > limit:
                        break
                    rec = _Rec.unpack(txn.get(exp_id, db=self._db["index"]))
                    if min_model_version is None or rec.model_version >= min_model_version:
                        total += 1
            return total

        return self._read(fn)

    def count_ready(self) -> int:
        """Experiences in the ready index (capacity back-pressure in FIFO mode)."""
        return self._read(lambda txn: txn.stat(self._db["ready"])["entries"])

    def has_group(self, group_id: str) -> bool:
        k = _key(group_id, "group_id")
        return self._read(lambda txn: txn.get(k, db=self._db["groups"]) is not None)

    def experience_ids(self) -> list[str]:
        """The ids of every experience whose payload the store holds (the SQL mirror's catch-up)."""
        return self._read(lambda txn: [k.decode() for k in txn.cursor(db=self._db["payload"]).iternext(values=False)])

    def get_experience(self, exp_id: str) -> Experience | None:
        """The stored experience (None when unknown or its payload was freed)."""
        k = _key(exp_id, "exp_id")
        data = self._read(lambda txn: txn.get(k, db=self._db["payload"]))
        return None if data is None else decode(data, expect=Experience)

    def get_group(self, group_id: str) -> ExperienceGroup | None:
        """The group with the experiences whose payloads are still stored."""
        k = _key(group_id, "group_id")

        def fn(txn: lmdb.Transaction) -> tuple[bytes, list[bytes]] | None:
            raw = txn.get(k, db=self._db["groups"])
            if raw is None:
                return None
            header, ids = msgpack.unpackb(raw)
            payloads = [txn.get(i.encode(), db=self._db["payload"]) for i in ids]
            return header, [p for p in payloads if p is not None]

        got = self._read(fn)
        if got is None:
            return None
        group = decode(got[0], expect=ExperienceGroup)
        group.experiences = [decode(p, expect=Experience) for p in got[1]]
        return group

    def experience_state(self, exp_id: str) -> tuple[State, int] | None:
        """``(state, use_count)`` of an experience, or None if unknown."""
        k = _key(exp_id, "exp_id")
        raw = self._read(lambda txn: txn.get(k, db=self._db["index"]))
        if raw is None:
            return None
        rec = _Rec.unpack(raw)
        return State(rec.state), rec.use_count

    def stats(self) -> ReplayStats:
        """Counts by state and model version, payload bytes. Scans the index (small fixed
        records, never payloads): meant for monitoring, not for every step."""

        def fn(txn: lmdb.Transaction) -> ReplayStats:
            by_state = {s.name.lower(): 0 for s in State}
            by_version: dict[int, dict[str, int]] = {}
            nbytes = 0
            n = 0
            for _, raw in txn.cursor(db=self._db["index"]):
                rec = _Rec.unpack(raw)
                name = State(rec.state).name.lower()
                by_state[name] += 1
                v = by_version.setdefault(rec.model_version, {})
                v[name] = v.get(name, 0) + 1
                n += 1
                if rec.state in (State.READY, State.COOLING) or rec.pending > 0:
                    nbytes += rec.size  # the payload is still stored
            pending = committed = 0
            for _, v in txn.cursor(db=self._db["batches"]):
                if msgpack.unpackb(v)["committed"]:
                    committed += 1
                else:
                    pending += 1
            return ReplayStats(
                mode=self.mode,
                by_state=by_state,
                by_model_version=dict(sorted(by_version.items())),
                payload_bytes=nbytes,
                experiences=n,
                groups=txn.stat(self._db["groups"])["entries"],
                pending_batches=pending,
                committed_batches=committed,
                map_size=self.env.info()["map_size"],
                file_bytes=(self.path / "data.mdb").stat().st_size,
                policy={
                    "capacity": self.capacity,
                    "reuse_cooldown_time": self.reuse_cooldown_time,
                    **dataclasses.asdict(self.priority_fn),
                },
            )

        return self._read(fn)


def _key(value: str, what: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise ReplayError(f"{what}: expected a non-empty string, got {value!r}")
    b = value.encode()
    if len(b) > _MAX_KEY:
        raise ReplayError(f"{what}: {len(b)} bytes, longer than the {_MAX_KEY}-byte key limit")
    return b
