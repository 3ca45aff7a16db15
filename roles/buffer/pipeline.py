"""The experience pipeline: what happens to a group between the bus and the replay store.

Operators come from ``data_processor.experience_pipeline.operators`` (name + args) and run in
order on each :class:`ExperienceGroup`; an operator returns the (possibly changed) group or
None to drop it. After them, when the algorithm's advantage needs only one group (GRPO, RLOO,
OPMD, ...: ``not spec.compute_advantage_in_trainer``), the group's advantages are computed
here, the moment the group arrives, with the function from :mod:`ops`. Keeping this a plain
function of the group (no I/O) is why a redelivered message gives the same stored result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import ops
from ops.advantages import INFO_ADVANTAGE_FNS
from ops.algorithms import AlgorithmSpec
from schemas.config import ExperiencePipelineConfig
from schemas.data import ExperienceGroup
from storage import juicer

Operator = Callable[[ExperienceGroup], ExperienceGroup | None]


SHAPING_OPS: dict[str, Callable[[float, float], float]] = {
    "ADD": lambda r, x: r + x, "SUB": lambda r, x: r - x,
    "MUL": lambda r, x: r * x, "DIV": lambda r, x: r / x if x != 0 else r,
}


def check_shaping_configs(reward_shaping_configs: list[dict[str, Any]]) -> None:
    """Refuse a ``reward_shaping_configs`` entry that could not shape anything, naming it."""
    if not isinstance(reward_shaping_configs, list) or not reward_shaping_configs:
        raise ValueError("reward_shaping_configs: a non-empty list of {stats_key, op_type, weight}")
    for j, c in enumerate(reward_shaping_configs):
        where = f"reward_shaping_configs[{j}]"
        if not isinstance(c, dict):
            raise ValueError(f"{where}: a mapping with stats_key, op_type, weight; got {c!r}")
        unknown = sorted(set(c) - {"stats_key", "op_type", "weight"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (stats_key, op_type, weight)")
        if not isinstance(c.get("stats_key"), str) or not c["stats_key"]:
            raise ValueError(f"{where}.stats_key: missing; name the experience info stat that shapes the reward")
        if str(c.get("op_type", "ADD")).upper() not in SHAPING_OPS:
            raise ValueError(f"{where}.op_type: {c.get('op_type')!r} is not one of {', '.join(SHAPING_OPS)}")
        w = c.get("weight", 1.0)
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise ValueError(f"{where}.weight: a number is needed, got {w!r}")


def reward_shaping_mapper(group: ExperienceGroup, *,
                          reward_shaping_configs: list[dict[str, Any]]) -> ExperienceGroup:
    """Trinity-RFT's ``reward_shaping_mapper``: for each ``{stats_key, op_type, weight}`` in
    order, ``reward <op>= weight * info[stats_key]`` (op ADD, SUB, MUL or DIV; a zero divisor
    leaves the reward). The stat comes from an earlier operator (e.g. a Data-Juicer scorer)
    or the workflow. An experience without it is an error naming it, where Trinity-RFT
    skips silently: shaping that never happens is a bug nobody would see."""
    check_shaping_configs(reward_shaping_configs)
    for i, e in enumerate(group.experiences):
        if e.reward is None:
            continue
        r = float(e.reward)
        for c in reward_shaping_configs:
            key = c["stats_key"]
            if key not in e.info:
                raise ValueError(f"ExperienceGroup.experiences[{i}].info[{key!r}]: missing; "
                                 f"reward_shaping_mapper's stats_key names it")
            stat = e.info[key]
            if isinstance(stat, bool) or not isinstance(stat, (int, float)):
                raise ValueError(f"ExperienceGroup.experiences[{i}].info[{key!r}]: {stat!r} is not a number")
            r = SHAPING_OPS[str(c.get("op_type", "ADD")).upper()](r, float(c.get("weight", 1.0)) * float(stat))
        e.reward = r
    return group


def pass_rate_calculator(group: ExperienceGroup, *, success_threshold: float | None = None) -> ExperienceGroup:
    """The group's pass rate into ``group.metrics["pass_rate"]``: the mean reward (Trinity-RFT's
    definition), or with ``success_threshold`` the share of rewards at or above it (for rewards
    outside [0, 1]). The buffer sends it back to the explorer's task selector
    (``difficulty_based``) as a :class:`schemas.data.TaskFeedback`; place it before operators
    that drop groups, so that dropped groups are counted too."""
    rewards = [float(e.reward) for e in group.experiences if e.reward is not None]
    if rewards:
        if success_threshold is None:
            group.metrics["pass_rate"] = sum(rewards) / len(rewards)
        else:
            group.metrics["pass_rate"] = sum(r >= success_threshold for r in rewards) / len(rewards)
    return group


def data_juicer(group: ExperienceGroup, *, config_path: str | None = None, operators: list[Any] | None = None,
                keep_filtered: bool = False) -> ExperienceGroup | None:
    """Real Data-Juicer filters on each experience's response (``text``; its prompt is
    ``prompt``), in-process (``storage/juicer.py``): every stat they compute goes into
    ``info`` (e.g. ``text_len`` for ``reward_shaping_mapper``), and the experiences a filter
    rejects are dropped (``keep_filtered``: only scored). ``config_path``: a Data-Juicer recipe
    (its ``process`` list); ``operators``: the same list inline."""

    built = juicer.load(juicer.recipe(config_path, operators), rows_only=True)
    rows = []
    for i, e in enumerate(group.experiences):
        if e.response_text is None:
            raise ValueError(f"ExperienceGroup.experiences[{i}].response_text: none; data_juicer scores the response text")
        rows.append({"text": e.response_text, "prompt": e.prompt_text or ""})
    out, kept = juicer.run(built, rows)
    for e, row in zip(group.experiences, out, strict=True):
        e.info.update(juicer.stats_of(row))
    if not keep_filtered:
        group.experiences = [e for e, k in zip(group.experiences, kept, strict=True) if k]
    return group if group.experiences else None


def reward_shaping(group: ExperienceGroup, *, scale: float = 1.0, bias: float = 0.0,
                   clip: list[float] | None = None) -> ExperienceGroup:
    """``r' = clip(scale * r + bias)``: rescale rewards (e.g. map {0, 1} to {-1, 1})."""
    for e in group.experiences:
        if e.reward is None:
            continue
        r = scale * float(e.reward) + bias
        if clip is not None:
            r = min(max(r, float(clip[0])), float(clip[1]))
        e.reward = r
    return group


