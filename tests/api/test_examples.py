"""The agentic examples' README commands, with short settings: each example's ``prepare.py``
builds its assets, then its config runs through ``trinity run`` with the example workflows
loaded from ``TRINITY_PLUGIN_DIRS`` (SFT warm-up 2 steps, RL 1 step, transformers engine,
no evaluation: the full runs take minutes, README "Agentic RL examples")."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from bus.server import free_port
from tests.run.helpers import ROOT, steps_log, trinity

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("example, config", [("agent_calculator", "calculator.yaml"),
                                             ("agent_guess", "guess.yaml")])
def test_example_runs(tmp_path, example, config):
    out = tmp_path / "build"
    p = subprocess.run([sys.executable, f"examples/{example}/prepare.py", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    text = (ROOT / f"examples/{example}/{config}").read_text().replace(f"examples/{example}/_build", str(out))
    cfg = yaml.safe_load(text)
    cfg.update(checkpoint_root_dir=str(tmp_path / "ckpt"), nats={"url": f"nats://127.0.0.1:{free_port()}"})
    cfg["buffer"].update(total_steps=1, batch_size=2)
    cfg["buffer"]["explorer_input"]["eval_tasksets"] = []
    cfg["algorithm"]["repeat_times"] = 2
    cfg["explorer"]["rollout_model"]["engine_type"] = "transformers"
    cfg["stages"] = [s for s in cfg["stages"] if s["mode"] != "bench"]  # the random model's eval
    cfg["stages"][0]["buffer"]["total_steps"] = 2
    path = tmp_path / config
    path.write_text(yaml.safe_dump(cfg))
    run = trinity("run", "--config", str(path), env_extra={"TRINITY_PLUGIN_DIRS": str(ROOT / "examples/agents")})
    stdout, _ = run.communicate(timeout=900)
    assert run.returncode == 0, stdout.decode()[-4000:]
    job = tmp_path / "ckpt" / cfg["project"] / cfg["name"]
    assert [e["step"] for e in steps_log(job / "grpo")][-1] == 1
