"""Named tensors in shared memory: what ``sync_method: memory`` moves weights through.

Why: trainer and rollout engine on one machine share its memory, yet a broadcast sends every
byte through gloo's loopback TCP (0.11-0.15 of memcpy on these CPUs). Here the trainer copies
its weights once into a memory file and the engine copies them once out of it.

The file is an anonymous ``memfd`` of the writing process (:class:`SharedSlot`): nothing in
``/dev/shm`` to clean up or to outgrow (Docker gives it 64 MB by default), and it is gone
when its process is. Readers open it as ``/proc/<pid>/fd/<fd>`` (:attr:`SharedSlot.path`),
which works for processes of the same user on the same machine.

Layout: an 8-byte little-endian header length, the header (JSON, space-padded), then each
tensor's bytes at a 64-byte aligned offset. The header names each tensor's dtype, shape and
byte range, and the weights' ``version`` and the offer's ``seq``, both written at a fixed width
so that the header is rewritten in place. A write first stamps ``seq`` 0 (busy), then copies the
tensors, then stamps the real ``seq``; a reader checks after its copy that the header is still
the one it read (:meth:`SharedWeights.intact`). A torn read (the writer came back to this file
while it was read) or a dead writer is thus detected, never loaded as weights.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch

ALIGN = 64
_WIDTH = 20  # digits of version and seq in the header: rewritten in place, same length
BUSY = 0  # the seq a slot holds while it is written


class TornRead(RuntimeError):
    """The weights in a shared slot are not the ones asked for, or changed while read."""


def _layout(named: list[tuple[str, torch.Tensor]]) -> tuple[dict[str, Any], int]:
    """Each tensor's header entry and the data's total size."""
    entries, off = {}, 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        entries[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                         "offsets": [off, off + nbytes]}
        off += -(-nbytes // ALIGN) * ALIGN
    return entries, off


def _header(entries: dict[str, Any], version: int, seq: int) -> bytes:
    meta = {"version": f"{version:0{_WIDTH}d}", "seq": f"{seq:0{_WIDTH}d}"}
    raw = json.dumps({"__metadata__": meta, **entries}).encode()
    raw += b" " * (-(len(raw) + 8) % ALIGN)  # the data starts aligned
    return struct.pack("<Q", len(raw)) + raw


#: Below this many bytes a copy runs on the calling thread alone (threads cost more than they save).
PARALLEL_MIN_BYTES = 32 * 2**20
_CHUNK_ELEMENTS = 4 * 2**20


def copy_tensors(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], threads: int | None = None) -> None:
    """``dst.copy_(src)`` for each ``(dst, src)`` pair, spread over ``threads`` threads (the
    machine's cores by default) in pieces of about equal size.

    Why: a weight sync pauses the trainer while it writes and the engine while it loads, and one
    thread's copy uses a fraction of the memory bandwidth (on these CPUs 9.5 GB/s on one core,
    16 GB/s on two); torch releases the GIL while it copies, so Python threads run the pieces
    side by side. torch's own intra-op threads are left as the process set them (a vLLM worker
    pins them to cores). Copies to or from a GPU stay on the calling thread."""
    pairs = list(pairs)
    threads = threads or os.cpu_count() or 1
    total = sum(d.numel() * d.element_size() for d, _ in pairs)
    on_cpu = all(d.device.type == "cpu" and s.device.type == "cpu" for d, s in pairs)
    with torch.no_grad():
        if threads == 1 or total < PARALLEL_MIN_BYTES or not on_cpu:
            for d, s in pairs:
                d.copy_(s)
            return
        pieces = []  # (bytes, dst piece, src piece): contiguous tensors cut into flat pieces
        for d, s in pairs:
            if d.is_contiguous() and s.is_contiguous() and d.dtype == s.dtype and d.shape == s.shape:
                fd, fs = d.view(-1), s.view(-1)
                for i in range(0, fd.numel(), _CHUNK_ELEMENTS):
                    piece = fd[i:i + _CHUNK_ELEMENTS]
                    pieces.append((piece.numel() * piece.element_size(), piece, fs[i:i + _CHUNK_ELEMENTS]))
            else:
                pieces.append((d.numel() * d.element_size(), d, s))
        groups: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(threads)]
        loads = [0] * threads
        for nbytes, d, s in sorted(pieces, key=lambda p: -p[0]):  # largest first, to the lightest group
            g = loads.index(min(loads))
            groups[g].append((d, s))
            loads[g] += nbytes

        def run(group: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
            with torch.no_grad():
                for d, s in group:
                    d.copy_(s)

        with ThreadPoolExecutor(threads, thread_name_prefix="copy") as pool:
            for f in [pool.submit(run, g) for g in groups if g]:
                f.result()


class SharedSlot:
    """One memory file this process writes weights into (see the module doc)."""

    def __init__(self, name: str) -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        self.size = 0
        self._buf: torch.Tensor | None = None

    @property
    def path(self) -> str:
        """Where another process of this machine opens it."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def write(self, named: Iterable[tuple[str, torch.Tensor]], version: int, seq: int) -> int:
        """Copy ``named`` in as ``version`` of offer ``seq`` (> 0); the tensors' bytes."""
        if seq <= BUSY:
            raise ValueError(f"seq must be > {BUSY}, got {seq}")
        named = list(named)
        entries, data = _layout(named)
        busy = _header(entries, version, BUSY)
        size = len(busy) + data
        if size > self.size:  # grown once (the first write), then its pages are reused
            self._buf = None
            os.ftruncate(self.fd, size)
            self.size = size
        if self._buf is None:
            self._buf = torch.from_file(f"/proc/self/fd/{self.fd}", shared=True, size=self.size, dtype=torch.uint8)
        buf, start = self._buf, len(busy)
        os.pwrite(self.fd, busy, 0)
        copy_tensors((buf[start + entries[name]["offsets"][0]:start + entries[name]["offsets"][1]]
                      .view(t.dtype).view(t.shape), t.detach()) for name, t in named)
        os.pwrite(self.fd, _header(entries, version, seq), 0)
        return sum(e["offsets"][1] - e["offsets"][0] for e in entries.values())

    def close(self) -> None:
        self._buf = None
        os.close(self.fd)


