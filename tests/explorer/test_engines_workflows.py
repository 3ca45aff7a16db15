"""Engines (transformers), workflows, the runner pool and the explorer loop in-process
against a real nats-server. Everything here runs on the HF engine (starts in seconds); the
vLLM engine has its own module."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import structlog.testing
import torch

from roles.explorer.engines.base import Limits
from roles.explorer.workflows import MultiTurnWorkflow, Workflow, get_workflow, register_workflow
from schemas.config import InferenceModelConfig
from tests.explorer.helpers import load, read_groups, teacher_logprobs, write_config


@pytest.fixture(scope="module")
def hf_engine(tiny_model: Path):
    from roles.explorer.engines.hf import HFEngine

    cfg = InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                               dtype="float32", max_model_len=96, max_prompt_tokens=40,
                               max_response_tokens=12, seed=0)
    return HFEngine(cfg)


def test_limits_truncate_prompt_and_bound_response() -> None:
    lim = Limits(max_model_len=20, max_prompt_tokens=8, max_response_tokens=16,
                 min_response_tokens=1, enable_prompt_truncation=True)
    assert lim.fit_prompt(list(range(10))) == (list(range(8)), True)
    assert lim.fit_prompt([1, 2]) == ([1, 2], False)
    assert lim.max_new_tokens(8, None) == 12  # max_model_len - prompt
    off = Limits(20, 8, 16, 1, enable_prompt_truncation=False)
    assert off.fit_prompt(list(range(10))) == (list(range(10)), False)
    with pytest.raises(Exception, match="max_model_len"):
        off.max_new_tokens(20, None)


async def test_hf_engine_logprobs_equal_teacher_forcing(hf_engine, hf_model) -> None:
    samples = await hf_engine.chat([{"role": "user", "content": "3+4=?"}], n=3, temperature=1.0)
    assert len(samples) == 3
    for s in samples:
        assert len(s.logprobs) == len(s.tokens) - s.prompt_length > 0
        ref = teacher_logprobs(hf_model, s.tokens, s.prompt_length)
        assert torch.allclose(ref, torch.tensor(s.logprobs), atol=1e-4)


async def test_hf_engine_batches_concurrent_requests_exactly(hf_engine, hf_model, monkeypatch) -> None:
    """Requests that wait together run as one left-padded ``generate``: each keeps its own
    prompt, ``n`` and ``max_tokens``, and its log-probs still equal a teacher-forced pass."""
    calls = []
    real = hf_engine._generate

    def counting(prompts, repeats, *a, **kw):
        calls.append(sum(repeats))
        return real(prompts, repeats, *a, **kw)

    monkeypatch.setattr(hf_engine, "_generate", counting)
    prompts = ["1+1=?", "12+34=?", "7+8=?"]
    outs = await asyncio.gather(*(hf_engine.generate(prompt=p, n=k + 1, max_tokens=3 + k, temperature=1.0,
                                                     ignore_eos=True) for k, p in enumerate(prompts)))
    assert calls[-1] == 1 + 2 + 3 or sum(calls[-2:]) == 1 + 2 + 3  # one batch (or the first alone)
    for k, (p, samples) in enumerate(zip(prompts, outs, strict=True)):
        assert len(samples) == k + 1
        for smp in samples:
            assert smp.prompt_length == len(hf_engine.tokenizer.encode(p, add_special_tokens=False))
            assert len(smp.response_tokens) == 3 + k and smp.finish_reason == "length"
            ref = teacher_logprobs(hf_model, smp.tokens, smp.prompt_length)
            assert torch.allclose(ref, torch.tensor(smp.logprobs), atol=1e-4)


def test_hf_engine_prefills_a_shared_prompt_once_and_samples_as_without(hf_engine, monkeypatch) -> None:
    """A prompt with several rows is prefilled once and its cache repeated to them: greedy
    rows, left-padded among prompts of other lengths, get the tokens and log-probs they get
    when every row prefills its own copy."""
    prefills = []
    real = hf_engine._prefill
    monkeypatch.setattr(hf_engine, "_prefill", lambda inp, *a: prefills.append(inp.shape) or real(inp, *a))
    tok = hf_engine.tokenizer
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("1+1=?", "12+34=?", "7+8=")]
    s = {"temperature": 0.0, "ignore_eos": True}
    shared = hf_engine._generate(prompts, [2, 3, 1], 5, s, [5] * 6)
    assert prefills == [(3, max(map(len, prompts)) - 1)]  # three prompts, once each, but their last token
    apart = hf_engine._generate([p for p, k in zip(prompts, [2, 3, 1], strict=True) for _ in range(k)], [1] * 6, 5, s, [5] * 6)
    assert len(prefills) == 1  # one row a prompt: nothing to share
    for (toks, lps, _, _), (toks2, lps2, _, _) in zip(shared, apart, strict=True):
        assert toks == toks2 and len(toks) == 5
        assert torch.allclose(torch.tensor(lps), torch.tensor(lps2), atol=1e-5)


async def test_a_cpu_engine_runs_bfloat16_only_where_the_cpu_has_it(tiny_model: Path, monkeypatch) -> None:
    """``dtype: bfloat16`` (the default) on a CPU: bfloat16 where the CPU multiplies it natively
    (TRINITY_CPU_BF16=1 stands in for its flags), as the trainer beside it; float32 elsewhere."""
    from roles.explorer.engines.hf import HFEngine

    cfg = InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers", dtype="bfloat16",
                               max_model_len=64, max_response_tokens=6, seed=0)
    monkeypatch.setenv("TRINITY_CPU_BF16", "0")
    assert next(HFEngine(cfg).model.parameters()).dtype == torch.float32
    monkeypatch.setenv("TRINITY_CPU_BF16", "1")
    engine = HFEngine(cfg)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    [s] = await engine.chat([{"role": "user", "content": "2+2=?"}], n=1, temperature=1.0)
    assert s.logprobs and all(math.isfinite(x) and x <= 0 for x in s.logprobs)
    await engine.close()


async def test_hf_engine_scores_given_tokens_as_a_teacher(hf_engine, hf_model) -> None:
    [s] = await hf_engine.chat([{"role": "user", "content": "2+2=?"}], n=1, temperature=1.0)
    scored = await hf_engine.score(s.tokens, s.prompt_length)
    ref = teacher_logprobs(hf_model, s.tokens, s.prompt_length)
    assert torch.allclose(ref, torch.tensor(scored), atol=1e-5)
    with pytest.raises(Exception, match="prompt_length"):
        await hf_engine.score(s.tokens, len(s.tokens))


def test_engine_template_settings_come_from_its_config(tiny_model) -> None:
    """``chat_template`` and ``enable_thinking`` (the loader fills them from ``model.*``)."""
    from roles.explorer.engines.hf import HFEngine

    template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %}!{% endif %}")
    eng = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                        dtype="float32", chat_template=template, enable_thinking=False))
    ids = eng.apply_chat_template([{"role": "user", "content": "1+1"}])
    assert eng.tokenizer.decode(ids) == "1+1!"


async def test_hf_engine_truncation_flags(hf_engine) -> None:
    long = "1+1=?" * 20  # 100 chars > max_prompt_tokens=40
    [s] = await hf_engine.generate(prompt=long, n=1, max_tokens=3, ignore_eos=True)
    assert s.prompt_truncated and s.prompt_length == 40
    assert s.response_truncated and len(s.response_tokens) == 3


async def test_hf_engine_update_weights_changes_logprobs(tiny_model: Path, hf_model) -> None:
    import copy

    from roles.explorer.engines.hf import HFEngine

    eng = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                        dtype="float32", max_model_len=96, max_response_tokens=8))
    new = copy.deepcopy(hf_model)
    with torch.no_grad():
        for p in new.parameters():
            p.mul_(1.3)
    await eng.update_weights(list(new.state_dict().items()), version=5)
    assert eng.model_version == 5
    [s] = await eng.chat([{"role": "user", "content": "2+2=?"}])
    ref_new = teacher_logprobs(new, s.tokens, s.prompt_length)
    assert torch.allclose(ref_new, torch.tensor(s.logprobs), atol=1e-4)
    with pytest.raises(Exception, match="unknown tensor"):
        await eng.update_weights([("nope.weight", torch.zeros(1))], 6)


def test_registry_module_path_and_plugin_dir(tmp_path: Path, monkeypatch) -> None:
    from roles.explorer.workflows.math import MathWorkflow
    from roles.explorer.workflows.registry import load_plugin_dirs

    assert get_workflow("math_workflow") is MathWorkflow
    assert get_workflow("roles.explorer.workflows.math:MathBoxedWorkflow").__name__ == "MathBoxedWorkflow"
    (tmp_path / "myplug.py").write_text(
        "from roles.explorer.workflows import Workflow, register_workflow\n"
        "@register_workflow('plugged')\nclass P(Workflow):\n    pass\n"
    )
    load_plugin_dirs(str(tmp_path))
    assert get_workflow("plugged").__name__ == "P"
    with pytest.raises(KeyError, match="unknown workflow 'nope'"):
        get_workflow("nope")
    with pytest.raises(KeyError, match="workflow 'alfworld_workflow' .Trinity-RFT's. is not available here: needs "
                                       "ALFWorld's game files: pip install alfworld && alfworld-download"):
        get_workflow("alfworld_workflow")


class _TwoTurns(MultiTurnWorkflow):
    is_async = True

    async def run_async(self):
        msgs = [{"role": "user", "content": "1+1=?"}]
        calls = []
        for _ in range(2):
            [e] = await self.model.achat(msgs, max_tokens=4)
            calls.append(e)
            msgs = msgs + [{"role": "assistant", "content": e.response_text},
                           {"role": "user", "content": "again"}]
        return [self.conversation_experience(msgs[:-1], reward=1.0, turn_experiences=calls)]


async def test_multi_turn_action_mask(hf_engine) -> None:
    from roles.explorer.workflows.base import ModelHandle
    from schemas.data import Task

    task = Task(task_id="mt/0", raw={}, workflow="x")
    wf = _TwoTurns(task=task, model=ModelHandle(hf_engine, asyncio.get_running_loop()))
    [e] = await wf.run_async()
    e.validate()
    tok = hf_engine.tokenizer
    text_masked = tok.decode([int(t) for t, m in zip(e.tokens[e.prompt_length:], e.action_mask, strict=False) if not m])
    assert "u:again" in text_masked  # the user's turn is not trained on
    assert e.action_mask.sum() > 0 and not e.action_mask.all()


async def test_math_boxed_workflow_takes_trinity_rfts_workflow_args(hf_engine) -> None:
    """``use_base`` completes upstream's plain-text prompt (no chat template); ``with_think``
    asks for <think> in the system prompt and the reward's format check; math_dapo_reward gets
    each response's length for its overlong penalty."""
    from roles.explorer.workflows.base import ModelHandle
    from roles.explorer.workflows.math import BOXED_THINK_SYSTEM_PROMPT, MathBoxedWorkflow
    from schemas.data import Task

    model = ModelHandle(hf_engine, asyncio.get_running_loop())
    tok = hf_engine.tokenizer

    def task(**kw):
        return Task(task_id="b/0", raw={"q": "1+1?", "a": "2"}, workflow="math_boxed_workflow", repeat_times=2,
                    format={"prompt_key": "q", "response_key": "a", "system_prompt": "Be brief."},
                    rollout_args={"max_tokens": 4}, **kw)

    exps = await MathBoxedWorkflow(task=task(workflow_args={"use_base": True}), model=model).run_async()
    want = tok.encode("System:Be brief.\nUser:\n1+1?\nAssistant:\n", add_special_tokens=False)
    assert len(exps) == 2 and all(list(e.tokens[:e.prompt_length]) == want for e in exps)

    think = MathBoxedWorkflow(task=Task(task_id="b/1", raw={"q": "1+1?", "a": "2"}, workflow="math_boxed_workflow",
                                        format={"prompt_key": "q", "response_key": "a"},
                                        workflow_args={"with_think": True, "format_score_coef": 0.3}), model=model)
    assert think.messages()[0]["content"] == BOXED_THINK_SYSTEM_PROMPT
    assert think.reward("\\boxed{2}") == {"accuracy": 1.0, "format_score": -0.3}  # no <think>

    dapo = MathBoxedWorkflow(task=task(reward_fn="math_dapo_reward", reward_fn_args={
        "enable_overlong_penalty": True, "penalty_factor": 1.0, "max_response_length": 4, "cache_length": 2}),
        model=model)
    for e in await dapo.run_async():
        assert e.info["format_score"] == pytest.approx(min(0.0, (2 - e.response_length) / 2))


