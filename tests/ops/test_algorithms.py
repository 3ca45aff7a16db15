"""Algorithm types: defaults, overrides, validation, derived requirements, generated docs."""

import dataclasses
from pathlib import Path

import pytest
import torch

from ops import algorithms
from ops.algorithms import ALGORITHM_TYPES, AlgorithmSpec, algorithms_markdown, resolve
from ops.registry import get, register, unregister

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"

SEED_TYPES = (
    "ppo", "grpo", "sft", "dpo", "mix_chord", "rec", "rloo", "reinforceplusplus", "gspo",
    "topr", "sppo", "asymre", "cispo", "sapo", "opmd", "on_policy_distill", "jsd",
)  # fmt: skip


def test_every_seed_algorithm_type_resolves():
    assert set(SEED_TYPES) <= set(ALGORITHM_TYPES)
    for name in ALGORITHM_TYPES:
        spec = resolve(name)
        assert isinstance(spec, AlgorithmSpec) and spec.algorithm_type == name
        assert spec.repeat_times >= spec.min_repeat_times


@pytest.mark.parametrize(
    ("name", "adv", "loss", "kl_loss", "entropy", "critic", "ref", "min_rep"),
    [
        ("ppo", "ppo", "ppo", "k2", "default", True, True, 1),
        ("grpo", "grpo", "ppo", "k2", "default", False, True, 2),
        ("sft", None, "sft", "none", "none", False, False, 1),
        ("dpo", None, "dpo", "k2", "default", False, True, 1),
        ("mix_chord", "grpo", "mix_chord", "k2", "mix", False, True, 2),
        ("rec", "rec", "rec", "k2", "default", False, True, 2),
        ("rloo", "rloo", "ppo", "k2", "default", False, True, 2),
        ("reinforceplusplus", "reinforceplusplus", "ppo", "k2", "default", False, True, 1),
        ("gspo", "grpo", "gspo", "k2", "default", False, True, 2),
        ("topr", "reinforce", "topr", "k2", "default", False, True, 1),
        ("sppo", "opmd", "sppo", "none", "none", False, False, 2),
        ("asymre", "asymre", "opmd", "none", "none", False, False, 2),
        ("cispo", "grpo", "cispo", "k2", "default", False, True, 2),
        ("sapo", "grpo", "sapo", "k2", "default", False, True, 2),
        ("opmd", "opmd", "opmd", "k2", "default", False, True, 2),
        ("on_policy_distill", "on_policy_distill", "ppo", "none", "none", False, False, 1),
        ("jsd", "jsd", "ppo", "none", "none", False, False, 1),
        # newer upstream (agentscope-ai/Trinity-RFT main): DAPOAlgorithm, M2POAlgorithm
        ("dapo", "grpo", "ppo", "none", "default", False, False, 2),
        ("m2po", "grpo", "m2po", "none", "none", False, False, 2),
        ("gigpo", "gigpo", "ppo", "k2", "default", False, True, 2),
    ],
)
def test_defaults_follow_trinity(name, adv, loss, kl_loss, entropy, critic, ref, min_rep):
    spec = resolve(name)
    assert (spec.advantage_fn, spec.policy_loss_fn) == (adv, loss)
    assert (spec.kl_penalty_fn, spec.kl_loss_fn, spec.entropy_loss_fn) == ("none", kl_loss, entropy)
    assert (spec.use_critic, spec.use_reference, spec.min_repeat_times) == (critic, ref, min_rep)


def test_specific_defaults():
    assert (resolve("dapo").repeat_times, resolve("m2po").repeat_times) == (16, 8)
    assert resolve("gspo").loss_agg_mode == "seq-mean-token-mean"
    assert resolve("gspo").policy_loss_fn_args == {"loss_agg_mode": "seq-mean-token-mean"}
    assert resolve("mix_chord").sample_strategy == "mix"
    assert resolve("jsd").advantage_fn_args == {"kl_coef": 1.0, "lambda_coef": 0.5}
    assert resolve("dpo").schema == "dpo"
    assert resolve("sft").schema == "sft"
    assert resolve("ppo").compute_advantage_in_trainer
    assert resolve("reinforceplusplus").compute_advantage_in_trainer
    assert not resolve("grpo").compute_advantage_in_trainer
    assert resolve(
        "grpo", advantage_fn_args={"std_cal_level": "batch"}
    ).compute_advantage_in_trainer


