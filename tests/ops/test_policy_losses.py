"""Policy losses: values against float64 references, metrics, and gradient direction."""

import math

import pytest
import torch

from ops.policy_losses import (
    chord_mu_schedule,
    cispo_policy_loss,
    dpo_loss,
    gspo_policy_loss,
    importance_sampling_policy_loss,
    mix_chord_policy_loss,
    mix_policy_loss,
    opmd_policy_loss,
    ppo_policy_loss,
    rec_policy_loss,
    sapo_policy_loss,
    sft_loss,
    sppo_policy_loss,
    topr_policy_loss,
)
from ops.registry import get, names

# Two sequences of three tokens; ratios exp(L - OLD) = [1.105, 1.492, (pad)], [1.0, 0.368, 3.669].
L = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
OLD = [[-1.1, -0.9, -1.0], [-0.3, -0.2, -2.0]]
A = [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]
M = [[1, 1, 0], [1, 1, 1]]


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def _args():
    return _t(L).requires_grad_(True), _t(OLD), _t(A), torch.tensor(M)


def _tokens():
    """(row, col, logprob, old, adv) for every counted token."""
    return [
        (i, j, L[i][j], OLD[i][j], A[i][j])
        for i in range(len(M))
        for j in range(len(M[0]))
        if M[i][j]
    ]


def _token_mean(per_token):
    vals = [per_token(lp, old, a) for _, _, lp, old, a in _tokens()]
    return sum(vals) / len(vals)


def _seq_mean_token_mean(per_token):
    rows = {}
    for i, _, lp, old, a in _tokens():
        rows.setdefault(i, []).append(per_token(lp, old, a))
    return sum(sum(r) / len(r) for r in rows.values()) / len(rows)


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ----------------------------------------------------------------------------- values


def test_ppo_symmetric_clip_value_and_metrics():
    def per_token(lp, old, a):
        r = math.exp(lp - old)
        return max(-a * r, -a * _clip(r, 0.8, 1.2))

    loss, metrics = ppo_policy_loss(*_args(), clip_range=0.2)
    assert loss.item() == pytest.approx(_token_mean(per_token))
    # clipped: token (0,1) r=1.49 with A>0 and token (1,1) r=0.37 with A<0 -> 2 of 5
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)
    kl = sum(old - lp for _, _, lp, old, _ in _tokens()) / 5
    assert metrics["ppo_kl"] == pytest.approx(kl)
    assert metrics["pg_clipfrac_lower"] == 0.0


def test_ppo_asymmetric_and_dual_clip():
    def per_token(lp, old, a):
        r = math.exp(lp - old)
        clipped = max(-a * r, -a * _clip(r, 1 - 0.1, 1 + 0.3))
        return min(clipped, -a * 3.0) if a < 0 else clipped

    loss, metrics = ppo_policy_loss(
        *_args(), clip_range_low=0.1, clip_range_high=0.3, clip_ratio_c=3.0
    )
    assert loss.item() == pytest.approx(_token_mean(per_token))
    # token (1,2): A=-1, r=3.67 -> unclipped loss 3.67 capped at 3
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_policy_loss(*_args(), clip_ratio_c=0.5)


