"""From a model's logits to the per-token quantities every loss works on.

``logits`` are ``B x T x V`` (already aligned so that position ``t`` predicts token ``t`` of the
response); the results are ``B x T``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _upcast(x: Tensor) -> Tensor:
    """Half-precision softmax loses the small probabilities; compute in float32 at least."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def logprobs_from_logits(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each sampled token: ``log_softmax(logits / temperature)[token]``.

    The rollout engine samples with ``temperature``; the trainer must divide by the same value
    or the importance ratio ``pi / pi_old`` is biased from the first step.
    """
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(_upcast(logits), dim=-1)
    return logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of the next-token distribution, ``H = logsumexp(z) - sum softmax(z) z``.

    This form needs one softmax and no ``log(0)``, so it is finite for any finite logits.
    """
    if temperature != 1.0:
        logits = logits / temperature
    logits = _upcast(logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
