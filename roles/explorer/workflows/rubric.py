"""Trinity-RFT's ``rubric_judge_workflow`` (after RaR-Implicit, arXiv:2507.17746): each rollout is
rated 1-10 by a judge model against the row's rubrics; the reward is the rating / 10.

Faithful to upstream's (``rubric_judge_workflow.py``): the row's prompt column is the question,
``rubric`` a list of ``{"weight", "description"}``; the system prompt is the taskset's or
upstream's default; auxiliary model 0 judges each rollout at temperature 0 with upstream's
prompts and must answer with a ```` ```json {"rating": n} ``` ```` block. A reply without a
rating between 1 and 10 gives 0; ``judge_success`` is the share of rollouts the judge rated.

``rubric_judge_openai_workflow`` is the same with an external OpenAI-compatible API as the judge
(upstream's ``RubricJudgeWorkflowWithAPI``): ``workflow_args.judge_model_name``, the base URL in
the environment variable ``judge_api_base_url_env`` names (default ``OPENAI_BASE_URL``), the key
in ``judge_api_key_env``'s (``OPENAI_API_KEY``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from roles.explorer.workflows.math import SimpleWorkflow
from schemas.data import Experience

DEFAULT_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer.\n    "
)

JUDGE_SYSTEM_PROMPT = """You are an expert evaluator. Given a user prompt, a generated response, and a list of quality rubrics, please rate the overall quality of the response on a scale of 1 to 10 based on how well it satisfies the rubrics.
Consider all rubrics holistically when determining your score. A response that violates multiple rubrics should receive a lower score, while a response that satisfies all rubrics should receive a higher score.
Start your response with a valid JSON object that starts with "```json" and ends with "```". The JSON object should contain
a single key "rating" and the value should be an integer between 1 and 10.
Example response:
```json
{
"rating": 7
}```"""


def rubric_judge_messages(question: str, response: str, rubric: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Upstream's judge prompt for one ``response``."""
    rubrics = ("\n".join(f"Rubric {i} (weight: {r['weight']}): {r['description']}" for i, r in enumerate(rubric))
               if rubric else "Rubrics are not provided.")
    user = f"""Given the following prompt, response, and rubrics, please rate the overall quality of the response on a scale of 1 to 10 based
on how well it satisfies the rubrics.
<prompt>
{question}
</prompt>
<response>
{response}
</response>
<rubrics>
{rubrics}
</rubrics>
Your JSON Evaluation:"""
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def rubric_rating(reply: str) -> float | None:
    """The judge's rating / 10 from its first ```` ```json ```` (else ```` ``` ````) block; None
    when there is no such block or no ``rating`` between 1 and 10 in it."""
    tag = "```json" if "```json" in reply else "```"
    start = reply.find(tag)
    end = reply.find("```", start + len(tag)) if start != -1 else -1
    if end == -1:
        return None
    try:
        rating = json.loads(reply[start + len(tag):end].strip()).get("rating")
    except (json.JSONDecodeError, AttributeError):
        return None
    if isinstance(rating, bool) or not isinstance(rating, (int, float)) or not 1 <= rating <= 10:
        return None
    return rating * 0.1


class RubricJudgeWorkflow(SimpleWorkflow):
    """Rollouts of one question, each rated by the judge (see the module's docstring)."""

    default_system_prompt = DEFAULT_SYSTEM_PROMPT
    reward_required = False
    auxiliary_required = 1  # auxiliary model 0 is the judge

    async def run_async(self) -> list[Experience]:
        messages = self.messages()
        exps = await self.model.achat(messages, n=self.repeat_times, **self.rollout_args)
        rubric = list(self.task.raw.get("rubric") or [])
        if not rubric:
            self.logger.warning("task %s: no rubric in the row", self.task.task_id)
        rated = 0
        for e in exps:
            ask = rubric_judge_messages(messages[-1]["content"], e.response_text or "", rubric)
            score = rubric_rating(await self.judge(ask))
            rated += score is not None
            e.reward = score or 0.0
        for e in exps:
            e.info["judge_success"] = rated / len(exps) if exps else 0.0
        return exps

    async def judge(self, messages: list[dict[str, Any]]) -> str:
        """The judge's reply to ``messages``, at temperature 0: auxiliary model 0's."""
        [reply] = await self.auxiliary_models[0].achat(messages, n=1, temperature=0.0)
        return reply.response_text or ""


class RubricJudgeOpenAIWorkflow(RubricJudgeWorkflow):
    """:class:`RubricJudgeWorkflow` judged by an external OpenAI-compatible API (see the
    module's docstring); a missing model name or base URL is an error naming it."""

    auxiliary_required = 0

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> list[str]:
        url_env = str(args.get("judge_api_base_url_env", "OPENAI_BASE_URL"))
        return ((["judge_model_name: missing: the judge API's model"] if not args.get("judge_model_name") else [])
                + ([f"judge_api_base_url_env: environment variable {url_env} is not set: the judge API's base URL"]
                   if not os.environ.get(url_env) else []))

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        import openai

        self.judge_model = self.args["judge_model_name"]
        url = os.environ[str(self.args.get("judge_api_base_url_env", "OPENAI_BASE_URL"))]
        key_env = str(self.args.get("judge_api_key_env", "OPENAI_API_KEY"))
        self.client = openai.AsyncOpenAI(base_url=url, api_key=os.environ.get(key_env) or "EMPTY")

    async def run_async(self) -> list[Experience]:
        try:
            return await super().run_async()
        finally:
            await self.client.close()  # one client per task run: its connections go with it

    async def judge(self, messages: list[dict[str, Any]]) -> str:
        done = await self.client.chat.completions.create(model=str(self.judge_model), messages=messages,
                                                         temperature=0.0, stream=False)
        return done.choices[0].message.content or ""
