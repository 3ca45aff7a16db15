"""Evaluation: run every eval taskset through the runners and report its metrics.

Eval groups are not published as experience (the trainer must not learn from them); what
leaves the explorer is one :class:`schemas.data.Metric` per taskset (``kind="eval"``) on the
metrics subject: accuracy (mean of the reward functions' ``accuracy`` score when they give
one, else the fraction of rollouts with a positive reward), reward mean/std, response length
mean, the number of failed tasks.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import structlog

from roles.explorer.runner import RunnerPool, TaskResult
from roles.explorer.workflows.registry import reads_prompt
from schemas.config import TrinityConfig
from schemas.data import Metric
from storage.tasksets import TaskReader

log = structlog.get_logger(__name__)


def group_metrics(results: list[TaskResult], detailed: bool = False) -> dict[str, float]:
    """Aggregate rollout metrics over task results (the rollout and eval metrics share it);
    ``detailed`` (``monitor.detailed_stats``) adds the max, min and std of rewards and
    response lengths."""
    exps = [e for r in results if r.group for e in r.group.experiences]
    # rewards and accuracy per episode: a step-wise episode's turns share its reward, and
    # counting turns would weigh long (often lost) episodes more
    firsts = list({e.episode_key: e for e in reversed(exps)}.values())
    rewards = [float(e.reward) for e in firsts if e.reward is not None]
    out: dict[str, float] = {
        "tasks": float(len(results)),
        "failed_tasks": float(sum(1 for r in results if not r.ok)),
        "experiences": float(len(exps)),
    }
    if rewards:
        mean = sum(rewards) / len(rewards)
        out["reward_mean"] = mean
        out["reward_std"] = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
        acc = [float(e.info["accuracy"]) for e in firsts if "accuracy" in e.info]
        out["accuracy"] = sum(acc) / len(acc) if acc else sum(r > 0 for r in rewards) / len(rewards)
    signal = groups_with_signal(results)
    if signal is not None:
        out["groups_with_signal"] = signal
    if exps:
        out["response_length_mean"] = sum(e.response_length for e in exps) / len(exps)
        out["prompt_truncated"] = float(sum(e.prompt_truncated for e in exps))
        out["response_truncated"] = float(sum(e.response_truncated for e in exps))
        out.update(episode_metrics(exps))
    if detailed:
        for name, xs in (("reward", rewards), ("response_length", [float(e.response_length) for e in exps])):
            if xs:
                mean = sum(xs) / len(xs)
                out.update({f"{name}_max": max(xs), f"{name}_min": min(xs),
                            f"{name}_std": math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))})
    return out


def groups_with_signal(results: list[TaskResult]) -> float | None:
    """The fraction of groups (tasks of several episodes) whose episodes got different rewards.
    Why: a group-relative advantage is 0 for every episode of a group whose rewards are all
    equal, so a step where this is 0 teaches nothing, whatever its reward mean. None when no
    group has two episodes (an eval, ``repeat_times: 1``)."""
    flags = []
    for r in results:
        if r.group is None:
            continue
        firsts = {e.episode_key: e.reward for e in r.group.experiences if e.reward is not None}
        if len(firsts) > 1:
            flags.append(max(firsts.values()) - min(firsts.values()) > 1e-9)
    return sum(flags) / len(flags) if flags else None


def episode_metrics(exps: list[Any]) -> dict[str, float]:
    """What an agent developer watches, per episode: model turns (``info["calls"]`` of each
    experience, else 1), tool calls and malformed tool calls (``info["tool_calls"]``,
    ``info["tool_call_errors"]``, as the OpenAI API records them), the context length at its
    end in tokens, and how many episodes were cut (a truncated prompt or response). An
    episode is a step-wise rollout's turns (``Experience.episode``) or one experience."""
    episodes: dict[tuple[str, Any], list[Any]] = {}
    for e in exps:
        episodes.setdefault(e.episode_key, []).append(e)
    n = len(episodes)
    turns = sum(int(e.info.get("calls", 1)) for e in exps)
    tools = sum(int(e.info.get("tool_calls", 0)) for e in exps)
    errors = sum(int(e.info.get("tool_call_errors", 0)) for e in exps)
    cut = sum(any(e.prompt_truncated or e.response_truncated for e in ep) for ep in episodes.values())
    return {"episodes": float(n), "turns_per_episode": turns / n, "tool_calls_per_episode": tools / n,
            "tool_call_errors": float(errors),
            "episode_tokens_mean": sum(max(e.prompt_length + e.response_length for e in ep)
                                           for ep in episodes.values()) / n,
            "truncated_episodes_rate": cut / n}


def eval_readers(cfg: TrinityConfig) -> list[TaskReader]:
    ei = cfg.buffer.explorer_input
    return [
        TaskReader.from_config(
            ts,
            batch_size=cfg.buffer.batch_size,
            is_eval=True,
            default_workflow_type=ei.default_eval_workflow_type or ei.default_workflow_type,
            default_reward_fn_type=ei.default_reward_fn_type,
            repeat_times=1,
            prompt=reads_prompt(ts.default_workflow_type),  # derive filled it from the defaults
        )
        for ts in ei.eval_tasksets
    ]


async def evaluate(
    cfg: TrinityConfig, pool: RunnerPool, step: int, publish: Any | None = None, final: bool = False
) -> list[Metric]:
    """Run all eval tasksets (each from its start) at ``step``; publish and return metrics.

    Each metric carries the engines' ``model_version`` (which weights were evaluated) and
    ``final`` = 1.0 for the evaluation of the run's last weights, which ``trinity run``
    reports at the end."""
    metrics = []
    for reader in eval_readers(cfg):
        tasks = []
        while batch := reader.read_batch():
            tasks.extend(batch)
        results = await asyncio.gather(*(pool.run_task(t) for t in tasks))
        values = group_metrics(list(results), cfg.monitor.detailed_stats)
        if reader.rowset is not None and reader.rowset.skipped:  # skip_invalid_rows
            values["skipped_rows"] = float(reader.rowset.skipped)
        values["model_version"] = float(min(e.model_version for e in pool.engines))
        values["final"] = 1.0 if final else 0.0
        m = Metric(role="explorer", step=step, kind="eval", values=values, taskset=reader.name)
        log.info("eval", step=step, taskset=reader.name, **{k: round(v, 4) for k, v in values.items()})
        if publish is not None:
            await publish(m)
        metrics.append(m)
    return metrics
