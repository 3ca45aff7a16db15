"""The OpenAI API end to end, through real processes and a real nats-server:

* a workflow plugin that knows only ``get_openai_client()`` runs in ``trinity debug`` (its
  experiences equal ``ModelHandle.chat``'s for the same prompt and seed) and trains in a GRPO
  run;
* ``mode: serve``: an agent in another process, with nothing but the ``openai`` package and a
  ``base_url``, runs two-turn tool episodes and posts rewards; the trainer trains on exactly
  those experiences, once each, and the engine's weights version rises.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bus.server import free_port
from roles.explorer.workflows.base import ModelHandle
from tests.run.helpers import (
    ROOT,
    final_ids,
    steps_log,
    tiny_run_config,
    trained_exactly_once,
    trinity,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(scope="module")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.tiny import build_arithmetic_taskset

    return build_arithmetic_taskset(tmp_path_factory.mktemp("api_data"), n_train=12, n_eval=3)


def agent_config(tmp_path: Path, model: Path, data: Path, **extra) -> Path:
    return tiny_run_config(tmp_path / "c.yaml", model=model, data=data, port=free_port(), stages=False,
                           extra={"buffer.explorer_input.default_workflow_type": "openai_agent",
                                  "buffer.explorer_input.taskset.workflow_args": {"seed": 5},
                                  "explorer.rollout_model.enable_openai_api": True,
                                  "explorer.openai_api.port": 0, **extra})


def test_openai_workflow_in_debug_equals_model_handle_chat(tmp_path, tiny_model, arith):
    cfg = agent_config(tmp_path, tiny_model, arith, **{"buffer.batch_size": 2})
    out = tmp_path / "debug.json"
    p = subprocess.run([sys.executable, "-m", "roles.cli", "debug", "--config", str(cfg), "--module",
                        "workflow", "--plugin-dir", str(PLUGINS), "--output-file", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    exps = json.loads(out.read_text())["experiences"]
    assert len(exps) == 2 * 4  # 2 tasks x repeat_times 4, one call each

    from .conftest import make_engine

    async def direct(messages):
        engine = make_engine(tiny_model, max_model_len=64)
        (e,) = await ModelHandle(engine, asyncio.get_running_loop()).achat(
            messages, seed=5, temperature=1.0, max_tokens=8)
        return e

    for x in exps[:2]:
        want = asyncio.run(direct(x["messages"]))
        assert x["tokens"] == want.tokens.tolist()
        assert x["logprobs"] == pytest.approx(want.logprobs.tolist(), abs=1e-5)
        assert x["prompt_length"] == want.prompt_length and all(x["action_mask"])


def test_openai_workflow_trains_with_grpo(tmp_path, tiny_model, arith):
    cfg = agent_config(tmp_path, tiny_model, arith, **{"buffer.total_steps": 2,
                                                       "explorer.eval_on_startup": False})
    p = trinity("run", "--config", str(cfg), env_extra={"TRINITY_PLUGIN_DIRS": str(PLUGINS)})
    out, _ = p.communicate(timeout=900)
    text = out.decode()
    assert p.returncode == 0, text[-4000:]
    assert "openai_api_listening" in text
    trained_exactly_once(tmp_path / "ckpt/t/r", steps=2, per_step=3 * 4)


def test_serve_mode_trains_an_outside_agent_exactly_once(tmp_path, tool_model, arith):
    port = free_port()
    steps, batch = 3, 2
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tool_model, data=arith, port=free_port(),
                          stages=False, extra={
                              "mode": "serve",
                              "algorithm": {"algorithm_type": "reinforceplusplus", "optimizer": {"lr": 1e-4}},
                              "model.max_model_len": 512, "model.max_response_tokens": 96,
                              "buffer.batch_size": batch, "buffer.total_steps": steps,
                              "buffer.explorer_input": {},
                              "explorer.openai_api": {"port": port, "enable_concatenated_multi_turn": True},
                          })
    run = trinity("run", "--config", str(cfg))
    agent = subprocess.Popen([sys.executable, str(ROOT / "examples/serve_agent/agent.py"),
                              f"http://127.0.0.1:{port}", str(steps * batch), "ep"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    agent_out, _ = agent.communicate(timeout=600)
    assert agent.returncode == 0, agent_out[-3000:]
    out, _ = run.communicate(timeout=600)
    text = out.decode()
    assert run.returncode == 0, text[-4000:]
    episodes = [json.loads(line) for line in agent_out.splitlines() if line.startswith("{")]
    assert len(episodes) == steps * batch
    assert episodes[0]["tool_calls"] == 1  # the first episode (base weights) called the tool
    posted = {f"{e['episode']}/{i}" for e in episodes for i in range(e["experiences"])}
    job = tmp_path / "ckpt/t/r"
    final = final_ids(steps_log(job))
    assert sorted(final) == list(range(1, steps + 1))
    trained = [i for ids in final.values() for i in ids]
    assert sorted(trained) == sorted(posted) and len(trained) == len(set(trained))
    versions = [int(v) for v in re.findall(r"weights_loaded.*?version=(\d+)", text)]
    assert versions and max(versions) == steps, text[-3000:]
