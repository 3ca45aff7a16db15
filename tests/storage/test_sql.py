"""The SQL experience store (``storage/sql.py``): every experience the replay store keeps
reaches the database once, in Trinity-RFT's table, read back by its ``ExperienceModel``; a
database that goes away is reported and the mirror catches up when it is back; a URL that
cannot be opened is refused before start, naming the key."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from schemas.data import Experience, ExperienceGroup
from storage.replay import ReplayStore
from storage.sql import SqlMirror, check_url, experiences

pytestmark = pytest.mark.unit


def _group(g: int, n: int = 3) -> ExperienceGroup:
    exps = [Experience(id=f"e{g}-{i}", task_id=f"t{g}", group_id=f"g{g}", run_id="p.r",
                       tokens=np.arange(6, dtype=np.int32), prompt_length=3, reward=float(i),
                       logprobs=np.full(3, -0.5, np.float32), model_version=g, prompt_text=f"q{g}",
                       response_text=f"a{g}-{i}", episode=i) for i in range(n)]
    return ExperienceGroup(group_id=f"g{g}", task_id=f"t{g}", run_id="p.r", experiences=exps)


def _rows(url: str) -> list[str]:
    engine = create_engine(url)
    with engine.connect() as c:
        ids = list(c.execute(select(experiences.c.msg_id).order_by(experiences.c.id)).scalars())
    engine.dispose()
    return ids


def _until(cond, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.05)


def test_every_stored_experience_reaches_the_database_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'exp.db'}"
    store = ReplayStore(tmp_path / "replay")
    store.put_groups([_group(0)])  # before the mirror started: caught up from the store
    mirror = SqlMirror(url, store, batch=2)
    for g in (1, 2):
        res = store.put_groups([_group(g)])
        assert [e.id for e, _ in res.stored] == [f"e{g}-{i}" for i in range(3)]  # with the store's encoding
        mirror.put(res.stored)
    assert store.put_groups([_group(2)]).stored == []  # a redelivered group: nothing new to write
    mirror.put([(e, None) for e in _group(2).experiences])  # a redelivered group: still once
    mirror.close()
    assert sorted(_rows(url)) == sorted(f"e{g}-{i}" for g in range(3) for i in range(3))
    # a restart with rows lost (a database restored from an old copy): caught up again
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(experiences.delete().where(experiences.c.task_id == "t1"))
    engine.dispose()
    again = SqlMirror(url, store)
    again.close()
    assert len(_rows(url)) == 9 == len(set(_rows(url)))

    from trinity.common.schema.sql_schema import ExperienceModel

    with Session(create_engine(url)) as sess:
        rows = sess.query(ExperienceModel).filter_by(task_id="t2").all()
        assert sess.scalar(select(func.count()).select_from(ExperienceModel)) == 9
    exp = ExperienceModel.to_experience(rows[0])
    assert exp.prompt_text == "q2" and exp.response_text.startswith("a2-") and exp.info["model_version"] == 2
    assert exp.tokens.tolist() == list(range(6)) and exp.prompt_length == 3 and exp.eid.task == "t2"
    store.close()


def test_a_database_that_goes_away_is_reported_and_caught_up_when_back(tmp_path):

    folder = tmp_path / "db"
    folder.mkdir()
    url = f"sqlite:///{folder / 'exp.db'}"
    store = ReplayStore(tmp_path / "replay")
    mirror = SqlMirror(url, store)
    store.put_groups([_group(0)])
    mirror.put([(e, None) for e in _group(0).experiences])
    _until(lambda: mirror.written == 3)
    (folder / "exp.db").unlink()
    folder.rmdir()  # gone: sqlite cannot even create the file again
    store.put_groups([_group(1)])
    mirror.put([(e, None) for e in _group(1).experiences])
    # reported: a warning (sql_mirror_failing) and the buffer's metric events (sql_store/*)
    _until(lambda: mirror.metrics()["sql_store/failing"] == 1.0)
    folder.mkdir()  # back, empty: the table is made again and filled from the replay store
    _until(lambda: mirror.failure is None and mirror.written >= 9, timeout=60)
    assert mirror.metrics() == {"sql_store/written": 9.0, "sql_store/pending": 0.0, "sql_store/failing": 0.0}
    mirror.close()
    assert sorted(_rows(url)) == sorted(f"e{g}-{i}" for g in range(2) for i in range(3))
    store.close()


def test_a_url_that_cannot_be_opened_is_named(tmp_path):
    assert check_url(f"sqlite:///{tmp_path}/exp.db") is None
    assert "does not exist" in check_url(f"sqlite:///{tmp_path}/no/such/folder/exp.db")
    assert "cannot connect" in check_url("postgresql://nobody@127.0.0.1:1/x")  # no driver, or refused
    assert "not a SQLAlchemy database URL" in check_url("not a url://")
