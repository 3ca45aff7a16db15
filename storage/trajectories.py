"""The experiences of recent training steps, kept for people to look at (``trinity studio``).

Why a file per step and not the replay store: the replay store drops an experience's payload
once a committed batch has used it (it holds what is still to train on, not history). The
trainer writes, after each step, exactly the experiences it trained on, with what the
buffer added (advantages of group algorithms, rewards after shaping), to
``<job>/trajectories/step_<N>.msgpack``: a msgpack list of :func:`schemas.codec.encode`
records, written to a temporary name and renamed (a reader never sees half a file). Only
the newest ``keep`` steps stay (``monitor.trajectory_steps``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import msgpack

from schemas.codec import decode, encode
from schemas.data import Experience

FOLDER = "trajectories"
_NAME = re.compile(r"^step_(\d+)\.msgpack$")


def step_path(job: str | Path, step: int) -> Path:
    return Path(job) / FOLDER / f"step_{step:08d}.msgpack"


def keep_trajectories(job: str | Path, step: int, exps: Sequence[Experience | bytes], keep: int) -> None:
    """Write step ``step``'s experiences; drop steps older than the newest ``keep`` (-1: keep
    all, 0: write nothing). An item already encoded (bytes: the trainer has each as the
    buffer sent it) is written as it is: encoding it again cost the trainer ~10% of a
    quickstart step."""
    if keep == 0:
        return
    path = step_path(job, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(msgpack.packb([e if isinstance(e, bytes) else encode(e) for e in exps]))
    os.replace(tmp, path)
    if keep > 0:
        for old in steps(job)[:-keep]:
            step_path(job, old).unlink(missing_ok=True)


def steps(job: str | Path) -> list[int]:
    """The steps kept, oldest first."""
    folder = Path(job) / FOLDER
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _NAME.match(p.name)))


def read_step(job: str | Path, step: int) -> list[Experience]:
    """The experiences step ``step`` trained on; FileNotFoundError when it is not kept."""
    raw = step_path(job, step).read_bytes()
    return [decode(b, Experience) for b in msgpack.unpackb(raw)]
