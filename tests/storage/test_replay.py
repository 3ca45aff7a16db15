"""Replay store: idempotent writes, FIFO, priority by formula, cooldown, use-count limits,
capacity eviction, staleness, exact batch resume, crash safety, readers in other processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ops.sampling import staleness_floor
from schemas.data import Experience, ExperienceGroup
from storage.replay import PriorityFn, ReplayError, ReplayStore, State, _gauss

ROOT = Path(__file__).resolve().parents[2]


def group(gid: str, version: int, n: int = 2, tokens: int = 16) -> ExperienceGroup:
    exps = [
        Experience(
            id=f"{gid}-{i}",
            task_id=f"t-{gid}",
            group_id=gid,
            run_id="run",
            tokens=np.arange(tokens, dtype=np.int32),
            prompt_length=tokens // 2,
            logprobs=np.full(tokens - tokens // 2, -0.5, dtype=np.float32),
            reward=float(i),
            model_version=version,
        )
        for i in range(n)
    ]
    return ExperienceGroup(
        group_id=gid, task_id=f"t-{gid}", run_id="run", model_version=version, experiences=exps
    )


def ids(exps: list[Experience]) -> list[str]:
    return [e.id for e in exps]


def test_idempotent_writes_and_group_roundtrip(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r") as store:
        res = store.put_groups([group("a", 0), group("b", 1)])
        assert (res.groups, res.experiences, res.duplicates) == (2, 4, 0)
        again = store.put_groups([group("a", 0), group("c", 1)])  # redelivery of "a"
        assert (again.groups, again.experiences, again.duplicates) == (1, 2, 1)
        g = store.get_group("a")
        assert g is not None and ids(g.experiences) == ["a-0", "a-1"]
        assert (
            np.array_equal(g.experiences[1].tokens, np.arange(16))
            and g.experiences[1].reward == 1.0
        )
        assert store.has_group("c") and not store.has_group("zz")
        st = store.stats()
        assert st.experiences == 6 and st.groups == 3 and st.by_state["ready"] == 6
        assert st.by_model_version == {0: {"ready": 2}, 1: {"ready": 4}} and st.payload_bytes > 0


def test_fifo_each_once_oldest_first(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r", mode="fifo") as store:
        store.put_groups([group("a", 3), group("b", 1), group("c", 2)])
        assert store.count_available() == 6
        assert ids(store.sample(3)) == ["a-0", "a-1", "b-0"]
        assert ids(store.sample(10)) == ["b-1", "c-0", "c-1"]
        assert store.sample(1) == [] and store.count_available() == 0
        assert store.stats().by_state["consumed"] == 6
        assert store.stats().payload_bytes == 0  # consumed payloads are freed


def test_priority_linear_decay_hand_worked(tmp_path: Path) -> None:
    """decay=2, cooldown 0. A(v5) B(v3) C(v4): priorities 5, 3, 4.
    t=0 take 1 -> A (A now 5-2*1=3, re-queued after B which also has 3).
    t=1 take 2 -> C(4), then B(3, queued before A).
    t=2 take 2 -> A(3), then C(4-2=2); B(3-2=1) is left."""
    store = ReplayStore(
        tmp_path / "r",
        mode="priority",
        reuse_cooldown_time=0.0,
        priority_fn="linear_decay",
        priority_fn_args={"decay": 2.0},
        capacity=0,
    )
    store.put_experiences(
        [
            group("A", 5, 1).experiences[0],
            group("B", 3, 1).experiences[0],
            group("C", 4, 1).experiences[0],
        ]
    )
    assert ids(store.sample(1, now=0)) == ["A-0"]
    assert ids(store.sample(2, now=1)) == ["C-0", "B-0"]
    got = store.sample(2, now=2)
    assert ids(got) == ["A-0", "C-0"] and [e.info["use_count"] for e in got] == [2, 2]
    assert ids(store.sample(5, now=3)) == ["B-0", "A-0", "C-0"]  # priorities 1, 1(A: 5-4), 0
    assert store.experience_state("A-0") == (State.COOLING, 3)
    store.close()


def test_decay_limit_randomization_use_count_limit(tmp_path: Path) -> None:
    with ReplayStore(
        tmp_path / "r",
        mode="priority",
        reuse_cooldown_time=0.0,
        priority_fn="decay_limit_randomization",
        priority_fn_args={"decay": 1.0, "use_count_limit": 2},
    ) as store:
        store.put_groups([group("a", 0, 3)])
        uses: dict[str, int] = {}
        for t in range(10):
            for e in store.sample(2, now=t):
                uses[e.id] = uses.get(e.id, 0) + 1
        assert uses == {"a-0": 2, "a-1": 2, "a-2": 2}
        assert store.stats().by_state["consumed"] == 3 and store.count_available(now=100) == 0
    # noise: deterministic per (seed, id, use), standard normal
    fn = PriorityFn.from_args("linear_decay_use_count_control_randomization", {"sigma": 0.5})
    assert (fn.name, fn.use_count_limit, fn.decay) == ("decay_limit_randomization", 3, 2.0)
    assert (
        fn.priority(4, 1, "x")
        == fn.priority(4, 1, "x")
        == pytest.approx(2 + 0.5 * _gauss(0, "x", 1))
    )
    z = np.array([_gauss(0, str(i), 0) for i in range(4000)])
    assert abs(z.mean()) < 0.06 and abs(z.std() - 1) < 0.06
    with pytest.raises(ReplayError, match=r"priority_fn_args.decya"):
        PriorityFn.from_args("linear_decay", {"decya": 1})


def test_cooldown(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r", mode="priority", reuse_cooldown_time=10.0) as store:
        store.put_groups([group("a", 1, 1)])
        assert ids(store.sample(1, now=0)) == ["a-0"]
        assert store.count_available(now=5) == 0 and store.sample(1, now=5) == []
        assert store.count_available(now=10) == 1
        assert ids(store.sample(1, now=10)) == ["a-0"]
    # reuse_cooldown_time None: never reused
    with ReplayStore(tmp_path / "n", mode="priority", reuse_cooldown_time=None) as store:
        store.put_groups([group("a", 1, 1)])
        assert len(store.sample(1, now=0)) == 1 and store.sample(1, now=1e9) == []


def test_capacity_evicts_lowest_priority(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r", mode="priority", capacity=3) as store:
        store.put_experiences([group(f"v{v}", v, 1).experiences[0] for v in (1, 2, 3)])
        res = store.put_experiences([group("v4", 4, 1).experiences[0]])
        assert res.evicted == 1 and store.experience_state("v1-0")[0] == State.EVICTED
        res = store.put_experiences([group("v0", 0, 1).experiences[0]])  # lower than all: dropped
        assert res.evicted == 1 and store.experience_state("v0-0")[0] == State.EVICTED
        assert ids(store.sample(5, now=0)) == ["v4-0", "v3-0", "v2-0"]
        assert store.stats().by_state["evicted"] == 2 and store.get_experience("v1-0") is None


def test_staleness_filter(tmp_path: Path) -> None:
    assert staleness_floor(10, 3) == 7 and staleness_floor(1, 3) == 0
    assert staleness_floor(5, None) is None and staleness_floor(5, float("inf")) is None
    for mode in ("fifo", "priority"):
        with ReplayStore(tmp_path / mode, mode=mode) as store:
            store.put_groups([group(f"g{v}", v) for v in (1, 5, 2, 4, 3)])
            assert store.count_available(min_model_version=3) == 6
            got = store.sample(10, min_model_version=3, now=0)
            assert sorted({e.model_version for e in got}) == [3, 4, 5] and len(got) == 6
            st = store.stats()
            assert st.by_state["stale"] == 4 and st.by_state["consumed"] == 6
            assert store.sample(10, now=1) == []  # retired for good


def test_take_batch_is_exact_across_restart(tmp_path: Path) -> None:
    path = tmp_path / "r"
    store = ReplayStore(path, mode="priority", reuse_cooldown_time=0.0)
    store.put_groups([group(f"g{i}", i) for i in range(4)])
    b1 = ids(store.take_batch("step-1", 3, now=0))
    store.close()
    store = ReplayStore(path, mode="priority", reuse_cooldown_time=0.0)  # "crash" + restart
    assert ids(store.take_batch("step-1", 3, now=5)) == b1  # same batch, no double use
    assert store.experience_state(b1[0]) == (State.COOLING, 1)
    assert store.pending_batches() == ["step-1"]
    b2 = ids(store.take_batch("step-2", 3, now=6))
    assert b2 != b1
    store.commit_batch("step-1")
    store.commit_batch("step-1")  # no-op
    with pytest.raises(ReplayError, match="already committed"):
        store.take_batch("step-1", 3)
    assert store.pending_batches() == ["step-2"]
    # release gives the batch back: use counts undone
    before = {i: store.experience_state(i)[1] for i in b2}
    assert store.release_batch("step-2") == 3
    assert all(store.experience_state(i)[1] == before[i] - 1 for i in b2)
    assert store.pending_batches() == []
    store.close()


def test_fifo_batch_payload_kept_until_commit(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r") as store:
        store.put_groups([group("a", 0)])
        assert ids(store.take_batch("1", 2)) == ["a-0", "a-1"]
        assert store.take_batch("2", 2) == [] and store.pending_batches() == ["1"]
        assert ids(store.take_batch("1", 2)) == ["a-0", "a-1"]
        store.commit_batch("1")
        assert store.get_experience("a-0") is None and store.stats().payload_bytes == 0


def test_use_counts_persist_and_policy_change_resorts(tmp_path: Path) -> None:
    path = tmp_path / "r"
    with ReplayStore(path, mode="fifo") as store:
        store.put_groups([group("old", 1), group("new", 9)])
        store.sample(1)
    with ReplayStore(path, mode="priority", reuse_cooldown_time=None) as store:
        assert store.experience_state("old-0") == (State.CONSUMED, 1)
        assert ids(store.sample(3, now=0)) == ["new-0", "new-1", "old-1"]


def test_map_grows(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r", map_size=1 << 20) as store:
        store.put_groups([group(f"g{i}", 0, 4, tokens=1024) for i in range(120)])  # ~5 MB
        st = store.stats()
        assert st.experiences == 480 and st.map_size > 1 << 20
        assert len(store.sample(480)) == 480


WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from tests.storage.test_replay import group
    from storage.replay import ReplayStore
    store = ReplayStore({path!r}, map_size=1 << 20)
    i = 0
    while True:
        batch = [group(f"g{{i + k}}", i, 2, tokens=512) for k in range(4)]
        store.put_groups(batch)
        print(" ".join(g.group_id for g in batch), flush=True)
        i += 4
    """
)