def test_overrides_by_name_and_none_keeps_default():
    spec = resolve(
        "grpo",
        policy_loss_fn="gspo",
        policy_loss_fn_args={"clip_range_high": 0.001},
        kl_loss_fn="low_var_kl",
        kl_loss_fn_args={"kl_coef": 0.01},
        entropy_loss_fn=None,
        sample_strategy=None,
        repeat_times=8,
    )
    assert spec.policy_loss_fn == "gspo"
    assert spec.policy_loss_fn_args == {"clip_range_high": 0.001, "loss_agg_mode": "token-mean"}
    assert spec.kl_loss_fn == "low_var_kl"
    assert spec.kl_loss_fn_args == {"kl_coef": 0.01, "loss_agg_mode": "token-mean"}
    assert spec.entropy_loss_fn == "default" and spec.sample_strategy == "default"
    assert spec.repeat_times == 8


def test_loss_agg_mode_reaches_every_part_unless_set_there():
    spec = resolve(
        "grpo",
        loss_agg_mode="seq-mean-token-sum",
        entropy_loss_fn_args={"entropy_coef": 0.01, "loss_agg_mode": "token-mean"},
    )
    assert spec.policy_loss_fn_args["loss_agg_mode"] == "seq-mean-token-sum"
    assert spec.kl_loss_fn_args["loss_agg_mode"] == "seq-mean-token-sum"
    assert spec.entropy_loss_fn_args == {"entropy_coef": 0.01, "loss_agg_mode": "token-mean"}
    assert "loss_agg_mode" not in resolve("dpo").policy_loss_fn_args  # DPO is per pair


def test_default_args_dropped_when_the_part_is_swapped():
    spec = resolve("jsd", advantage_fn="on_policy_distill")
    assert spec.advantage_fn_args == {}
    assert resolve("jsd", advantage_fn_args={"kl_coef": 2.0}).advantage_fn_args == {
        "kl_coef": 2.0,
        "lambda_coef": 0.5,
    }


def test_derived_requirements_follow_the_parts():
    assert resolve("grpo", kl_loss_fn="none").use_reference is False
    assert resolve("sppo", kl_penalty_fn="k1").use_reference is True
    assert resolve("grpo", advantage_fn="ppo").use_critic is True
    assert resolve("grpo", advantage_fn="ppo").min_repeat_times == 1
    assert resolve("ppo", advantage_fn="grpo", repeat_times=4).min_repeat_times == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"algorithm_type": "grpoo"}, r"algorithm_type.*valid names: ppo, grpo"),
        ({"advantage_fn": "gpro"}, r"algorithm.advantage_fn: unknown advantage_fn 'gpro'.*grpo"),
        ({"policy_loss_fn": "ppo2"}, r"algorithm.policy_loss_fn.*valid names: .*gspo"),
        ({"kl_loss_fn": "k4"}, r"algorithm.kl_loss_fn.*valid names: abs, corrected_k3, k1, k2, k3"),
        ({"kl_penalty_fn": "kl"}, r"algorithm.kl_penalty_fn"),
        ({"entropy_loss_fn": "max"}, r"algorithm.entropy_loss_fn.*default, mix, none"),
        ({"loss_agg_mode": "mean"}, r"algorithm.loss_agg_mode.*token-mean"),
        ({"sample_strategy": "random"}, r"algorithm.sample_strategy.*staleness_control"),
        (
            {"policy_loss_fn_args": {"clip_rnage": 0.2}},
            r"policy_loss_fn_args.*clip_rnage.*clip_range",
        ),
        ({"advantage_fn_args": {"gamma": 0.9}}, r"advantage_fn_args.*gamma.*epsilon"),
        ({"kl_loss_fn_args": {"coef": 0.1}}, r"kl_loss_fn_args.*coef.*kl_coef"),
        ({"kl_penalty_fn_args": {"adaptive": True}}, r"adaptive KL needs target_kl"),
        ({"repeat_times": 1}, r"repeat_times >= 2, got 1"),
        ({"optimizer": {}}, r"unknown algorithm field.*valid names: advantage_fn"),
    ],
)
def test_wrong_names_fail_listing_valid_ones(kwargs, match):
    kwargs = {"algorithm_type": "grpo", **kwargs}
    with pytest.raises(ValueError, match=match):
        resolve(**kwargs)


