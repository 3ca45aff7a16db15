"""``trinity debug``: a workflow on a few tasks without the bus, and the model it talks to.

``--module workflow``: no bus, no synchronizer: the engines of ``explorer.rollout_model`` (use
``engine_type=transformers`` for a start in seconds), the first ``buffer.batch_size`` tasks of
the taskset, the same runner pool as the explorer (timeouts, retries), and a JSON file with
every experience (tokens, logprobs, reward, text) and every failure.

``--module inference_model`` (Trinity-RFT's debug flow, step 1): start the config's model once
and serve it (our OpenAI API) until Ctrl-C; it writes its address to
``<job>/debug/inference_model.json``. A ``--module workflow`` of the same config started
meanwhile, from another terminal, finds it there and sends its chat calls to it instead of
loading the model again: a user edits the workflow and reruns it in seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from roles.explorer.core import (
    make_pool,
    served_model_name,
    start_auxiliary_apis,
    stop_auxiliary_apis,
)
from roles.explorer.engines import RolloutEngine, create_auxiliary, create_engines
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


def served_at(cfg: TrinityConfig) -> Path:
    """Where ``--module inference_model`` writes its address for ``--module workflow``."""
    return Path(cfg.checkpoint_job_dir) / "debug" / "inference_model.json"


def find_inference_model(cfg: TrinityConfig) -> dict[str, Any] | None:
    """The running inference model of this config's job (its record), or None: none written,
    its process gone, or it does not answer."""
    try:
        rec = json.loads(served_at(cfg).read_text())
        os.kill(int(rec["pid"]), 0)
        req = urllib.request.Request(rec["url"] + "/v1/models", headers={"Authorization": f"Bearer {rec['key']}"})
        with urllib.request.urlopen(req, timeout=5):
            return rec
    except (OSError, ValueError, KeyError, TypeError):
        return None


async def workflow_engines(cfg: TrinityConfig) -> list[RolloutEngine]:
    """The engines a debug run's workflows use: the running inference model's, else their own."""
    rec = find_inference_model(cfg)
    if rec is None:
        return await create_engines(cfg.explorer.rollout_model, cfg.model.external_model)
    from roles.explorer.engines.external import ExternalEngine
    from schemas.config import ExternalModelConfig

    print(f"trinity debug: using the inference model at {rec['url']}/v1 (pid {rec['pid']})", file=sys.stderr)
    model = cfg.explorer.rollout_model.model_copy(update={"engine_type": "external"})
    ext = ExternalModelConfig(model_name=rec["model"])
    return [ExternalEngine(model, ext, "inference-model", base_url=rec["url"] + "/v1", api_key=rec["key"],
                           token_ids=True)]


async def serve_inference_model(cfg: TrinityConfig, stop: asyncio.Event | None = None) -> None:
    """Serve the config's rollout model over our OpenAI API until ``stop`` (SIGINT/SIGTERM)."""
    import secrets

    from roles.explorer.api import ApiServer
    from roles.runtime.signals import stop_on_signals

    if stop is None:
        stop = asyncio.Event()
        stop_on_signals(stop)
    api_cfg = cfg.explorer.openai_api
    key = api_cfg.api_key or secrets.token_urlsafe(18)  # a local port: anyone could call it otherwise
    engines = await create_engines(cfg.explorer.rollout_model, cfg.model.external_model)
    api = ApiServer(api_cfg.model_copy(update={"api_key": key}), engines, served_model_name(cfg), cfg.run_id,
                    publish=None, record=False)
    path = served_at(cfg)
    try:
        url = await api.start()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "model": served_model_name(cfg), "key": key,
                                   "engine_type": cfg.explorer.rollout_model.engine_type}))
        os.chmod(tmp, 0o600)  # it holds the key
        tmp.replace(path)
        print(f"trinity debug: serving {served_model_name(cfg)} at {url}/v1 "
              f"({cfg.explorer.rollout_model.engine_type}); `trinity debug --module workflow` with this "
              "config uses it from another terminal; Ctrl-C stops", flush=True)
        await stop.wait()
    finally:
        path.unlink(missing_ok=True)
        await api.stop()
        for e in engines:
            await e.close()


async def debug_workflow(cfg: TrinityConfig, n_tasks: int | None = None) -> dict[str, Any]:
    engines = await workflow_engines(cfg)
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


def main(cfg: TrinityConfig, output_file: str | None, module: str = "workflow") -> int:
    """``cfg`` was loaded by :func:`roles.runtime.config.load`, which imported the plugin folders
    (``TRINITY_PLUGIN_DIRS`` and ``--plugin-dir``)."""
    if module == "inference_model":
        asyncio.run(serve_inference_model(cfg))
        return 0
    out = asyncio.run(debug_workflow(cfg))
    text = json.dumps(out, indent=1, default=str)
    if output_file:
        with open(output_file, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {len(out['experiences'])} experiences ({len(out['failures'])} failed tasks) to {output_file}")
    else:
        sys.stdout.write(text + "\n")
    return 1 if out["failures"] and not out["experiences"] else 0
