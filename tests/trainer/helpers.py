"""Helpers for tests that run real role processes against the session nats-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, **sections: Any) -> Path:
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


def start_role(role: str, config: Path, log: Path, launcher: list[str] | None = None, **env: str) -> subprocess.Popen:
    """``python -m roles.cli <role> --config <config>`` with output to ``log``; ``launcher``:
    a command that takes a module instead (``[deepspeed, ..., --module]``)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    full.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}, **env)
    head = [*launcher] if launcher else [sys.executable, "-m"]
    return subprocess.Popen(
        [*head, "roles.cli", role, "--config", str(config)],
        cwd=ROOT, env=full, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
    )


def stop_roles(*procs: subprocess.Popen) -> None:
    """SIGTERM every role still running, then wait; SIGKILL one that does not stop in 30 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()




def groups(run_id: str, first: int, count: int, size: int = 4, vocab: int = 60, seed: int = 0) -> list[Any]:
    """``count`` groups of ``size`` short experiences with rewards 0/1 (never all equal)."""
    from schemas.data import Experience, ExperienceGroup

    out = []
    for g in range(first, first + count):
        rng = np.random.default_rng(seed + g)
        exps = []
        for i in range(size):
            n = int(rng.integers(8, 16))
            p = 4
            exps.append(Experience(
                id=f"g{g}/{i}", task_id=f"t{g}", group_id=f"g{g}", run_id=run_id,
                tokens=rng.integers(4, vocab, n, dtype=np.int32), prompt_length=p,
                logprobs=-rng.random(n - p, dtype=np.float32) - 3.0,
                action_mask=np.ones(n - p, dtype=bool), reward=float(i % 2),
            ))
        out.append(ExperienceGroup(group_id=f"g{g}", task_id=f"t{g}", run_id=run_id, experiences=exps))
    return out


async def publish(nats_cfg: Any, run_id: str, gs: list[Any]) -> None:
    import bus

    nc = await bus.connect(nats_cfg, name="test-explorer")
    try:
        await bus.ensure_streams(bus.jetstream(nc, nats_cfg), nats_cfg, run_id)
        pub = bus.Publisher(nc, nats_cfg, run_id)
        for g in gs:
            await pub.publish_group(g)
    finally:
        await nc.close()