def test_sigkill_mid_stream_keeps_every_committed_group(tmp_path: Path) -> None:
    path = str(tmp_path / "r")
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT), path=path))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    committed: list[str] = []
    try:
        while len(committed) < 200:
            line = proc.stdout.readline()
            assert line, "writer died"
            committed += line.split()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with ReplayStore(path) as store:
        st = store.stats()
        assert st.experiences == 2 * st.groups >= 2 * len(committed)
        for gid in committed:
            g = store.get_group(gid)
            assert g is not None and len(g.experiences) == 2
        assert len(store.sample(10_000)) == st.experiences


READER = textwrap.dedent(
    """
    import sys, json
    sys.path.insert(0, {root!r})
    from storage.replay import ReplayStore
    s = ReplayStore({path!r}, readonly=True, map_size=1 << 20)
    try:
        s.sample(1)
    except Exception as e:
        print(type(e).__name__, flush=True)
    for _ in sys.stdin:  # one report per request, on the same open environment
        st = s.stats()
        print(json.dumps([st.experiences, s.count_available(min_model_version=1), st.map_size, st.mode]), flush=True)
    """
)


def test_reader_in_another_process_while_the_map_grows(tmp_path: Path) -> None:
    path = str(tmp_path / "r")
    script = tmp_path / "reader.py"
    script.write_text(READER.format(root=str(ROOT), path=path))
    with ReplayStore(path, map_size=1 << 20, mode="priority", reuse_cooldown_time=0.0) as store:
        store.put_groups([group("a", 0), group("b", 1)])
        reader = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert reader.stdout.readline().strip() == "ReplayError"  # readonly: no takes
            reader.stdin.write("report\n")
            reader.stdin.flush()
            assert json.loads(reader.stdout.readline())[:2] == [4, 2]
            store.sample(1, now=0)  # b-0 (v1) used: cooling, due at once, still counted
            store.put_groups([group(f"g{i}", 1, 4, tokens=1024) for i in range(60)])  # grows
            assert store.stats().map_size > 1 << 20
            reader.stdin.write("report\n")
            reader.stdin.flush()
            n, avail, map_size, mode = json.loads(reader.stdout.readline())
            assert (n, avail, mode) == (244, 242, "priority")  # the writer's mode, not the default
            assert map_size == store.stats().map_size
        finally:
            reader.stdin.close()
            reader.wait(timeout=30)
        assert reader.returncode == 0