async def test_simple_workflow_is_math_workflow_without_its_defaults(hf_engine) -> None:
    from roles.explorer.workflows.base import ModelHandle
    from roles.explorer.workflows.math import THINK_SYSTEM_PROMPT
    from schemas.data import Task

    model = ModelHandle(hf_engine, asyncio.get_running_loop())

    def make(name, **kw):
        task = Task(task_id="s/0", raw={"prompt": "1+1?", "response": "2"}, workflow=name, repeat_times=2,
                    rollout_args={"max_tokens": 4}, **kw)
        return get_workflow(name)(task=task, model=model)

    assert make("simple_workflow").messages() == [{"role": "user", "content": "1+1?"}]
    assert make("async_math_workflow").messages()[0]["content"] == THINK_SYSTEM_PROMPT
    exps = await make("async_simple_workflow", reward_fn="format_reward").run_async()
    assert len(exps) == 2 and all(e.reward == e.info["format_score"] == -0.1 for e in exps)  # no <think>
    with pytest.raises(KeyError, match="simple_workflow needs a reward function"):
        await make("simple_workflow").run_async()


async def test_on_policy_distill_workflows_are_upstreams(hf_engine) -> None:
    """No reward of their own (the teacher's log-probs are the signal; the explorer fills them);
    the math one asks in Qwen2.5-Math's words and scores the boxed answer."""
    from roles.explorer.workflows.base import ModelHandle
    from schemas.data import Task

    model = ModelHandle(hf_engine, asyncio.get_running_loop())

    def make(name, **kw):
        task = Task(task_id="d/0", raw={"prompt": "1+1?", "response": "2"}, workflow=name, repeat_times=2,
                    rollout_args={"max_tokens": 4}, **kw)
        return get_workflow(name)(task=task, model=model)

    assert all(e.reward == 0.0 for e in await make("on_policy_distill_workflow").run_async())
    wf = make("on_policy_distill_math_workflow")
    assert wf.messages() == [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": "1+1?\nPlease reason step by step, and put your "
                                                         "final answer within \\boxed{}."}]
    assert wf.reward("so \\boxed{2}") == {"accuracy": 1.0} and wf.reward("3") == {"accuracy": 0.0}
    with pytest.raises(ValueError, match="workflow_args.temperature: 0.5: the teacher scores at temperature 1"):
        make("on_policy_distill_workflow", workflow_args={"temperature": 0.5})
    ev = get_workflow("async_math_eval_workflow")(task=Task(
        task_id="e/0", raw={"question": "1+1?", "answer": "2"}, workflow="math_eval_workflow",
        format={"response_key": "answer"}, rollout_args={"temperature": 0.0, "max_tokens": 4}), model=model)
    assert ev.messages() == wf.messages() and ev.rollout_args["temperature"] == 0.6 and ev.rollout_args["top_p"] == 0.8
    assert ev.reward("\\boxed{2}") == {"accuracy": 1.0}


