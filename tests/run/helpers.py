"""A tiny staged config (SFT warmup on the taskset's answers, then GRPO) and process helpers
for the ``trinity run`` tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def tiny_run_config(path: Path, *, model: Path, data: Path, port: int, name: str = "r",
                    stages: bool = True, extra: dict[str, Any] | None = None) -> Path:
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer", "system_prompt": ""}
    cfg: dict[str, Any] = {
        "project": "t", "name": name, "mode": "both",
        "checkpoint_root_dir": str(path.parent / "ckpt"),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 1e-4}},
        "model": {"model_path": str(model), "max_model_len": 64, "max_response_tokens": 8},
        "buffer": {
            "batch_size": 3, "total_epochs": 1,
            "explorer_input": {
                "taskset": {"name": "arith", "path": str(data), "split": "train", "format": fmt,
                            "rollout_args": {"temperature": 1.0}},
                "eval_tasksets": [{"name": "test", "path": str(data), "split": "test", "format": fmt,
                                   "rollout_args": {"temperature": 0.0}}],
                "default_workflow_type": "math_workflow", "default_reward_fn_type": "accuracy_reward",
            },
        },
        "explorer": {"eval_on_startup": True, "runner_per_model": 4,
                     "rollout_model": {"engine_type": "transformers", "dtype": "float32", "seed": 0}},
        "synchronizer": {"sync_method": "nccl", "sync_interval": 1, "sync_timeout": 60},
        "trainer": {"trainer_type": "pytorch", "save_interval": 2},
        "monitor": {"monitor_type": "tensorboard"},
        "nats": {"url": f"nats://127.0.0.1:{port}", "embedded": True},
    }
    if stages:
        cfg["stages"] = [
            {"stage_name": "sft", "mode": "train",
             "algorithm": {"algorithm_type": "sft"},
             "buffer": {"train_batch_size": 8, "total_steps": 2, "total_epochs": 10,
                        "trainer_input": {"experience_buffer": {
                            "name": "sft", "storage_type": "file", "path": str(data), "split": "train",
                            "format": fmt}}}},
            {"stage_name": "grpo", "mode": "both"},
        ]
    for dotted, value in (extra or {}).items():
        node = cfg
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def trinity(*args: str, log: Path | None = None, env_extra: dict[str, str] | None = None,
            **popen: Any) -> subprocess.Popen:
    """``python -m roles.cli ...`` as a process, TRINITY_* variables of the caller removed
    (``env_extra`` set instead)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env_extra or {}))
    out = open(log, "wb") if log else subprocess.PIPE
    return subprocess.Popen([sys.executable, "-m", "roles.cli", *args], cwd=ROOT, env=env,
                            stdout=out, stderr=subprocess.STDOUT, **popen)


@contextlib.contextmanager
def running(*args: str, log: Path, env_extra: dict[str, str] | None = None,
            timeout: float = 900) -> Iterator[subprocess.Popen]:
    """``trinity <args>`` while the block acts on it (waits for a step, kills a role...); then
    until it exits, killed after ``timeout`` s or when the block failed."""
    p = trinity(*args, log=log, env_extra=env_extra)
    try:
        yield p
        wait_or_dump(p, log, timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def run_to_end(cfg: Path, log: Path, timeout: float = 900) -> tuple[int, str]:
    """``trinity run`` of ``cfg`` until it exits (killed after ``timeout`` s): its exit code
    and output."""
    p = trinity("run", "--config", str(cfg), log=log)
    try:
        wait_or_dump(p, log, timeout)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, log.read_text(errors="replace")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop(0))
        todo += children.get(out[-1], [])
    return out


def wait_or_dump(p: subprocess.Popen, log: Path, timeout: float) -> None:
    """Wait for ``p`` (a ``trinity`` command logging to ``log``); past ``timeout`` s, ask it and
    every Python process below it for their stacks (SIGUSR1: ``roles.runtime.signals.stacks_on_sigusr1``),
    kill it and fail with the log's end, so a hang seen once says where each process was."""
    try:
        p.wait(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    for pid in descendants(p.pid):
        with contextlib.suppress(OSError):
            if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                os.kill(pid, signal.SIGUSR1)
    time.sleep(5)
    p.kill()
    p.wait()
    raise AssertionError(f"{' '.join(map(str, p.args[2:]))} still running after {timeout:.0f} s, "
                         f"killed; its log ends (stacks after SIGUSR1):\n{log.read_text(errors='replace')[-20000:]}")


def steps_log(job: Path) -> list[dict[str, Any]]:
    f = job / "trainer_steps.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def final_ids(entries: list[dict[str, Any]]) -> dict[int, list[str]]:
    """The ids of each step's last attempt (what the model was trained on)."""
    final: dict[int, list[str]] = {}
    for e in entries:
        final[e["step"]] = e["ids"]
    return final


def trained_exactly_once(job: Path, steps: int, per_step: int) -> dict[int, list[str]]:
    """The final trajectory (each step's last attempt) has steps 1..``steps``, each of
    ``per_step`` experiences, and no experience twice."""
    final = final_ids(steps_log(job))
    assert sorted(final) == list(range(1, steps + 1)), f"steps trained: {sorted(final)}"
    ids = [i for s in final.values() for i in s]
    assert len(ids) == len(set(ids)), "an experience was trained twice"
    assert len(ids) == steps * per_step, "an experience was skipped"
    return final




def _pids(match: Callable[[list[bytes]], bool]) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and match(cmd):
            return int(pid)
    return None


def nats_server_pid(store: Path) -> int | None:
    """The pid of the nats-server whose config lives in ``store`` (found in /proc)."""
    conf = str(store / "nats-server.conf").encode()
    return _pids(lambda cmd: cmd[0].endswith(b"nats-server") and conf in cmd)


def role_pid(role: str, config: Path) -> int | None:
    """The pid of ``python -m roles.cli <role> --config <config>`` (found in /proc)."""
    return _pids(lambda cmd: b"roles.cli" in cmd and role.encode() in cmd
                 and str(config).encode() in cmd)


def sweep_host_pid(role: str) -> int | None:
    """The pid of a ``trinity sweep-host --role <role>`` process (found in /proc)."""
    return _pids(lambda cmd: b"sweep-host" in cmd and role.encode() in cmd)
