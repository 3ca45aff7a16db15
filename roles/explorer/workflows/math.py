"""Built-in single-turn workflows: Trinity-RFT's ``simple_workflow`` (the reward function the
config names), the seeds' GSM8K quickstart (``math_workflow``) and the ``\\boxed{}`` variant
(``math_boxed_workflow``). Upstream's ``async_*`` names of each are the same classes here (every
one runs as a coroutine on the explorer's loop).

Each asks the model for ``repeat_times`` samples of one prompt in a single engine call (the
fast path) and scores each with a rule-based reward from :mod:`ops.rewards`; the reward is the
sum of the named scores, each score is kept in ``experience.info``.
"""

from __future__ import annotations

import inspect
from typing import Any

from ops.rewards import REWARD_FNS, call_reward
from roles.explorer.workflows.base import Workflow
from schemas.data import Experience

#: Trinity-RFT's default system prompt of ``math_workflow`` (used when the taskset's
#: ``format.system_prompt`` is not set; set it to ``""`` for none).
THINK_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think> <answer> answer here </answer>."
)

BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
BOXED_THINK_SYSTEM_PROMPT = (  # Trinity-RFT's math_boxed_workflow with ``with_think``
    "You are a helpful assistant that solves MATH problems. You should first thinks about the "
    "reasoning process in mind and then provides the user with the answer. You should present your "
    "reasoning process using the format: <think>\n ...your reasoning process here... </think>\n "
    "first. You should always include your final answer in \\boxed{} as closed-form results."
)


class SimpleWorkflow(Workflow):
    """Trinity-RFT's ``simple_workflow``: single-turn question -> answer, scored by the reward
    function the taskset names (``default_reward_fn_type``) against ``raw[format.response_key]``;
    the system prompt is the taskset's (``format.system_prompt``), none by default."""

    default_reward_fn: str | None = None
    default_system_prompt: str | None = None
    #: The config must name a reward function (checked before start): no default here.
    reward_required: bool = True

    def messages(self) -> list[dict[str, Any]]:
        """System prompt (per row, per taskset, or the default) + the user's question, or the
        row's message list when it has one."""
        raw, fmt = self.task.raw, self.task.format
        prompt_key = fmt.get("prompt_key", "prompt")
        messages_key = fmt.get("messages_key", "message")
        if prompt_key not in raw and messages_key in raw:
            return list(raw[messages_key])
        if prompt_key not in raw:
            raise KeyError(
                f"task {self.task.task_id}: row has no {prompt_key!r} (format.prompt_key); "
                f"keys: {sorted(raw)}"
            )
        sys_key = fmt.get("system_prompt_key")
        system = raw.get(sys_key) if sys_key else None
        if system is None:
            system = fmt.get("system_prompt")
        if system is None:
            system = self.default_system_prompt
        msgs = [{"role": "system", "content": system}] if system else []
        msgs.append({"role": "user", "content": str(raw[prompt_key])})
        return msgs

    def truth(self) -> Any:
        return self.task.raw.get(self.task.format.get("response_key", "response"))

    def reward_options(self, fn: Any) -> dict[str, Any]:
        """What this workflow gives reward function ``fn`` besides the taskset's ``reward_fn_args``
        (which win)."""
        return {}

    def reward(self, response: str, prompt: str | None = None,
               response_length: int | None = None) -> dict[str, float]:
        name = self.task.reward_fn or self.default_reward_fn
        if name is None:  # the config check refuses this before start; a row's own workflow may not
            raise KeyError(f"task {self.task.task_id}: {self.task.workflow} needs a reward function "
                           f"(default_reward_fn_type); known: {sorted(REWARD_FNS)}")
        fn = REWARD_FNS.get(name)
        if fn is None:
            raise KeyError(f"task {self.task.task_id}: unknown reward_fn {name!r}; known: {sorted(REWARD_FNS)}")
        return call_reward(fn, response, self.truth(), prompt=prompt, response_length=response_length,
                           options={**self.reward_options(fn), **self.task.reward_fn_args})

    def score(self, exps: list[Experience]) -> list[Experience]:
        for e in exps:
            scores = self.reward(e.response_text or "", response_length=e.response_length)
            e.reward = float(sum(scores.values()))
            e.info.update({k: float(v) for k, v in scores.items()})
        return exps

    async def run_async(self) -> list[Experience]:
        exps = await self.model.achat(self.messages(), n=self.repeat_times, **self.rollout_args)
        return self.score(exps)

    is_async = True


class MathWorkflow(SimpleWorkflow):
    """The seeds' GSM8K workflow: :class:`SimpleWorkflow` with ``math_reward`` and its
    ``<think>``/``<answer>`` system prompt by default."""

    default_reward_fn = "math_reward"
    default_system_prompt = THINK_SYSTEM_PROMPT
    reward_required = False


