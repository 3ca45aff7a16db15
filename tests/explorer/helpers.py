"""Shared pieces of the explorer tests: config files for the tiny model and taskset, a
teacher-forced logprob reference, reading groups back from the bus."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

import torch
import yaml


def write_config(
    path: Path, *, model: Path, taskset: Path, nats_url: str, engine: str = "transformers",
    batch_size: int = 2, repeat_times: int = 3, extra: dict[str, Any] | None = None,
    name: str | None = None,
) -> Path:
    """A YAML config running the explorer alone (mode explore) on the tiny model."""
    cfg: dict[str, Any] = {
        "project": "t",
        "name": name or f"x{uuid.uuid4().hex[:8]}",
        "mode": "explore",
        "checkpoint_root_dir": str(path.parent / "ckpt"),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": repeat_times},
        "model": {"model_path": str(model), "max_model_len": 96, "max_response_tokens": 12},
        "buffer": {
            "batch_size": batch_size,
            "total_epochs": 1,
            "explorer_input": {
                "taskset": {
                    "name": "arith", "path": str(taskset), "split": "train",
                    "format": {"prompt_type": "plaintext", "prompt_key": "question",
                               "response_key": "answer", "system_prompt": ""},
                    "rollout_args": {"temperature": 1.0},
                },
                "default_workflow_type": "math_workflow",
            },
        },
        "explorer": {
            "runner_per_model": 4, "eval_on_startup": False, "max_timeout": 120,
            "rollout_model": {"engine_type": engine, "dtype": "float32", "seed": 0},
        },
        "nats": {"url": nats_url, "embedded": False, "connect_wait": 5.0},
    }
    for dotted, value in (extra or {}).items():
        node = cfg
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path.write_text(yaml.safe_dump(cfg))
    return path


def load(path: Path, *overrides: str) -> Any:
    from roles.runtime.config import load as load_settings

    ns = argparse.Namespace(config=str(path), overrides=list(overrides), dotenv=str(path) + ".noenv")
    return load_settings(ns, quiet=True).config


def teacher_logprobs(model: Any, tokens: list[int], prompt_length: int) -> torch.Tensor:
    """log p(token_t | tokens_<t) of the response tokens from one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([list(tokens)])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[prompt_length - 1 : -1]
    return lp.gather(-1, torch.tensor(list(tokens[prompt_length:]))[:, None]).squeeze(-1)


async def read_groups(nats_cfg: Any, run_id: str, expect: int, timeout: float = 10.0, kind: str = "exp") -> list[Any]:
    """All experience groups on the run's exp stream (or the messages of stream ``kind``);
    waits for ``expect`` of them."""
    import asyncio

    import bus

    nc = await bus.connect(nats_cfg, name="test-reader")
    try:
        c = await bus.Consumer(nc, nats_cfg, run_id, kind, f"r{uuid.uuid4().hex[:6]}").start()
        got: list[Any] = []
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            batch = await c.fetch(64, timeout=0.5)
            got += [d.obj for d in batch]
            if len(got) >= expect and not batch:
                break
        return got
    finally:
        await nc.close()