async def _math(wf: Workflow):
    """The math workflow on ``wf``'s task and model (what the test workflows do after their trick)."""
    from roles.explorer.workflows.math import MathWorkflow

    inner = MathWorkflow(task=wf.task, model=wf.model)
    inner.repeat_times = wf.repeat_times
    return await inner.run_async()


@register_workflow("flaky_every_third")
class FlakyEveryThird(Workflow):
    """Raises on tasks 2, 5, 8, ...; otherwise the math workflow."""

    is_async = True

    async def run_async(self):
        if self.task.index % 3 == 2:
            raise RuntimeError(f"boom on {self.task.task_id}")
        return await _math(self)


@register_workflow("hangs_forever")
class Hangs(Workflow):
    is_async = True

    async def run_async(self):
        await asyncio.sleep(3600)


async def _explore_in_process(cfg, engine):
    from roles.explorer.core import Explorer, NoSync
    from roles.explorer.explore import explore
    from roles.runtime.role import connected_context

    async with connected_context(cfg, "explorer") as ctx:
        return await explore(Explorer(ctx, [engine], sync=NoSync()))


async def test_failing_workflow_is_counted_and_others_published(
    tmp_path, tiny_model, arith, hf_engine, nats_server
) -> None:
    from tests.conftest import nats_settings

    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url=nats_server.url,
                        batch_size=3, repeat_times=2,
                        extra={"buffer.explorer_input.default_workflow_type": "flaky_every_third",
                               "explorer.max_retry_times": 1})
    cfg = load(path)
    with structlog.testing.capture_logs() as logs:
        stats = await _explore_in_process(cfg, hf_engine)
    assert stats.steps == 2 and stats.published == 4
    assert sorted(t for t, _ in stats.failed) == ["arith/2", "arith/5"]
    assert all("boom on" in err for _, err in stats.failed)
    assert any(e["event"] == "workflow_failed" and e["task_id"] == "arith/2" and e["attempt"] == "2/2"
               for e in logs), logs
    groups = await read_groups(nats_settings(nats_server.url), cfg.run_id, expect=4)
    assert sorted(g.task_id for g in groups) == ["arith/0", "arith/1", "arith/3", "arith/4"]
    assert all(len(g.experiences) == 2 for g in groups)