def test_ppo_loss_agg_mode_is_honoured():
    def per_token(lp, old, a):
        r = math.exp(lp - old)
        return max(-a * r, -a * _clip(r, 0.8, 1.2))

    loss, _ = ppo_policy_loss(*_args(), loss_agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx(_seq_mean_token_mean(per_token))


def test_gspo_uses_the_sequence_ratio():
    seq_log = {}
    for i, _, lp, old, _ in _tokens():
        seq_log.setdefault(i, []).append(lp - old)
    s = {i: math.exp(sum(v) / len(v)) for i, v in seq_log.items()}

    def per_token_for(i):
        return lambda lp, old, a: max(-a * s[i], -a * _clip(s[i], 1 - 0.2, 1 + 0.2))

    rows = {}
    for i, _, lp, old, a in _tokens():
        rows.setdefault(i, []).append(per_token_for(i)(lp, old, a))
    expected = sum(sum(r) / len(r) for r in rows.values()) / len(rows)
    loss, metrics = gspo_policy_loss(*_args(), clip_range_low=0.2, clip_range_high=0.2)
    assert loss.item() == pytest.approx(expected)
    assert metrics["ppo_kl_seq"] == pytest.approx(-sum(math.log(v) for v in s.values()) / 2)


def test_cispo_clips_and_detaches_the_weight():
    def per_token(lp, old, a):
        return -a * _clip(math.exp(lp - old), 0.0, 1.28) * lp

    loss, metrics = cispo_policy_loss(*_args())
    assert loss.item() == pytest.approx(_token_mean(per_token))
    assert metrics["masked_frac"] == 1.0

    def masked(lp, old, a):
        r = math.exp(lp - old)
        drop = (r > 1.28 and a > 0) or (r < 0.0 and a < 0)
        return 0.0 if drop else -a * _clip(r, 0.0, 1.28) * lp

    loss, metrics = cispo_policy_loss(*_args(), enable_mask_clip=True)
    assert loss.item() == pytest.approx(_token_mean(masked))
    assert metrics["masked_frac"] == pytest.approx(4 / 5)  # token (0,1): r=1.49, A>0


def test_sapo_soft_gate_value():
    def per_token(lp, old, a):
        tau = 1.0 if a > 0 else 1.05
        return -a * 4.0 / tau * _sigmoid(tau * (math.exp(lp - old) - 1.0))

    loss, metrics = sapo_policy_loss(*_args())
    assert loss.item() == pytest.approx(_token_mean(per_token))
    assert metrics["pos_adv_frac"] == pytest.approx(2 / 5)


def test_sapo_gradient_weight_is_one_on_policy():
    logprob = _t([[-0.7]]).requires_grad_(True)
    loss, _ = sapo_policy_loss(logprob, _t([[-0.7]]), _t([[2.0]]), torch.ones(1, 1))
    loss.backward()
    # d/dlogp of -A f(r) at r = 1 is -A * f'(1) * r = -A
    assert logprob.grad.item() == pytest.approx(-2.0)


def test_topr_truncates_only_negative_examples():
    def per_token(lp, old, a):
        alpha = _clip(math.exp(lp - old), 0.0, 1.0) if a <= 0 else 1.0
        return -alpha * a * lp

    loss, metrics = topr_policy_loss(*_args())
    assert loss.item() == pytest.approx(_token_mean(per_token))
    alphas = [(_clip(math.exp(lp - old), 0, 1) if a <= 0 else 1.0) for *_, lp, old, a in _tokens()]
    assert metrics["avg_alpha"] == pytest.approx(sum(alphas) / 5)


def test_sppo_log_ratio_with_trust_region():
    eps = 0.3

    def per_token(lp, old, a):
        r = math.exp(lp - old)
        inside = 1 / (1 + eps) <= r <= 1 + eps
        return -a * (lp - old) if inside else 0.0

    loss, metrics = sppo_policy_loss(*_args(), epsilon=eps)
    assert loss.item() == pytest.approx(_token_mean(per_token))
    assert metrics["pg_clipfrac"] == pytest.approx(3 / 5)  # r = 1.49, 0.37, 3.67 outside


@pytest.mark.parametrize(
    ("clip_mode", "weight", "regularizer"),
    [
        ("none", "none", "none"),
        ("two-side", "importance_sampling", "k2"),
        ("one-side", "truncated_importance_sampling", "forward-kl"),
        ("ring", "advantage", "none"),
    ],
)
def test_rec_modes(clip_mode, weight, regularizer):
    el, eh, elp, ehp, temp, coef = 0.2, 0.2, 0.6, 2.0, 0.5, 0.1

    def per_token(lp, old, a):
        r = math.exp(lp - old)
        two = 1 - el <= r <= 1 + eh
        if clip_mode == "two-side":
            inside = two
        elif clip_mode == "one-side":
            inside = (a >= 0 and r <= 1 + eh) or (a <= 0 and r >= 1 - el)
        elif clip_mode == "ring":
            inside = two or (a >= 0 and r <= 1 - elp) or (a <= 0 and r >= 1 + ehp)
        else:
            inside = True
        w = {
            "none": a,
            "importance_sampling": a * r,
            "truncated_importance_sampling": a * _clip(r, 1 - elp, 1 + ehp),
            "advantage": a * math.exp(a / temp),
        }[weight]
        value = -w * lp * (1.0 if inside else 0.0)
        if regularizer == "k2":
            value += coef * (lp - old) ** 2
        elif regularizer == "forward-kl":
            value -= coef * lp
        return value

    loss, _ = rec_policy_loss(
        *_args(),
        clip_mode=clip_mode,
        weight=weight,
        regularizer=regularizer,
        regularizer_coef=coef,
        temp=temp,
    )
    assert loss.item() == pytest.approx(_token_mean(per_token))


def test_rec_gspo_one_side_and_bad_names():
    seq = {}
    for i, _, lp, old, _ in _tokens():
        seq.setdefault(i, []).append(lp - old)
    s = {i: math.exp(sum(v) / len(v)) for i, v in seq.items()}
    rows = {}
    for i, _, lp, _, a in _tokens():
        inside = (a >= 0 and s[i] <= 1.2) or (a <= 0 and s[i] >= 0.8)
        rows.setdefault(i, []).append(-a * lp * s[i] * inside)
    expected = sum(sum(r) / len(r) for r in rows.values()) / len(rows)
    loss, _ = rec_policy_loss(
        *_args(), clip_mode="gspo-one-side", weight="gspo_importance_sampling"
    )
    assert loss.item() == pytest.approx(expected)
    for bad in ({"clip_mode": "x"}, {"weight": "x"}, {"regularizer": "x"}):
        with pytest.raises(ValueError, match="valid names"):
            rec_policy_loss(*_args(), **bad)


def test_opmd_sft_and_importance_sampling():
    loss, _ = opmd_policy_loss(*_args(), tau=3.0)
    assert loss.item() == pytest.approx(_token_mean(lambda lp, old, a: -a * lp) / 4.0)
    loss, metrics = sft_loss(*_args())
    assert loss.item() == pytest.approx(_token_mean(lambda lp, old, a: -lp))
    assert metrics["sft_loss"] == pytest.approx(loss.item())
    loss, _ = importance_sampling_policy_loss(*_args())
    assert loss.item() == pytest.approx(_token_mean(lambda lp, old, a: -a * math.exp(lp - old)))


def test_dpo_value_and_metrics():
    lp = [[-1.0, -2.0], [-1.5, -0.5], [-0.2, -0.3], [-2.0, -9.0]]
    ref = [[-1.2, -2.0], [-1.0, -1.0], [-0.5, -0.5], [-1.0, -1.0]]
    mask = [[1, 1], [1, 1], [1, 1], [1, 0]]
    beta, ls = 0.5, 0.1
    h = [
        sum(a - b for a, b, m in zip(lr, rr, mr, strict=True) if m)
        for lr, rr, mr in zip(lp, ref, mask, strict=True)
    ]
    losses = []
    for c, r in ((h[0], h[1]), (h[2], h[3])):
        z = beta * (c - r)
        losses.append(-(1 - ls) * math.log(_sigmoid(z)) - ls * math.log(_sigmoid(-z)))
    logprob = _t(lp)
    loss, metrics = dpo_loss(
        logprob, _t(lp), _t([[0.0] * 2] * 4), torch.tensor(mask),
        ref_logprob=_t(ref), beta=beta, label_smoothing=ls,
    )  # fmt: skip
    assert loss.item() == pytest.approx(sum(losses) / 2)
    assert metrics["chosen_reward"] == pytest.approx(beta * (h[0] + h[2]) / 2)
    assert metrics["rejected_reward"] == pytest.approx(beta * (h[1] + h[3]) / 2)
    assert metrics["accuracy_mean"] == pytest.approx(((h[0] > h[1]) + (h[2] > h[3])) / 2)
    # without ref_logprob, old_logprob is the reference (how Trinity-RFT passes it)
    same, _ = dpo_loss(
        logprob, _t(ref), _t([[0.0] * 2] * 4), torch.tensor(mask), beta=beta, label_smoothing=ls
    )
    assert same.item() == pytest.approx(loss.item())
    with pytest.raises(ValueError, match="pairs"):
        dpo_loss(logprob[:3], _t(ref)[:3], _t(ref)[:3], torch.ones(3, 2))


def test_chord_mu_schedule_by_hand():
    args = {"mu_warmup_steps": 10, "mu_decay_steps": 20, "mu_peak": 0.5, "mu_valley": 0.1}
    assert chord_mu_schedule(0, **args) == 0.0
    assert chord_mu_schedule(5, **args) == pytest.approx(0.25)
    assert chord_mu_schedule(10, **args) == pytest.approx(0.5)
    assert chord_mu_schedule(20, **args) == pytest.approx(0.3)  # half way down the cosine
    assert chord_mu_schedule(30, **args) == pytest.approx(0.1)
    assert chord_mu_schedule(99, **args) == pytest.approx(0.1)
    assert chord_mu_schedule(0, 0, 0, 0.7, 0.2) == pytest.approx(0.2)


def _ppo_ref_row(i, low=0.2, high=0.2):
    vals = []
    for row, _, lp, old, a in _tokens():
        if row == i:
            r = math.exp(lp - old)
            vals.append(max(-a * r, -a * _clip(r, 1 - low, 1 + high)))
    return sum(vals) / len(vals)


def test_mix_weights_rl_and_sft_rows():
    expert = torch.tensor([False, True])
    loss, metrics = mix_policy_loss(*_args(), expert_mask=expert, mu=0.25)
    sft = -(L[1][0] + L[1][1] + L[1][2]) / 3
    assert loss.item() == pytest.approx(0.75 * _ppo_ref_row(0) + 0.25 * sft)
    assert metrics["expert/sft_loss"] == pytest.approx(sft)
    assert metrics["mu"] == 0.25
    # no expert rows: pure PPO scaled by (1 - mu)
    only_rl, _ = mix_policy_loss(*_args(), expert_mask=torch.tensor([True, False]) & False, mu=0.25)
    ppo, _ = ppo_policy_loss(*_args())
    assert only_rl.item() == pytest.approx(0.75 * ppo.item())
    with pytest.raises(ValueError, match="expert_mask"):
        mix_policy_loss(*_args())


def test_mix_parts_average_over_the_whole_mini_batch_however_it_is_split():
    """Six rows, two of them expert, in micro-batches of 3 rows holding 0 and 2 expert rows:
    weighted as the trainer weighs them, the sum is (1 - mu) * the mean PPO loss of the 4
    rollout rows + mu * the mean SFT loss of the 2 expert rows (upstream's layout arithmetic)."""
    torch.manual_seed(0)
    lp, old = -torch.rand(6, 4), -torch.rand(6, 4)
    adv, mask = torch.randn(6, 4), torch.ones(6, 4)
    expert = torch.tensor([False, False, False, True, False, True])
    mu, kw = 0.3, {"loss_agg_mode": "seq-mean-token-mean"}
    total = 0.0
    for rows in ([0, 1, 2], [3, 4, 5]):
        r = torch.tensor(rows)
        share = len(rows) / 6  # the trainer's share of a micro-batch (seq modes: its rows)
        e = int(expert[r].sum())
        weights = ((len(rows) - e) / 4 / share, e / 2 / share)
        loss, _ = mix_policy_loss(lp[r], old[r], adv[r], mask[r], expert_mask=expert[r], mu=mu,
                                  part_weights=weights, **kw)
        total += share * loss.item()
    usual = [i for i in range(6) if not expert[i]]
    rl = sum(ppo_policy_loss(lp[[i]], old[[i]], adv[[i]], mask[[i]], **kw)[0].item() for i in usual) / 4
    sft = -(lp[3].mean() + lp[5].mean()).item() / 2
    assert total == pytest.approx((1 - mu) * rl + mu * sft, rel=1e-5)
    # a part's own aggregation: token-sum for the expert rows
    loss, m = mix_policy_loss(*_args(), expert_mask=torch.tensor([False, True]), mu=0.25,
                              sft_loss_agg_mode="seq-mean-token-sum")
    assert m["expert/sft_loss"] == pytest.approx(-sum(L[1]))


def test_mix_chord_phi_weighting_and_schedule():
    expert = torch.tensor([False, True])
    args = {"mu_warmup_steps": 0, "mu_decay_steps": 10, "mu_peak": 0.6, "mu_valley": 0.2}
    loss, metrics = mix_chord_policy_loss(*_args(), expert_mask=expert, global_step=5, **args)
    mu = 0.2 + 0.4 * 0.5 * (1 + math.cos(math.pi * 0.5))
    phi = [-lp * math.exp(lp) * (1 - math.exp(lp)) for lp in L[1]]
    sft = sum(phi) / 3
    assert metrics["mu"] == pytest.approx(mu)
    assert loss.item() == pytest.approx((1 - mu) * _ppo_ref_row(0) + mu * sft)
    plain, _ = mix_chord_policy_loss(
        *_args(), expert_mask=expert, global_step=5, enable_phi_function=False, **args
    )
    assert plain.item() == pytest.approx((1 - mu) * _ppo_ref_row(0) + mu * -sum(L[1]) / 3)


# ------------------------------------------------------------------ degenerate inputs


EXTRAS = {"expert_mask": torch.tensor([False, True]), "ref_logprob": _t(OLD)}


@pytest.mark.parametrize("name", names("policy_loss_fn"))
def test_empty_mask_gives_zero_loss_and_finite_grad(name):
    fn = get("policy_loss_fn", name)
    logprob, old, adv, _ = _args()
    loss, metrics = fn(logprob, old, adv, torch.zeros(2, 3), **EXTRAS)
    if name != "dpo":  # DPO of two empty sequences is log 2, finite
        assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprob.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", names("policy_loss_fn"))
def test_padding_values_do_not_leak(name):
    """Garbage on masked tokens (even an infinite advantage) must not change the loss."""
    fn = get("policy_loss_fn", name)
    logprob, old, adv, mask = _args()
    base, _ = fn(logprob, old, adv, mask, **EXTRAS)
    lp2, old2, adv2 = logprob.detach().clone(), old.clone(), adv.clone()
    lp2[0, 2], old2[0, 2], adv2[0, 2] = -50.0, 30.0, math.inf
    lp2.requires_grad_(True)
    other, _ = fn(lp2, old2, adv2, mask, **EXTRAS)
    assert other.item() == pytest.approx(base.item())
    # finite garbage must not reach the gradient either
    adv2[0, 2] = 1e6
    other, _ = fn(lp2, old2, adv2, mask, **EXTRAS)
    other.backward()
    assert torch.isfinite(lp2.grad).all() and lp2.grad[0, 2] == 0


# --------------------------------------------------------------------- gradient signs

RL_LOSSES = [n for n in names("policy_loss_fn") if n not in ("sft", "sft_is", "sft_phi", "dpo", "mix", "mix_chord")]


def _step_logprob(name, advantage, token=2, lr=0.5, old_offset=0.0, **extra):
    """Log-prob of ``token`` before and after one gradient step on a toy logit vector."""
    logits = torch.tensor([0.3, -0.2, 0.1, 0.5, -1.0], dtype=torch.float64, requires_grad=True)
    logprob = torch.log_softmax(logits, dim=-1)[token].reshape(1, 1)
    old = logprob.detach() + old_offset
    loss, _ = get("policy_loss_fn", name)(
        logprob, old, _t([[advantage]]), torch.ones(1, 1), **extra
    )
    loss.backward()
    with torch.no_grad():
        after = torch.log_softmax(logits - lr * logits.grad, dim=-1)[token]
    return logprob.item(), after.item()


@pytest.mark.parametrize("name", RL_LOSSES)
def test_positive_advantage_raises_the_token_probability(name):
    before, after = _step_logprob(name, 1.0)
    assert after > before


@pytest.mark.parametrize("name", RL_LOSSES)
def test_negative_advantage_lowers_the_token_probability(name):
    before, after = _step_logprob(name, -1.0)
    assert after < before


@pytest.mark.parametrize("name", ["ppo", "cispo", "sapo", "topr", "sppo", "rec", "opmd"])
def test_direction_holds_slightly_off_policy(name):
    for adv in (1.0, -1.0):
        before, after = _step_logprob(name, adv, old_offset=0.05)
        assert (after - before) * adv > 0


def test_ppo_clipped_token_gets_no_gradient():
    # ratio = e^0.5 = 1.65 > 1.2 with A > 0: the clip removes the incentive entirely
    before, after = _step_logprob("ppo", 1.0, old_offset=-0.5)
    assert after == pytest.approx(before)


@pytest.mark.parametrize("name", ["sft", "sft_is", "sft_phi", "mix", "mix_chord"])
def test_supervised_parts_raise_the_demonstrated_token(name):
    extra = {"expert_mask": torch.tensor([True])} if name.startswith("mix") else {}
    before, after = _step_logprob(name, 0.0, **extra)
    assert after > before


@pytest.mark.parametrize("name", ["mix", "mix_chord"])
def test_mix_rl_rows_follow_the_advantage(name):
    extra = {"expert_mask": torch.tensor([False])}
    for adv in (1.0, -1.0):
        before, after = _step_logprob(name, adv, **extra)
        assert (after - before) * adv > 0


def test_dpo_moves_probability_from_rejected_to_chosen():
    logits = torch.tensor([0.3, -0.2, 0.1, 0.5, -1.0], dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(logits, dim=-1)
    chosen, rejected = 1, 3
    logprob = torch.stack([logp[chosen], logp[rejected]]).reshape(2, 1)
    loss, _ = dpo_loss(logprob, logprob.detach(), torch.zeros(2, 1), torch.ones(2, 1))
    loss.backward()
    with torch.no_grad():
        new = torch.log_softmax(logits - 1.0 * logits.grad, dim=-1)
    assert new[chosen] > logp[chosen]
    assert new[rejected] < logp[rejected]


# ------------------------------------------------------------------ M2PO, checked by hand


def test_m2po_mask_drops_the_largest_second_moments_until_the_mean_fits():
    """Algorithm 1 of M2PO: log-ratios 0.1, 0.2, 0.3 with A > 0 are all in PPO's active
    quadrant; their mean square (0.01 + 0.04 + 0.09) / 3 = 0.0467 > 0.04, so 0.3 goes and
    (0.01 + 0.04) / 2 = 0.025 fits."""
    from ops.policy_losses import m2po_token_mask

    mask, m = m2po_token_mask(torch.tensor([[0.1, 0.2, 0.3]]), torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 3))
    assert mask.tolist() == [[True, True, False]]
    assert m["m2po/m2_before"] == pytest.approx(0.14 / 3) and m["m2po/m2_after"] == pytest.approx(0.025)
    assert m["m2po/masked_fraction"] == pytest.approx(1 / 3) and m["m2po/trust_region_fraction"] == 1.0
    # only the quadrants where a clip would bite are constrained: r > 1 with A < 0 and r < 1
    # with A > 0 stay however far the ratio is
    mask, _ = m2po_token_mask(torch.tensor([[1.0, -1.0, 1.0, -1.0]]), torch.ones(1, 4, dtype=torch.bool),
                              torch.tensor([[-1.0, 1.0, 1.0, -1.0]]), 0.1)
    assert mask.tolist() == [[True, True, False, False]]
    # a masked-out position (padding) is never kept, and never counted
    mask, m = m2po_token_mask(torch.tensor([[0.1, 5.0]]), torch.tensor([[True, False]]), torch.ones(1, 2))
    assert mask.tolist() == [[True, False]] and m["m2po/masked_fraction"] == 0.0
    with pytest.raises(ValueError, match="m2_threshold"):
        m2po_token_mask(torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), -0.1)


