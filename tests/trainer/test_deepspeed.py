"""DeepSpeed ZeRO engine on CPU (its CPU accelerator, gloo): stages 1, 2 and 3, one and two
processes. Ranks train on different data; afterwards their parameters are equal and moved."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

pytest.importorskip("deepspeed")

# the deepspeed_shm_comm op compiles once (~70 s) and is cached here across runs
EXT_DIR = os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "trinity-torch-extensions"))


def _drop_stale_lock() -> None:
    """A JIT build killed midway leaves its ``lock`` behind and every later build waits on it
    forever; no build takes 10 minutes, so an older lock is stale."""
    import time

    for lock in Path(EXT_DIR).glob("*/lock"):
        if time.time() - lock.stat().st_mtime > 600:
            lock.unlink(missing_ok=True)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("stage,world", [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (3, 2)])
def test_zero_stage_trains_and_ranks_agree(tmp_path, tiny_model, stage, world):
    _drop_stale_lock()
    port = str(_port())
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, TORCH_EXTENSIONS_DIR=EXT_DIR, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.trainer.ds_peer", str(tiny_model), str(stage), str(tmp_path)],
            cwd=ROOT, env=env, stdout=open(tmp_path / f"log{rank}", "wb"), stderr=subprocess.STDOUT))
    for rank, p in enumerate(procs):
        p.wait(900)
        assert p.returncode == 0, (tmp_path / f"log{rank}").read_text()[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r in results:
        assert r["world"] == world and r["moved"] > 1e-4 and r["grad_norm"] > 0
        assert r["micro_batches"] >= 2  # the accumulation path was exercised
    for r in results[1:]:
        assert r["sums"] == results[0]["sums"], "ranks disagree after training"


@pytest.mark.slow
@pytest.mark.parametrize("stage,world", [(2, 1), (3, 1), (2, 2), (3, 2)])
def test_resume_continues_exactly_where_the_checkpoint_left_off(tmp_path, tiny_model, stage, world):
    """The real Trainer on the DeepSpeed engine: a trainer restarted from a checkpoint takes
    step 3 exactly as the one that kept running did (weights, Adam moments, schedule). With
    two processes each rank saves and reloads its own optimizer partition; a trainer of
    another size refuses that checkpoint."""
    from .helpers import write_config

    _drop_stale_lock()
    cfg = write_config(
        tmp_path / "ds.yaml", project="t", name="ds", checkpoint_root_dir=str(tmp_path / "ckpt"),
        model={"model_path": str(tiny_model), "max_model_len": 64},
        algorithm={"algorithm_type": "grpo", "repeat_times": 4, "kl_loss_fn": "none",
                   "optimizer": {"lr": 1e-2, "lr_warmup_steps": 2, "lr_scheduler_type": "cosine"}},
        trainer={"trainer_type": "deepspeed", "deepspeed": {"zero_stage": stage}, "save_hf_checkpoint": "never"},
        buffer={"batch_size": 2, "total_steps": 6},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(TORCH_EXTENSIONS_DIR=EXT_DIR, OMP_NUM_THREADS="1")

    def launch(mode: str, n: int) -> list[subprocess.Popen]:
        port = str(_port())
        procs = []
        for rank in range(n):
            e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=port)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.trainer.ds_resume_peer", str(cfg), str(tmp_path), mode], cwd=ROOT,
                env=e, stdout=open(tmp_path / f"{mode}{rank}.log", "wb"), stderr=subprocess.STDOUT))
        for p in procs:
            p.wait(900)
        return procs

    for mode in ("first", "resumed"):
        for rank, p in enumerate(launch(mode, world)):
            assert p.returncode == 0, (mode, rank, (tmp_path / f"{mode}{rank}.log").read_text()[-3000:])
    import torch

    tags = [""] if world == 1 else [f"_rank{r}" for r in range(world)]
    for tag in tags:
        a, b = torch.load(tmp_path / f"first{tag}.pt"), torch.load(tmp_path / f"resumed{tag}.pt")
        assert a.keys() == b.keys()
        for k in a:
            assert torch.allclose(a[k], b[k], atol=1e-6), (tag, k)
        ma, mb = (json.loads((tmp_path / f"{m}{tag}.json").read_text()) for m in ("first", "resumed"))
        assert ma["lr"] == mb["lr"] and abs(ma["loss"] - mb["loss"]) < 1e-6, (tag, ma, mb)
    if world > 1:  # one process cannot take two processes' optimizer partitions
        (p,) = launch("resumed", 1)
        log = (tmp_path / "resumed0.log").read_text()
        assert p.returncode != 0 and "resume with as many as saved it" in log, log[-3000:]
