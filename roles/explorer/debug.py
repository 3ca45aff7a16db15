"""``trinity debug --module workflow``: run a workflow on a few tasks, dump the experiences.

No bus, no synchronizer: the engines of ``explorer.rollout_model`` (use
``engine_type=transformers`` for a start in seconds), the first ``buffer.batch_size`` tasks of
the taskset, the same runner pool as the explorer (timeouts, retries), and a JSON file with
every experience (tokens, logprobs, reward, text) and every failure.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np

from roles.explorer.engines import RolloutEngine, create_auxiliary, create_engines
from roles.explorer.main import (
    make_pool,
    served_model_name,
    start_auxiliary_apis,
    stop_auxiliary_apis,
)
from roles.explorer.workflows.registry import reads_prompt
from schemas.config import TrinityConfig
from schemas.data import Experience
from storage.scheduler import scheduler_from_config


def experience_json(e: Experience) -> dict[str, Any]:
    def arr(a: Any) -> Any:
        return None if a is None else np.asarray(a).tolist()

    return {
        "id": e.id, "task_id": e.task_id, "group_id": e.group_id,
        "prompt_length": e.prompt_length, "tokens": arr(e.tokens), "logprobs": arr(e.logprobs),
        "teacher_logprobs": arr(e.teacher_logprobs),
        "action_mask": arr(e.action_mask), "reward": e.reward, "model_version": e.model_version,
        "prompt_truncated": e.prompt_truncated, "response_truncated": e.response_truncated,
        "prompt_text": e.prompt_text, "response_text": e.response_text, "messages": e.messages,
        "info": e.info,
    }


async def debug_workflow(cfg: TrinityConfig, n_tasks: int | None = None) -> dict[str, Any]:
    engines = await create_engines(cfg.explorer.rollout_model, cfg.model.external_model)
    auxiliary: list[list[RolloutEngine]] = []
    api = pool = None
    try:
        auxiliary = await create_auxiliary(cfg.explorer.auxiliary_models, cfg.model.external_model)
        if cfg.explorer.rollout_model.enable_openai_api:  # workflows' get_openai_client()
            from roles.explorer.api import ApiServer

            api = ApiServer(cfg.explorer.openai_api, engines, served_model_name(cfg), cfg.run_id,
                            publish=None)
            await api.start()
        pool = make_pool(cfg, engines, auxiliary, api)
        if api is not None:
            await start_auxiliary_apis(cfg, pool)
        tasks_of = scheduler_from_config(cfg, reads_prompt)  # one step's tasks, or the first n_tasks
        tasks = tasks_of.next_batch()
        while n_tasks is not None and len(tasks) < n_tasks and (batch := tasks_of.next_batch()):
            tasks += batch
        tasks = tasks[:n_tasks]
        results = await asyncio.gather(*(pool.run_task(t) for t in tasks))
    finally:
        if api is not None:
            await api.stop()
            if pool is not None:
                await stop_auxiliary_apis(pool)
        for e in engines + [a for engs in auxiliary for a in engs]:
            await e.close()
    return {
        "experiences": [experience_json(x) for r in results if r.group for x in r.group.experiences],
        "failures": [{"task_id": r.task.task_id, "error": r.error} for r in results if not r.ok],
    }


def main(cfg: TrinityConfig, output_file: str | None) -> int:
    """``cfg`` was loaded by :func:`roles.settings.load`, which imported the plugin folders
    (``TRINITY_PLUGIN_DIRS`` and ``--plugin-dir``)."""
    out = asyncio.run(debug_workflow(cfg))
    text = json.dumps(out, indent=1, default=str)
    if output_file:
        with open(output_file, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {len(out['experiences'])} experiences ({len(out['failures'])} failed tasks) to {output_file}")
    else:
        sys.stdout.write(text + "\n")
    return 1 if out["failures"] and not out["experiences"] else 0
