"""math_ruler_workflow: upstream's judge prompt, score parsing and rewards, on the real
transformers engine (the tiny random model as policy and judge)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from roles.explorer.workflows.base import ModelHandle
from roles.explorer.workflows.registry import get_workflow
from roles.explorer.workflows.ruler import judge_messages, judge_scores
from schemas.config import InferenceModelConfig
from schemas.data import Task


def test_the_judge_ends_with_a_list_of_scores_each_clipped() -> None:
    assert judge_scores("think... [0.5, 1.2, -1]", 3) == [0.5, 1.0, 0.0]
    assert judge_scores("first [1, 0] then [0.25, 0.75]", 2) == [0.25, 0.75]  # the last list
    assert judge_scores("[0.5, 1]", 3) is None  # wrong length
    assert judge_scores("no list", 2) is None and judge_scores("[a, b]", 2) is None and judge_scores("] [", 1) is None


def test_the_judge_prompt_is_upstreams() -> None:
    system, user = judge_messages("1+1?", ["2", "3"])
    assert system["content"].startswith("You are a fair judge. The user will provide a question and 2 candidate")
    assert "\nQuestion: 1+1?\n\nSolution format requirement:" in user["content"]
    assert "Candidate solution 1: 2\n\nCandidate solution 2: 3\n" in user["content"]
    assert user["content"].endswith("..., score for solution 2]\n")


async def test_rollouts_are_rewarded_by_the_judge_and_keep_their_gold_reward(tiny_model: Path) -> None:
    from roles.explorer.engines.hf import HFEngine

    engine = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                           dtype="float32", max_model_len=2048, seed=0))
    loop = asyncio.get_running_loop()
    task = Task(task_id="r/0", raw={"prompt": "1+1?", "response": "2"}, workflow="math_ruler_workflow",
                repeat_times=2, rollout_args={"max_tokens": 4})
    judge = ModelHandle(engine, loop, {"max_tokens": 8})
    wf = get_workflow("async_math_ruler_workflow")(task=task, model=ModelHandle(engine, loop), auxiliary_models=[judge])
    exps = await wf.run_async()
    assert len(exps) == 2
    for e in exps:  # the random judge writes no list: rewards 0, and says so
        assert e.reward == 0.0 and e.info["judge_success"] == 0.0 and "gold_reward" in e.info


def test_a_judged_workflow_without_a_judge_is_refused(tmp_path) -> None:
    from roles.launch.checks import check_names
    from schemas.loader import load_config

    data = tmp_path / "d"
    data.mkdir()
    (data / "train.jsonl").write_text('{"prompt": "1+1?", "response": "2"}\n')
    cfg = load_config(None, [f"buffer.explorer_input.taskset.path={data}", "buffer.explorer_input.taskset.name=t",
                             "buffer.explorer_input.default_workflow_type=math_ruler_workflow",
                             "model.model_path=/m"]).config
    problems = check_names(cfg, "", frozenset({"explorer"}))
    assert any("explorer.auxiliary_models: workflow 'math_ruler_workflow' (taskset) asks auxiliary model 0 to judge"
               in p for p in problems), problems


def test_the_rubric_judges_rating_is_read_as_upstream_reads_it() -> None:
    from roles.explorer.workflows.rubric import rubric_judge_messages, rubric_rating

    assert rubric_rating('```json\n{"rating": 7}\n```') == 0.7000000000000001  # rating * 0.1, as upstream
    assert rubric_rating('thoughts ```{"rating": 10}``` more') == 1.0
    for bad in ('```json {"rating": 11} ```', '```json {"rating": "7"} ```', '{"rating": 7}', '```json [7] ```',
                '```json {"rating": 7}', '```json {"rating": true} ```'):
        assert rubric_rating(bad) is None, bad
    _, user = rubric_judge_messages("Q?", "A.", [{"weight": 2, "description": "is short"}])
    assert "<prompt>\nQ?\n</prompt>\n<response>\nA.\n</response>\n<rubrics>\nRubric 0 (weight: 2): is short\n" \
           "</rubrics>\nYour JSON Evaluation:" in user["content"]
    assert "Rubrics are not provided." in rubric_judge_messages("Q?", "A.", [])[1]["content"]


async def test_rubric_rollouts_are_rewarded_by_the_judge(tiny_model: Path) -> None:
    from roles.explorer.engines.hf import HFEngine

    engine = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                           dtype="float32", max_model_len=2048, seed=0))
    loop = asyncio.get_running_loop()
    task = Task(task_id="r/1", raw={"prompt": "Say hi", "rubric": [{"weight": 1, "description": "greets"}]},
                workflow="rubric_judge_workflow", repeat_times=2, rollout_args={"max_tokens": 4})
    wf = get_workflow("rubric_judge_workflow")(task=task, model=ModelHandle(engine, loop),
                                               auxiliary_models=[ModelHandle(engine, loop, {"max_tokens": 8})])
    assert wf.messages()[0]["content"].startswith("A conversation between User and Assistant.")
    exps = await wf.run_async()
    assert [e.reward for e in exps] == [0.0, 0.0] and all(e.info["judge_success"] == 0.0 for e in exps)


def test_the_trainable_judge_is_rewarded_by_its_distance_to_the_gold_rewards() -> None:
    """By hand: gold rewards 1.1 (right, formatted) and -0.1 map to 1 and 0; scores 0.8 and 0.4
    are off by 0.2 and 0.4, so the reply earns 1 - 0.3 = 0.7; no list earns 0."""
    from roles.explorer.workflows.ruler import judge_reward

    assert abs(judge_reward([0.8, 0.4], [1.1, -0.1]) - 0.7) < 1e-9
    assert judge_reward(None, [1.0]) == 0.0
    system, user = judge_messages("1+1?", ["2", "3"], sep="\n")
    assert system["content"] == judge_messages("1+1?", ["2", "3"])[0]["content"]
    assert user["content"].startswith("\nBelow is a question and several candidate solutions.\nQuestion: 1+1?\n\n")
    assert "</answer>.\nCandidate solution 1: 2\n\nCandidate solution 2: 3\nPlease assign" in user["content"]


async def test_trainable_ruler_returns_its_judge_replies_as_their_own_subgroup(tiny_model: Path) -> None:
    """With the ground truth (share 1): the answers keep their gold reward, the policy judges
    them repeat_times times, and those replies come back as the group's "ruler" part, whose
    GRPO baseline is each other's; without it (share 0): one judge reply, its scores are the
    rewards (the random tiny model writes no list: 0)."""
    from ops.algorithms import resolve
    from roles.buffer.pipeline import group_advantages
    from roles.explorer.engines.hf import HFEngine
    from schemas.data import ExperienceGroup

    engine = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                           dtype="float32", max_model_len=2048, seed=0))
    loop = asyncio.get_running_loop()

    def workflow(share: float):
        task = Task(task_id="t/0", raw={"prompt": "1+1?", "response": "2"}, workflow="math_trainable_ruler_workflow",
                    repeat_times=2, rollout_args={"max_tokens": 4}, workflow_args={"ground_truth_share": share})
        return get_workflow("math_trainable_ruler_workflow")(task=task, model=ModelHandle(engine, loop))

    exps = await workflow(1.0).run_async()
    answers, judges = exps[:2], exps[2:]
    assert len(judges) == 2 and all(j.info["subgroup"] == "ruler" and j.reward == 0.0 for j in judges)
    assert all(e.reward == e.info["gold_reward"] and "subgroup" not in e.info for e in answers)
    for i, e in enumerate(exps):
        e.id, e.group_id = f"g/{i}", "g"
    answers[0].reward, judges[0].reward = 1.0, 0.5  # one right answer; one judge reply closer than the other
    g = group_advantages(ExperienceGroup(group_id="g", task_id="t/0", run_id="r", experiences=exps), resolve("grpo"))
    adv = [float(e.advantages[0]) for e in g.experiences]
    assert adv[0] > 0 > adv[1] and adv[2] > 0 > adv[3]  # each part against its own kind
    assert abs(adv[0] + adv[1]) < 1e-6 and abs(adv[2] + adv[3]) < 1e-6
    exps = await workflow(0.0).run_async()
    assert len(exps) == 2 and all(e.reward == 0.0 and e.info["judge_success"] == 0.0 for e in exps)


async def test_the_rubric_judge_can_be_an_openai_compatible_api(tiny_model: Path, monkeypatch) -> None:
    """rubric_judge_openai_workflow asks the API its workflow_args name (here trinity's own
    server over the tiny model, through the real openai client) and reads the rating as the
    auxiliary-model judge does; a missing model name or base URL is refused naming it."""
    import pytest

    from roles.explorer.api import ApiServer
    from roles.explorer.engines.hf import HFEngine
    from schemas.config import OpenAIApiConfig

    engine = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                           dtype="float32", max_model_len=2048, seed=0), "hf-0")
    # the judge replies until max_model_len (the random model writes no EOS): a short one
    judge_engine = HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                                 dtype="float32", max_model_len=1100, seed=0), "hf-1")
    server = ApiServer(OpenAIApiConfig(port=0), [judge_engine], "tiny", "run", None)
    await server.start()
    loop = asyncio.get_running_loop()
    try:
        monkeypatch.setenv("JUDGE_URL", f"{server.url}/v1")

        def workflow(**args):
            task = Task(task_id="r/2", raw={"prompt": "Say hi", "rubric": [{"weight": 1, "description": "greets"}]},
                        workflow="rubric_judge_openai_workflow", repeat_times=2, rollout_args={"max_tokens": 4},
                        workflow_args=args)
            return get_workflow("rubric_judge_openai_workflow")(task=task, model=ModelHandle(engine, loop))

        wf = workflow(judge_model_name="tiny", judge_api_base_url_env="JUDGE_URL")
        assert wf.auxiliary_required == 0
        exps = await wf.run_async()
        assert [e.reward for e in exps] == [0.0, 0.0] and all(e.info["judge_success"] == 0.0 for e in exps)
        with pytest.raises(ValueError, match="workflow_args.judge_model_name: missing"):
            workflow(judge_api_base_url_env="JUDGE_URL")
        with pytest.raises(ValueError, match="workflow_args.judge_api_base_url_env: environment variable NO_SUCH_URL is not set"):
            workflow(judge_model_name="tiny", judge_api_base_url_env="NO_SUCH_URL")
    finally:
        await server.stop()
