"""The SQL experience store: every experience the buffer stores, also in a SQL database, in
Trinity-RFT's table, for people and their scripts to query (its FAQ's SQLAlchemy script).

Asked for with ``buffer.trainer_input.experience_buffer.storage_type: sql`` and a SQLAlchemy
URL as its ``path`` (``sqlite:///exp.db``, ``postgresql://...``), or a ``queue`` whose path is
such a URL (Trinity-RFT's backup). The LMDB replay store stays what the trainer reads; this
is a mirror of it, written by a thread of its own in batches *after* the buffer stored a
group, so the bus is acknowledged without waiting for the database. A database that goes away
is reported and retried; what the mirror could not hold meanwhile is read back from the
replay store when it answers again (a new database, an empty table too), and so on a restart (:meth:`SqlMirror.catch_up`): what
the replay store holds reaches the database, each experience once (its id is unique there).

The table (``experience_buffer``) has upstream's columns: ``id``, ``timestamp``, ``task_id``,
``run_id`` (the rollout's episode number), ``msg_id`` (the experience's id), ``model_version``,
``experience_bytes`` (the experience as our codec writes it, :func:`schemas.codec.encode`),
``reward``, ``consumed`` (always 0: the replay store counts uses); and ours: ``group_id``.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import (
    Column,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    select,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from schemas.codec import encode
from schemas.data import Experience

log = structlog.get_logger(__name__)

TABLE = "experience_buffer"
metadata = MetaData()
experiences = Table(
    TABLE, metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("timestamp", DateTime, server_default=func.now()),
    Column("task_id", String(255), index=True),
    Column("run_id", Integer, index=True),
    Column("msg_id", String(255), unique=True),
    Column("model_version", Integer, index=True),
    Column("experience_bytes", LargeBinary),
    Column("reward", Float),
    Column("consumed", Integer, default=0, index=True),
    Column("group_id", String(255), index=True),
)


def is_sql_url(path: str | None) -> bool:
    """Whether an experience buffer's ``path`` names a database (a SQLAlchemy URL)."""
    if not path or "://" not in path:
        return False
    try:
        make_url(path)
    except ArgumentError:
        return False
    return True


def check_url(url: str) -> str | None:
    """What keeps the mirror from opening ``url``, or None. A SQLite file's folder must exist
    (the check creates no file); any other database must answer."""
    try:
        u = make_url(url)
    except ArgumentError as e:
        return f"{url!r} is not a SQLAlchemy database URL ({e})"
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:" and not Path(u.database).expanduser().resolve().parent.is_dir():
            return f"{url}: the folder of {u.database} does not exist"
        return None
    try:
        engine = create_engine(url)
        with engine.connect():
            pass
        engine.dispose()
    except (SQLAlchemyError, ImportError, OSError) as e:  # a missing driver is an ImportError
        return f"{url}: cannot connect: {type(e).__name__}: {str(e).splitlines()[0]}"
    return None


def row(e: Experience, data: bytes | None = None) -> dict[str, Any]:
    """The table's row for ``e``; ``data``: its encoding when already made (the replay store's)."""
    return {"task_id": e.task_id, "run_id": e.episode, "msg_id": e.id, "model_version": e.model_version,
            "experience_bytes": encode(e) if data is None else data, "reward": e.reward, "consumed": 0,
            "group_id": e.group_id}


class SqlMirror:
    """Writes what :meth:`put` is given to the database at ``url`` from a thread, ``batch`` rows
    a transaction. ``source`` (the replay store) is where it catches up from: at start, and
    after the database was away longer than ``max_pending`` experiences."""

    def __init__(self, url: str, source: Any, *, batch: int = 256, max_pending: int = 20000) -> None:
        self.url = url
        self.source = source
        self.batch = batch
        self.max_pending = max_pending
        self.engine = create_engine(url)
        self.pending: collections.deque[tuple[Experience, bytes | None]] = collections.deque()
        self.behind = True  # until it has caught up with the replay store
        self.written = 0
        self.failure: str | None = None  # the database's last error, while it fails
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="sql-mirror", daemon=True)
        self._thread.start()

    def put(self, exps: list[tuple[Experience, bytes | None]]) -> None:
        """Queue experiences the replay store just stored, each with its encoding or None
        (never blocks on the database)."""
        with self._cv:
            if self.behind:
                return  # catching up reads them from the replay store
            self.pending.extend(exps)
            if len(self.pending) > self.max_pending:
                self.pending.clear()
                self.behind = True
            self._cv.notify()

    def metrics(self) -> dict[str, float]:
        """For the buffer's metrics: rows written, experiences waiting, whether it is failing."""
        return {"sql_store/written": float(self.written), "sql_store/pending": float(len(self.pending)),
                "sql_store/failing": float(self.failure is not None)}

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (up to ``timeout`` s), then stop."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)
        left = len(self.pending)
        if left or self.behind:
            log.warning("sql_mirror_unfinished", url=self.url, pending=left,
                        note="the next start catches up from the replay store")
        self.engine.dispose()

    def catch_up(self) -> int:
        """Write the replay store's experiences the database lacks; how many."""
        with self.engine.begin() as conn:
            metadata.create_all(conn)
            known = set(conn.execute(select(experiences.c.msg_id)).scalars())
        missing = [i for i in self.source.experience_ids() if i not in known]
        for k in range(0, len(missing), self.batch):
            exps = [(e, None) for e in map(self.source.get_experience, missing[k:k + self.batch]) if e is not None]
            self._write(exps)
        return len(missing)

    def _write(self, exps: list[tuple[Experience, bytes | None]]) -> None:
        ids = [e.id for e, _ in exps]
        with self.engine.begin() as conn:
            there = set(conn.execute(select(experiences.c.msg_id).where(experiences.c.msg_id.in_(ids))).scalars())
            rows = [row(e, data) for e, data in exps if e.id not in there]
            if rows:
                conn.execute(insert(experiences), rows)
        self.written += len(rows)

    def _loop(self) -> None:
        wait = 1.0
        while True:
            with self._cv:
                while not self._stop and not self.pending and not self.behind:
                    self._cv.wait()
                if self._stop and (not self.pending or self.failure):
                    return
                take = [self.pending.popleft() for _ in range(min(self.batch, len(self.pending)))]
                behind = self.behind
            try:
                if behind:
                    with self._cv:
                        self.behind = False  # what arrives from now on is queued, and also read here
                    n = self.catch_up()
                    log.info("sql_mirror_caught_up", url=self.url, written=n)
                if take:
                    self._write(take)
            except (SQLAlchemyError, OSError) as e:
                with self._cv:  # read it all back from the replay store once the database answers
                    self.pending.clear()
                    self.behind = True
                self.engine.dispose()  # new connections next time: a pooled one may hold a dead file or socket
                if self.failure is None:
                    log.warning("sql_mirror_failing", url=self.url, error=f"{type(e).__name__}: {str(e).splitlines()[0]}",
                                note="the run goes on; the replay store keeps every experience")
                self.failure = str(e)
                if self._stop:
                    return
                time.sleep(wait)
                wait = min(wait * 2, 30.0)
                continue
            if self.failure is not None:
                log.info("sql_mirror_recovered", url=self.url)
            self.failure, wait = None, 1.0
