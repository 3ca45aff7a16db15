"""Algorithm types: which parts an ``algorithm_type`` uses by default, and ``resolve``.

An algorithm is the set of parts Trinity-RFT names in its ``algorithm`` config section:
``advantage_fn``, ``policy_loss_fn``, ``kl_penalty_fn`` (KL in the reward), ``kl_loss_fn``
(KL in the loss), ``entropy_loss_fn``, ``loss_agg_mode`` and ``sample_strategy``, each with
its ``*_args``. ``algorithm_type`` picks defaults for all of them; the config may override
any one by name::

    spec = resolve("grpo", policy_loss_fn="gspo", kl_loss_fn_args={"kl_coef": 0.01})

``resolve`` checks every name and argument against the registered functions, so a typo fails
when the config is read, not hours into a run. From the resolved parts it also derives what
the rest of the system must provide: a critic (GAE needs values), a reference model (any KL
term, DPO), a minimum ``repeat_times`` (group baselines need two rollouts per task) and
whether advantages need the whole batch (so the trainer computes them) or only one group (so
the buffer computes them as each group arrives).

``python -m ops.algorithms`` prints the table of defaults as markdown;
``python -m ops.algorithms --write docs/algorithms.md`` writes it.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ops import advantages, entropy, kl, policy_losses, rewards, sampling
from ops.aggregation import LOSS_AGG_MODES
from ops.registry import bad_values, get, names

# The ``algorithm.*`` config fields ``resolve`` accepts as overrides.
CONFIG_FIELDS: tuple[str, ...] = (
    "advantage_fn",
    "advantage_fn_args",
    "policy_loss_fn",
    "policy_loss_fn_args",
    "kl_penalty_fn",
    "kl_penalty_fn_args",
    "kl_loss_fn",
    "kl_loss_fn_args",
    "entropy_loss_fn",
    "entropy_loss_fn_args",
    "loss_agg_mode",
    "sample_strategy",
    "sample_strategy_args",
    "repeat_times",
)


@dataclass(frozen=True)
class AlgorithmSpec:
    """A fully resolved algorithm: part names, their arguments and what they require.

    The ``*_args`` dicts hold only non-default hyperparameters (the function signatures carry
    the defaults); call a part as ``get(kind, spec.policy_loss_fn)(..., **spec.policy_loss_fn_args)``.
    Treat the dicts as read-only.
    """

    algorithm_type: str
    advantage_fn: str | None  # None: the algorithm learns from data, not advantages (sft, dpo)
    advantage_fn_args: dict[str, Any]
    policy_loss_fn: str
    policy_loss_fn_args: dict[str, Any]
    kl_penalty_fn: str
    kl_penalty_fn_args: dict[str, Any]
    kl_loss_fn: str
    kl_loss_fn_args: dict[str, Any]
    entropy_loss_fn: str
    entropy_loss_fn_args: dict[str, Any]
    loss_agg_mode: str
    sample_strategy: str
    sample_strategy_args: dict[str, Any]
    repeat_times: int  # rollouts per task (default; DPO's 2 is one chosen/rejected pair)
    min_repeat_times: int  # 2 when the advantage compares rollouts of the same task
    use_critic: bool  # a value model is trained (GAE)
    use_reference: bool  # reference-model log-probs are needed (KL terms, DPO)
    use_teacher: bool  # the explorer scores rollouts with a teacher (on-policy distillation)
    compute_advantage_in_trainer: bool  # advantages need the whole batch, not one group
    schema: str  # training data: "experience" (rollouts), "sft" or "dpo" (datasets)


@dataclass(frozen=True)
class _Defaults:
    advantage_fn: str | None
    policy_loss_fn: str = "ppo"
    kl_penalty_fn: str = "none"
    kl_loss_fn: str = "k2"
    entropy_loss_fn: str = "default"
    loss_agg_mode: str = "token-mean"
    sample_strategy: str = "default"
    repeat_times: int = 2
    schema: str = "experience"
    advantage_fn_args: dict[str, Any] = field(default_factory=dict)
    policy_loss_fn_args: dict[str, Any] = field(default_factory=dict)


_NO_KL = {"kl_loss_fn": "none", "entropy_loss_fn": "none"}

# Trinity-RFT's defaults per algorithm type (trinity/algorithm/algorithm.py), one row each.
ALGORITHM_DEFAULTS: dict[str, _Defaults] = {
    "ppo": _Defaults("ppo", repeat_times=1),
    "grpo": _Defaults("grpo"),
    "sft": _Defaults(None, policy_loss_fn="sft", repeat_times=1, schema="sft", **_NO_KL),
    "dpo": _Defaults(None, policy_loss_fn="dpo", schema="dpo"),
    "mix": _Defaults(
        "grpo", policy_loss_fn="mix", entropy_loss_fn="mix", sample_strategy="mix", repeat_times=8
    ),
    "mix_chord": _Defaults(
        "grpo",
        policy_loss_fn="mix_chord",
        entropy_loss_fn="mix",
        sample_strategy="mix",
        repeat_times=8,
    ),
    # RAFT (reward-ranked fine-tuning): SFT's loss on the explorer's own rollouts; which ones
    # is the experience pipeline's (reward_filter) or the workflow's choice
    "raft": _Defaults(None, policy_loss_fn="sft", repeat_times=1, **_NO_KL),
    # upstream's GRPO with advantages computed in its trainer: the same values per group, so
    # computed in the buffer here as GRPO's are
    "grpo_verl": _Defaults("grpo"),
    "rec": _Defaults("rec", policy_loss_fn="rec"),
    "rloo": _Defaults("rloo"),
    "multi_step_grpo": _Defaults("step_wise_grpo", repeat_times=8),
    # GiGPO (newer upstream's GiGPOAlgorithm): episode- and anchor-state-level advantages, PPO's
    # symmetric clip at 0.2
    "gigpo": _Defaults(
        "gigpo",
        repeat_times=8,
        advantage_fn_args={"omega": 1.0, "gamma": 1.0, "fnorm": "none", "epsilon": 1e-6},
        policy_loss_fn_args={"clip_range_low": 0.2, "clip_range_high": 0.2, "loss_agg_mode": "token-mean"},
    ),
    "reinforceplusplus": _Defaults("reinforceplusplus"),
    "gspo": _Defaults("grpo", policy_loss_fn="gspo", loss_agg_mode="seq-mean-token-mean"),
    "topr": _Defaults("reinforce", policy_loss_fn="topr"),
    "sppo": _Defaults("opmd", policy_loss_fn="sppo", **_NO_KL),
    "asymre": _Defaults("asymre", policy_loss_fn="opmd", **_NO_KL),
    "cispo": _Defaults("grpo", policy_loss_fn="cispo"),
    # DAPO (arXiv:2503.14476): GRPO's advantage and PPO's loss without a KL term; its
    # clip-higher, token-level loss, overlong shaping and dynamic sampling are set in the config
    # (policy_loss_fn_args, math_dapo_reward, the dapo_dynamic_sampling operator)
    "dapo": _Defaults("grpo", kl_loss_fn="none", repeat_times=16),
    # M2PO: GRPO's advantage, its own loss (no clip; a second-moment token mask), no KL
    "m2po": _Defaults("grpo", policy_loss_fn="m2po", repeat_times=8, **_NO_KL),
    "sapo": _Defaults("grpo", policy_loss_fn="sapo"),
    "opmd": _Defaults("opmd", policy_loss_fn="opmd"),
    "on_policy_distill": _Defaults(
        "on_policy_distill",
        repeat_times=8,
        advantage_fn_args={"kl_coef": 1.0},
        **_NO_KL,
    ),
    "jsd": _Defaults(
        "jsd",
        repeat_times=8,
        advantage_fn_args={"kl_coef": 1.0, "lambda_coef": 0.5},
        **_NO_KL,
    ),
}

ALGORITHM_TYPES: tuple[str, ...] = tuple(ALGORITHM_DEFAULTS)
"""The built-in algorithm types (a plugin adds more with :func:`register_algorithm`)."""


def register_algorithm(name: str, *, advantage_fn: str | None, replace: bool = False, **defaults: Any) -> None:
    """Add algorithm type ``name``: its default parts and their arguments, as a row of
    :data:`ALGORITHM_DEFAULTS` has them (Trinity-RFT's ``AlgorithmType.default_config``; the
    ``trinity`` package's ``ALGORITHM_TYPE`` calls this). Checked at once by :func:`resolve`:
    a part or argument that does not exist fails the registration, naming it."""
    if name in ALGORITHM_DEFAULTS and not replace:
        raise ValueError(f"algorithm_type {name!r} is already registered (pass replace=True)")
    old = ALGORITHM_DEFAULTS.get(name)
    ALGORITHM_DEFAULTS[name] = _Defaults(advantage_fn, **defaults)
    try:
        resolve(name)
    except (ValueError, TypeError):
        if old is None:
            del ALGORITHM_DEFAULTS[name]
        else:
            ALGORITHM_DEFAULTS[name] = old
        raise

# Per config field: registry kind, and the data arguments of its functions (not hyperparameters).
_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "advantage_fn": ("advantage_fn", advantages.ADVANTAGE_DATA),
    "policy_loss_fn": ("policy_loss_fn", policy_losses.POLICY_LOSS_DATA),
    "entropy_loss_fn": ("entropy_loss_fn", entropy.ENTROPY_DATA),
}
_KL_WRAPPERS: dict[str, Callable[..., Any]] = {
    "kl_penalty_fn": kl.kl_penalty,
    "kl_loss_fn": kl.kl_loss,
}


#: The "default" :func:`hyperparameters` gives a keyword-only setting the config must give.
REQUIRED = inspect.Parameter.empty


def hyperparameters(fn: Callable[..., Any], data: tuple[str, ...] = ()) -> dict[str, Any]:
    """Keyword parameters of ``fn`` that are not data, with their defaults (``REQUIRED`` for a
    keyword-only one without)."""
    out: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in data or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind == p.POSITIONAL_ONLY or (p.default is p.empty and p.kind != p.KEYWORD_ONLY):
            continue
        out[p.name] = p.default
    return out


def _accepts_any(fn: Callable[..., Any]) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


def _check_args(
    field_name: str, fn_name: str, fn: Callable[..., Any], args: dict[str, Any], valid: list[str]
) -> None:
    unknown = sorted(set(args) - set(valid))
    if unknown and not _accepts_any(fn):
        raise ValueError(
            f"algorithm.{field_name}_args: {fn_name!r} has no argument(s) {', '.join(unknown)}; "
            f"valid names: {', '.join(valid) or '(none)'}"
        )
    params = inspect.signature(fn).parameters
    missing = [k for k in valid if k in params and params[k].default is REQUIRED and k not in args]
    if missing:
        raise ValueError(f"algorithm.{field_name}_args: {fn_name!r} needs {', '.join(missing)} (no default)")
    bad = bad_values(fn, args)
    if bad:
        raise ValueError("; ".join(f"algorithm.{field_name}_args.{line} ({fn_name!r})" for line in bad))


def _lookup(field_name: str, kind: str, name: str) -> Callable[..., Any]:
    try:
        return get(kind, name)
    except ValueError as err:
        raise ValueError(f"algorithm.{field_name}: {err}") from None


def resolve(algorithm_type: str, **overrides: Any) -> AlgorithmSpec:
    """The :class:`AlgorithmSpec` for ``algorithm_type`` with config ``overrides`` applied.

    ``overrides`` are ``algorithm.*`` config fields (:data:`CONFIG_FIELDS`); ``None`` keeps the
    default. ``*_args`` are merged over the algorithm's defaults for that part (dropped when the
    part itself is overridden by another name). ``loss_agg_mode`` is passed to every part
    that takes one unless its own args set it. Raises ``ValueError`` naming the field and the
    valid names for an unknown algorithm type, field, part, argument, loss_agg_mode,
    sample_strategy, or a ``repeat_times`` below the minimum.
    """
    if algorithm_type not in ALGORITHM_DEFAULTS:
        raise ValueError(
            f"algorithm.algorithm_type: unknown {algorithm_type!r}; "
            f"valid names: {', '.join(ALGORITHM_DEFAULTS)}"
        )
    unknown = sorted(set(overrides) - set(CONFIG_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown algorithm field(s) {', '.join(unknown)}; valid names: {', '.join(CONFIG_FIELDS)}"
        )
    given = {k: v for k, v in overrides.items() if v is not None}
    base = ALGORITHM_DEFAULTS[algorithm_type]

    loss_agg_mode = given.get("loss_agg_mode", base.loss_agg_mode)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"algorithm.loss_agg_mode: unknown {loss_agg_mode!r}; "
            f"valid names: {', '.join(LOSS_AGG_MODES)}"
        )
    sample_strategy = given.get("sample_strategy", base.sample_strategy)
    strategy_fn = _lookup("sample_strategy", "sample_strategy", sample_strategy)
    sample_strategy_args = dict(given.get("sample_strategy_args") or {})
    _check_args("sample_strategy", sample_strategy, strategy_fn, sample_strategy_args,
                list(hyperparameters(strategy_fn, sampling.SAMPLE_DATA)))

    resolved: dict[str, Any] = {}
    for field_name in ("advantage_fn", "policy_loss_fn", "entropy_loss_fn"):
        kind, data = _PARTS[field_name]
        default_name = getattr(base, field_name)
        name = given.get(field_name, default_name)
        default_args = getattr(base, f"{field_name}_args", {}) if name == default_name else {}
        args = {**default_args, **dict(given.get(f"{field_name}_args") or {})}
        if name is None:
            if args:
                raise ValueError(f"algorithm.{field_name}_args given but {algorithm_type} has none")
        else:
            fn = _lookup(field_name, kind, name)
            valid = list(hyperparameters(fn, data))
            _check_args(field_name, name, fn, args, valid)
            for key, mode in args.items():  # loss_agg_mode, and a part's own (sft_loss_agg_mode)
                if key.endswith("loss_agg_mode") and mode is not None and mode not in LOSS_AGG_MODES:
                    raise ValueError(f"algorithm.{field_name}_args.{key}: unknown {mode!r}; "
                                     f"valid names: {', '.join(LOSS_AGG_MODES)}")
            if "loss_agg_mode" in valid:
                args.setdefault("loss_agg_mode", loss_agg_mode)
        resolved[field_name] = name
        resolved[f"{field_name}_args"] = args

    for field_name, wrapper in _KL_WRAPPERS.items():
        name = given.get(field_name, getattr(base, field_name))
        _lookup(field_name, "kl_fn", name)
        args = dict(given.get(f"{field_name}_args") or {})
        valid = [k for k in hyperparameters(wrapper) if k != "kl_fn"]
        _check_args(field_name, name, wrapper, args, valid)
        if args.get("adaptive") and (args.get("target_kl") is None or args.get("horizon") is None):
            raise ValueError(
                f"algorithm.{field_name}_args: adaptive KL needs target_kl and horizon"
            )
        if "loss_agg_mode" in valid:
            args.setdefault("loss_agg_mode", loss_agg_mode)
        resolved[field_name] = name
        resolved[f"{field_name}_args"] = args

    adv = resolved["advantage_fn"]
    min_repeat_times = 2 if adv in advantages.GROUP_ADVANTAGE_FNS else 1
    repeat_times = int(given.get("repeat_times", base.repeat_times))
    if repeat_times < min_repeat_times:
        raise ValueError(
            f"algorithm.repeat_times: {algorithm_type} with advantage_fn {adv!r} compares "
            f"rollouts of the same task and needs repeat_times >= {min_repeat_times}, "
            f"got {repeat_times}"
        )
    local = advantages.GROUP_ADVANTAGE_FNS | advantages.SEQUENCE_ADVANTAGE_FNS
    batch_std = adv in ("grpo", "grpo_verl", "step_wise_grpo") and resolved["advantage_fn_args"].get("std_cal_level") == "batch"
    # A KL penalty in the reward needs reference log-probs, which only the trainer has.
    kl_in_reward = resolved["kl_penalty_fn"] != "none"
    in_trainer = adv is not None and (adv not in local or batch_std or kl_in_reward)
    use_teacher = adv in advantages.TEACHER_ADVANTAGE_FNS
    if use_teacher and in_trainer:
        raise ValueError(
            f"algorithm.kl_penalty_fn: {adv} computes advantages from the teacher's log-probs in "
            "the buffer; a KL penalty in the reward (computed in the trainer) cannot be combined with it"
        )

    return AlgorithmSpec(
        algorithm_type=algorithm_type,
        **resolved,
        loss_agg_mode=loss_agg_mode,
        sample_strategy=sample_strategy,
        sample_strategy_args=sample_strategy_args,
        repeat_times=repeat_times,
        min_repeat_times=min_repeat_times,
        use_critic=adv == "ppo",
        use_reference=(
            resolved["kl_penalty_fn"] != "none"
            or resolved["kl_loss_fn"] != "none"
            or resolved["policy_loss_fn"] == "dpo"
        ),
        use_teacher=use_teacher,
        compute_advantage_in_trainer=in_trainer,
        schema=base.schema,
    )


# ------------------------------------------------------------------------ docs table


def _builtin(kind: str) -> list[tuple[str, Callable[..., Any]]]:
    """Registered parts defined in ``ops`` itself (user parts are left out of the docs)."""
    return [(n, get(kind, n)) for n in names(kind) if get(kind, n).__module__.startswith("ops.")]


def _summary(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")


def _fmt_args(args: dict[str, Any]) -> str:
    return ", ".join(f"`{k}` (required)" if v is REQUIRED else f"`{k}={v!r}`" for k, v in args.items()) or "-"


def algorithms_markdown() -> str:
    """The defaults table and the list of registered parts, as markdown."""
    lines = [
        "# Algorithms",
        "",
        "<!-- Generated by `python -m ops.algorithms --write docs/algorithms.md`; do not edit."
        " tests/ops/test_algorithms.py fails when this file is out of date. -->",
        "",
        "Each `algorithm_type` sets a default for every part; any part can be overridden by name",
        "in the `algorithm` config section (`advantage_fn`, `policy_loss_fn`, `kl_penalty_fn`,",
        "`kl_loss_fn`, `entropy_loss_fn`, each with `*_args`, plus `loss_agg_mode` and",
        "`sample_strategy`). *Advantages in* says where advantages can be computed: `buffer`",
        "when one group (or one experience) suffices, `trainer` when they need the whole batch,",
        "the critic's values (*critic*: GAE) or reference log-probs (a `kl_penalty_fn`, KL in the",
        "reward, moves any advantage to the trainer). The critic is a value head on",
        "`model.critic_model_path`, trained in the trainer process with the clipped value loss",
        "(`critic.optim`, `critic.grad_clip`, `critic.cliprange_value`; `trainer.critic_warmup`",
        "steps train it alone).",
        "",
        "## Algorithm types",
        "",
        "| algorithm_type | advantage_fn | policy_loss_fn | kl_penalty_fn | kl_loss_fn "
        "| entropy_loss_fn | loss_agg_mode | sample_strategy | repeat_times (min) | critic "
        "| reference | advantages in | default args |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ALGORITHM_TYPES:
        s = resolve(name)
        base = ALGORITHM_DEFAULTS[name]
        args = {
            **{f"advantage_fn.{k}": v for k, v in base.advantage_fn_args.items()},
            **{f"policy_loss_fn.{k}": v for k, v in base.policy_loss_fn_args.items()},
        }
        where = "-" if s.advantage_fn is None else (
            "trainer" if s.compute_advantage_in_trainer else "buffer"
        )  # fmt: skip
        lines.append(
            f"| `{name}` | {s.advantage_fn or '-'} | {s.policy_loss_fn} | {s.kl_penalty_fn} "
            f"| {s.kl_loss_fn} | {s.entropy_loss_fn} | {s.loss_agg_mode} | {s.sample_strategy} "
            f"| {s.repeat_times} ({s.min_repeat_times}) | {'yes' if s.use_critic else 'no'} "
            f"| {'yes' if s.use_reference else 'no'} | {where} | {_fmt_args(args)} |"
        )
    lines += [
        "",
        f"`loss_agg_mode`: {', '.join(f'`{m}`' for m in LOSS_AGG_MODES)}.",
        "",
        "## Parts",
        "",
        "Hyperparameters are the function's keyword arguments (set them in `*_args`).",
        "Add a part with `@ops.registry.register(kind, name)` in a file of a folder listed in",
        "`TRINITY_PLUGIN_DIRS` (every trinity process imports them before it reads the config,",
        "so `trinity config` checks the name), or name it by import path: `module.path:function`.",
    ]
    sections: list[tuple[str, str, tuple[str, ...]]] = [
        ("advantage_fn", "advantage_fn", advantages.ADVANTAGE_DATA),
        ("policy_loss_fn", "policy_loss_fn", policy_losses.POLICY_LOSS_DATA),
        ("kl_fn", "kl_penalty_fn / kl_loss_fn", ("logprob", "ref_logprob")),
        ("entropy_loss_fn", "entropy_loss_fn", entropy.ENTROPY_DATA),
        ("reward_fn", "reward_fn (workflows)", rewards.REWARD_DATA),
        ("sample_strategy", "sample_strategy (buffer; args in `sample_strategy_args`)",
         sampling.SAMPLE_DATA),
    ]
    for kind, title, data in sections:
        lines += ["", f"### {title}", "", "| name | hyperparameters | what |", "|---|---|---|"]
        for part_name, fn in _builtin(kind):
            lines.append(
                f"| `{part_name}` | {_fmt_args(hyperparameters(fn, data))} | {_summary(fn)} |"
            )
        if kind == "kl_fn":
            for label, wrapper in _KL_WRAPPERS.items():
                args = {k: v for k, v in hyperparameters(wrapper).items() if k != "kl_fn"}
                lines += ["", f"`{label}_args`: {_fmt_args(args)}."]
    return "\n".join(lines) + "\n"


#: The generated part of ``docs/algorithms.md`` ends here; ``--write`` keeps what follows (the
#: measured runs, written by hand).
HAND_WRITTEN = "<!-- Written by hand below this line; --write keeps it. -->\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the algorithm table as markdown.")
    parser.add_argument("--write", metavar="PATH", help="write it to PATH instead of stdout")
    ns = parser.parse_args(argv)
    text = algorithms_markdown()
    if ns.write:
        try:
            with open(ns.write, encoding="utf-8") as fh:
                old = fh.read()
        except FileNotFoundError:
            old = ""
        kept = old.split(HAND_WRITTEN, 1)[1] if HAND_WRITTEN in old else ""
        with open(ns.write, "w", encoding="utf-8") as fh:
            fh.write(text + "\n" + HAND_WRITTEN + kept)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
