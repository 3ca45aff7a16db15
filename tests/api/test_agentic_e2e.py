"""The example agents (``examples/agents``) through real processes, short: the calculator
agent, as concatenated multi-turn (one experience per episode) and step-wise (one experience
per model turn), trained with multi_step_grpo on the tiny tool-calling model. (The guessing
game runs in its example; the tiny test model only knows the calculator's tool.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bus.server import free_port
from tests.run.helpers import ROOT, final_ids, steps_log, tiny_run_config, trinity

pytestmark = pytest.mark.slow
AGENTS = str(ROOT / "examples/agents")


def run_agent(tmp_path: Path, model: Path, data: Path, workflow: str, concatenate: bool,
              algorithm: str = "multi_step_grpo", **extra) -> tuple[str, Path]:
    cfg = tiny_run_config(tmp_path / "c.yaml", model=model, data=data, port=free_port(), stages=False,
                          extra={"algorithm": {"algorithm_type": algorithm, "repeat_times": 3,
                                               "optimizer": {"lr": 1e-4}},
                                 "model.max_model_len": 512, "model.max_response_tokens": 96,
                                 "buffer.batch_size": 2, "buffer.total_steps": 2,
                                 "buffer.explorer_input.default_workflow_type": workflow,
                                 "buffer.explorer_input.taskset.rollout_args": {"temperature": 1.0, "max_tokens": 96},
                                 "buffer.explorer_input.eval_tasksets": [],
                                 "explorer.concurrent_mode": "multi-threading",
                                 "explorer.eval_on_startup": False,
                                 "explorer.rollout_model.enable_openai_api": True,
                                 "explorer.openai_api": {"port": 0, "enable_concatenated_multi_turn": concatenate},
                                 **extra})
    p = trinity("run", "--config", str(cfg), env_extra={"TRINITY_PLUGIN_DIRS": AGENTS})
    out, _ = p.communicate(timeout=900)
    text = out.decode()
    assert p.returncode == 0, text[-4000:]
    job = tmp_path / "ckpt/t/r"
    final = final_ids(steps_log(job))
    assert sorted(final) == [1, 2]
    ids = [i for s in final.values() for i in s]
    assert len(ids) == len(set(ids)), "an experience was trained twice"
    rows = [json.loads(x) for x in (job / "monitor/metrics.jsonl").read_text().splitlines()]
    train = [r["values"] for r in rows if r["kind"] == "train"]
    assert train and all(v["loss"] == v["loss"] for v in train)  # finite, not NaN
    if algorithm == "ppo":  # the critic trained on the same experiences
        assert all("critic/grad_norm" in v for v in train), train[-1]
    return text, job


def rollout_metrics(job: Path) -> list[dict]:
    rows = [json.loads(x) for x in (job / "monitor/metrics.jsonl").read_text().splitlines()]
    return [r["values"] for r in rows if r["kind"] == "rollout"]


#: both agent shapes train with a group baseline and with a critic (PPO's GAE per experience)
ALGORITHMS = ["multi_step_grpo", "ppo"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_calculator_agent_concatenated_multi_turn(tmp_path, tool_model, algorithm):
    from storage.tiny import build_arithmetic_taskset

    data = build_arithmetic_taskset(tmp_path / "data", n_train=8, n_eval=2)
    text, job = run_agent(tmp_path, tool_model, data, "calculator_agent", concatenate=True, algorithm=algorithm)
    m = rollout_metrics(job)
    assert m and all(v["experiences"] == v["episodes"] for v in m)  # one experience per episode
    assert all(v["turns_per_episode"] >= 1 for v in m)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_calculator_agent_step_wise(tmp_path, tool_model, algorithm):
    """The same agent with one experience per model turn (no concatenation): the tiny tool
    model calls ``add`` on "3+4?" and answers after the tool result, so an episode has two
    turns, and multi_step_grpo compares episodes."""
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 6), ("test", 1)):
        row = json.dumps({"question": "3+4?", "answer": "7"}) + "\n"
        (data / f"{split}.jsonl").write_text(row * n)
    text, job = run_agent(tmp_path, tool_model, data, "calculator_agent", concatenate=False, algorithm=algorithm)
    m = rollout_metrics(job)
    assert m and all(v["experiences"] > v["episodes"] for v in m)  # turns are experiences
    assert all(v["turns_per_episode"] == pytest.approx(v["experiences"] / v["episodes"]) for v in m)
    assert all(v["tool_calls_per_episode"] > 0 for v in m)
