"""The cores an idle explorer leaves, taken by the trainer (``cluster.cpu_tuning``, CPU only).

Why: each role process runs ``cores // 4`` torch threads while the roles work together
(:func:`roles.runtime.cpu_tuning.share_cpu`), so that they do not oversubscribe the machine.
But on a real model the explorer idles for much of a step: SmolLM2 on 2 cores generates a
step's rollouts in a third to a half of the trainer's step, then waits for the next weights,
while the trainer computes on one core. So the explorer says when it works (one byte in a
file in shared memory, per explorer process), and the trainer, before each decoder layer's
forward and after each layer's gradients, takes the explorers' threads too while every one of
them idles, and gives them back as soon as one works again. An explorer that never says (a
vLLM engine elsewhere, another machine, ``mode: serve``) leaves the trainer at its share. A
sweep's trainer host follows every run's explorer: they all generate in the explorer host.
Only a trainer alone on the machine takes more: runs started apart side by side each have
their own, whose idle explorers' cores are not free (the other runs use them).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from roles.runtime.cpu_tuning import tuning_on
from schemas.config import TrinityConfig
from schemas.modes import MODES

#: A flag file's byte while its explorer works, and while it idles.
BUSY, IDLE = b"1", b"0"
#: The smallest model whose trainer follows the explorer: SmolLM2-135M's step took 14.5 s
#: instead of 18.9 s (2 cores, 2026-11-30), while the quickstart's 0.3M model, whose
#: layers are too small for a second thread to pay, was no faster (within its noise, 4 runs).
MIN_PARAMETERS = 10_000_000


def flag_dir() -> Path:
    """Shared memory where Linux has it (a read is a page-cache hit, no disk), else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def flag_prefix(run_id: str) -> str:
    """Flag files of one run start with this (a hash: run ids may hold any character)."""
    return f"trinity-{hashlib.sha1(run_id.encode()).hexdigest()[:16]}.explorer-"


class ExplorerWork:
    """The explorer's side: :meth:`busy` around the work that needs its cores (a step's
    rollouts, an evaluation). Nested and overlapping uses count."""

    def __init__(self, run_id: str) -> None:
        self.path = flag_dir() / f"{flag_prefix(run_id)}{os.getpid()}"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._depth = 0
        os.pwrite(self._fd, IDLE, 0)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self._depth += 1
        if self._depth == 1:
            os.pwrite(self._fd, BUSY, 0)
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                os.pwrite(self._fd, IDLE, 0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self.path.unlink(missing_ok=True)


def live_files(prefix: str) -> list[Path]:
    """Files ``<prefix><pid>`` in :func:`flag_dir` whose process lives (a process killed before
    it could remove its file left it behind: skipped)."""
    return [p for p in flag_dir().glob(prefix + "*")
            if (pid := p.name[len(prefix):]).isdigit() and Path(f"/proc/{pid}").exists()]


def explorer_flags(run_id: str) -> list[Path]:
    """This run's flag files of live explorer processes."""
    return live_files(flag_prefix(run_id))


def all_idle(flags: list[Path]) -> bool:
    """True when there is a flag and every one reads idle (one that cannot be read: busy)."""
    try:
        return bool(flags) and all(p.read_bytes()[:1] == IDLE for p in flags)
    except OSError:
        return False


class TrainerThreads:
    """The trainer's side: :meth:`attach` hooks a model so that its torch threads follow the
    explorers of ``run_ids`` (one run's; a sweep's trainer host: every run's, whose explorers
    share one engine process), ``share`` while one works, ``share + extra`` while all idle."""

    #: Seconds between looks for explorers that started or left (each check reads the flags
    #: it knows; listing the folder costs more and explorers come and go rarely).
    RESCAN_S = 1.0

    def __init__(self, run_ids: Sequence[str], share: int, extra: int) -> None:
        self.run_ids, self.share, self.extra = tuple(run_ids), share, extra
        self.switches = 0
        self._flags: list[Path] = []
        self._alone = False
        self._scanned = -self.RESCAN_S
        say_trainer_here()

    def follow(self, *_: Any) -> None:
        """Set this process's torch threads for what the explorers do now."""
        import torch

        now = time.monotonic()
        if now - self._scanned >= self.RESCAN_S:
            self._flags = [p for r in self.run_ids for p in explorer_flags(r)]
            self._alone, self._scanned = not other_trainers(), now
        want = self.share + self.extra if self._alone and all_idle(self._flags) else self.share
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)
            self.switches += 1

    def attach(self, model: Any) -> int:
        """Check before every decoder layer's forward and after each layer's first parameter
        gets its gradient (the backward's pace); returns how many layers it hooked. Modules
        are found by name (``*DecoderLayer``, transformers' convention); a model without them
        is checked once per forward."""
        layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")] or [model]
        for layer in layers:
            layer.register_forward_pre_hook(self.follow)
            first = next((p for p in layer.parameters() if p.requires_grad), None)
            if first is not None:
                first.register_post_accumulate_grad_hook(self.follow)
        return len(layers)


#: A following trainer process's presence file: while another one lives on the machine (runs
#: started apart), none takes extra threads. Four SmolLM2 runs at once, each trainer taking its
#: idle explorer's core, put up to 8 threads on 2 cores: a first step took ~290 s, not ~40.
TRAINER_PREFIX = "trinity-trainer-"


def say_trainer_here() -> None:
    """Leave this process's presence file (once; removed at exit, skipped by others once dead)."""
    path = flag_dir() / f"{TRAINER_PREFIX}{os.getpid()}"
    if not path.exists():
        path.touch()
        atexit.register(path.unlink, missing_ok=True)


def other_trainers() -> list[Path]:
    """Presence files of the live following trainer processes other than this one."""
    me = f"{TRAINER_PREFIX}{os.getpid()}"
    return [p for p in live_files(TRAINER_PREFIX) if p.name != me]


def follows_explorer(cfg: TrinityConfig) -> bool:
    """Whether this run's trainer takes an idle explorer's cores: CPU tuning applies here
    (``cluster.cpu_tuning``), nobody fixed the threads (``OMP_NUM_THREADS``), and the mode
    runs an explorer beside the trainer on one machine, whose work is its tasks (not
    ``serve``'s, where the API's callers decide when it generates)."""
    mode = MODES[cfg.mode]
    return (tuning_on(cfg.cluster.cpu_tuning, cfg.cluster.gpu_per_node) and not os.environ.get("OMP_NUM_THREADS")
            and {"explorer", "trainer"} <= set(mode.roles) and not mode.serves_api and cfg.cluster.node_num == 1)
