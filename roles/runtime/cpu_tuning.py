"""Process tuning for small shared CPU machines (``cluster.cpu_tuning``): torch threads shared
among the role processes, a frozen import heap, glibc keeping freed memory.

Why a setting: each was measured to help on the 2-core CPU VMs trinity's CPU path runs on (the
figures are in each function's docstring), and none was measured on a GPU node, where the
trainer's and engines' work is on the GPU and memory is plentiful. ``auto`` (the default)
applies them where there is no GPU (``cluster.gpu_per_node: 0``); true/false decide
everywhere. ``OMP_NUM_THREADS`` set by hand still wins over the thread share.
"""

from __future__ import annotations

import os
import sys

#: /proc/cpuinfo flags of native bfloat16 arithmetic: AVX512-BF16 (Intel Cooper Lake, AMD Zen 4
#: and later) and AMX (Intel Sapphire Rapids and later).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: ``0`` or ``1``: what :func:`cpu_bf16` answers, whatever the flags say (a container that hides
#: them; a check of the bfloat16 path on a CPU that only emulates it).
BF16_ENV = "TRINITY_CPU_BF16"


def cpu_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (:data:`BF16_FLAGS`, Linux) and torch's
    kernels use it (an AVX-512 level: ``ATEN_CPU_CAPABILITY=avx2`` runs an older machine's),
    where a bfloat16 matmul runs ~2x float32's (405 against 175 GFLOP/s measured on a Xeon with
    AVX512-BF16). Elsewhere torch emulates it, slower than float32, so CPU engines and the
    trainer compute in float32 there. :data:`BF16_ENV` overrides."""
    forced = os.environ.get(BF16_ENV, "")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    if not any(flag in flags for flag in BF16_FLAGS):
        return False
    import torch

    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def cpu_dtype(configured: str) -> str:
    """The dtype a model configured with ``dtype: <configured>`` computes in on this CPU:
    bfloat16 where the CPU has it natively (:func:`cpu_bf16`), else float32 (float16 and
    ``auto`` too: no CPU runs float16 fast, and a checkpoint's own dtype is usually bfloat16)."""
    return "bfloat16" if configured == "bfloat16" and cpu_bf16() else "float32"


def tuning_on(setting: bool | str, gpu_per_node: int) -> bool:
    """Whether ``cluster.cpu_tuning`` = ``setting`` applies on a node with ``gpu_per_node`` GPUs."""
    return setting is True or (setting == "auto" and gpu_per_node == 0)


def tune_process(setting: bool | str, gpu_per_node: int) -> bool:
    """At a role process's start: the thread share of a process whose roles run together, the
    frozen heap and glibc's thresholds, if the setting applies here; returns whether it did."""
    if not tuning_on(setting, gpu_per_node):
        return False
    share_cpu()
    freeze_heap()
    keep_freed_memory()
    return True


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's cpuset);
    ``os.cpu_count()`` where the platform has no affinity call (macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def share_cpu(mode: str = "both") -> None:
    """Give this role process its share of the CPU's cores as torch threads, unless
    ``OMP_NUM_THREADS`` says otherwise: ``cores // 4`` (at least 1) while the roles run
    together, every core for the trainer of a ``train`` stage, where it is the only one at work.

    Why: up to four role processes share a CPU machine, and torch's default of one thread per
    core in every process oversubscribes it; OpenMP threads then spin waiting for each other.
    Measured on 2 cores with the roles running: a tiny trainer step took 9.0 s with 2 threads
    and 0.7 s with 1. In a ``train`` stage (SFT, DPO) the explorer idles and the buffer works
    only while the trainer waits for its batch: the calculator example's SFT step took 0.90 s
    with 1 thread and 0.57 s with 2. Called at start and again at every stage's start (the
    processes live through all stages). GPU work is not affected (the threads only run CPU ops)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    torch.set_num_threads((os.cpu_count() or 1) if mode == "train" else role_threads())


def role_threads() -> int:
    """A role process's torch threads while the roles run together: ``cores // 4``, at least 1."""
    return max(1, (os.cpu_count() or 1) // 4)


def freeze_heap() -> None:
    """Take every object alive now out of the cyclic garbage collector's full passes.

    Why: a role process holds ~440k objects after its imports (torch, transformers, vLLM),
    and a full collection walks all of them: 0.3-0.7 s measured here, during which the
    role's event loop stands still (heartbeats, acks, batch replies). The buffer and explorer
    allocate ~100 objects per experience group, so full collections do come round in a run.
    Frozen objects are those that live for the whole process anyway (modules, classes); what
    is created later is collected as usual."""
    import gc

    gc.freeze()


def keep_freed_memory() -> bool:
    """Let glibc keep the memory this process frees for reuse, instead of returning it to the
    OS at once. Returns whether it applied (glibc only; elsewhere nothing changes).

    Why: roles move ~64 KB messages through fresh buffers (the encoded message, the PUB
    command, asyncio's join of everything pending on a socket, received payloads). glibc
    serves a block over its mmap threshold (128 KiB at first) with a fresh mmap, and hands the
    top of the heap back to the OS once 128 KiB are free there; either way the next buffer
    lands on new pages, and the first touch of each page is a page fault: 11-20 us each on
    these VMs (copying 64 KiB into fresh memory took 250 us and 16 faults, into reused memory
    13 us). In the bus bench a producer took 2-20 thousand faults per 1500 messages. Now blocks
    up to 32 MiB come from the heap, and up to 256 MiB of free heap stays mapped: the price is
    an RSS that stays near its high-water mark."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>; musl's stub returns 0
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))