#: A reader's mappings of the slots it read, by (device, inode, size): mapping a slot anew at
#: every load cost a page fault per 4 kB page (a third of the load's time at 400 MB); the
#: trainer writes two slots in turn, so two are kept (an old one pins a gone trainer's memory
#: only until the next two slots have been read).
_MAPPINGS: dict[tuple[int, int, int], torch.Tensor] = {}
_KEEP = 2


def _mapping(fd: int) -> torch.Tensor:
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, st.st_size)
    buf = _MAPPINGS.pop(key, None)
    if buf is None:
        buf = torch.from_file(f"/proc/self/fd/{fd}", shared=False, size=st.st_size, dtype=torch.uint8)
    _MAPPINGS[key] = buf  # the newest last
    while len(_MAPPINGS) > _KEEP:
        del _MAPPINGS[next(iter(_MAPPINGS))]
    return buf


class SharedWeights:
    """The weights of another process's :class:`SharedSlot`, opened at ``path`` to be copied
    out: :attr:`tensors` are views of its memory, valid until :meth:`close`."""

    def __init__(self, path: str, version: int, seq: int) -> None:
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise TornRead(f"cannot open {path} ({e.strerror}): its process is gone, or runs on "
                           "another machine or as another user") from e
        try:
            self.head = self._read_header()
            entries = json.loads(self.head[8:])
            meta = entries["__metadata__"]
            if (int(meta["version"]), int(meta["seq"])) != (version, seq):
                raise TornRead(f"{path} holds version {int(meta['version'])} of offer {int(meta['seq'])} "
                               f"(0: being written), not version {version} of offer {seq}")
            buf = _mapping(self.fd)
            start = len(self.head)
            self.tensors = [(name, buf[start + e["offsets"][0]:start + e["offsets"][1]]
                             .view(getattr(torch, e["dtype"])).view(e["shape"]))
                            for name, e in entries.items() if name != "__metadata__"]
        except BaseException:
            os.close(self.fd)
            raise

    def _read_header(self) -> bytes:
        n = struct.unpack("<Q", os.pread(self.fd, 8, 0))[0]
        return os.pread(self.fd, 8 + n, 0)

    def intact(self) -> bool:
        """Whether the slot still holds what was opened (call after copying the tensors out)."""
        return self._read_header() == self.head

    def close(self) -> None:
        self.tensors = []
        os.close(self.fd)

    def __enter__(self) -> SharedWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def read_whole(path: str, version: int, seq: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The tensors of ``version`` of offer ``seq`` in the slot at ``path``, to be copied out
    inside the ``with``; :class:`TornRead` at its end when the slot changed meanwhile (what was
    copied is then a mix of two writes), or at its start when it holds other weights."""
    with SharedWeights(path, version, seq) as w:
        yield w.tensors
        if not w.intact():
            raise TornRead(f"{path} was rewritten while version {version} was read")
