"""``trinity convert`` reads veRL's FSDP checkpoints: shards written by torch's own ``fully_shard``
(two gloo ranks, ``tests/storage/fsdp_layout.py``) become a Hugging Face folder transformers
loads with the trained weights; the FAQ's ``load_fsdp_state_dict_from_verl_checkpoint`` gives
the same state dict; a shard that is not a weights-only pickle is refused, naming it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fsdp_job(tmp_path_factory):
    from storage.tiny import build_tiny_model

    tmp = tmp_path_factory.mktemp("fsdp")
    base = build_tiny_model(tmp / "base")
    actor = tmp / "job" / "global_step_3" / "actor"
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "fsdp_layout.py"), str(base), str(actor)],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return base, tmp / "job", actor


def _expected(base: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # as fsdp_layout.py trained it
    return model.state_dict()


def test_verl_fsdp_shards_convert_into_a_folder_transformers_loads(fsdp_job):
    from transformers import AutoModelForCausalLM

    base, job, actor = fsdp_job
    r = subprocess.run([sys.executable, "-m", "roles.cli", "convert", "--checkpoint-dir", str(job),
                        "--base-model-dir", str(base)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "veRL FSDP shards" in r.stdout, r.stderr[-3000:]
    got = AutoModelForCausalLM.from_pretrained(actor / "huggingface", dtype=torch.float32).state_dict()
    want = _expected(base)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_the_faqs_loader_gives_the_trained_state_dict(fsdp_job):
    from transformers import AutoModelForCausalLM
    from trinity.common.models.utils import load_fsdp_state_dict_from_verl_checkpoint

    base, _, actor = fsdp_job
    model = AutoModelForCausalLM.from_pretrained(base)  # the FAQ's snippet
    model.load_state_dict(load_fsdp_state_dict_from_verl_checkpoint(str(actor)))
    want = _expected(base)
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_shard_that_would_run_code_is_refused_naming_it(tmp_path):
    from storage.checkpoints import CheckpointError
    from storage.convert import load_fsdp_shards

    actor = tmp_path / "actor"
    actor.mkdir()
    for r in range(2):
        with open(actor / f"model_world_size_2_rank_{r}.pt", "wb") as f:
            pickle.dump({"w": _Boom()}, f)
    with pytest.raises(CheckpointError, match="model_world_size_2_rank_0.pt: not a weights-only FSDP shard"):
        load_fsdp_shards(actor)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    (actor / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(CheckpointError, match=r"missing shards \['model_world_size_2_rank_1.pt'\]"):
        load_fsdp_shards(actor)