def drop_equal_reward_groups(group: ExperienceGroup, *, min_size: int = 2, fill: bool = False,
                             max_fill_rounds: int = 3) -> ExperienceGroup | None:
    """Drop a group whose rewards are all equal: a group baseline gives every member advantage
    0, so it costs a training slot and teaches nothing. With ``fill`` (DAPO's dynamic
    sampling) the explorer runs as many more tasks in the step as groups were dropped, up to
    ``max_fill_rounds`` times, so the trainer still gets a full batch (``roles/explorer``)."""
    rewards = [e.reward for e in group.experiences if e.reward is not None]
    if len(rewards) >= min_size and max(rewards) == min(rewards):
        return None
    return group


def reward_filter(group: ExperienceGroup, *, threshold: float = 0.0) -> ExperienceGroup | None:
    """Trinity-RFT's ``reward_filter``: keep the experiences whose reward is at least
    ``threshold`` (one without a reward goes too, where upstream's would raise)."""
    group.experiences = [e for e in group.experiences if e.reward is not None and e.reward >= threshold]
    return group if group.experiences else None


def reward_std_filter(group: ExperienceGroup, *, threshold: float = 0.0) -> ExperienceGroup | None:
    """Trinity-RFT's ``reward_std_filter``: drop a group of fewer than two experiences, or one
    whose rewards' (population) standard deviation is at most ``threshold``."""
    rewards = [float(e.reward) if e.reward is not None else math.nan for e in group.experiences]
    if len(rewards) < 2 or not float(np.std(rewards)) > threshold:
        return None
    return group