async def test_hanging_workflow_times_out_and_explorer_goes_on(
    tmp_path, tiny_model, arith, hf_engine, nats_server
) -> None:
    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url=nats_server.url,
                        batch_size=6, extra={"buffer.explorer_input.default_workflow_type": "hangs_forever",
                                             "explorer.max_timeout": 1, "explorer.max_retry_times": 1})
    stats = await _explore_in_process(load(path), hf_engine)
    assert stats.steps == 1 and stats.published == 0 and len(stats.failed) == 6
    assert "timed out after 1s" in stats.failed[0][1]


def test_debug_workflow_writes_json(tmp_path, tiny_model, arith) -> None:
    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url="nats://127.0.0.1:1",
                        batch_size=2, repeat_times=2)
    out = tmp_path / "exps.json"
    r = subprocess.run([sys.executable, "-m", "roles.cli", "debug", "--config", str(path),
                        "--module", "workflow", "--output-file", str(out), "--dotenv", str(out) + ".x"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert len(data["experiences"]) == 4 and data["failures"] == []
    e = data["experiences"][0]
    assert len(e["logprobs"]) == len(e["tokens"]) - e["prompt_length"]
    assert e["task_id"] == "arith/0" and isinstance(e["reward"], float)
    assert np.isfinite(e["logprobs"]).all()


def test_debug_inference_model_serves_workflow_runs_from_another_terminal(tmp_path, tiny_model, arith, hf_model) -> None:
    """Trinity-RFT's debug flow: ``--module inference_model`` starts the model once; each
    ``--module workflow`` of the same config, from another process, finds it and samples there
    (exact token ids and log-probs), without loading the model itself."""
    import signal

    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url="nats://127.0.0.1:1",
                        batch_size=2, repeat_times=2, name="dbg", extra={"explorer.openai_api.port": 0})
    args = ["--config", str(path), "--dotenv", str(tmp_path / "no.env")]
    served = tmp_path / "ckpt" / "t" / "dbg" / "debug" / "inference_model.json"
    server = subprocess.Popen([sys.executable, "-m", "roles.cli", "debug", *args, "--module", "inference_model"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(1200):
            assert server.poll() is None, server.communicate()[0][-3000:]
            if served.exists():
                break
            time.sleep(0.1)
        assert oct(served.stat().st_mode & 0o777) == "0o600"  # it holds the API key
        for k in range(2):  # edit, rerun: the model stays up
            out = tmp_path / f"exps{k}.json"
            r = subprocess.run([sys.executable, "-m", "roles.cli", "debug", *args, "--module", "workflow",
                                "--output-file", str(out)], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-3000:]
            assert "using the inference model at http://" in r.stderr, r.stderr[-2000:]
            data = json.loads(out.read_text())
            assert len(data["experiences"]) == 4 and data["failures"] == []
            for e in data["experiences"]:
                ref = teacher_logprobs(hf_model, e["tokens"], e["prompt_length"])
                assert torch.allclose(ref, torch.tensor(e["logprobs"]), atol=1e-4)  # the served model's own
    finally:
        server.send_signal(signal.SIGINT)
        log = server.communicate(timeout=60)[0]
    assert server.returncode == 0, log[-3000:]
    assert "serving" in log and not served.exists()
    # without it, a workflow run loads its own engine again
    r = subprocess.run([sys.executable, "-m", "roles.cli", "debug", *args, "--module", "workflow",
                        "--output-file", str(tmp_path / "alone.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "using the inference model" not in r.stderr, r.stderr[-2000:]


@register_workflow("asks_the_judge")
class AsksTheJudge(Workflow):
    """The policy answers through its OpenAI client, auxiliary model 0 (a judge) through its own."""

    repeatable = False

    def run(self):
        policy = self.model.get_openai_client()
        judge = self.auxiliary_models[0].get_openai_client()
        q = [{"role": "user", "content": self.task.raw["question"]}]
        answer = policy.chat.completions.create(model=policy.models.list().data[0].id, messages=q, max_tokens=4)
        verdict = judge.chat.completions.create(model=judge.models.list().data[0].id, messages=q, max_tokens=2)
        exps = self.model.extract_experience_from_history()
        assert self.auxiliary_models[0].extract_experience_from_history() == []  # nothing recorded
        for e in exps:
            e.reward = float(bool(verdict.choices[0].message.content is not None))
            e.info["answer"] = answer.choices[0].message.content
        return exps


async def test_auxiliary_models_are_handles_and_openai_clients_and_score_as_a_teacher(
        tmp_path, tiny_model, arith) -> None:
    """``explorer.auxiliary_models`` become engines beside the rollout model: workflows get a
    handle each (chat, and an OpenAI client whose calls are never trained on), and a
    distilling algorithm's rollouts are scored by auxiliary model 0 (here the policy's own
    model, so the teacher's log-probs equal the sampled ones)."""
    from roles.explorer.debug import debug_workflow

    aux = [{"model_path": str(tiny_model), "engine_type": "transformers", "dtype": "float32"}]
    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url="nats://127.0.0.1:1",
                        batch_size=2, repeat_times=2,
                        extra={"explorer.auxiliary_models": aux,
                               "explorer.rollout_model.enable_openai_api": True,
                               "explorer.openai_api.port": 0,
                               "buffer.explorer_input.default_workflow_type": "asks_the_judge"})
    out = await debug_workflow(load(path))
    assert out["failures"] == [] and len(out["experiences"]) == 4
    assert all(e["teacher_logprobs"] is None for e in out["experiences"])  # grpo: no teacher
    path = write_config(tmp_path / "d.yaml", model=tiny_model, taskset=arith, nats_url="nats://127.0.0.1:1",
                        batch_size=2, repeat_times=2,
                        extra={"explorer.auxiliary_models": aux, "algorithm.algorithm_type": "on_policy_distill"})
    out = await debug_workflow(load(path))
    assert out["failures"] == [] and len(out["experiences"]) == 4
    for e in out["experiences"]:
        assert np.allclose(e["teacher_logprobs"], e["logprobs"], atol=1e-4)
    # without a teacher the config is refused, naming the field
    with pytest.raises(Exception, match="explorer.auxiliary_models: algorithm 'on_policy_distill'"):
        load(write_config(tmp_path / "e.yaml", model=tiny_model, taskset=arith, nats_url="nats://127.0.0.1:1",
                          extra={"algorithm.algorithm_type": "on_policy_distill"}))


@register_workflow("slow_second_task")
class SlowSecond(Workflow):
    """Task 1 hangs; the others are the math workflow."""

    is_async = True

    async def run_async(self):
        if self.task.index == 1:
            await asyncio.sleep(3600)
        return await _math(self)


async def test_stop_abandons_the_step_without_half_groups_or_cursor_move(
    tmp_path, tiny_model, arith, hf_engine, nats_server
) -> None:
    """What SIGTERM does (its handler sets ``stop``): the step in flight gets a grace period,
    then is abandoned; finished groups are whole, the cursor stays before the step and holds
    the step's tasks, which a restart runs again (the finished groups de-duplicate)."""
    from roles.explorer.core import CURSOR_KEY, Explorer, NoSync
    from roles.explorer.explore import explore
    from roles.runtime.role import connected_context

    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url=nats_server.url,
                        batch_size=3, repeat_times=2,
                        extra={"buffer.explorer_input.default_workflow_type": "slow_second_task"})
    cfg = load(path)
    async with connected_context(cfg, "explorer") as ctx:
        ex = Explorer(ctx, [hf_engine], sync=NoSync(), shutdown_grace=0.5)
        run = asyncio.create_task(explore(ex))
        while ex.stats.published < 2:  # tasks 0 and 2 finish, task 1 hangs
            await asyncio.sleep(0.1)
        ctx.stop.set()
        stats = await asyncio.wait_for(run, 60)
        assert stats.interrupted and stats.steps == 0 and stats.published == 2
        cursor = await ctx.state.get(CURSOR_KEY)
        assert cursor.step == 0 and cursor.batch == [["arith", i, 0, i] for i in range(3)]
        hb = (await ctx.state.heartbeats())["explorer"]
        assert hb["state"] == "stopped"
    groups = await read_groups(cfg.nats, cfg.run_id, expect=2, timeout=3)
    assert sorted(g.task_id for g in groups) == ["arith/0", "arith/2"]
    assert all(len(g.experiences) == 2 for g in groups)


@register_workflow("slow_task_one")
class SlowTaskOne(Workflow):
    """Task 1 takes 3 s more than the others; then the math workflow."""

    is_async = True

    async def run_async(self):
        if self.task.index == 1:
            await asyncio.sleep(3)
        if self.task.index == 4:
            await asyncio.sleep(float(os.environ.get("TEST_TASK4_SLEEP", "0")))
        return await _math(self)


def test_dynamic_timeout_and_over_rollout_minimum() -> None:
    from roles.explorer.explore import over_rollout_minimum
    from roles.explorer.runner import dynamic_timeout

    assert dynamic_timeout(600, [], 3.0) == 600
    assert dynamic_timeout(600, [1.0, 3.0], 3.0) == 6.0 and dynamic_timeout(5, [10.0], 3.0) == 5
    cfg = load_from_dict({"explorer": {"over_rollout": {"ratio": 0.5}},
                          "synchronizer": {"sync_style": "explorer_driven"}})
    assert over_rollout_minimum(8, cfg) == 4 and over_rollout_minimum(3, cfg) == 2
    assert over_rollout_minimum(8, cfg.model_copy(update={"synchronizer": cfg.synchronizer.model_copy(
        update={"sync_style": "fixed"})})) == 8


def load_from_dict(d):
    from schemas.config import TrinityConfig

    return TrinityConfig.model_validate(d)


async def test_over_rollout_goes_on_without_the_slow_task_and_publishes_it_later(
    tmp_path, tiny_model, arith, hf_engine, nats_server
) -> None:
    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url=nats_server.url,
                        batch_size=3, repeat_times=2,
                        extra={"buffer.explorer_input.default_workflow_type": "slow_task_one",
                               "synchronizer.sync_style": "explorer_driven",
                               "explorer.over_rollout": {"ratio": 0.34, "wait_after_min": 0.2},
                               "explorer.runner_state_report_interval": 1})
    cfg = load(path)
    with structlog.testing.capture_logs() as logs:
        stats = await _explore_in_process(cfg, hf_engine)
    # step 1 went on with tasks 0 and 2; task 1 was published later, before "finished"
    assert stats.steps == 2 and stats.published == 6 and not stats.failed
    went_on = [e for e in logs if e["event"] == "over_rollout_goes_on"]
    assert went_on and {k: went_on[0][k] for k in ("step", "done", "tasks", "still_running")} == {
        "step": 1, "done": 2, "tasks": 3, "still_running": 1}, logs
    assert any(e["event"] == "runners" and "arith/1" in (e["longest"] or "") for e in logs), logs
    groups = await read_groups(cfg.nats, cfg.run_id, expect=6)
    assert sorted(g.task_id for g in groups) == [f"arith/{i}" for i in range(6)]


async def test_dynamic_timeout_cuts_a_task_far_slower_than_the_others(
    tmp_path, tiny_model, arith, hf_engine, nats_server, monkeypatch
) -> None:
    monkeypatch.setenv("TEST_TASK4_SLEEP", "600")
    path = write_config(tmp_path / "c.yaml", model=tiny_model, taskset=arith, nats_url=nats_server.url,
                        batch_size=3, repeat_times=2,
                        extra={"buffer.explorer_input.default_workflow_type": "slow_task_one",
                               "explorer.max_timeout": 900, "explorer.max_retry_times": 0,
                               "explorer.dynamic_timeout": {"enable": True, "ratio": 3.0, "warmup_min_steps": 1}})
    stats = await asyncio.wait_for(_explore_in_process(load(path), hf_engine), 300)
    assert stats.steps == 2 and stats.published == 5
    assert [t for t, _ in stats.failed] == ["arith/4"] and "(dynamic_timeout)" in stats.failed[0][1]