@pytest.mark.parametrize("algorithm_type,kwargs,match", [
    ("m2po", {"policy_loss_fn_args": {"m2_threshold": -1}}, r"policy_loss_fn_args.m2_threshold: -1 must be >= 0"),
    ("m2po", {"policy_loss_fn_args": {"log_ratio_clip": float("inf")}}, r"log_ratio_clip: inf must be < inf"),
    ("ppo", {"policy_loss_fn_args": {"clip_ratio_c": 0.5}}, r"clip_ratio_c: 0.5 must be > 1.0 \('ppo'\)"),
    ("ppo", {"policy_loss_fn_args": {"clip_ratio_c": float("nan")}}, r"clip_ratio_c: nan must be > 1.0"),
    ("ppo", {"policy_loss_fn_args": {"clip_ratio_c": "big"}}, r"clip_ratio_c: 'big' is not a number"),
    ("grpo", {"advantage_fn_args": {"std_cal_level": "foo"}}, r"std_cal_level: 'foo' is not one of 'group', 'batch'"),
    ("gigpo", {"advantage_fn_args": {"fnorm": "max"}}, r"advantage_fn_args.fnorm: 'max' is not one of 'std'"),
    ("opmd", {"advantage_fn_args": {"opmd_baseline": "max"}}, r"opmd_baseline: 'max' is not one of"),
    ("rec", {"policy_loss_fn_args": {"weight": "x"}}, r"policy_loss_fn_args.weight: 'x' is not one of 'none'"),
    ("mix_chord", {"policy_loss_fn": "sft_phi", "policy_loss_fn_args": {"cutoff_prob": 0}}, r"cutoff_prob: 0 must be > 0"),
])
def test_a_value_the_part_rules_out_fails_naming_the_argument(algorithm_type, kwargs, match):
    """A part declares its valid values in its signature (Literal, annotated-types bounds), so
    a config is refused before start, not at the trainer's first step."""
    with pytest.raises(ValueError, match=match):
        resolve(algorithm_type, **kwargs)
    ok = {k: {a: None if a == "clip_ratio_c" else v for a, v in args.items()} for k, args in kwargs.items()
          if k.endswith("_args") and "clip_ratio_c" in args}
    if ok:  # None is the "off" a bound allows
        resolve(algorithm_type, **ok)


def test_a_plugin_parts_required_setting_must_be_given():
    """A part whose keyword-only setting has no default is refused until the config gives it,
    not at the trainer's first step."""
    from ops.registry import unregister

    @register("advantage_fn", "test_needs_beta")
    def needs_beta(*, action_mask, rewards=None, group_ids=None, beta: float, **_unused):
        raise AssertionError("not called")

    try:
        with pytest.raises(ValueError, match=r"advantage_fn_args: 'test_needs_beta' needs beta \(no default\)"):
            resolve("grpo", advantage_fn="test_needs_beta")
        assert resolve("grpo", advantage_fn="test_needs_beta", advantage_fn_args={"beta": 0.5})
    finally:
        unregister("advantage_fn", "test_needs_beta")


def test_user_registered_part_can_be_named():
    @register("advantage_fn", "test_median")
    def median_baseline(*, action_mask, rewards=None, shift: float = 0.0, **_unused):
        scores = rewards - rewards.median() + shift
        return scores[:, None] * action_mask

    try:
        spec = resolve("grpo", advantage_fn="test_median", advantage_fn_args={"shift": 1.0})
        assert spec.advantage_fn == "test_median" and spec.advantage_fn_args == {"shift": 1.0}
        assert spec.compute_advantage_in_trainer  # unknown scope: the safe choice
        adv = get("advantage_fn", spec.advantage_fn)(
            action_mask=torch.ones(3, 2), rewards=torch.tensor([1.0, 2.0, 4.0]), group_ids=None,
            **spec.advantage_fn_args,
        )  # fmt: skip
        assert adv[:, 0].tolist() == [0.0, 1.0, 3.0]
        with pytest.raises(ValueError, match="already registered"):
            register("advantage_fn", "grpo")(median_baseline)
    finally:
        unregister("advantage_fn", "test_median")


