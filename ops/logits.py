"""From a model's logits to the per-token quantities every loss works on.

``logits`` are ``B x T x V`` (already aligned so that position ``t`` predicts token ``t`` of the
response); the results are ``B x T``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


def _upcast(x: Tensor) -> Tensor:
    """Half-precision softmax loses the small probabilities; compute in float32 at least."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


#: Bytes of float32 work per block of rows in :class:`_TokenLogprob` and :class:`_Entropy` (440
#: rows of a 152k vocabulary): small next to the logits, big enough that the loop costs nothing.
CHUNK_BYTES = 256 << 20


def _blocks(z: Tensor, step: int) -> list[tuple[slice, slice]]:
    """(batch slice, token slice) of every block of at most ``step`` rows of ``z`` (B x T x V):
    whole sequences, several at a time, when a sequence fits in a block (one block for a
    small batch or vocabulary: a Python loop per sequence cost more than the math there),
    else one sequence's tokens in chunks. Each ``z[bs, ts]`` is a plain block, even when ``z``
    is a view such as ``logits[:, :-1]`` that no reshape could flatten without a copy."""
    n_batch, n_tok = z.shape[0], z.shape[1]
    if n_tok <= step:
        per = max(step // max(n_tok, 1), 1)
        return [(slice(b, b + per), slice(None)) for b in range(0, n_batch, per)]
    return [(slice(b, b + 1), slice(a, a + step)) for b in range(n_batch) for a in range(0, n_tok, step)]


def _rows_per_block(z: Tensor) -> int:
    return max(1, CHUNK_BYTES // max(4 * z.shape[-1], 1))


def _per_row(z: Tensor) -> Tensor:
    """An empty B x T tensor in the working dtype of ``z`` (float32 at least)."""
    return torch.empty(z.shape[:2], dtype=_upcast(z[:0, :0]).dtype, device=z.device)


def _scaled_blocks(z: Tensor, temperature: float, lse: Tensor) -> Iterator[tuple[slice, slice, Tensor]]:
    """Each block of rows of ``z / temperature`` in the working dtype, its log-sum-exp
    written to ``lse`` before the block is yielded."""
    for b, sl in _blocks(z, _rows_per_block(z)):
        zc = _upcast(z[b, sl]) / temperature
        lse[b, sl] = torch.logsumexp(zc, dim=-1)
        yield b, sl, zc


def _logp_blocks(z: Tensor, temperature: float, lse: Tensor) -> Iterator[tuple[slice, slice, Tensor]]:
    """Each block of rows of ``log_softmax(z / temperature)`` in the working dtype, from the
    log-sum-exp a forward pass saved: what both backward passes recompute the softmax from."""
    for b, sl in _blocks(z, _rows_per_block(z)):
        yield b, sl, _upcast(z[b, sl]) / temperature - lse[b, sl, None]


def _as_rows(logits: Tensor) -> Tensor:
    """``logits`` as B x T x V: a 3-D tensor as it is, any other shape as one batch row."""
    return logits if logits.dim() == 3 else logits.reshape(1, -1, logits.shape[-1])


class _TokenLogprob(torch.autograd.Function):
    """``log_softmax(z / t)[token]`` of each row of ``z`` (B x T x V), float32 (or wider)
    inside, a block of rows at a time, keeping only ``z`` itself and one number per row for
    backward.

    Why not ``log_softmax(...).gather(...)``: autograd then keeps the float32 copy of the
    logits and the float32 log-probabilities, two B x T x V tensors each twice the size of
    bf16 logits (4.6 GiB each per 8k-token micro-batch of a 152k vocabulary), and backward
    makes more. Here backward recomputes the softmax block by block from ``z`` and the saved
    log-sum-exp: d/dz_j = g * ([j = token] - softmax_j) / t. The temperature divides after
    the upcast, as vLLM does, not in bf16.
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, tokens: Tensor, temperature: float) -> Tensor:
        out, lse = _per_row(z), _per_row(z)
        for b, sl, zc in _scaled_blocks(z, temperature, lse):
            out[b, sl] = zc.gather(-1, tokens[b, sl, None]).squeeze(-1) - lse[b, sl]
        ctx.save_for_backward(z, tokens, lse)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        z, tokens, lse = ctx.saved_tensors
        t = ctx.temperature
        grad = torch.empty_like(z, memory_format=torch.contiguous_format)
        for b, sl, logp in _logp_blocks(z, t, lse):
            gc = g[b, sl, None].to(lse.dtype) / t
            d = logp.exp_().mul_(-gc)
            d.scatter_add_(-1, tokens[b, sl, None], gc)
            grad[b, sl] = d
        return grad, None, None


class _Entropy(torch.autograd.Function):
    """Entropy ``H = -sum p log p`` (``log p = z - logsumexp(z)``) of each row of ``z / t`` (B x T x V),
    a block of rows at a time, keeping ``z`` and two numbers per row for backward, for the
    reason :class:`_TokenLogprob` gives: the trainer computes it on every micro-batch (a
    metric at least), and the plain form kept a float32 copy of the logits and the float32
    probabilities alive through backward. Backward recomputes ``log p`` per block:
    dH/dz_k = -p_k (log p_k + H) / t.

    Measured on an H100 (0.5B Qwen2 shape, 152k vocabulary, DeepSpeed ZeRO-2 bf16, gradient
    checkpointing, 32 x 1024 tokens per step), with :class:`_TokenLogprob` and the trainer
    no longer upcasting the logits: peak memory at 8192 tokens per micro-batch 44.9 -> 15.5
    GiB; 16384 tokens, out of memory before, now fit in 22.8 GiB (34k tokens/s); the same
    gradient norms step by step."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, temperature: float) -> Tensor:
        h, lse = _per_row(z), _per_row(z)
        for b, sl, zc in _scaled_blocks(z, temperature, lse):
            logp = zc.sub_(lse[b, sl, None])  # log p without log(0); each p log p is small,
            h[b, sl] = -(torch.exp(logp) * logp).sum(dim=-1)  # so no large terms cancel
        ctx.save_for_backward(z, lse, h)
        ctx.temperature = temperature
        return h

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None]:
        z, lse, h = ctx.saved_tensors
        t = ctx.temperature
        grad = torch.empty_like(z, memory_format=torch.contiguous_format)
        for b, sl, logp in _logp_blocks(z, t, lse):
            d = torch.exp(logp).mul_(logp.add_(h[b, sl, None]))  # p (log p + H)
            grad[b, sl] = d.mul_(g[b, sl, None].to(lse.dtype) / -t)
        return grad, None


def logprobs_from_logits(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each sampled token: ``log_softmax(logits / temperature)[token]``,
    in float32 at least (see :class:`_TokenLogprob` for how it spares memory). ``logits``
    are ``... x V``, ``token_ids`` the leading shape.

    The rollout engine samples with ``temperature``; the trainer must divide by the same value
    or the importance ratio ``pi / pi_old`` is biased from the first step.
    """
    rows = _as_rows(logits)
    ids = token_ids.long().reshape(rows.shape[:2])
    return _TokenLogprob.apply(rows, ids, float(temperature)).view(logits.shape[:-1])


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of the next-token distribution, ``H = -sum p log p`` with ``log p = z -
    logsumexp(z)``, in float32 at least (see :class:`_Entropy`).

    ``log p`` comes from the log-sum-exp, never ``log(0)``, so it is finite for any finite
    logits; summing the small terms ``p log p`` loses less than ``logsumexp(z) - sum p z``,
    whose two large terms cancel when the entropy is small.
    """
    return _Entropy.apply(_as_rows(logits), float(temperature)).view(logits.shape[:-1])
