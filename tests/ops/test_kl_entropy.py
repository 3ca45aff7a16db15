"""KL estimators, KL as reward penalty and as loss, adaptive coefficient, entropy bonus."""

import math

import pytest
import torch

from ops.entropy import default_entropy_loss, mix_entropy_loss, no_entropy_loss
from ops.kl import adaptive_kl_coef, kl_loss, kl_penalty
from ops.registry import get, names
from tests.ops.helpers import assert_close

LP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
REF = [[-1.5, -0.5, -0.1], [-0.2, -3.0, -40.0]]
MASK = [[1, 1, 0], [1, 1, 1]]


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def _per_token(name, lp, ref):
    d = lp - ref  # log pi - log ref
    return {
        "none": 0.0,
        "k1": d,
        "k2": 0.5 * d * d,
        "k3": math.exp(-d) - 1 + d,
        "low_var_kl": min(max(math.exp(_clamp(-d, 20)) - 1 - _clamp(-d, 20), -10), 10),
        "abs": abs(d),
    }[name]


def _clamp(x, bound):
    return min(max(x, -bound), bound)


@pytest.mark.parametrize("name", ["none", "k1", "k2", "k3", "low_var_kl", "abs"])
def test_estimators_match_reference(name):
    got = get("kl_fn", name)(_t(LP), _t(REF))
    expected = [
        [_per_token(name, a, b) for a, b in zip(ra, rb, strict=True)]
        for ra, rb in zip(LP, REF, strict=True)
    ]
    assert_close(got, _t(expected))


def test_low_var_kl_is_clamped_and_k3_is_not():
    # log r = ref - lp = -39.3 ... the k3 estimate is 38.3; low_var_kl caps it at 10
    assert get("kl_fn", "k3")(_t(LP), _t(REF))[1, 2].item() == pytest.approx(math.exp(-39.3) + 38.3)
    assert get("kl_fn", "low_var_kl")(_t(LP), _t(REF))[1, 2].item() == 10.0
    # k3 is never negative, k1 can be
    assert (get("kl_fn", "k3")(_t(LP), _t(REF)) >= 0).all()
    assert (get("kl_fn", "k1")(_t(LP), _t(REF)) < 0).any()


def test_kl_registry_lists_names():
    assert names("kl_fn") == ["abs", "corrected_k3", "k1", "k2", "k3", "low_var_kl", "none"]
    with pytest.raises(ValueError, match="abs, corrected_k3, k1, k2, k3, low_var_kl, none"):
        get("kl_fn", "k4")


def test_kl_penalty_on_scalar_rewards():
    rewards = _t([1.0, 2.0])
    token, metrics = kl_penalty(
        rewards, _t(LP), _t(REF), torch.tensor(MASK), kl_fn="k1", kl_coef=0.1
    )
    kl = [
        [(a - b) * m for a, b, m in zip(ra, rb, mr, strict=True)]
        for ra, rb, mr in zip(LP, REF, MASK, strict=True)
    ]
    expected = [[-0.1 * k for k in row] for row in kl]
    expected[0][1] += 1.0  # reward on the last counted token
    expected[1][2] += 2.0
    assert_close(token, _t(expected))
    per_seq = [sum(kl[0]) / 2, sum(kl[1]) / 3]
    assert metrics["kl"] == pytest.approx(sum(per_seq) / 2)
    assert metrics["kl_coef"] == 0.1 and metrics["next_kl_coef"] == 0.1


def test_kl_penalty_none_keeps_token_rewards():
    token_rewards = _t([[0.0, 1.0, 0.0], [0.0, 0.0, 0.5]])
    out, metrics = kl_penalty(token_rewards, _t(LP), _t(REF), torch.tensor(MASK), kl_fn="none")
    assert_close(out, token_rewards)
    assert metrics == {}


def test_adaptive_coefficient_by_hand():
    # kl above target: error clipped to +0.2; coef * (1 + 0.2 * 64 / 1000)
    assert adaptive_kl_coef(
        0.1, current_kl=1.0, target_kl=0.1, horizon=1000, n_steps=64
    ) == pytest.approx(0.1 * 1.0128)
    # kl half the target: error -0.5 clipped to -0.2
    assert adaptive_kl_coef(0.1, 0.05, 0.1, 100, 10) == pytest.approx(0.1 * 0.98)
    # on target: unchanged
    assert adaptive_kl_coef(0.1, 0.1, 0.1, 100, 10) == pytest.approx(0.1)
    _, metrics = kl_penalty(
        _t([0.0, 0.0]), _t(LP), _t(REF), torch.tensor(MASK),
        kl_fn="abs", kl_coef=0.1, adaptive=True, target_kl=0.01, horizon=100,
    )  # fmt: skip
    assert metrics["next_kl_coef"] == pytest.approx(0.1 * (1 + 0.2 * 2 / 100))
    with pytest.raises(ValueError, match="target_kl"):
        kl_loss(_t(LP), _t(REF), torch.tensor(MASK), adaptive=True)