def test_spec_drives_a_full_loss_computation():
    """What a trainer does: look every part up by the spec's names and call it with its args."""
    spec = resolve("grpo", entropy_loss_fn_args={"entropy_coef": 0.01})
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])
    result = get("advantage_fn", spec.advantage_fn)(
        action_mask=mask, rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), group_ids=[0, 0, 1, 1],
        **spec.advantage_fn_args,
    )  # fmt: skip
    logits = torch.randn(4, 3, 7, requires_grad=True)
    logprob = torch.log_softmax(logits, -1).gather(-1, torch.randint(0, 7, (4, 3, 1))).squeeze(-1)
    pg, _ = get("policy_loss_fn", spec.policy_loss_fn)(
        logprob, logprob.detach(), result.advantages, mask, **spec.policy_loss_fn_args
    )
    from ops.kl import kl_loss
    from ops.logits import entropy_from_logits

    kl, _ = kl_loss(
        logprob, logprob.detach() - 0.1, mask, kl_fn=spec.kl_loss_fn, **spec.kl_loss_fn_args
    )
    ent, _ = get("entropy_loss_fn", spec.entropy_loss_fn)(
        entropy_from_logits(logits), mask, **spec.entropy_loss_fn_args
    )
    (pg + kl + ent).backward()
    assert torch.isfinite(logits.grad).all()


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolve("grpo").policy_loss_fn = "sft"  # type: ignore[misc]


def test_docs_table_is_up_to_date():
    assert DOC.exists(), "run: python -m ops.algorithms --write docs/algorithms.md"
    generated = DOC.read_text(encoding="utf-8").split("\n" + algorithms.HAND_WRITTEN, 1)[0]
    assert generated == algorithms_markdown(), (
        "docs/algorithms.md is out of date; run: python -m ops.algorithms --write docs/algorithms.md"
    )


def test_docs_list_every_type_and_part():
    text = algorithms_markdown()
    for name in ALGORITHM_TYPES:
        assert f"| `{name}` |" in text
    for kind in ("advantage_fn", "policy_loss_fn", "kl_fn", "entropy_loss_fn", "reward_fn"):
        for part in algorithms.names(kind):  # the built-in ones (a plugin a test loaded is not listed)
            if algorithms.get(kind, part).__module__.startswith("ops."):
                assert f"| `{part}` |" in text


def test_cli_prints_and_writes(tmp_path, capsys):
    assert algorithms.main([]) == 0
    assert capsys.readouterr().out == algorithms_markdown()
    target = tmp_path / "a.md"
    assert algorithms.main(["--write", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == algorithms_markdown() + "\n" + algorithms.HAND_WRITTEN
    with open(target, "a", encoding="utf-8") as f:
        f.write("## Measured\nkept\n")
    assert algorithms.main(["--write", str(target)]) == 0  # the hand-written part survives
    assert target.read_text(encoding="utf-8").endswith(algorithms.HAND_WRITTEN + "## Measured\nkept\n")


def test_ops_imports_nothing_from_the_rest_of_the_project():
    import ast

    ops_dir = Path(algorithms.__file__).parent
    for path in ops_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod.split(".")[0] not in ("schemas", "bus", "storage", "roles"), path


def test_a_parts_own_loss_agg_mode_is_checked():
    with pytest.raises(ValueError, match=r"policy_loss_fn_args.sft_loss_agg_mode: unknown 'token_mean'; valid names"):
        resolve("mix", policy_loss_fn_args={"sft_loss_agg_mode": "token_mean"})
    with pytest.raises(ValueError, match=r"'ppo' has no argument\(s\) ngpus_trainer"):
        resolve("ppo", policy_loss_fn_args={"ngpus_trainer": 4})
    assert resolve("mix", policy_loss_fn_args={"sft_loss_agg_mode": "seq-mean-token-sum"}).policy_loss_fn_args[
        "sft_loss_agg_mode"] == "seq-mean-token-sum"
