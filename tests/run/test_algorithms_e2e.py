"""Every algorithm type trains end to end: each ``examples/algorithms/<type>.yaml`` runs 3 steps
through real processes (embedded nats-server, explorer, buffer, trainer, synchronizer), on the
assets ``examples/algorithms/prepare.py`` builds.

Start-up is shared: one ``trinity run`` walks all 23 configs as the stages of one experiment
(each stage takes its example's algorithm, buffer, explorer, trainer and mode; the role
processes start once). A stage starts from the previous stage's final weights, so "the weights
changed" compares each stage's last checkpoint with the one it started from. Per algorithm the
test checks: 3 train steps, a finite loss, changed weights, and the metrics the algorithm is
about (its loss terms, the critic's, DPO's rewards, CHORD's mu, the teacher's KL).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from bus.server import free_port

from .helpers import ROOT, run_to_end

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples" / "algorithms"
ALGORITHMS = ["ppo", "grpo", "sft", "dpo", "mix_chord", "rec", "rloo", "reinforceplusplus", "gspo",
              "topr", "sppo", "asymre", "cispo", "sapo", "opmd", "on_policy_distill", "jsd", "raft", "grpo_verl", "clipb", "dapo", "m2po", "gigpo"]
#: A metric each algorithm's own part logs (its loss, its critic, its teacher...).
OWN_METRIC = {
    "ppo": "critic/vf_loss", "grpo": "pg_clipfrac", "sft": "sft_loss", "dpo": "chosen_reward",
    "mix_chord": "mu", "rec": "pg_loss", "rloo": "pg_clipfrac", "reinforceplusplus": "pg_clipfrac",
    "gspo": "pg_clipfrac", "topr": "topr_loss", "sppo": "pg_loss", "asymre": "opmd_loss",
    "cispo": "cispo_loss", "sapo": "sapo_loss", "opmd": "opmd_loss",
    "on_policy_distill": "distill/teacher_kl", "jsd": "distill/teacher_kl", "raft": "sft_loss",
    "grpo_verl": "pg_clipfrac", "clipb": "advantage/frac_clipped", "dapo": "pg_clipfrac",
    "m2po": "m2po/masked_fraction", "gigpo": "pg_clipfrac",
}
STAGE_SECTIONS = ("algorithm", "buffer", "explorer", "trainer", "synchronizer", "model", "data_processor")


def staged_config(path: Path, build: Path, port: int) -> Path:
    """All example configs as the stages of one experiment, 3 steps each, on ``build``."""
    stages = []
    for name in ALGORITHMS:
        text = (EXAMPLES / f"{name}.yaml").read_text().replace("examples/algorithms/_build", str(build))
        cfg = yaml.safe_load(text)
        cfg["buffer"]["total_steps"] = 3
        cfg["explorer"] = {**cfg.get("explorer", {}), "eval_on_startup": False}
        cfg["explorer"].pop("eval_interval", None)
        cfg["buffer"].get("explorer_input", {}).pop("eval_tasksets", None)
        stages.append({"stage_name": name, "mode": cfg["mode"],
                       **{k: cfg[k] for k in STAGE_SECTIONS if k in cfg}})
    first = yaml.safe_load((EXAMPLES / "ppo.yaml").read_text().replace("examples/algorithms/_build", str(build)))
    top = {"project": "algorithms", "name": "all", "checkpoint_root_dir": str(path.parent / "ckpt"),
           "model": first["model"], "critic": first["critic"], "monitor": {"monitor_type": "none"},
           "nats": {"url": f"nats://127.0.0.1:{port}"}, "stages": stages}
    path.write_text(yaml.safe_dump(top, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def algorithm_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Build the assets, run every example as a stage; returns the run's paths and log."""
    tmp = tmp_path_factory.mktemp("algorithms")
    build = tmp / "build"
    subprocess.run([sys.executable, str(EXAMPLES / "prepare.py"), "--out", str(build)], check=True,
                   cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    cfg = staged_config(tmp / "all.yaml", build, free_port())
    rc, text = run_to_end(cfg, tmp / "run.log", timeout=1500)
    return {"rc": rc, "log": text, "jobs": tmp / "ckpt" / "algorithms" / "all", "build": build}


def _train_metrics(job: Path) -> list[dict[str, float]]:
    lines = (job / "monitor" / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    return [r["values"] for r in sorted((r for r in recs if r["kind"] == "train"), key=lambda r: r["step"])]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _final_hf(job: Path) -> Path:
    from storage import checkpoints as ckpt

    return ckpt.hf_dir(job, ckpt.list_steps(job)[-1])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_three_steps(algorithm_run, algorithm):
    assert algorithm_run["rc"] == 0, algorithm_run["log"][-4000:]
    job = algorithm_run["jobs"] / algorithm
    steps = _train_metrics(job)
    assert len(steps) == 3, f"{algorithm}: {len(steps)} train steps"
    for m in steps:
        assert math.isfinite(m["loss"]), (algorithm, m)
        assert math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0, (algorithm, m)
    assert any(OWN_METRIC[algorithm] in m for m in steps), (algorithm, sorted(steps[-1]))
    i = ALGORITHMS.index(algorithm)
    start = algorithm_run["build"] / "student" if i == 0 else _final_hf(algorithm_run["jobs"] / ALGORITHMS[i - 1])
    before, after = _weights(start), _weights(_final_hf(job))
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before), f"{algorithm}: weights unchanged"
