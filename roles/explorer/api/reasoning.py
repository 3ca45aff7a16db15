"""A completion's reasoning apart from its answer: ``message.reasoning_content``.

Thinking models (DeepSeek-R1, Qwen3) write their reasoning as ``<think>...</think>`` before the
answer. vLLM's ``--reasoning-parser`` returns it in the message's ``reasoning_content`` and only
the rest as ``content``; agent frameworks written against vLLM (upstream Trinity-RFT's
AgentScope examples set ``reasoning_parser``) read the answer from ``content`` and would
otherwise parse the reasoning as the answer. The text is only split: the experience keeps every
token the model generated.

The two parsers differ in a completion without ``</think>``: ``deepseek_r1`` (whose template
opens ``<think>`` in the prompt) counts all of it as reasoning still going on, ``qwen3`` as an
answer without reasoning.
"""

from __future__ import annotations

from typing import Literal

ReasoningParser = Literal["deepseek_r1", "qwen3"]


def split_reasoning(text: str, parser: ReasoningParser | None) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a completion's ``text``; ``(None, text)`` without a parser."""
    if parser is None:
        return None, text
    if "</think>" not in text:
        return (text.removeprefix("<think>"), "") if parser == "deepseek_r1" else (None, text)
    reasoning, content = text.split("</think>", 1)
    return reasoning.split("<think>", 1)[-1], content.lstrip("\n")
