"""Trinity-RFT's ``math_ruler_workflow``: the rollouts of a math question are scored against each
other by a judge model (RULER, after OpenPipe's ART), not by a rule; and
``math_trainable_ruler_workflow``, where the judge is the policy itself, trained to judge.

Faithful to upstream's (``math_ruler_workflow.py``): the policy answers as in ``math_workflow``
(its system prompt; ``math_reward`` still scores each answer, kept as ``info`` with
``gold_reward``, what evaluation reports); auxiliary model 0 gets upstream's judge prompt (the
question, the answer format, every candidate) and must end its reply with a list of scores; each
is clipped to [0, 1] and is that rollout's reward. A reply without a list of the right length
gives every rollout 0 and ``judge_success`` 0.
"""

from __future__ import annotations

import ast
import random
from typing import Any

from roles.explorer.workflows.math import MathWorkflow
from schemas.data import Experience

ANSWER_FORMAT = (
    "Solution format requirement: first think about the reasoning process in the mind and then provides the "
    "final answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e.,\n<think> reasoning process here </think>\n<answer> answer here </answer>."
)


def judge_messages(question: str, answers: list[str], sep: str = "\n\n") -> list[dict[str, Any]]:
    """Upstream's RULER prompt for ``answers`` to ``question``. Its paragraphs are joined with
    ``sep``: a blank line in ``math_ruler_workflow``'s, a line break in the trainable one's."""
    n = len(answers)
    system = (f"You are a fair judge. The user will provide a question and {n} candidate solutions to it. Your "
              "task is to compare the solutions, see how well they resolve the question, and assign a score "
              "within the range [0, 1] for each solution.")
    parts = [
        "Below is a question and several candidate solutions.",
        f"Question: {question}\n\n{ANSWER_FORMAT}",
        "\n\n".join(f"Candidate solution {i + 1}: {a}" for i, a in enumerate(answers)),
        "Please assign a score within the range [0, 1] for each of them, reflecting how well they solve the "
        "question.\nYou may compare them against each other and think step by step before returning your final "
        "scores, but keep your reasoning process brief and concise when possible.",
        "Conclude your response with a list of scores, in the following format: [score for solution 1, score for "
        f"solution 2, ..., score for solution {n}]",
    ]
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n" + sep.join(parts) + "\n"}]


def judge_scores(reply: str, n: int) -> list[float] | None:
    """The last ``[...]`` of the judge's reply as ``n`` scores clipped to [0, 1]; None when it
    holds no such list."""
    start, end = reply.rfind("["), reply.rfind("]")
    if start == -1 or end == -1 or start > end:
        return None
    try:
        scores = [max(0.0, min(1.0, float(s))) for s in ast.literal_eval(reply[start:end + 1])]
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return scores if len(scores) == n else None


class MathRULERWorkflow(MathWorkflow):
    """The rollouts of one question, rewarded by the judge (see the module's docstring)."""

    auxiliary_required = 1  # auxiliary model 0 is the judge

    async def run_async(self) -> list[Experience]:
        messages = self.messages()
        exps = await self.model.achat(messages, n=self.repeat_times, **self.rollout_args)
        for e in self.score(exps):
            e.info["gold_reward"] = e.reward
        question = messages[-1]["content"]
        answers = [e.response_text or "" for e in exps]
        [reply] = await self.auxiliary_models[0].achat(judge_messages(question, answers), n=1)
        scores = judge_scores(reply.response_text or "", len(exps))
        if scores is None:
            self.logger.warning("task %s: no list of %d scores in the judge's reply: rewards 0",
                                self.task.task_id, len(exps))
        for e, s in zip(exps, scores or [0.0] * len(exps), strict=True):
            e.reward = s
            e.info["judge_success"] = float(scores is not None)
        return exps


#: The share of questions whose ground truth trainable RULER uses (upstream's
#: ``PROBABILITY_GROUND_TRUTH_AVAILABLE``).
GROUND_TRUTH_SHARE = 0.2


def judge_reward(scores: list[float] | None, gold: list[float]) -> float:
    """A trainable judge's reward: ``1 - mean |score - (gold + 0.1) / 1.2|`` (the gold rewards,
    in [-0.1, 1.1], put on the scores' [0, 1]); 0 for a reply without a list of scores."""
    if scores is None:
        return 0.0
    return 1.0 - sum(abs(s - (g + 0.1) / 1.2) for s, g in zip(scores, gold, strict=True)) / len(scores)


class MathTrainableRULERWorkflow(MathWorkflow):
    """Trinity-RFT's ``math_trainable_ruler_workflow``: RULER with the policy as its own judge.

    As upstream's: the policy answers (``math_reward`` scores each answer: ``gold_reward``),
    then judges its answers with :func:`judge_messages` (its paragraphs a line apart, as
    upstream's). For a share of questions (:data:`GROUND_TRUTH_SHARE`;
    ``workflow_args.ground_truth_share`` is ours) the ground truth is "available": the answers are rewarded by it, the judge replies ``repeat_times``
    times and each reply is rewarded by how close its scores are to the gold rewards
    (:func:`judge_reward`), so the policy learns to judge; those replies are returned too,
    as their own sub-group (``info["subgroup"]``: their baseline is each other, not the
    answers). Otherwise the judge replies once and its scores (the mean over the replies that
    parsed; 0 when none did) are the answers' rewards. ``judge_success``: the share of replies
    that parsed. The draw is random per question, as upstream's."""

    async def run_async(self) -> list[Experience]:
        messages = self.messages()
        exps = self.score(await self.model.achat(messages, n=self.repeat_times, **self.rollout_args))
        gold = [float(e.reward or 0.0) for e in exps]
        for e, g in zip(exps, gold, strict=True):
            e.info["gold_reward"] = g
        with_truth = random.random() < float(self.args.get("ground_truth_share", GROUND_TRUTH_SHARE))
        asked = judge_messages(messages[-1]["content"], [e.response_text or "" for e in exps], sep="\n")
        judges = await self.model.achat(asked, n=self.repeat_times if with_truth else 1, **self.rollout_args)
        parsed = [judge_scores(j.response_text or "", len(exps)) for j in judges]
        good = [p for p in parsed if p is not None]
        success = len(good) / len(judges) if judges else 0.0
        for e in exps:
            e.info["judge_success"] = success
        if not with_truth:
            means = [sum(col) / len(good) for col in zip(*good, strict=True)] if good else [0.0] * len(exps)
            for e, m in zip(exps, means, strict=True):
                e.reward = m
            return exps
        for j, p in zip(judges, parsed, strict=True):
            j.reward = judge_reward(p, gold)
            j.info.update(subgroup="ruler", judge_success=success, reward_for_judge=j.reward)
        return exps + judges