def test_m2po_mask_is_the_papers_drop_the_largest_loop():
    from ops.policy_losses import m2po_token_mask

    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        lr, adv = 0.8 * torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
        valid = torch.rand(4, 7, generator=g) > 0.2
        expected = valid.clone().reshape(-1)
        active = torch.nonzero((valid & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))).reshape(-1)).squeeze(-1).tolist()
        m2 = lr.square().reshape(-1)
        while active and m2[active].mean() > 0.04:
            largest = max(active, key=lambda i: m2[i])
            expected[largest] = False
            active.remove(largest)
        assert m2po_token_mask(lr, valid, adv)[0].reshape(-1).tolist() == expected.tolist()


def test_m2po_loss_counts_masked_tokens_in_the_denominator_and_gives_them_no_gradient():
    """l = -A r on kept tokens, over every counted token: ratios 1 and e, the second masked:
    loss = -(1 * 1 + 0) / 2 = -0.5, gradient -A r / 2 = -0.5 on the first token, 0 on the second."""
    from ops.policy_losses import m2po_policy_loss

    lp = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss, m = m2po_policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool),
                               m2po_mask=torch.tensor([[True, False]]))
    loss.backward()
    assert loss.item() == pytest.approx(-0.5) and m["pg_loss"] == pytest.approx(-0.5)
    assert lp.grad.tolist() == [[-0.5, 0.0]]
    # the log-ratio is clamped in value only: a ratio past e^20 keeps its gradient
    big = torch.tensor([[25.0]], requires_grad=True)
    loss, _ = m2po_policy_loss(big, torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool),
                               m2po_mask=torch.ones(1, 1, dtype=torch.bool))
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5) and big.grad.item() == pytest.approx(math.exp(20.0), rel=1e-5)
    with pytest.raises(ValueError, match="token-mean"):
        m2po_policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), loss_agg_mode="seq-mean-token-mean")


