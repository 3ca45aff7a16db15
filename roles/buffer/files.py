"""File-based experience buffers (``storage_type: file``): SFT and DPO datasets as experiences.

Why deterministic by step: the batch for train step N is rows ``[N*k, (N+1)*k)`` of the
reader's epoch order, a pure function of the step, so a trainer restarted from a checkpoint
asks for step N again and gets the same rows, without any cursor state to keep in sync.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from schemas.config import ExperienceBufferConfig
from schemas.data import Experience
from storage.tasksets import DatasetReader, FormattedRow, dataset_reader_from_config


def _plain_template(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if add_generation_prompt else "")


def render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
           tools: list[dict[str, Any]] | None = None, chat_template: str | None = None,
           **template_vars: Any) -> list[int]:
    """Token ids of ``messages`` (and ``tools``) with ``chat_template`` or else the tokenizer's
    (a plain ``role: text`` layout when there is none, e.g. a tiny test tokenizer);
    ``template_vars`` (``enable_thinking``) go to the template."""
    if chat_template or getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True,
            chat_template=chat_template, **({"tools": tools} if tools else {}), **template_vars,
        )
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)
    return list(tokenizer(_plain_template(messages, add_generation_prompt))["input_ids"])


class FileBuffer:
    """Serves an SFT or DPO dataset as Experience batches, one fixed slice per step."""

    def __init__(
        self,
        cfg: ExperienceBufferConfig,
        tokenizer: Any,
        *,
        batch_size: int,
        kind: Literal["sft", "dpo"] = "sft",
        total_epochs: int = 1,
        max_length: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.kind = kind
        self.tokenizer = tokenizer
        self.max_length = max_length
        # total_steps is not bounded here: the trainer's total_steps is the limit.
        self.reader: DatasetReader[FormattedRow] = dataset_reader_from_config(
            cfg, batch_size=batch_size, kind=kind, total_epochs=max(total_epochs, 1)
        )

    def __len__(self) -> int:
        return len(self.reader)

    def batch(self, step: int, n: int) -> list[Experience]:
        """The ``n`` rows of train step ``step`` (1-based) as experiences; [] past the end."""
        self.reader.seek((step - 1) * n)
        rows = self.reader.peek_indices(n)
        return [self._experience(idx, epoch, self.reader.transform(idx, self.reader.rows[idx], epoch))
                for idx, epoch in rows]

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None) -> list[int]:
        """:func:`render` with this dataset's ``format.chat_template`` / ``enable_thinking``
        (the loader fills them from ``model.*``)."""
        fmt = self.cfg.format
        extra = {} if fmt.enable_thinking is None else {"enable_thinking": fmt.enable_thinking}
        return render(self.tokenizer, messages, add_generation_prompt, tools, fmt.chat_template, **extra)

    def _cut(self, ids: list[int]) -> list[int]:
        return ids[: self.max_length] if self.max_length else ids

    def _experience(self, idx: int, epoch: int, row: FormattedRow) -> Experience:
        name = self.cfg.name or "dataset"
        eid = f"{name}/{epoch}/{idx}"
        if self.kind == "dpo":
            prompt = self._render(row.messages, True)
            chosen = self._render(row.messages + (row.chosen or []), False)[len(prompt):]
            rejected = self._render(row.messages + (row.rejected or []), False)[len(prompt):]
            return Experience(
                id=eid, task_id=eid, group_id=eid, run_id=name,
                tokens=np.asarray(prompt, dtype=np.int32), prompt_length=len(prompt),
                chosen=np.asarray(self._cut(chosen), dtype=np.int32),
                rejected=np.asarray(self._cut(rejected), dtype=np.int32),
                info={"is_expert": True},
            )
        if self.cfg.format.enable_concatenated_multi_turn:
            prompt, full, mask = self._all_turns(row, eid)
        else:  # the last assistant turn is the response
            prompt = self._render(row.messages[:-1], True, row.tools)
            full = self._render(row.messages, False, row.tools)
            mask = np.ones(len(full) - len(prompt), dtype=bool)
        cut = self._cut(full)
        p = len(prompt)
        if len(cut) <= p:  # the cut left no response: train on the last token kept
            p = max(len(cut) - 1, 0)
            mask = np.ones(len(cut) - p, dtype=bool)
        else:
            mask = mask[: len(cut) - p]
        return Experience(
            id=eid, task_id=eid, group_id=eid, run_id=name,
            tokens=np.asarray(cut, dtype=np.int32), prompt_length=p, action_mask=mask,
            response_truncated=len(cut) < len(full), info={"is_expert": True},
        )

    def _all_turns(self, row: FormattedRow, eid: str) -> tuple[list[int], list[int], np.ndarray]:
        """``enable_concatenated_multi_turn``: the prompt is everything before the first
        assistant turn; the mask is 1 on every assistant turn and 0 on what lies between
        (user turns, tool results), found by rendering prefixes with the chat template."""
        msgs, tools = row.messages, row.tools
        first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), None)
        if first is None:
            raise ValueError(f"{eid}: enable_concatenated_multi_turn: the conversation has no assistant turn")
        prompt = self._render(msgs[:first], True, tools)
        full = self._render(msgs, False, tools)
        mask = np.zeros(len(full) - len(prompt), dtype=bool)
        for i in range(first, len(msgs)):
            if msgs[i].get("role") == "assistant":
                start = len(self._render(msgs[:i], True, tools))
                end = len(self._render(msgs[: i + 1], False, tools))
                mask[start - len(prompt):end - len(prompt)] = True
        return prompt, full, mask
