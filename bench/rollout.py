"""Rollout throughput: the vLLM engine inside the explorer vs plain ``vllm.LLM.generate``.

Same model, same prompts, same sampling (``ignore_eos`` so both generate exactly
``--max-tokens`` per sample), same run. The explorer path is the whole thing: runner pool,
``math_workflow`` (chat template, rewards), experience groups, publishing to a real
nats-server. Prints generated tokens/s of each and the ratio (target >= 0.9).

    python bench/rollout.py                      # tiny model built offline, embedded NATS
    python bench/rollout.py --model DIR --tasks 256 --repeat 8 --max-tokens 256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report import record  # noqa: E402  (bench/report.py, beside this script)


def tasks_for(n: int, repeat: int, max_tokens: int):
    from storage.tasksets import TaskSpec
    from storage.tiny import arithmetic_rows

    fmt = {"prompt_key": "question", "response_key": "answer", "system_prompt": ""}
    spec = TaskSpec(taskset="bench", workflow="math_workflow", repeat_times=repeat,
                    rollout_args={"temperature": 1.0, "max_tokens": max_tokens}, format=fmt)
    return [spec.make_task(i, r, 0) for i, r in enumerate(arithmetic_rows(n, seed=1))]


def plain_vllm(model: str, prompts: list[list[int]], repeat: int, max_tokens: int, max_len: int) -> tuple[float, int]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=max_len, enforce_eager=True, seed=0)
    sp = SamplingParams(n=repeat, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], sp, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    llm.llm_engine.engine_core.shutdown() if hasattr(llm.llm_engine, "engine_core") else None
    del llm
    return dt, tokens


async def explorer_path(model: str, tasks, max_len: int, nats_url: str) -> tuple[float, int]:
    import bus
    from roles.explorer.engines.vllm import VLLMEngine
    from roles.explorer.runner import RunnerPool
    from schemas.config import ExplorerConfig, InferenceModelConfig, NatsConfig

    rm = InferenceModelConfig(model_path=model, dtype="float32", max_model_len=max_len, seed=0,
                              ignore_eos=True)
    engine = await VLLMEngine.create(rm)
    ncfg = NatsConfig(url=nats_url, embedded=False)
    nc = await bus.connect(ncfg, name="bench-explorer")
    run_id = f"bench.rollout{os.getpid()}"
    await bus.ensure_streams(bus.jetstream(nc, ncfg), ncfg, run_id)
    pub = bus.Publisher(nc, ncfg, run_id)
    pool = RunnerPool([engine], ExplorerConfig(runner_per_model=len(tasks), rollout_model=rm), run_id)

    async def one(t):
        r = await pool.run_task(t)
        await pub.submit_group(r.group)
        return sum(e.response_length for e in r.group.experiences)

    await asyncio.gather(*(pool.run_task(t) for t in tasks[:4]))  # warm-up (not published)
    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(t) for t in tasks)))
    await pub.flush()
    dt = time.perf_counter() - t0
    await nc.close()
    await engine.close()
    return dt, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model folder (default: build the tiny model)")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--nats-url", default=None, help="default: start an embedded nats-server")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tmp = tempfile.mkdtemp(prefix="bench-rollout-")
    model = a.model
    if model is None:
        from storage.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tmp) / "model"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tasks = tasks_for(a.tasks, a.repeat, a.max_tokens)
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t.raw["question"]}],
                                            add_generation_prompt=True, tokenize=True, return_dict=False))
               for t in tasks]
    max_len = max(len(p) for p in prompts) + a.max_tokens + 8

    server = None
    url = a.nats_url
    if url is None:
        from bus.server import EmbeddedServer, free_port

        server = EmbeddedServer(Path(tmp) / "nats", port=free_port()).start()
        url = server.url
    try:
        dt_plain, tok_plain = plain_vllm(model, prompts, a.repeat, a.max_tokens, max_len)
        dt_exp, tok_exp = asyncio.run(explorer_path(model, tasks, max_len, url))
    finally:
        if server is not None:
            server.stop()
    plain, exp = tok_plain / dt_plain, tok_exp / dt_exp
    print(f"tasks={a.tasks} repeat={a.repeat} max_tokens={a.max_tokens} model={model}")
    print(f"plain vllm.LLM.generate : {tok_plain:7d} tokens in {dt_plain:7.2f}s = {plain:9.1f} tokens/s")
    print(f"explorer (runners+rewards+publish): {tok_exp:7d} tokens in {dt_exp:7.2f}s = {exp:9.1f} tokens/s")
    print(f"ratio explorer/plain: {exp / plain:.3f} (target >= 0.9)")
    record("rollout", {
        f"explorer, tokens/s ({a.tasks} tasks x {a.repeat}, {a.max_tokens} tokens)": round(exp, 1),
        "plain vllm.LLM.generate, tokens/s": round(plain, 1),
        "explorer / plain": round(exp / plain, 3),
    }, target="explorer >= 0.9 of plain vllm.LLM.generate", met=bool(exp / plain >= 0.9))


if __name__ == "__main__":
    main()
