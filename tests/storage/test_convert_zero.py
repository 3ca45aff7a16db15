"""DeepSpeed ZeRO checkpoints: read without unpickling code, the same tensors as DeepSpeed's
``zero_to_fp32``; a crafted ``*_model_states.pt`` is refused by ``trinity convert``, named,
before anything in it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from storage.checkpoints import CheckpointError
from storage.zero_checkpoint import load_zero_state_dict

from .zero_layout import model_params, write_zero_checkpoint

pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[2]


def _allowed() -> list:
    from roles.trainer.deepspeed_engine import checkpoint_safe_globals

    return checkpoint_safe_globals()


def _params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"emb.weight": (7, 5), "a.weight": (3, 5), "a.bias": (3,), "b.weight": (5, 3),
              "norm.weight": (5,)}
    return {n: torch.randn(s, generator=g) for n, s in shapes.items()}


@pytest.mark.parametrize("stage,world,groups", [(1, 1, 1), (2, 1, 2), (2, 2, 2), (2, 3, 1),
                                                (3, 1, 1), (3, 2, 2), (3, 3, 1)])
def test_zero_state_dict_equals_the_weights_and_deepspeeds_reader(tmp_path, stage, world, groups):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    params = _params()
    buffers = {"rope.inv_freq": torch.arange(3, dtype=torch.float32)}
    write_zero_checkpoint(tmp_path, params, stage=stage, world=world, groups=groups,
                          shared={"head.weight": "emb.weight"}, buffers=buffers,
                          pad_first_param=2 if stage == 2 else 0)
    sd = load_zero_state_dict(tmp_path, allowed_globals=_allowed())
    assert set(sd) == {*params, "head.weight", "rope.inv_freq"}
    for n, t in params.items():
        assert torch.equal(sd[n], t), n
    assert torch.equal(sd["head.weight"], params["emb.weight"])
    assert torch.equal(sd["rope.inv_freq"], buffers["rope.inv_freq"])
    ref = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))  # trusted file: its reader
    assert set(ref) == set(sd) and all(torch.equal(ref[k], sd[k]) for k in ref)


def test_zero_checkpoint_without_the_allow_list_is_refused_naming_file_and_class(tmp_path):
    tag = write_zero_checkpoint(tmp_path, _params(), stage=2)
    with pytest.raises(CheckpointError) as e:
        load_zero_state_dict(tmp_path)
    msg = str(e.value)
    assert str(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt") in msg
    assert "deepspeed.runtime.fp16.loss_scaler.LossScaler" in msg and "weights_only" in msg


def test_zero_checkpoint_with_a_missing_rank_or_a_stray_latest_fails_named(tmp_path):
    tag = write_zero_checkpoint(tmp_path / "a", _params(), stage=2, world=2)
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(CheckpointError, match="say 2 ranks but there are 1"):
        load_zero_state_dict(tmp_path / "a", allowed_globals=_allowed())
    write_zero_checkpoint(tmp_path / "b", _params(), stage=3)
    (tmp_path / "b" / "latest").write_text("../a/global_step1")
    with pytest.raises(CheckpointError, match="not a folder of this checkpoint"):
        load_zero_state_dict(tmp_path / "b", allowed_globals=_allowed())


def _convert(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "roles.cli", "convert", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


class _WritesAFile:
    """What an attacker pickles: unpickling it calls ``os.system`` (here: ``touch``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_convert_refuses_a_crafted_model_states_file_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    actor = tmp_path / "job" / "global_step_1" / "actor"
    tag = write_zero_checkpoint(actor / "deepspeed", _params(), stage=2)
    evil = tag / "mp_rank_00_model_states.pt"
    torch.save({"module": {}, "buffer_names": [], "payload": _WritesAFile(marker)}, evil)
    # the file is live: a full unpickle (what zero_to_fp32 does) runs the command
    torch.load(evil, weights_only=False)
    assert marker.exists()
    marker.unlink()
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    r = _convert("--checkpoint-dir", str(tmp_path / "job"), "--base-model-dir", str(tmp_path / "base"))
    assert r.returncode != 0
    assert str(evil) in r.stderr and "system" in r.stderr and "never unpickles" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not marker.exists(), "trinity convert ran code from the checkpoint"
    assert not (actor / "huggingface").exists()


def test_convert_turns_a_zero3_checkpoint_into_the_same_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from storage.tiny import build_tiny_model

    base = build_tiny_model(tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(base)
    params, shared = model_params(model)
    actor = tmp_path / "job" / "global_step_4" / "actor"
    write_zero_checkpoint(actor / "deepspeed", params, stage=3, world=2, shared=shared)
    r = _convert("--checkpoint-dir", str(tmp_path / "job"), "--base-model-dir", str(base))
    assert r.returncode == 0, r.stderr
    assert "converted global_step_4" in r.stdout and "deepspeed checkpoint" in r.stdout
    out = AutoModelForCausalLM.from_pretrained(actor / "huggingface")
    want = model.state_dict()
    got = out.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
