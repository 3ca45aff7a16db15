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
import torch

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


def _run_ranks(args: list[str], world: int, logs: list[Path]) -> list[subprocess.Popen]:
    """``python -m <args>`` as ``world`` ranks of one job (the launcher's variables set by
    hand), output to ``logs[rank]``; waits for all and returns them (callers check exit codes)."""
    port = str(_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(TORCH_EXTENSIONS_DIR=EXT_DIR, OMP_NUM_THREADS="1", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=port)
    procs = [subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=open(logs[r], "wb"), stderr=subprocess.STDOUT) for r in range(world)]
    for p in procs:
        p.wait(900)
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("stage,world", [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (3, 2)])
def test_zero_stage_trains_and_ranks_agree(tmp_path, tiny_model, stage, world):
    _drop_stale_lock()
    logs = [tmp_path / f"log{rank}" for rank in range(world)]
    procs = _run_ranks(["tests.trainer.ds_peer", str(tiny_model), str(stage), str(tmp_path)], world, logs)
    for rank, p in enumerate(procs):
        assert p.returncode == 0, logs[rank].read_text()[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r in results:
        assert r["world"] == world and r["moved"] > 1e-4 and r["grad_norm"] > 0
        assert r["micro_batches"] >= 2  # the accumulation path was exercised
    for r in results[1:]:
        assert r["sums"] == results[0]["sums"], "ranks disagree after training"


@pytest.mark.slow
# each stage once and each world size once: (3, 2) saves and reloads ZeRO-3's partitioned
# parameters and optimizer state per rank, (2, 1) the whole of ZeRO-2's in one file (the four
# pairs took 249 s of the suite's time, these two 162 s)
@pytest.mark.parametrize("stage,world", [(2, 1), (3, 2)])
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

    def launch(mode: str, n: int) -> list[subprocess.Popen]:
        return _run_ranks(["tests.trainer.ds_resume_peer", str(cfg), str(tmp_path), mode], n,
                          [tmp_path / f"{mode}{rank}.log" for rank in range(n)])

    for mode in ("first", "resumed"):
        for rank, p in enumerate(launch(mode, world)):
            assert p.returncode == 0, (mode, rank, (tmp_path / f"{mode}{rank}.log").read_text()[-3000:])

    tags = [""] if world == 1 else [f"_rank{r}" for r in range(world)]
    for tag in tags:
        a, b = torch.load(tmp_path / f"first{tag}.pt", weights_only=True), torch.load(tmp_path / f"resumed{tag}.pt", weights_only=True)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.allclose(a[k], b[k], atol=1e-6), (tag, k)
        ma, mb = (json.loads((tmp_path / f"{m}{tag}.json").read_text()) for m in ("first", "resumed"))
        assert ma["lr"] == mb["lr"] and abs(ma["loss"] - mb["loss"]) < 1e-6, (tag, ma, mb)
    if world > 1:  # one process cannot take two processes' optimizer partitions
        (p,) = launch("resumed", 1)
        log = (tmp_path / "resumed0.log").read_text()
        assert p.returncode != 0 and "resume with as many as saved it" in log, log[-3000:]


def _one_and_two_ranks(tmp_path: Path, tiny_model: Path, stage: int) -> tuple[dict, dict, list, list]:
    """Train three batches with the real Trainer as one process and as two (rank 0 leading;
    ``tests/trainer/ds_dp_peer.py``); the leader's final weights and metrics of each."""
    from .helpers import write_config

    _drop_stale_lock()
    for world in (1, 2):
        cfg = write_config(
            tmp_path / f"dp{world}.yaml", project="t", name="dp", checkpoint_root_dir=str(tmp_path / f"ckpt{world}"),
            model={"model_path": str(tiny_model), "max_model_len": 128},
            algorithm={"algorithm_type": "grpo", "repeat_times": 4, "kl_penalty_fn": "k1", "kl_loss_fn": "k2",
                       "optimizer": {"lr": 1e-3}},
            trainer={"trainer_type": "deepspeed", "deepspeed": {"zero_stage": stage}, "save_hf_checkpoint": "never",
                     "use_dynamic_bsz": False, "micro_batch_size_per_gpu": 1},
            buffer={"batch_size": 3, "total_steps": 3},
        )
        logs = [tmp_path / f"w{world}r{rank}.log" for rank in range(world)]
        procs = _run_ranks(["tests.trainer.ds_dp_peer", str(cfg), str(tmp_path)], world, logs)
        for rank, p in enumerate(procs):
            assert p.returncode == 0, (world, rank, logs[rank].read_text()[-3000:])
    one, two = torch.load(tmp_path / "world1.pt", weights_only=True), torch.load(tmp_path / "world2.pt", weights_only=True)
    m1, m2 = (json.loads((tmp_path / f"world{w}.json").read_text()) for w in (1, 2))
    return one, two, m1, m2


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_train_as_one_process_on_the_whole_batch(tmp_path, tiny_model, stage):
    """The real Trainer with two processes, rank 0 leading: each rank trains its share of
    every batch (unequal shares, so unequal micro-batch counts, padded with weightless ones)
    and the result is what one process makes of the whole batch: same weights, loss and
    gradient norm (Adam hides a gradient's scale in the weights; the norm shows it). The
    advantages are computed in the trainer (KL penalty in the reward) from every rank's
    reference log-probs; a few experiences lack the sampler's log-probs, so the policy's
    forward (collective under ZeRO-3) runs for them on every rank."""
    one, two, m1, m2 = _one_and_two_ranks(tmp_path, tiny_model, stage)
    assert one.keys() == two.keys()
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-4), (k, float((one[k] - two[k]).abs().max()))
    for a, b in zip(m1, m2, strict=True):
        # 12 rows, one per micro-batch: more than 6 on a rank means the other ran fillers
        assert a["micro_batches"] == 12 and b["micro_batches"] > 6, (a["micro_batches"], b["micro_batches"])
        for key in ("loss", "grad_norm", "kl_penalty/kl", "pg_loss", "tokens", "batch_size"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (key, a[key], b[key])
    actor = tmp_path / "ckpt2" / "t" / "dp" / "global_step_3" / "actor"
    assert sorted(p.name for p in actor.glob("trainer_state*.pt")) == [
        "trainer_state_world_size_2_rank_0.pt", "trainer_state_world_size_2_rank_1.pt"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two NVIDIA GPUs")
@pytest.mark.parametrize("stage", [2, 3])
def test_two_gpus_train_as_one_gpu_on_the_whole_batch(tmp_path, tiny_model, stage):
    """The same on two GPUs: NCCL under DeepSpeed, bf16 (the engine's choice on a GPU), the
    control group still gloo. bf16 rounds differently when the batch is split, so the bounds
    are bf16's, not fp32's."""
    one, two, m1, m2 = _one_and_two_ranks(tmp_path, tiny_model, stage)
    for k in one:
        assert torch.allclose(one[k], two[k], atol=2e-2), (k, float((one[k] - two[k]).abs().max()))
    for a, b in zip(m1, m2, strict=True):
        for key in ("loss", "grad_norm", "kl_penalty/kl"):
            assert abs(a[key] - b[key]) <= 5e-2 * max(1.0, abs(a[key])), (key, a[key], b[key])