def test_sft_is_and_sft_phi_weight_each_token_by_hand():
    """Probabilities 0.5 and 0.9: sft_is = -(0.5 ln 0.5 + 0.9 ln 0.9) / 2; sft_phi weights by
    p (1 - p) = 0.25 and 0.09; with cutoff_prob 0.8 the 0.9 token gets no gradient."""
    from ops.policy_losses import sft_is_loss, sft_phi_loss

    p = torch.tensor([[0.5, 0.9]])
    mask = torch.ones(1, 2)
    lp = p.log().requires_grad_(True)
    loss, m = sft_is_loss(lp, lp.detach(), torch.zeros(1, 2), mask)
    assert loss.item() == pytest.approx(-(0.5 * math.log(0.5) + 0.9 * math.log(0.9)) / 2)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.25, -0.45]) and m["sft_is_loss"] == pytest.approx(loss.item())
    lp = p.log().requires_grad_(True)
    loss, _ = sft_phi_loss(lp, lp.detach(), torch.zeros(1, 2), mask)
    assert loss.item() == pytest.approx(-(0.25 * math.log(0.5) + 0.09 * math.log(0.9)) / 2)
    lp = p.log().requires_grad_(True)
    loss, _ = sft_phi_loss(lp, lp.detach(), torch.zeros(1, 2), mask, cutoff_prob=0.8)
    loss.backward()
    assert loss.item() == pytest.approx(-(0.25 * math.log(0.5) + 0.09 * math.log(0.8)) / 2)
    assert lp.grad[0].tolist() == pytest.approx([-0.125, 0.0])
    with pytest.raises(ValueError, match="cutoff_prob"):
        sft_phi_loss(lp, lp.detach(), torch.zeros(1, 2), mask, cutoff_prob=0.0)
