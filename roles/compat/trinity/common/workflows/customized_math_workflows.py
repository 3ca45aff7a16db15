"""Trinity-RFT's ``MathBoxedWorkflow`` (``\\boxed{}`` answers), in upstream's shape for plugins
that subclass it: its ``workflow_args`` ``with_think``, ``format_score_coef`` and ``use_base``
(a plain-text prompt completed as text), our prompts and ``math_boxed_reward``."""

from __future__ import annotations

from typing import Any

from roles.explorer.workflows.math import BOXED_SYSTEM_PROMPT, BOXED_THINK_SYSTEM_PROMPT
from trinity.common.experience import Experience
from trinity.common.workflows.workflow import SimpleWorkflow, Task

__all__ = ["AsyncMathBoxedWorkflow", "MathBoxedWorkflow", "Task"]


class MathBoxedWorkflow(SimpleWorkflow):
    default_reward = "math_boxed_reward"

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.use_base = bool(self.workflow_args.get("use_base", False))
        self.with_think = bool(self.workflow_args.get("with_think", False))
        self.format_score_coef = self.workflow_args.get("format_score_coef", 0.1)
        if self.system_prompt is None:
            self.system_prompt = BOXED_THINK_SYSTEM_PROMPT if self.with_think else BOXED_SYSTEM_PROMPT

    def format_prompt(self) -> str:
        head = f"System:{self.system_prompt}\nUser:\n" if self.system_prompt else "User:\n"
        return f"{head}{self.task_desc}\nAssistant:\n"

    def reward_kwargs(self, response: Experience) -> dict[str, Any]:
        return {"with_think": self.with_think, "format_score_coef": self.format_score_coef,
                "response_token": response.tokens[response.prompt_length:]}

    def run(self) -> list[Experience]:
        if self.use_base:
            return self.score(self.model.generate([self.format_prompt()], **self.rollout_args))
        return self.score(self.model.chat(self.format_messages(), **self.rollout_args))


class AsyncMathBoxedWorkflow(MathBoxedWorkflow):
    is_async = True

    async def run_async(self) -> list[Experience]:
        if self.use_base:
            return self.score(await self.model.generate_async([self.format_prompt()], **self.rollout_args))
        return self.score(await self.model.chat_async(self.format_messages(), **self.rollout_args))
