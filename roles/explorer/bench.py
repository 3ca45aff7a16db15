"""Mode ``bench`` (Trinity-RFT's benchmark mode): evaluate the model, then every checkpoint
of this job that has a Hugging Face folder, in step order; with
``explorer.bench_on_latest_checkpoint`` only the newest one. No trainer, no weight sync: the
checkpoints are loaded here, one after the other."""

from __future__ import annotations

import asyncio

from roles.explorer.core import Explorer, ExplorerStats
from roles.explorer.eval import evaluate
from roles.runtime.signals import until_stopped
from storage import checkpoints as ckpt


async def bench(ex: Explorer) -> ExplorerStats:
    cfg = ex.cfg
    if not cfg.buffer.explorer_input.eval_tasksets:
        raise ValueError("buffer.explorer_input.eval_tasksets: mode bench needs at least one")
    await ex.open()
    job = cfg.checkpoint_job_dir
    todo = [(0, None)] + [(s, ckpt.hf_dir(job, s)) for s in ckpt.list_steps(job)
                          if ckpt.hf_weights_complete(ckpt.hf_dir(job, s))]
    if cfg.explorer.bench_on_latest_checkpoint:  # the newest checkpoint only (the model if none)
        todo = todo[-1:]
    try:
        for i, (step, path) in enumerate(todo):
            if path is not None:
                await asyncio.gather(*(e.load_checkpoint(str(path), step) for e in ex.sync_engines))
            ok, _ = await until_stopped(evaluate(cfg, ex.pool, step, ex.report, final=i == len(todo) - 1), ex.stop)
            if not ok:
                ex.stats.interrupted = True
                break
            ex.stats.steps += 1
        await ex.pub.flush()
    finally:
        ex.close()
    return ex.stats