class MathBoxedWorkflow(MathWorkflow):
    """Like :class:`MathWorkflow` with ``\\boxed{}`` answers (``math_boxed_reward``), and
    Trinity-RFT's ``workflow_args``: ``with_think`` (a system prompt asking for
    ``<think>...</think>``, and the reward's format check), ``format_score_coef`` (0.1: that
    check's penalty), ``use_base`` (a base model: the plain-text prompt
    ``System:...\\nUser:\\n...\\nAssistant:\\n`` completed as text, no chat template)."""

    default_reward_fn = "math_boxed_reward"

    @property
    def default_system_prompt(self) -> str:  # type: ignore[override]
        return BOXED_THINK_SYSTEM_PROMPT if self.args.get("with_think") else BOXED_SYSTEM_PROMPT

    def reward_options(self, fn: Any) -> dict[str, Any]:
        takes = inspect.signature(fn).parameters  # upstream hands these to every reward fn that takes them
        return {k: v for k, v in (("with_think", bool(self.args.get("with_think", False))),
                                  ("format_score_coef", self.args.get("format_score_coef", 0.1))) if k in takes}

    async def run_async(self) -> list[Experience]:
        if not self.args.get("use_base"):
            return await super().run_async()
        msgs = self.messages()
        system = next((m["content"] for m in msgs if m["role"] == "system"), None)
        user = msgs[-1]["content"]
        text = (f"System:{system}\nUser:\n" if system else "User:\n") + f"{user}\nAssistant:\n"
        return self.score(await self.model.agenerate(text, n=self.repeat_times, **self.rollout_args))


class OnPolicyDistillWorkflow(SimpleWorkflow):
    """Trinity-RFT's ``on_policy_distill_workflow``: the student's samples of the prompt, each
    scored by the teacher (auxiliary model 0: the explorer fills ``teacher_logprobs`` for
    algorithms that learn from a teacher, whatever the workflow), with reward 0 unless the
    config names a reward function: the advantage is the teacher's, not a reward's."""

    reward_required = False

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> list[str]:
        if float(args.get("temperature", 1.0)) != 1.0:
            return [f"temperature: {args['temperature']}: the teacher scores at temperature 1 here"]
        return []

    def reward(self, response: str, prompt: str | None = None,
               response_length: int | None = None) -> dict[str, float]:
        return super().reward(response, prompt, response_length) if self.task.reward_fn else {}


class OnPolicyDistillMathWorkflow(OnPolicyDistillWorkflow):
    """Trinity-RFT's ``on_policy_distill_math_workflow``: Qwen2.5-Math's prompt (a fixed system
    line, the question and "Please reason step by step, and put your final answer within
    \\boxed{}."), and the answer's correctness as reward and accuracy (``math_boxed_reward``;
    upstream: qwen25_eval's ``verify_math_answer``)."""

    def messages(self) -> list[dict[str, Any]]:
        return qwen_math_messages(super().messages()[-1]["content"])

    def reward(self, response: str, prompt: str | None = None,
               response_length: int | None = None) -> dict[str, float]:
        return boxed_accuracy(response, self.truth())


def qwen_math_messages(question: str) -> list[dict[str, Any]]:
    """Qwen2.5-Math's evaluation prompt, as upstream's math eval and distillation workflows ask."""
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"{question}\nPlease reason step by step, and put your final "
                                        "answer within \\boxed{}."}]


def boxed_accuracy(response: str, truth: Any) -> dict[str, float]:
    """Whether the last ``\\boxed{}`` answer is right (``math_boxed_reward``'s accuracy; upstream:
    qwen25_eval's ``verify_math_answer``)."""
    return {"accuracy": call_reward(REWARD_FNS["math_boxed_reward"], response, truth)["accuracy"]}


class MathEvalWorkflow(SimpleWorkflow):
    """Trinity-RFT's ``math_eval_workflow``: Qwen2.5-Math's evaluation (its prompt on the row's
    ``question``, sampled at temperature 0.6 and top-p 0.8 whatever the taskset says, as
    upstream does) scored by the boxed answer's correctness."""

    reward_required = False

    def messages(self) -> list[dict[str, Any]]:
        if "question" not in self.task.raw:
            raise KeyError(f"task {self.task.task_id}: math_eval_workflow reads the row's 'question'; "
                           f"keys: {sorted(self.task.raw)}")
        return qwen_math_messages(str(self.task.raw["question"]))

    @property
    def rollout_args(self) -> dict[str, Any]:
        return {**super().rollout_args, "temperature": 0.6, "top_p": 0.8}

    def reward(self, response: str, prompt: str | None = None,
               response_length: int | None = None) -> dict[str, float]:
        return boxed_accuracy(response, self.truth())
