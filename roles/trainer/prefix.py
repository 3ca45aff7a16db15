"""The prompt once per group: the logits of a micro-batch whose rows share prompts.

Why: a GRPO group is ``repeat_times`` responses to one prompt, and the plain forward runs that
prompt once per response. On a real model the prompt is most of each row (the SmolLM2 bench's
rows are 46 prompt and <= 8 response tokens), so the forward and backward spent most of their
FLOPs recomputing the same prompt. Here each distinct prompt runs once (left padded, one
batch), its key/value cache is repeated for the rows that share it, and only the responses
run on top of it; the backward sums every response's gradient into the one prompt pass. The
log-probs are the plain forward's up to float rounding (``tests/trainer/test_prefix.py``).

Only the logits that the loss reads are made: the prompt's last position (it predicts the
first response token) and each response position but the last.
"""

from __future__ import annotations

from typing import Any

import torch

from .batch import Batch


def prompt_owners(mb: Batch) -> tuple[list[int], list[int]]:
    """For each row, the index of its prompt among the distinct prompts; and for each distinct
    prompt, the first row that has it. Rows share a prompt when their prompt tokens are equal."""
    lengths = (mb.resp_index[:, 0] + 1).tolist()
    seen: dict[bytes, int] = {}
    owners, firsts = [], []
    for i, p in enumerate(lengths):
        key = mb.input_ids[i, :p].numpy().tobytes()
        if key not in seen:
            seen[key] = len(firsts)
            firsts.append(i)
        owners.append(seen[key])
    return owners, firsts


def shared_prompts(mb: Batch, model: Any) -> tuple[list[int], list[int]] | None:
    """:func:`prompt_owners` where the shared-prompt forward applies (some prompt is shared,
    and the model is a Hugging Face causal LM that keeps a cache in this mode: gradient
    checkpointing in training drops it, so such a model takes the plain forward); else None."""
    if mb.size < 2 or not hasattr(model, "config"):
        return None
    if getattr(model, "is_gradient_checkpointing", False) and model.training:
        return None
    owners, firsts = prompt_owners(mb)
    return (owners, firsts) if len(firsts) < len(owners) else None


def shared_prompt_logits(model: Any, mb: Batch, owners: list[int], firsts: list[int],
                         pad_token_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, targets)``: ``B x R x V`` logits of each row's ``R`` (longest response)
    response tokens and the tokens themselves (``B x R``, padding past a row's end), given
    the rows' prompts as :func:`shared_prompts` found them."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    p = (mb.resp_index[:, 0] + 1).tolist()
    n = mb.attention_mask.sum(-1).tolist()
    width = max(p[i] for i in firsts)
    prompt_ids = torch.full((len(firsts), width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for u, i in enumerate(firsts):  # left padded: every prompt's last token is at width - 1
        prompt_ids[u, width - p[i]:] = mb.input_ids[i, :p[i]]
        prompt_mask[u, width - p[i]:] = 1
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids.to(dev), attention_mask=prompt_mask.to(dev), position_ids=positions.to(dev),
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    owner = torch.as_tensor(owners, dtype=torch.long)
    first = out.logits[:, -1][owner.to(dev)].unsqueeze(1)  # B x 1 x V: predicts response token 0
    r = [n[i] - p[i] for i in range(mb.size)]
    R = max(r)
    targets = torch.full((mb.size, R), pad_token_id, dtype=torch.long)
    for i in range(mb.size):
        targets[i, :r[i]] = mb.input_ids[i, p[i]:n[i]]
    if R == 1:
        return first, targets
    # every response token but the last predicts the next one; rows are right padded
    resp_mask = torch.zeros(mb.size, R - 1, dtype=torch.long)
    for i in range(mb.size):
        resp_mask[i, :r[i] - 1] = 1
    cache = out.past_key_values
    cache.reorder_cache(owner.to(dev))
    mask = torch.cat([prompt_mask[owner], resp_mask], 1)
    pos = torch.as_tensor(p).unsqueeze(1) + torch.arange(R - 1)
    rest = model(input_ids=targets[:, :-1].to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                 past_key_values=cache, use_cache=True).logits
    return torch.cat([first, rest], 1), targets