def invalid_reward_filter(group: ExperienceGroup) -> ExperienceGroup | None:
    """Trinity-RFT's ``invalid_reward_filter``: drop the experiences whose reward is missing or NaN."""
    group.experiences = [e for e in group.experiences if e.reward is not None and not math.isnan(e.reward)]
    return group if group.experiences else None


def dapo_dynamic_sampling(group: ExperienceGroup, *, metric_key: str = "accuracy",
                          correct_threshold: float = 0.0, fill: bool = False,
                          max_fill_rounds: int = 3) -> ExperienceGroup | None:
    """Trinity-RFT's ``dapo_dynamic_sampling`` (DAPO, arXiv:2503.14476 sec. 3.2): keep a group
    only when some but not all of its rollouts are correct, correct meaning the rollout's
    ``info[metric_key]`` (else its reward) is above ``correct_threshold``. Why the outcome and
    not the reward: DAPO's reward adds a length penalty, which would make an all-correct group
    look mixed. A group of one goes too. As upstream's, by default it only drops, and the
    trainer's batches then take the next step's groups (a run may end steps short); with
    ``fill`` the explorer runs as many more tasks in the step as groups were dropped, up to
    ``max_fill_rounds`` times, as the paper's sampler does (as ``drop_equal_reward_groups``)."""
    def correct(e: Any) -> bool:
        score = e.info.get(metric_key, e.reward)
        if score is None:
            raise ValueError(f"dapo_dynamic_sampling: experience {e.id} has no {metric_key!r} in its info and no reward")
        return float(score) > correct_threshold

    n = sum(correct(e) for e in group.experiences)
    return group if len(group.experiences) >= 2 and 0 < n < len(group.experiences) else None


def mask_response_truncated(group: ExperienceGroup) -> ExperienceGroup:
    """Trinity-RFT's ``mask_response_truncated`` (DAPO's overlong filtering, sec. 3.4): a
    response cut at ``max_tokens`` stays in its group (its reward still counts in the group's
    baseline) but none of its tokens is trained on. ``drop_truncated`` removes it instead."""
    for e in group.experiences:
        if e.response_truncated:
            e.action_mask = np.zeros(e.response_length, dtype=bool)
    return group


