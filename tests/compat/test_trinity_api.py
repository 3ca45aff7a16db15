"""``trinity``: Trinity-RFT's plugin API. A workflow and a reward written as upstream's guides
show (``tests/compat/plugins``) run in our runner on a real engine, then train through real
processes; a plugin that registers a taken name, or returns what is not a list of
experiences, is refused naming its file and class."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from roles.explorer.workflows import get_workflow
from roles.explorer.workflows.base import ModelHandle
from roles.runtime.plugins import PluginError, load_plugin_dirs
from schemas.config import InferenceModelConfig
from schemas.data import Experience as OurExperience
from schemas.data import Task

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(autouse=True, scope="module")
def plugins():
    """The plugins registered for this module's tests, and gone after (other modules in the
    same worker see the built-in names only)."""
    from ops.algorithms import ALGORITHM_DEFAULTS
    from ops.registry import KINDS, parts
    from roles.buffer.pipeline import OPERATORS
    from roles.explorer.workflows.registry import WORKFLOWS

    maps = [WORKFLOWS, ALGORITHM_DEFAULTS, OPERATORS, *(parts(k) for k in KINDS)]
    before = set(sys.modules), [dict(m) for m in maps]
    load_plugin_dirs([str(PLUGINS)])
    yield
    for name in set(sys.modules) - before[0]:
        if name.startswith("trinity_plugin_"):
            del sys.modules[name]
    for now, then in zip(maps, before[1], strict=True):
        now.clear()
        now.update(then)


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    from roles.explorer.engines.hf import HFEngine

    return HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers", dtype="float32",
                                         max_model_len=512, max_response_tokens=8, seed=0))


def _task(workflow: str, reward: str | None = "digit_match_reward", fmt: dict | None = None, **kw) -> Task:
    return Task(task_id="arith/0", raw={"question": "2+2", "answer": "4"}, workflow=workflow, reward_fn=reward,
                rollout_args={"temperature": 1.0}, repeat_times=3,
                format={"prompt_key": "question", "response_key": "answer", "system_prompt": "", **(fmt or {})}, **kw)


async def _run(workflow: str, engine, **kw) -> list[OurExperience]:
    wf = get_workflow(workflow)(task=_task(workflow, **kw), model=ModelHandle(engine, asyncio.get_running_loop()))
    wf.repeat_times = 3
    return await (wf.run_async() if wf.is_async else asyncio.to_thread(wf.run))


async def test_the_guides_workflow_runs_in_our_runner_with_its_registered_reward(engine):
    exps = await _run("example_workflow", engine, reward_fn_args={"partial": 0.25})
    assert len(exps) == 3 and all(isinstance(e, OurExperience) for e in exps)  # one chat call, n=3
    for e in exps:
        e.validate()
        assert e.response_length > 0 and len(e.logprobs) == e.response_length
        assert e.reward in (0.0, 0.25, 1.0)  # the registered class's scores, with reward_fn_args
        assert e.action_mask is not None and e.action_mask.all()  # single-turn: every token trained


async def test_a_registered_reward_class_is_one_of_ours_and_ours_are_classes_there(engine):
    from trinity.common.rewards import REWARD_FUNCTIONS

    from ops.registry import get
    from ops.rewards import call_reward

    ours = get("reward_fn", "digit_match_reward")  # what math_workflow and the config check find
    assert call_reward(ours, "it is 4", "4") == {"digit_match": 1.0}
    assert call_reward(ours, "five", "4", options={"partial": 0.5}) == {"digit_match": 0.0}
    acc = REWARD_FUNCTIONS.get("accuracy_reward")()  # a built-in, as upstream's code calls one
    assert acc(response="<answer>4</answer>", truth="4") == {"accuracy": 1.0}
    assert REWARD_FUNCTIONS.get("digit_match_reward").__name__ == "DigitMatchReward"
    exps = await _run("math_workflow", engine)  # our built-in workflow, the plugin's reward
    assert {k for e in exps for k in e.info} >= {"digit_match"}


def test_the_guides_algorithm_resolves_and_computes_its_own_formulas():
    """OPMD as the algorithm guide writes it: the mean baseline per task, the loss
    ``-A * logprob`` averaged over tokens, divided by ``1 + tau``; a misspelt argument is refused."""
    import torch

    from ops.algorithms import resolve
    from ops.registry import get

    spec = resolve("my_opmd", policy_loss_fn_args={"tau": 0.5})
    assert (spec.advantage_fn, spec.policy_loss_fn, spec.sample_strategy) == ("my_opmd", "my_opmd", "warmup")
    assert spec.use_reference and not spec.use_critic
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    out = get("advantage_fn", "my_opmd")(action_mask=mask, rewards=torch.tensor([1.0, 0.0, 1.0, 0.5]),
                                         group_ids=["a", "a", "b", "b"])
    want = torch.tensor([0.5, -0.5, 0.25, -0.25])[:, None] * mask  # reward - its task's mean
    assert torch.allclose(out.advantages, want) and out.keep.all()
    assert out.metrics == {"group_advantages/group_baseline/mean": pytest.approx((0.5 + 0.75) / 2)}
    logprob = torch.log(torch.tensor([[0.5, 0.25, 1.0], [0.5, 0.5, 0.5], [0.1, 1.0, 1.0], [0.2, 0.2, 0.2]]))
    loss, metrics = get("policy_loss_fn", "my_opmd")(logprob, logprob, out.advantages, mask.float(),
                                                    **spec.policy_loss_fn_args)
    by_hand = (-(want * logprob))[mask].mean() / 1.5
    assert torch.allclose(loss, by_hand) and metrics["opmd_loss"] == pytest.approx(float(by_hand))
    with pytest.raises(ValueError, match="'my_opmd' has no argument.s. tua; valid names: tau"):
        resolve("my_opmd", policy_loss_fn_args={"tua": 0.5})


def test_an_experience_operator_runs_in_the_buffers_pipeline(tmp_path):
    import numpy as np

    from roles.buffer.pipeline import Pipeline
    from schemas.config import OperatorConfig
    from schemas.data import ExperienceGroup

    (tmp_path / "ops_plugin.py").write_text(
        "from trinity.buffer.operators import EXPERIENCE_OPERATORS, ExperienceOperator\n\n"
        "@EXPERIENCE_OPERATORS.register_module('scale_and_drop_zero')\nclass Scale(ExperienceOperator):\n"
        "    def __init__(self, factor: float = 0.5):\n        self.factor = factor\n"
        "    def process(self, exps):\n"
        "        for e in exps:\n            e.reward = e.reward * self.factor\n            e.metrics['scaled'] = 1.0\n"
        "        return [e for e in exps if e.reward != 0], {'seen': len(exps)}\n")
    load_plugin_dirs([str(tmp_path)])
    exps = [OurExperience(id=f"e{i}", task_id="t", group_id="g", run_id="r", tokens=np.arange(5, dtype=np.int32),
                          prompt_length=2, reward=float(i)) for i in range(3)]
    pipe = Pipeline.from_config([OperatorConfig(name="scale_and_drop_zero", args={"factor": 2.0})], None)
    out, _ = pipe.run(ExperienceGroup(group_id="g", task_id="t", run_id="r", experiences=exps))
    assert [(e.id, e.reward, e.info["scaled"]) for e in out.experiences] == [("e1", 2.0, 1.0), ("e2", 4.0, 1.0)]
    assert out.metrics["scale_and_drop_zero/seen"] == 3.0
    with pytest.raises(ValueError, match=r"operators\[0\] \(scale_and_drop_zero\).args: .*'fator'"):
        Pipeline.from_config([OperatorConfig(name="scale_and_drop_zero", args={"fator": 2.0})], None)
    from trinity.buffer.operators import EXPERIENCE_OPERATORS, ExperienceOperatorV1

    class Async(ExperienceOperatorV1):
        pass

    with pytest.raises(TypeError, match="ExperienceOperatorV1 .* no adapter here yet"):
        EXPERIENCE_OPERATORS.register_module("async_op", Async)


def test_names_without_an_adapter_say_what_to_use():
    with pytest.raises(ImportError, match=r"KL_FN: .*ops.registry.register\('kl_fn'"):
        from trinity.algorithm import KL_FN  # noqa: F401
    with pytest.raises(ImportError, match="MathEvalWorkflow: upstream's class is not here to subclass; name it in a config as 'math_eval_workflow'"):
        from trinity.common.workflows import MathEvalWorkflow  # noqa: F401
    from trinity.algorithm import ALGORITHM_TYPE, AlgorithmType

    class Critic(AlgorithmType):
        use_critic = True

        @classmethod
        def default_config(cls):
            return {"advantage_fn": "grpo"}

    with pytest.raises(ValueError, match="use_critic=True, but here a critic is trained exactly when"):
        ALGORITHM_TYPE.register_module("critic_grpo", Critic)


async def test_a_subclass_of_upstreams_built_in_workflow_keeps_its_hooks(engine, tmp_path):
    """Plugins such as upstream's BOTS and learn-to-ask subclass its built-in workflows and
    override ``reset``/``format_messages``: those hooks run, with our prompts and rewards."""
    (tmp_path / "boxed_plugin.py").write_text(
        "from trinity.common.workflows import WORKFLOWS\n"
        "from trinity.common.workflows.customized_math_workflows import MathBoxedWorkflow, Task\n\n"
        "@WORKFLOWS.register_module('prefixed_boxed')\nclass Prefixed(MathBoxedWorkflow):\n"
        "    def reset(self, task: Task):\n        super().reset(task)\n"
        "        self.task_desc = 'Compute: ' + self.task_desc\n")
    load_plugin_dirs([str(tmp_path)])
    exps = await _run("prefixed_boxed", engine, reward=None, workflow_args={"with_think": True},
                      fmt={"system_prompt": None})  # none set: the workflow's own
    assert len(exps) == 3
    for e in exps:
        assert "Compute: 2+2" in e.prompt_text and "You are a helpful assistant that solves MATH" in e.prompt_text
        assert {"accuracy", "format_score"} <= set(e.info), e.info  # math_boxed_reward's, with_think on
        assert e.reward == pytest.approx(e.info["accuracy"] + e.info["format_score"])


def test_a_taken_name_is_refused_naming_the_file_and_both_classes(tmp_path):
    (tmp_path / "dup.py").write_text(
        "from trinity.common.workflows import WORKFLOWS, Workflow\n\n"
        "@WORKFLOWS.register_module('math_workflow')\nclass Mine(Workflow):\n    pass\n")
    with pytest.raises(PluginError) as e:
        load_plugin_dirs([str(tmp_path)])
    msg = str(e.value)
    assert "dup.py" in msg and "'math_workflow' is already registered" in msg and "MathWorkflow" in msg and "Mine" in msg
    from trinity.common.workflows import WORKFLOWS

    with pytest.raises(TypeError, match="not a Workflow subclass"):
        WORKFLOWS.register_module("not_a_workflow", object)


async def test_what_is_not_a_list_of_experiences_is_refused_naming_the_class(engine, tmp_path):
    (tmp_path / "bad_returns.py").write_text(
        "from trinity.common.workflows import WORKFLOWS, Workflow\n\n"
        "@WORKFLOWS.register_module('returns_a_dict')\nclass ReturnsADict(Workflow):\n"
        "    def run(self):\n        return {'reward': 1.0}\n\n"
        "@WORKFLOWS.register_module('returns_text')\nclass ReturnsText(Workflow):\n"
        "    def run(self):\n        return self.model.chat([{'role': 'user', 'content': 'hi'}]) + ['oops']\n")
    load_plugin_dirs([str(tmp_path)])
    with pytest.raises(TypeError) as e:
        await _run("returns_a_dict", engine)
    assert "ReturnsADict in" in str(e.value) and "bad_returns.py" in str(e.value) and "not a list" in str(e.value)
    with pytest.raises(TypeError) as e:
        await _run("returns_text", engine)
    assert "ReturnsText in" in str(e.value) and "experience 1" in str(e.value) and "returned str" in str(e.value)


#: Trinity-RFT's FAQ ("What's the purpose of buffer.trainer_input.experience_buffer.path?"),
#: as it is written there; the test puts the run's URL where it names the config key
FAQ_SCRIPT = """
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool
from trinity.common.schema.sql_schema import ExperienceModel

