"""Replay store retention: records of used-up groups beyond the newest ``keep_groups`` are
forgotten, live ones never are, and a store written for hours stays the same size."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.replay import ReplayStore, State

from .test_replay import group

pytestmark = pytest.mark.unit


def use_up(store: ReplayStore, key: str, n: int) -> None:
    """Take a batch of ``n`` and commit it: those experiences are used up (fifo: consumed)."""
    assert len(store.take_batch(key, n)) == n
    store.commit_batch(key)


def test_used_up_groups_beyond_the_newest_are_forgotten_and_live_ones_kept(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r") as store:
        store.put_groups([group(f"g{i}", 0) for i in range(10)])  # 20 experiences
        use_up(store, "step-1", 12)  # g0..g5 used up, g6..g9 ready
        assert store.forget(keep_groups=2) == 6  # only the used-up ones go, oldest first
        assert not store.has_group("g0") and store.experience_state("g0-0") is None
        assert all(store.has_group(f"g{i}") for i in range(6, 10))  # ready: kept, whatever keep says
        # a forgotten group is no longer recognised: that is the horizon's trade
        assert store.put_groups([group("g0", 0)]).groups == 1
        # the ready ones are still handed out whole
        assert [e.group_id for e in store.take_batch("step-2", 8)][:2] == ["g6", "g6"]


def test_a_group_in_an_uncommitted_batch_is_kept_until_it_is_committed(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r") as store:
        store.put_groups([group(f"g{i}", 0) for i in range(4)])
        store.take_batch("step-1", 8)  # taken, not committed: a crashed trainer asks again
        assert store.forget(keep_groups=0) == 0
        assert [e.id for e in store.take_batch("step-1", 8)][0] == "g0-0"  # the same batch
        store.commit_batch("step-1")
        assert store.forget(keep_groups=0) == 4
        assert store.stats().experiences == 0


def test_keep_groups_minus_one_keeps_every_record(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r") as store:
        store.put_groups([group(f"g{i}", 0) for i in range(4)])
        use_up(store, "step-1", 8)
        assert store.forget(keep_groups=-1) == 0
        assert store.experience_state("g0-0") == (State.CONSUMED, 1)
        assert store.put_groups([group("g0", 0)]).duplicates == 1  # still recognised


def test_loose_experiences_and_committed_batches_are_forgotten_too(tmp_path: Path) -> None:
    with ReplayStore(tmp_path / "r") as store:
        for step in range(6):
            store.put_experiences(group(f"s{step}", 0).experiences)
            use_up(store, f"step-{step}", 2)
        assert store.forget(keep_groups=4, keep_batches=2) == 8  # 12 loose -> the newest 4
        st = store.stats()
        assert (st.experiences, st.committed_batches) == (4, 2)
        assert store.batch_committed("step-5") and store.batch_committed("step-0") is None


def test_a_long_run_keeps_the_store_flat(tmp_path: Path) -> None:
    """Put, take, commit and forget as the buffer does, 40 rounds: the file stops growing
    once freed pages are reused (LMDB never shrinks a file; it reuses its free pages)."""
    sizes = []
    with ReplayStore(tmp_path / "r", capacity=0) as store:
        for step in range(40):
            store.put_groups([group(f"s{step}-{i}", 0, n=8, tokens=64) for i in range(32)])
            use_up(store, f"step-{step}", 256)
            store.forget(keep_groups=64)
            sizes.append(store.stats().file_bytes)
        assert store.stats().experiences == 64 * 8
    assert sizes[-1] <= sizes[len(sizes) // 2] * 1.1, sizes