def drop_truncated(group: ExperienceGroup) -> ExperienceGroup | None:
    """Drop experiences whose response was cut at max_tokens (their reward is unreliable)."""
    group.experiences = [e for e in group.experiences if not e.response_truncated]
    return group if group.experiences else None


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, (list, tuple)):
        return any(_has_nan(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    return False


def check_arg_types(fn: Callable[..., Any], args: dict[str, Any], where: str, name: str) -> None:
    """Refuse an operator argument whose value does not have the type its parameter is
    annotated with (strictly: ``'big'`` is no float, ``'true'`` no bool, ``2.0`` no int), or
    that holds a NaN, naming ``<where>.<arg>``. Why before start: the operator would raise on
    every group, every group would go to the dead-letter stream, and the run would never end.
    A parameter without an annotation (or with one that does not resolve) takes anything."""
    import typing

    from pydantic import ConfigDict, TypeAdapter, ValidationError
    from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a plugin's annotations that do not resolve: unchecked
        hints = {}
    for arg, value in args.items():
        tp = hints.get(arg)
        if tp is not None:
            try:
                TypeAdapter(tp, config=ConfigDict(arbitrary_types_allowed=True)).validate_python(value, strict=True)
            except ValidationError:
                raise ValueError(f"{where}.{arg}: got {value!r}; {name} takes {_type_name(tp)}") from None
            except (PydanticSchemaGenerationError, PydanticUserError):
                pass  # a type pydantic cannot check: left to the operator
        if _has_nan(value):
            raise ValueError(f"{where}.{arg}: got {value!r}; NaN is no setting ({name})")


OPERATORS: dict[str, Callable[..., ExperienceGroup | None]] = {
    "reward_shaping": reward_shaping,
    "reward_shaping_mapper": reward_shaping_mapper,
    "pass_rate_calculator": pass_rate_calculator,
    "data_juicer": data_juicer,
    "reward_filter": reward_filter,
    "reward_std_filter": reward_std_filter,
    "invalid_reward_filter": invalid_reward_filter,
    "drop_equal_reward_groups": drop_equal_reward_groups,
    "drop_truncated": drop_truncated,
    "dapo_dynamic_sampling": dapo_dynamic_sampling,
    "mask_response_truncated": mask_response_truncated,
}


def teacher_row(e: Any) -> torch.Tensor:
    """Experience ``e``'s teacher log-probs, one per response token (on-policy distillation:
    the explorer scores each rollout with ``explorer.auxiliary_models[0]``)."""
    if e.teacher_logprobs is None:
        raise ValueError(f"experience {e.id}: no teacher_logprobs; the explorer scores rollouts with "
                         "explorer.auxiliary_models[0] for on-policy distillation")
    lp = torch.as_tensor(np.asarray(e.teacher_logprobs, dtype=np.float32))
    if lp.ndim != 1:
        raise ValueError(f"experience {e.id}: teacher_logprobs of shape {tuple(lp.shape)}; "
                         "distillation needs the sampled token's (one per response token)")
    return lp


def group_advantages(group: ExperienceGroup, spec: AlgorithmSpec) -> ExperienceGroup | None:
    """Fill ``advantages``/``returns`` of every experience with ``spec.advantage_fn`` over the
    group (responses padded to the longest); rows the function does not keep are dropped. The
    function's metrics go into ``group.metrics`` as ``advantage/<name>``, kept or not."""
    exps = group.experiences
    if not exps:
        return None
    lengths = [e.response_length for e in exps]
    t = max(max(lengths), 1)
    # padded in numpy, one torch tensor each: row by row in torch cost the buffer ~10% of its
    # CPU on the quickstart (a torch op on a tiny slice costs more than the work)
    mask = np.zeros((len(exps), t), dtype=bool)
    old = np.zeros((len(exps), t), dtype=np.float32)
    teacher = torch.zeros(len(exps), t, dtype=torch.float32) if spec.use_teacher else None
    for i, (e, n) in enumerate(zip(exps, lengths, strict=True)):
        mask[i, :n] = True if e.action_mask is None else e.action_mask
        if e.logprobs is not None:
            old[i, :n] = e.logprobs
        if teacher is not None:
            teacher[i, :n] = teacher_row(e)
    rewards = torch.tensor([0.0 if e.reward is None else float(e.reward) for e in exps], dtype=torch.float32)
    fn = ops.get("advantage_fn", spec.advantage_fn)
    infos = {"infos": [e.info for e in exps]} if spec.advantage_fn in INFO_ADVANTAGE_FNS else {}
    res = fn(action_mask=torch.from_numpy(mask), rewards=rewards, group_ids=[e.advantage_group for e in exps],
             old_logprob=torch.from_numpy(old), teacher_logprob=teacher, episode_ids=[e.episode_key for e in exps],
             **infos, **spec.advantage_fn_args)
    group.metrics.update({f"advantage/{k}": float(v) for k, v in res.metrics.items()})
    keep = res.keep.reshape(-1).tolist() if res.keep.numel() == len(exps) else [True] * len(exps)
    advantages, returns = res.advantages.to(torch.float32).numpy(), res.returns.to(torch.float32).numpy()
    kept = []
    for i, (e, n) in enumerate(zip(exps, lengths, strict=True)):
        if not keep[i]:
            continue
        e.advantages = advantages[i, :n].copy()
        e.returns = returns[i, :n].copy()
        kept.append(e)
    group.experiences = kept
    return group if kept else None


@dataclass
class Pipeline:
    """Operators in order, then group advantages when the algorithm computes them per group."""

    operators: list[tuple[str, Operator]] = field(default_factory=list)
    spec: AlgorithmSpec | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    #: the group advantages' metrics since :meth:`take_advantage_means`: name -> (sum, groups)
    advantage_sums: dict[str, tuple[float, int]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, operators: list[Any], spec: AlgorithmSpec | None) -> Pipeline:
        """Build from ``experience_pipeline.operators`` (objects with ``name`` and ``args``);
        an unknown name or argument is an error naming the operator."""
        ops_: list[tuple[str, Operator]] = []
        for i, op in enumerate(operators):
            name, args = op.name, dict(op.args or {})
            if name not in OPERATORS:
                raise ValueError(
                    f"data_processor.experience_pipeline.operators[{i}].name: unknown {name!r}; "
                    f"valid names: {', '.join(sorted(OPERATORS))}"
                )
            fn = OPERATORS[name]
            try:
                import inspect

                inspect.signature(fn).bind(None, **args)
            except TypeError as e:
                raise ValueError(
                    f"data_processor.experience_pipeline.operators[{i}] ({name}).args: {e}"
                ) from e
            check_arg_types(fn, args, f"data_processor.experience_pipeline.operators[{i}].args", name)
            where = f"data_processor.experience_pipeline.operators[{i}] ({name})"
            if name == "reward_shaping" and args.get("clip") is not None:
                clip = args["clip"]
                if len(clip) != 2 or not clip[0] <= clip[1]:
                    raise ValueError(f"data_processor.experience_pipeline.operators[{i}].args.clip: got {clip!r}; "
                                     "expected [low, high] with low <= high")
            if name == "reward_shaping_mapper":
                try:
                    check_shaping_configs(args["reward_shaping_configs"])
                except ValueError as e:
                    raise ValueError(f"{where}.args.{e}") from e
            elif name == "data_juicer":  # the package, the recipe, each op's name and args

                try:
                    juicer.load(juicer.recipe(args.get("config_path"), args.get("operators")), rows_only=True)
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{where}: {e}") from e
            ops_.append((name, lambda g, fn=fn, args=args: fn(g, **args)))

        return cls(ops_, spec, feeds_back=ExperiencePipelineConfig(operators=list(operators)).feeds_back())

    def __call__(self, group: ExperienceGroup) -> ExperienceGroup | None:
        return self.run(group)[0]

    #: whether the buffer reports each group's fate (``ExperiencePipelineConfig.feeds_back``)
    feeds_back: bool = False

    def run(self, group: ExperienceGroup) -> tuple[ExperienceGroup | None, float | None]:
        """The group out (None: dropped) and its pass rate, read from the last form the group
        had, so a group dropped after ``pass_rate_calculator`` still reports it."""
        g: ExperienceGroup | None = group
        rate: float | None = None
        for name, op in self.operators:
            last = g
            g = op(g)
            rate = (g or last).metrics.get("pass_rate", rate)  # type: ignore[union-attr]
            if g is None:
                self.dropped[name] = self.dropped.get(name, 0) + 1
                return None, rate
        spec = self.spec
        if spec is not None and spec.advantage_fn and not spec.compute_advantage_in_trainer:
            before, g = g, group_advantages(g, spec)
            for k, v in before.metrics.items():
                if k.startswith("advantage/"):
                    total, n = self.advantage_sums.get(k, (0.0, 0))
                    self.advantage_sums[k] = (total + v, n + 1)
            if g is None:
                self.dropped["advantage"] = self.dropped.get("advantage", 0) + 1
        return g, rate

    def take_advantage_means(self) -> dict[str, float]:
        """Each group-advantage metric's mean over the groups since the last call (the buffer
        publishes them with its counters; the trainer cannot see them: it gets experiences)."""
        means = {k: total / n for k, (total, n) in self.advantage_sums.items()}
        self.advantage_sums.clear()
        return means