def test_kl_loss_value_and_gradient():
    logprob = _t(LP).requires_grad_(True)
    loss, metrics = kl_loss(logprob, _t(REF), torch.tensor(MASK), kl_fn="k2", kl_coef=0.5)
    vals = [
        0.5 * (a - b) ** 2
        for ra, rb, mr in zip(LP, REF, MASK, strict=True)
        for a, b, m in zip(ra, rb, mr, strict=True)
        if m
    ]
    assert metrics["kl_loss"] == pytest.approx(sum(vals) / len(vals))
    assert loss.item() == pytest.approx(0.5 * sum(vals) / len(vals))
    loss.backward()
    # the k2 gradient pulls logprob toward the reference: sign(grad) == sign(lp - ref)
    for i, row in enumerate(MASK):
        for j, m in enumerate(row):
            d = LP[i][j] - REF[i][j]
            g = logprob.grad[i, j].item()
            assert g == 0 if not m or d == 0 else math.copysign(1, g) == math.copysign(1, d)


def test_kl_loss_none_and_empty_mask():
    loss, metrics = kl_loss(_t(LP), _t(REF), torch.tensor(MASK), kl_fn="none")
    assert loss.item() == 0.0 and metrics == {}
    for name in names("kl_fn"):
        loss, _ = kl_loss(_t(LP), _t(REF), torch.zeros(2, 3), kl_fn=name)
        assert loss.item() == 0.0
        out, _ = kl_penalty(_t([1.0, 1.0]), _t(LP), _t(REF), torch.zeros(2, 3), kl_fn=name)
        assert torch.isfinite(out).all() and (out == 0).all()  # no counted token, nowhere to put it


def test_entropy_bonus_sign_and_modes():
    ent = _t([[1.0, 2.0, 9.0], [0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    term, metrics = default_entropy_loss(ent, mask, entropy_coef=0.01)
    assert metrics["entropy"] == pytest.approx((1 + 2 + 0.5) / 3)
    assert term.item() == pytest.approx(
        -0.01 * 3.5 / 3
    )  # added to the loss: more entropy, lower loss
    term, metrics = default_entropy_loss(
        ent, mask, entropy_coef=0.01, loss_agg_mode="seq-mean-token-mean"
    )
    assert metrics["entropy"] == pytest.approx((1.5 + 0.5) / 2)
    term, metrics = mix_entropy_loss(
        ent, mask, expert_mask=torch.tensor([False, True]), entropy_coef=1.0
    )
    assert metrics["entropy"] == pytest.approx(1.5)  # only the rollout row
    with pytest.raises(ValueError, match="expert_mask"):
        mix_entropy_loss(ent, mask)
    term, metrics = no_entropy_loss(ent, mask, entropy_coef=1.0)
    assert term.item() == 0.0 and metrics == {}
    for name in names("entropy_loss_fn"):
        term, _ = get("entropy_loss_fn", name)(
            ent, torch.zeros(2, 3), expert_mask=torch.tensor([False, False]), entropy_coef=1.0
        )
        assert term.item() == 0.0


def test_corrected_k3_is_k3_times_the_clamped_importance_ratio():
    """Trinity-RFT's corrected_k3 by hand: log pi = -1, log ref = -1.5, so k3 = e^-0.5 - 1 + 0.5;
    the rollout's log pi_old = -1.2 gives ratio e^0.2, and -2 would give e^1 = 2.72, clamped to 2.
    In the loss it needs old_logprob (kl_loss passes it); without it, as in the reward
    penalty, it is k3."""
    lp, ref = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.5, -1.5]])
    k3 = math.exp(-0.5) - 1 + 0.5
    out = get("kl_fn", "corrected_k3")(lp, ref, old_logprob=torch.tensor([[-1.2, -2.0]]))
    assert out[0].tolist() == pytest.approx([math.exp(0.2) * k3, 2.0 * k3])
    assert get("kl_fn", "corrected_k3")(lp, ref)[0].tolist() == pytest.approx([k3, k3])
    loss, m = kl_loss(lp, ref, torch.ones(1, 2), kl_fn="corrected_k3", kl_coef=1.0,
                      old_logprob=torch.tensor([[-1.2, -2.0]]))
    assert loss.item() == pytest.approx((math.exp(0.2) + 2.0) * k3 / 2) and m["kl_loss"] == pytest.approx(loss.item())
