"""Weights through shared memory (``storage/shared_weights.py``, ``sync_method: memory``):
what one process writes another reads whole, or refuses: another version, a torn read, a
writer that is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from storage.shared_weights import SharedSlot, SharedWeights, TornRead, read_whole

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [("model.embed_tokens.weight", torch.randn(37, 16, generator=g)),
            ("model.norm.weight", torch.randn(16, generator=g).to(torch.bfloat16)),
            ("odd.bias", torch.randn(3, generator=g).to(torch.float16)),
            ("steps", torch.arange(5, dtype=torch.int64)),
            ("t.weight", torch.randn(16, 8, generator=g).t())]  # not contiguous


def test_what_is_written_is_read_back_exactly_and_aligned():
    slot = SharedSlot("test")
    try:
        named = _named()
        nbytes = slot.write(named, version=3, seq=1)
        assert nbytes == sum(t.numel() * t.element_size() for _, t in named)
        with SharedWeights(slot.path, 3, 1) as w:
            got = dict(w.tensors)
            assert list(got) == [n for n, _ in named]
            for name, t in named:
                assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
                assert got[name].data_ptr() % 64 == 0  # engines copy aligned rows
            assert w.intact()
    finally:
        slot.close()


def test_another_process_reads_it_at_the_slots_path():
    """The explorer's engines are other processes: they open ``/proc/<pid>/fd/<fd>``."""
    slot = SharedSlot("test")
    try:
        slot.write([("w", torch.full((4, 4), 2.5))], version=7, seq=2)
        code = ("import sys, torch\n"
                "from storage.shared_weights import SharedWeights\n"
                f"with SharedWeights({slot.path!r}, 7, 2) as w:\n"
                "    (name, t), = w.tensors\n"
                "    print(name, float(t.sum()), w.intact())\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["w", "40.0", "True"]
    finally:
        slot.close()


def test_another_version_or_offer_is_refused_before_any_copy():
    slot = SharedSlot("test")
    try:
        slot.write(_named(), version=3, seq=1)
        with pytest.raises(TornRead, match="holds version 3 of offer 1.*not version 4 of offer 1"):
            SharedWeights(slot.path, 4, 1)
        with pytest.raises(TornRead, match="not version 3 of offer 2"):
            SharedWeights(slot.path, 3, 2)
    finally:
        slot.close()


def test_a_write_during_the_read_is_seen_as_torn():
    """The trainer came back to this slot (two offers later) while an engine copied it."""
    slot = SharedSlot("test")
    try:
        named = _named()
        slot.write(named, version=3, seq=1)
        with SharedWeights(slot.path, 3, 1) as w:
            slot.write([(n, t + 1 if t.is_floating_point() else t) for n, t in named], version=5, seq=3)
            assert not w.intact()
        # what the engines load through: the same check at the end of their copy
        with pytest.raises(TornRead, match="was rewritten while version 5 was read"):
            with read_whole(slot.path, 5, 3):
                slot.write(named, version=7, seq=5)
    finally:
        slot.close()


def test_a_slot_of_a_gone_process_cannot_be_opened():
    slot = SharedSlot("test")
    path = slot.path
    slot.write(_named(), version=1, seq=1)
    slot.close()
    with pytest.raises(TornRead, match="its process is gone, or runs on another machine"):
        SharedWeights(path, 1, 1)
    with pytest.raises(ValueError, match="seq must be > 0"):
        SharedSlot("test").write(_named(), version=1, seq=0)


def test_a_slot_grows_for_larger_weights_and_keeps_its_pages_otherwise():
    slot = SharedSlot("test")
    try:
        slot.write([("a", torch.ones(10))], version=1, seq=1)
        small = slot.size
        slot.write([("a", torch.ones(1000)), ("b", torch.zeros(3))], version=2, seq=2)
        assert slot.size > small
        grown = slot.size
        slot.write([("a", torch.ones(10))], version=3, seq=3)
        assert slot.size == grown
        with SharedWeights(slot.path, 3, 3) as w:
            assert [(n, float(t.sum())) for n, t in w.tensors] == [("a", 10.0)]
    finally:
        slot.close()


def test_copy_tensors_over_threads_copies_every_byte(monkeypatch):
    """The pieces a copy is cut into (to run on every core) cover each tensor exactly, a
    non-contiguous destination and a dtype change included."""
    import storage.shared_weights as sw

    monkeypatch.setattr(sw, "PARALLEL_MIN_BYTES", 0)  # small tensors, the threaded path
    monkeypatch.setattr(sw, "_CHUNK_ELEMENTS", 7)  # pieces that do not divide the tensors
    g = torch.Generator().manual_seed(1)
    src = [torch.randn(50, generator=g), torch.randn(6, 5, generator=g), torch.randn(4, 3, generator=g),
           torch.randn(9, generator=g)]
    dst = [torch.zeros(50), torch.zeros(5, 6).t(), torch.zeros(4, 3, dtype=torch.float64),
           torch.zeros(9, dtype=torch.bfloat16)]
    sw.copy_tensors(zip(dst, src, strict=True), threads=3)
    for d, s in zip(dst, src, strict=True):
        assert torch.equal(d, s.to(d.dtype))
