"""Bases for agentic workflows: one experience per conversation, or one per turn.

:class:`MultiTurnWorkflow` (Trinity-RFT's "concatenated multi-turn"): the workflow talks to the
model and an environment, then :meth:`MultiTurnWorkflow.conversation_experience` turns the
whole conversation into *one* experience whose ``action_mask`` is 1 on the assistant's tokens
and 0 on everything the environment/user said, so the loss trains only what the model wrote.

:class:`StepWiseWorkflow` (the "general multi-step" workflow): every model call becomes its
own experience; after the episode all of them get the episode's reward.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from roles.explorer.workflows.base import Workflow
from schemas.data import Experience


class MultiTurnWorkflow(Workflow):
    """Base of a concatenated multi-turn workflow (implement ``run``/``run_async``)."""

    repeatable = False  # each rollout is one whole conversation

    def conversation_experience(
        self,
        messages: list[dict[str, Any]],
        reward: float,
        info: dict[str, Any] | None = None,
        turn_experiences: list[Experience] | None = None,
    ) -> Experience:
        """One experience for a conversation whose first message(s) before the first
        assistant turn are the prompt.

        The action mask comes from rendering prefixes with the chat template: an assistant
        turn's tokens are those between ``render(messages[:i], generation prompt)`` and
        ``render(messages[:i+1])``. When ``turn_experiences`` (the model calls, in order) are
        given and their sampled tokens equal the rendered turns, their logprobs are kept;
        otherwise ``logprobs`` is None and the trainer recomputes them.

        A conversation longer than the engine's ``max_model_len`` is cut to its first
        ``max_model_len`` tokens (the seeds' rule for prompts: keep the head), flagged
        ``response_truncated`` with ``info["truncated"]`` saying from how many tokens; a
        prompt that alone reaches ``max_model_len`` is an error (nothing left to train on).
        """
        render = self.model.engine.apply_chat_template  # the engine's template and its variables
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None:
            raise ValueError(f"task {self.task.task_id}: conversation has no assistant turn")
        prompt = render(messages[:first], True)
        full = render(messages, False)
        if full[: len(prompt)] != prompt:
            raise ValueError(
                f"task {self.task.task_id}: the chat template does not render the prompt as a "
                "prefix of the conversation; cannot build an action mask"
            )
        r = len(full) - len(prompt)
        mask = np.zeros(r, dtype=bool)
        logprobs = np.zeros(r, dtype=np.float32)
        calls = list(turn_experiences or [])
        keep_logprobs = bool(calls)
        for i in range(first, len(messages)):
            if messages[i]["role"] != "assistant":
                continue
            start = len(render(messages[:i], True))
            end = len(render(messages[: i + 1], False))
            mask[start - len(prompt) : end - len(prompt)] = True
            if calls:
                call = calls.pop(0)
                resp = call.tokens[call.prompt_length :]
                n = len(resp)
                span = full[start:end]
                if call.logprobs is not None and list(resp[: len(span)]) == span[:n]:
                    m = min(n, end - start)
                    logprobs[start - len(prompt) : start - len(prompt) + m] = call.logprobs[:m]
                else:
                    keep_logprobs = False
        info = {"calls": sum(m["role"] == "assistant" for m in messages), **(info or {})}
        limit = getattr(getattr(self.model.engine, "limits", None), "max_model_len", None)
        truncated = limit is not None and len(full) > limit
        if truncated:
            if len(prompt) >= limit:
                raise ValueError(f"task {self.task.task_id}: the prompt alone is {len(prompt)} tokens, "
                                 f"max_model_len is {limit}")
            info["truncated"] = f"{len(full)} tokens cut to max_model_len={limit}"
            full, keep = full[:limit], limit - len(prompt)
            mask, logprobs = mask[:keep], logprobs[:keep]
        return Experience(
            id=uuid.uuid4().hex, task_id="", group_id="", run_id="",
            tokens=np.asarray(full, dtype=np.int32), prompt_length=len(prompt),
            logprobs=logprobs if keep_logprobs else None, action_mask=mask, reward=float(reward),
            model_version=self.model.model_version, messages=list(messages), info=info,
            response_truncated=truncated,
        )


class StepWiseWorkflow(Workflow):
    """Base of a step-wise workflow: implement ``step(step_num) -> bool`` (False ends the
    episode) and ``reward(experiences) -> float``; every model call made with
    ``self.model`` during the episode becomes one experience."""

    repeatable = False
    max_step_num: int = 10

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.model.enable_history = True
        self.max_step_num = int(self.args.get("max_step_num", self.max_step_num))

    def step(self, step_num: int) -> bool:
        raise NotImplementedError

    def reward(self, exps: list[Experience]) -> float:
        raise NotImplementedError

    def run(self) -> list[Experience]:
        exps: list[Experience] = []
        for i in range(self.max_step_num):
            go_on = self.step(i)
            for e in self.model.extract_history():
                e.info["step"] = i
                exps.append(e)
            if not go_on:
                break
        r = float(self.reward(exps))
        for e in exps:
            e.reward = r
        return exps
