"""The explorer's OpenAI API vs calling the engine directly, in the same run.

``--episodes`` concurrent episodes (default 32) each make ``--turns`` chat requests; every
request generates exactly ``--max-tokens`` tokens (``ignore_eos``), so both sides do the same
work. Direct: ``engine.chat(messages)`` from 32 coroutines in the explorer's process. API: the
same requests as HTTP to :class:`roles.explorer.api.ApiServer` over the same engine, one
episode URL each.

What sends the API's requests (``--client``): ``http`` (default) posts the OpenAI JSON body
with aiohttp, so the figure is the server's cost (HTTP, parsing, template, recording,
response); ``openai`` uses ``openai.AsyncOpenAI``, whose own pydantic work per request is
added on top. ``--agent-process`` sends from a separate process (an agent under ``mode:
serve``) instead of the explorer's (a workflow's ``get_openai_client()``); on a machine with
few cores that process competes with the engine for CPU. Prints requests/s and p50/p99
latency of each side and the throughput ratio (target >= 0.8).

    python bench/openai_api.py                           # tiny model, transformers engine
    python bench/openai_api.py --engine vllm --client openai --agent-process
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report import record  # noqa: E402  (bench/report.py, beside this script)

TARGET = 0.8
Send = Callable[[int, int], Awaitable[None]]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def messages(i: int, t: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{i}+{t}=?"}]


async def run_load(episodes: int, turns: int, send: Send) -> tuple[float, list[float]]:
    """Wall time and per-request latencies of ``episodes`` concurrent loops of ``turns``."""
    lat: list[float] = []

    async def episode(i: int) -> None:
        for t in range(turns):
            t0 = time.perf_counter()
            await send(i, t)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(episodes)))
    return time.perf_counter() - t0, lat


def api_sender(kind: str, urls: list[str], max_tokens: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """``(send, close)``: request ``t`` of episode ``i`` to ``urls[i]`` with the chosen client."""
    if kind == "openai":
        import openai

        clients = [openai.AsyncOpenAI(base_url=u, api_key="x") for u in urls]

        async def send(i: int, t: int) -> None:
            await clients[i].chat.completions.create(model="bench", messages=messages(i, t),
                                                     max_tokens=max_tokens, temperature=1.0)

        async def close() -> None:
            for c in clients:
                await c.close()

        return send, close
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def send_http(i: int, t: int) -> None:
        body = {"model": "bench", "messages": messages(i, t), "max_tokens": max_tokens, "temperature": 1.0}
        async with session.post(f"{urls[i]}/chat/completions", json=body) as r:
            r.raise_for_status()
            await r.read()

    return send_http, session.close


async def main(args: argparse.Namespace) -> int:
    from roles.explorer.api import ApiServer
    from roles.explorer.engines import create_engines
    from schemas.config import InferenceModelConfig, OpenAIApiConfig
    from storage.tiny import build_tiny_model

    model = args.model or str(build_tiny_model(Path(tempfile.mkdtemp()) / "model"))
    cfg = InferenceModelConfig(model_path=model, engine_type=args.engine, dtype="float32",
                               max_model_len=256, seed=0, ignore_eos=True)
    (engine,) = await create_engines(cfg)

    async def direct(i: int, t: int) -> None:
        await engine.chat(messages(i, t), max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True)

    server = ApiServer(OpenAIApiConfig(port=0), [engine], "bench", "bench", None)
    await server.start()
    # ignore_eos has no OpenAI field: it is these episodes' default (as a task's rollout_args)
    urls = [f"{server.url}/v1/episodes/{server.book.own(None, engine, {'ignore_eos': True})}"
            for _ in range(args.episodes)]
    send, close = api_sender(args.client, urls, args.max_tokens)

    async def agent_process() -> tuple[float, list[float]]:
        spec = {"urls": urls, "turns": args.turns, "max_tokens": args.max_tokens, "client": args.client}
        proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--agent", json.dumps(spec),
                                                    stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        got = json.loads(out.decode().strip().splitlines()[-1])
        return got["wall"], got["latencies"]

    try:
        await run_load(4, 1, direct)  # warm-up both paths
        await run_load(4, 1, send)
        results: dict[str, tuple[float, list[float]]] = {}
        for name in ("direct", "api", "direct", "api"):
            if name == "direct":
                wall, lat = await run_load(args.episodes, args.turns, direct)
            elif args.agent_process:
                wall, lat = await agent_process()
            else:
                wall, lat = await run_load(args.episodes, args.turns, send)
            if name not in results or wall < results[name][0]:  # best of two, interleaved
                results[name] = (wall, lat)
    finally:
        await close()
        await server.stop()
        await engine.close()
    n = args.episodes * args.turns
    where = "an agent process" if args.agent_process else "the explorer's process"
    print(f"{args.engine} engine, {args.episodes} concurrent episodes x {args.turns} requests, "
          f"{args.max_tokens} tokens each; API requests by the {args.client} client in {where} "
          "(best of 2 rounds)")
    for name, (wall, lat) in results.items():
        print(f"  {name:<7} {n / wall:8.1f} req/s   p50 {1000 * statistics.median(lat):7.1f} ms   "
              f"p99 {1000 * pct(lat, 0.99):7.1f} ms")
    ratio = results["direct"][0] / results["api"][0]
    print(f"api / direct throughput: {ratio:.2f} (target >= {TARGET}) {'PASS' if ratio >= TARGET else 'FAIL'}")
    figures: dict[str, float] = {}
    for name, (wall, lat) in results.items():
        figures[f"{name}: requests/s ({args.engine} engine, {args.episodes} episodes x {args.turns})"] = round(n / wall, 1)
        figures[f"{name}: p50 latency, ms"] = round(1000 * statistics.median(lat), 1)
    figures[f"api / direct throughput ({args.client} client)"] = round(ratio, 2)
    record("openai_api", figures, target=f"api / direct throughput >= {TARGET}", met=bool(ratio >= TARGET))
    return 0 if ratio >= TARGET else 1


def agent(spec: str) -> None:
    """The agent process: one client per episode URL, all concurrent; prints the timings."""
    o = json.loads(spec)

    async def go() -> None:
        send, close = api_sender(o["client"], o["urls"], o["max_tokens"])
        await run_load(min(4, len(o["urls"])), 1, send)  # warm-up: connections
        wall, lat = await run_load(len(o["urls"]), o["turns"], send)
        await close()
        print(json.dumps({"wall": wall, "latencies": lat}))

    asyncio.run(go())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--agent":
        agent(sys.argv[2])
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="transformers", choices=["transformers", "vllm"])
    ap.add_argument("--model", default=None, help="HF folder (default: the tiny model, built offline)")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--client", default="http", choices=["http", "openai"])
    ap.add_argument("--agent-process", action="store_true", help="send from a separate process")
    sys.exit(asyncio.run(main(ap.parse_args())))
