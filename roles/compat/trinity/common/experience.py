"""Trinity-RFT's ``Experience`` and ``EID``, as its workflows build and read them.

A plugin workflow gets these from :class:`trinity.common.models.model.ModelWrapper` (torch
tensors, ``metrics``, ``eid``, ``truncate_status``, as upstream's) and returns them; the
runner's adapter turns each back into our :class:`schemas.data.Experience` with
:func:`to_ours`, which is what travels on the bus. Only that conversion is ours: the fields
and the constructor are upstream's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from schemas.data import Experience as OurExperience


@dataclass
class EID:
    """Which batch, task, run and step an experience is. ``run``/``step`` are the workflow's to
    set; here the runner sets the ids that travel (``task_id``, ``group_id``)."""

    batch: int | str = ""
    task: int | str = ""
    run: int = 0
    step: int = 0
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    @property
    def uid(self) -> str:
        return f"{self.batch}/{self.task}/{self.run}/{self.step}/{self.suffix}"

    @property
    def sid(self) -> str:
        return f"{self.batch}/{self.task}/{self.step}"

    @property
    def rid(self) -> str:
        return f"{self.batch}/{self.task}/{self.run}"

    @property
    def tid(self) -> str:
        return f"{self.batch}/{self.task}"

    def __str__(self) -> str:
        return self.uid


def _tensor(x: Any, dtype: torch.dtype) -> torch.Tensor | None:
    if x is None or isinstance(x, torch.Tensor):
        return x
    return torch.tensor(np.asarray(x), dtype=dtype)  # a copy: a decoded array is read-only


class Experience:
    """One rollout as Trinity-RFT's workflows see it (keyword-only, as upstream's).

    Its experience type follows upstream's rule: an ``action_mask`` makes it multi-turn,
    ``chosen`` and ``rejected`` DPO, anything else single-turn (every response token trained)."""

    def __init__(self, *, eid: EID | dict | None = None, tokens: Any, logprobs: Any = None,
                 reward: float | None = None, token_level_reward: Any = None, advantages: Any = None,
                 returns: Any = None, truncate_status: str | None = None, info: dict | None = None,
                 metrics: dict | None = None, prompt_length: int = 1, response_text: str | None = None,
                 prompt_text: str | None = None, action_mask: Any = None, messages: list | None = None,
                 tools: list | None = None, chosen: Any = None, rejected: Any = None,
                 chosen_messages: list | None = None, rejected_messages: list | None = None,
                 multi_modal_inputs: dict | None = None, teacher_logprobs: Any = None,
                 custom_fields: list | None = None) -> None:
        if multi_modal_inputs:
            raise ValueError("Experience.multi_modal_inputs: multi-modal experiences are not implemented here")
        self.tokens = _tensor(tokens, torch.int32)
        if action_mask is not None:
            self.experience_type = "multi_turn"
        elif chosen is not None and rejected is not None:
            self.experience_type, prompt_length = "dpo", len(self.tokens)
        else:
            self.experience_type = "single_turn"
            if prompt_length < 1:
                raise ValueError(f"Experience.prompt_length: must be > 0 for a single-turn experience, got {prompt_length}")
            if truncate_status != "prompt_truncated" and len(self.tokens) <= prompt_length:
                raise ValueError(f"Experience.tokens: {len(self.tokens)} tokens hold no response after "
                                 f"prompt_length={prompt_length}")
            action_mask = torch.ones(max(len(self.tokens) - prompt_length, 0), dtype=torch.bool)
        self.eid = EID(**eid) if isinstance(eid, dict) else eid or EID()
        self.logprobs = _tensor(logprobs, torch.float32)
        self.reward = reward
        self.token_level_reward = _tensor(token_level_reward, torch.float32)
        self.advantages = _tensor(advantages, torch.float32)
        self.returns = _tensor(returns, torch.float32)
        self.truncate_status = truncate_status
        self.info = info or {}
        self.metrics = metrics or {}
        self.prompt_length = prompt_length
        self.response_text = response_text
        self.prompt_text = prompt_text
        self.action_mask = _tensor(action_mask, torch.bool)
        self.messages = messages
        self.tools = tools
        self.chosen = _tensor(chosen, torch.int32)
        self.rejected = _tensor(rejected, torch.int32)
        self.chosen_messages = chosen_messages
        self.rejected_messages = rejected_messages
        self.teacher_logprobs = _tensor(teacher_logprobs, torch.float32)
        self.custom_fields = custom_fields or []
        self.model_version = 0  # ours: the weights that sampled it (the wrapper sets it)

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    def __repr__(self) -> str:
        return (f"Experience(eid={self.eid}, tokens={len(self.tokens)}, prompt_length={self.prompt_length}, "
                f"reward={self.reward})")


def _np(x: Any, dtype: Any) -> np.ndarray | None:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def from_ours(e: OurExperience) -> Experience:
    """What upstream's model wrapper returns for one of our engine's samples."""
    status = "prompt_truncated" if e.prompt_truncated else "response_truncated" if e.response_truncated else None
    mask = e.action_mask if e.action_mask is not None and not bool(np.all(e.action_mask)) else None
    out = Experience(tokens=e.tokens, logprobs=e.logprobs, prompt_length=e.prompt_length, truncate_status=status,
                     response_text=e.response_text, prompt_text=e.prompt_text, messages=e.messages,
                     action_mask=mask, info=dict(e.info), reward=e.reward)
    out.model_version = e.model_version
    return out


def to_ours(x: Any, owner: str) -> OurExperience:
    """One experience a plugin workflow returned, as ours; ``owner`` (the class and its file)
    is named in the error when it is not one."""
    if isinstance(x, OurExperience):
        return x
    if not isinstance(x, Experience):
        raise TypeError(f"{owner}: returned {type(x).__name__}, not an Experience "
                        "(trinity.common.experience.Experience)")
    info = dict(x.info)
    info.update({k: float(v) for k, v in x.metrics.items() if isinstance(v, (int, float))})
    ours = OurExperience(
        id=uuid.uuid4().hex, task_id="", group_id="", run_id="",
        tokens=_np(x.tokens, np.int32), prompt_length=int(x.prompt_length),
        logprobs=_np(x.logprobs, np.float32), action_mask=_np(x.action_mask, bool),
        reward=None if x.reward is None else float(x.reward),
        token_level_reward=_np(x.token_level_reward, np.float32), advantages=_np(x.advantages, np.float32),
        returns=_np(x.returns, np.float32), model_version=int(x.model_version),
        prompt_truncated=x.truncate_status == "prompt_truncated",
        response_truncated=x.truncate_status == "response_truncated",
        messages=x.messages, prompt_text=x.prompt_text, response_text=x.response_text,
        chosen=_np(x.chosen, np.int32), rejected=_np(x.rejected, np.int32),
        teacher_logprobs=_np(x.teacher_logprobs, np.float32), info=info)
    try:
        ours.validate(owner)
    except ValueError as e:
        raise ValueError(f"{owner}: returned an experience that cannot train: {e}") from e
    return ours


def group_by(experiences: list[Experience], id_type: str) -> dict[str, list[Experience]]:
    """Experiences by their task (``"task"``), run (``"run"``) or step (``"step"``) id."""
    attr = {"task": "tid", "run": "rid", "step": "sid"}.get(id_type)
    if attr is None:
        raise ValueError(f"group_by: id_type {id_type!r}; valid: task, run, step")
    out: dict[str, list[Experience]] = {}
    for e in experiences:
        out.setdefault(getattr(e.eid, attr), []).append(e)
    return out