engine = create_engine(buffer.trainer_input.experience_buffer.path)
session = sessionmaker(bind=engine)
sess = session()

MAX_EXPERIENCES = 4
experiences = (
    sess.query(ExperienceModel)
    .limit(MAX_EXPERIENCES)
    .all()
)

exp_list = []
for exp in experiences:
    exp_list.append(ExperienceModel.to_experience(exp))

# Print the experiences
for exp in exp_list:
    print(f"{exp.prompt_text=}", f"{exp.response_text=}")
"""


@pytest.mark.slow
def test_the_guides_plugin_trains_through_real_processes_and_the_faqs_sql_script_reads_it(
        tmp_path, tiny_model, arith, nats_server):
    from tests.run.helpers import tiny_run_config, trained_exactly_once, trinity

    url = f"sqlite:///{tmp_path / 'experiences.db'}"
    # the worker's one server is shared: a run name no other test on it uses (tests/run/test_modes.py has t/r)
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=0, stages=False, name="plugin", extra={
        "nats.url": nats_server.url, "nats.embedded": False, "buffer.total_steps": 2,
        "algorithm.algorithm_type": "my_opmd",  # the guide's OPMD: its advantage, loss and defaults
        "buffer.explorer_input.default_workflow_type": "example_workflow",
        "buffer.explorer_input.default_reward_fn_type": "digit_match_reward",
        "buffer.explorer_input.taskset.reward_fn_args": {"partial": 0.1},
        "buffer.trainer_input.experience_buffer": {"name": "exp", "storage_type": "sql", "path": url}})
    log = tmp_path / "run.log"
    p = trinity("run", "--config", str(cfg), log=log, env_extra={"TRINITY_PLUGIN_DIRS": str(PLUGINS)})
    assert p.wait(600) == 0, log.read_text()[-4000:]
    job = tmp_path / "ckpt" / "t" / "plugin"
    trained_exactly_once(job, 2, 12)  # batch 3 x repeat 4
    meta = json.loads((job / "explorer_meta.json").read_text())  # the seeds' layout
    assert meta["latest_iteration"] == 2 and "taskset_states" in meta
    rollouts = [json.loads(line) for line in (job / "monitor" / "metrics.jsonl").read_text().splitlines()]
    train = [r["values"] for r in rollouts if r["kind"] == "train"]
    assert len(train) == 2 and all("opmd_loss" in v and "advantage/group_advantages/group_baseline/mean" in v
                                   for v in train), train  # the plugin's loss and advantage trained it
    # every experience the buffer stored is in the database; the FAQ's script prints four
    script = FAQ_SCRIPT.replace("buffer.trainer_input.experience_buffer.path", repr(url))
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("exp.prompt_text='") and "exp.response_text='" in line
                                   for line in lines), out.stdout
    assert any(q in out.stdout for q in (json.loads(r)["question"] for r in (arith / "train.jsonl").read_text().splitlines()))
    import sqlite3

    with sqlite3.connect(tmp_path / "experiences.db") as db:
        assert db.execute("select count(*), count(distinct msg_id) from experience_buffer").fetchone() == (24, 24)
        # the guide's Experience(...) carries no version: the adapter gave each the weights that sampled it
        assert db.execute("select model_version, count(*) from experience_buffer group by 1").fetchall() == [(0, 12), (1, 12)]


#: A workflow shaped as Trinity-RFT's learn-to-ask example is (examples/learn_to_ask): in the
#: user's own ``examples/`` folder, named in the config by dotted path from the folder it runs
#: in, a SimpleWorkflow that needs one auxiliary model and asks it through an OpenAI client
#: with ``model=client.model_path``
JUDGED = '''
from trinity.common.workflows.workflow import SimpleWorkflow, Task


class JudgedWorkflow(SimpleWorkflow):
    def __init__(self, *, task: Task, model, auxiliary_models=None):
        assert auxiliary_models is not None and len(auxiliary_models) == 1, "one judge"
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    def reset(self, task: Task):  # its own, without super(): no reward class, reward_fn is a method
        self.task_desc = task.task_desc

    def reward_fn(self, response):
        client = self.auxiliary_models[0]
        judged = client.chat.completions.create(
            model=client.model_path, messages=[{"role": "user", "content": "Judge: " + response}], max_tokens=4)
        return float(len(judged.choices[0].message.content or "") > 0)

    def run(self):
        responses = self.model.chat([{"role": "user", "content": self.task_desc}], **self.rollout_args)
        for r in responses:
            r.reward = self.reward_fn(r.response_text)
            r.info["judge_model"] = self.auxiliary_models[0].model_path
        return responses
'''


async def test_an_upstream_style_workflow_by_dotted_path_asks_its_judge_model(engine, tmp_path, monkeypatch):
    from roles.explorer.api import ApiServer
    from roles.runtime.plugins import importable_working_dir
    from schemas.config import OpenAIApiConfig
    from tests.api.conftest import Published

    (tmp_path / "examples" / "judged").mkdir(parents=True)
    (tmp_path / "examples" / "judged" / "workflow.py").write_text(JUDGED)
    monkeypatch.chdir(tmp_path)
    # as in the user's folder: this repository's own examples package out of sight
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", repo, str(tmp_path))])
    monkeypatch.delitem(sys.modules, "examples", raising=False)
    importable_working_dir()  # what every entry point does before it reads a config
    name = "examples.judged.workflow.JudgedWorkflow"
    judge = ApiServer(OpenAIApiConfig(port=0), [engine], "judge", "run", Published())
    await judge.start()
    try:
        loop = asyncio.get_running_loop()
        wf = get_workflow(name)(task=_task(name, reward=None), model=ModelHandle(engine, loop),
                                auxiliary_models=[ModelHandle(engine, loop, api=judge)])
        wf.repeat_times = 3
        exps = await asyncio.to_thread(wf.run)
    finally:
        await judge.stop()
        for mod in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
            del sys.modules[mod]  # the user's: this repository's own comes back on next import
    assert len(exps) == 3 and all(e.reward == 1.0 for e in exps), [e.reward for e in exps]
    assert {e.info["judge_model"] for e in exps} == {"judge"}  # the name its API serves
