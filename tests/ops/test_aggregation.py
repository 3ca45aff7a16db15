"""Masked reductions, loss aggregation and logits helpers against plain float64 references."""

import math

import pytest
import torch

from ops.aggregation import (
    LOSS_AGG_MODES,
    aggregate_loss,
    masked_mean,
    masked_var,
    masked_whiten,
)
from ops.logits import entropy_from_logits, logprobs_from_logits
from tests.ops.helpers import assert_close

VALUES = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [5.0, 6.0, 7.0, 8.0]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]  # padding, a one-token row, an empty row


def _ref(mode: str, values=VALUES, mask=MASK) -> float:
    rows = [
        [v for v, m in zip(vr, mr, strict=True) if m] for vr, mr in zip(values, mask, strict=True)
    ]
    tokens = [v for r in rows for v in r]
    nonempty = [r for r in rows if r]
    if mode == "token-mean":
        return sum(tokens) / len(tokens) if tokens else 0.0
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty) if nonempty else 0.0
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty) if nonempty else 0.0
    return sum(tokens) / len(values[0])  # seq-mean-token-sum-norm, normalizer T


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_loss_matches_reference(mode):
    v = torch.tensor(VALUES, dtype=torch.float64)
    m = torch.tensor(MASK)
    assert aggregate_loss(v, m, mode).item() == pytest.approx(_ref(mode))


def test_hand_values():
    v = torch.tensor(VALUES, dtype=torch.float64)
    m = torch.tensor(MASK)
    # token-mean: (1+2+3+10)/4; seq-mean-token-mean: (2 + 10)/2; token-sum: (6+10)/2; norm: 16/4
    assert aggregate_loss(v, m, "token-mean").item() == 4.0
    assert aggregate_loss(v, m, "seq-mean-token-mean").item() == 6.0
    assert aggregate_loss(v, m, "seq-mean-token-sum").item() == 8.0
    assert aggregate_loss(v, m, "seq-mean-token-sum-norm").item() == 4.0
    assert aggregate_loss(v, m, "seq-mean-token-sum-norm", normalizer=8).item() == 2.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_mask_gives_zero_and_finite_grad(mode):
    v = torch.randn(3, 5, requires_grad=True)
    loss = aggregate_loss(v, torch.zeros(3, 5), mode)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.isfinite(v.grad).all() and (v.grad == 0).all()


def test_unknown_mode_lists_valid_names():
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-sum-norm"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "mean")


def test_masked_mean_dim_and_empty_rows():
    v = torch.tensor(VALUES, dtype=torch.float64)
    m = torch.tensor(MASK)
    assert masked_mean(v, m, dim=-1).tolist() == [2.0, 10.0, 0.0]


def test_masked_var_and_whiten():
    x = [1.0, 2.0, 4.0]
    v = torch.tensor([[1.0, 2.0], [4.0, 99.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1], [1, 0]])
    mean = sum(x) / 3
    var = sum((a - mean) ** 2 for a in x) / 2  # unbiased
    assert masked_var(v, m).item() == pytest.approx(var)
    w = masked_whiten(v, m)
    expected = [[(1 - mean) / math.sqrt(var + 1e-8), (2 - mean) / math.sqrt(var + 1e-8)],
                [(4 - mean) / math.sqrt(var + 1e-8), 0.0]]  # fmt: skip
    assert_close(w, torch.tensor(expected, dtype=torch.float64))


def test_whiten_degenerate_cases_are_zero():
    one = masked_whiten(torch.tensor([[3.0, 7.0]]), torch.tensor([[1, 0]]))
    assert one.tolist() == [[0.0, 0.0]]
    equal = masked_whiten(torch.full((2, 3), 0.7), torch.ones(2, 3))
    assert torch.allclose(equal, torch.zeros(2, 3), atol=1e-6)
    empty = masked_whiten(torch.randn(2, 3), torch.zeros(2, 3))
    assert (empty == 0).all()


def test_logprobs_and_entropy_from_logits():
    logits = torch.tensor([[[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    ids = torch.tensor([[1, 2]])
    rows = logits[0].tolist()
    ref_lp, ref_h = [], []
    for row, tok in zip(rows, [1, 2], strict=True):
        z = math.log(sum(math.exp(a) for a in row))
        ref_lp.append(row[tok] - z)
        ref_h.append(-sum(math.exp(a - z) * (a - z) for a in row))
    assert logprobs_from_logits(logits, ids)[0].tolist() == pytest.approx(ref_lp)
    assert entropy_from_logits(logits)[0].tolist() == pytest.approx(ref_h)
    assert entropy_from_logits(logits)[0, 1].item() == pytest.approx(math.log(3))
    # temperature divides the logits before the softmax
    hot = logprobs_from_logits(logits, ids, temperature=2.0)
    assert_close(hot, logprobs_from_logits(logits / 2, ids))


def test_logits_helpers_upcast_half_precision():
    logits = torch.randn(2, 3, 50).to(torch.bfloat16)
    ids = torch.randint(0, 50, (2, 3))
    assert logprobs_from_logits(logits, ids).dtype == torch.float32
    assert torch.isfinite(entropy_from_logits(logits)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("what", ["logprob", "entropy"])
@pytest.mark.parametrize("rows", [2, 14])
def test_blockwise_logprob_and_entropy_match_the_plain_forms(monkeypatch, dtype, temperature, what, rows):
    """The block-wise log-prob and entropy (float32 inside, softmax recomputed in backward)
    against their plain forms in float64 on the same logits: values and the gradient that
    reaches the logits, with blocks of 2 rows (sequences of 7 cross block edges) or 14 (two
    whole sequences a block, the last block one); gradcheck in float64; and a view such as
    the trainer's ``logits[:, :-1]`` gives the same numbers."""
    import ops.logits

    monkeypatch.setattr(ops.logits, "CHUNK_BYTES", rows * 4 * 50)
    torch.manual_seed(0)
    z = (torch.randn(3, 7, 50) * 4).to(dtype).requires_grad_()
    ids = torch.randint(0, 50, (3, 7))

    def blockwise(x, tokens=ids):
        if what == "logprob":
            return logprobs_from_logits(x, tokens, temperature)
        return entropy_from_logits(x, temperature)

    def plain(x):
        logp = torch.log_softmax(x / temperature, -1)
        if what == "logprob":
            return logp.gather(-1, ids[..., None]).squeeze(-1)
        return -(logp.exp() * logp).sum(-1)

    weights = torch.randn(3, 7, dtype=torch.float64)
    got = blockwise(z)
    (got.double() * weights).sum().backward()
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    z64 = z.detach().double().requires_grad_()
    want = plain(z64)
    (want * weights).sum().backward()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert_close(got.double(), want.detach(), atol=tol)
    # the gradient comes back in the logits' dtype: bf16 rounds it to ~3 significant digits
    gtol = 1e-2 if dtype == torch.bfloat16 else tol
    assert torch.allclose(z.grad.double(), z64.grad, atol=gtol, rtol=gtol)
    assert torch.autograd.gradcheck(
        lambda x: blockwise(x, ids[0]), (z64.detach()[0].clone().requires_grad_(),)
    )
    view = z.detach()[:, :-1]
    assert not view.is_contiguous()
    assert torch.equal(blockwise(view, ids[:, :-1]), got.detach()[:, :-1])
