"""How trinity's cost grows with the work: four curves, one command, a chart per curve.

    python bench/scaling.py [--only replay,bus,sync,memory] [--replay-max 10000000]
                            [--explorers 1,2,4,8] [--params-m 10,50,100,250,500] [--minutes 30]

* ``replay``: ``ReplayStore`` put and take rates, and the process's resident memory (its own
  heap, and the LMDB pages it has mapped), as the store grows from 10k to ``--replay-max``
  stored experiences (64 tokens each, groups of 8; puts of 4 groups per transaction and takes
  of 256, as the buffer makes them). Target: rates within 20% of their 10k value, heap flat.
* ``bus``: experience groups/s through the bus (``Publisher.submit_group`` -> one durable
  ``Consumer``, as the buffer reads them) with 1..8 explorer processes publishing at once.
  On 2 cores the publishers share them with the consumer and nats-server: the curve says
  whether more publishers cost throughput (contention), not what a node with more cores gets.
* ``sync``: a full weight sync, trainer process to explorer process, against the parameter
  count: through shared memory (``sync_method: memory``) and over gloo (``nccl``'s CPU
  backend), beside a memory copy of the same bytes in the same run (on one thread: the target's
  memcpy; on every core, as the sync's own copies run: printed beside). Target: the memory
  sync's time linear in bytes, at >= 0.5 of memcpy's rate (it copies twice).
* ``memory``: every role's resident memory through a ``--minutes`` GRPO run (the quickstart's
  task and model, the transformers engine), sampled every 10 s. Target: after warm-up (the
  first fifth), no role grows by more than 5%.

Each curve is written to ``docs/scaling-<curve>.svg`` and its figures to
``bench/results/scaling_<curve>.jsonl`` (``python bench/report.py`` renders them). Run it alone: on a
2-core machine any other CPU work moves every rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from report import record  # noqa: E402  (bench/report.py, beside this script)

DOCS = ROOT / "docs"
WORK = ROOT / ".bench" / "scaling"


# ---- a chart ---------------------------------------------------------------------------------

def chart(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float]]],
          logx: bool = False, ymin: float | None = 0.0) -> None:
    """A plain SVG line chart (no plotting library in the project): one polyline per series."""
    import math

    w, h, pad = 640, 360, 70
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    fx = (lambda v: math.log10(v)) if logx else (lambda v: v)  # noqa: E731
    x0, x1 = fx(min(xs)), fx(max(xs))
    y0 = min(ys) if ymin is None else ymin
    tick = nice_step((max(ys) - y0) / 5 if max(ys) > y0 else 1.0)
    y1 = y0 + tick * math.ceil((max(ys) - y0) / tick + 1e-9)
    px = lambda v: pad + (w - 2 * pad) * (fx(v) - x0) / max(x1 - x0, 1e-12)  # noqa: E731
    py = lambda v: h - pad - (h - 2 * pad) * (v - y0) / (y1 - y0)  # noqa: E731
    colors = ["#d9480f", "#1c7ed6", "#2b8a3e", "#862e9c", "#5c5f66", "#e8590c"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    v = y0
    while v <= y1 + tick / 2:
        out.append(f'<line x1="{pad}" x2="{w - pad}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{pad - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{human(v)}</text>')
        v += tick
    marks = sorted(set(xs))
    if len(marks) > 12:  # a time series: round marks instead of every sample
        step = nice_step((max(xs) - min(xs)) / 6)
        marks = [min(xs) + step * i for i in range(int((max(xs) - min(xs)) / step) + 1)]
    last = -1e9
    for x in marks:
        if px(x) - last >= 36:  # labels that would overlap are left out
            out.append(f'<text x="{px(x):.1f}" y="{h - pad + 16}" text-anchor="middle">{human(x)}</text>')
            last = px(x)
    out.append(f'<text x="{w / 2}" y="{h - 22}" text-anchor="middle">{xlabel}</text>'
               f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">{ylabel}</text>')
    for i, (name, pts) in enumerate(series.items()):
        c = colors[i % len(colors)]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2.5"/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>' for x, y in pts]
        out.append(f'<text x="{pad + 10}" y="{pad + 4 + 16 * i}" fill="{c}">{name}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    print(f"  wrote {os.path.relpath(path, ROOT)}")


def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at least ``raw``: a grid step a reader can count in."""
    import math

    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def human(v: float) -> str:
    """10000 -> 10k, 2500000 -> 2.5M, 0.25 -> 0.25: axis labels a reader takes in at a glance."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.3g}{unit}"
    return f"{v:.3g}"


def memory_mb(pid: int | str = "self") -> tuple[float, float]:
    """(anonymous, file-backed) resident memory of a process in MB, from /proc (Linux): the
    heap it owns, and the mapped file pages (LMDB's) the kernel can drop at will."""
    anon = file = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            anon = int(line.split()[1]) / 1024
        elif line.startswith(("RssFile:", "RssShmem:")):
            file += int(line.split()[1]) / 1024
    return anon, file


# ---- replay ----------------------------------------------------------------------------------

def io_counters() -> tuple[int, int]:
    """(bytes this process caused to be written to disk, major page faults: pages it had to
    read from disk) so far, from /proc (Linux)."""
    written = int(next(x for x in Path("/proc/self/io").read_text().splitlines()
                       if x.startswith("write_bytes:")).split()[1])
    majflt = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[9])
    return written, majflt


def replay(max_size: int) -> dict[str, float]:
    import numpy as np

    from schemas.data import Experience, ExperienceGroup
    from storage.replay import ReplayStore

    rng = np.random.default_rng(0)
    counter = iter(range(10**12))

    def groups(n: int) -> list[ExperienceGroup]:
        out = []
        for _ in range(n):
            g = next(counter)
            gid = f"g{g:010d}"
            out.append(ExperienceGroup(group_id=gid, task_id=f"t{g}", run_id="scale", model_version=g % 8, experiences=[
                Experience(id=f"{gid}/{i}", task_id=f"t{g}", group_id=gid, run_id="scale",
                           tokens=rng.integers(0, 50_000, 64, dtype=np.int32), prompt_length=32,
                           logprobs=-rng.random(32, dtype=np.float32), reward=float(rng.random()), model_version=g % 8)
                for i in range(8)]))
        return out

    sizes = [s for s in (10_000, 100_000, 1_000_000, 10_000_000) if s <= max_size] or [max_size]
    work = Path(tempfile.mkdtemp(prefix="scaling-replay-"))
    rows = []
    try:
        store = ReplayStore(work / "store", mode="priority", capacity=0, map_size=1 << 40)
        stored, t_fill = 0, time.perf_counter()
        for size in sizes:
            while stored < size:  # fill in large transactions: the measured windows come after
                n = min(256, (size - stored + 7) // 8)
                store.put_groups(groups(n))
                stored += 8 * n
            os.sync()  # the fill's dirty pages written back first: the windows measure the store, not that
            window = groups(4 * 250)  # 8,000 experiences, 4 groups a transaction
            io0, t = io_counters(), time.perf_counter()
            for i in range(0, len(window), 4):
                store.put_groups(window[i:i + 4])
            put = 8 * len(window) / (time.perf_counter() - t)
            io1 = io_counters()
            stored += 8 * len(window)
            t, taken = time.perf_counter(), 0
            for b in range(40):
                taken += len(store.take_batch(f"{size}-{b}", 256))
                store.commit_batch(f"{size}-{b}")
            take = taken / (time.perf_counter() - t)
            io2 = io_counters()
            anon, file = memory_mb()
            disk = sum(f.stat().st_size for f in (work / "store").iterdir()) / 2**20
            with store.env.begin() as txn:
                stats = [txn.stat(db) for db in store._db.values()] + [store.env.stat()]
            depth = max(st["depth"] for st in stats)
            used = sum(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"] for st in stats)
            free_pages = store.env.info()["last_pgno"] + 1 - used  # LMDB's free list (and its own pages)
            # where the time goes: disk written per transaction, pages read back from disk
            put_kb, take_kb = (io1[0] - io0[0]) / 250 / 1024, (io2[0] - io1[0]) / 80 / 1024
            faults = (io1[1] - io0[1]) / 250, (io2[1] - io1[1]) / 80
            rows.append((size, put, take, anon, file, disk, put_kb, take_kb, *faults, depth, free_pages))
            print(f"  {size:>10,} stored: put {put:8,.0f} exp/s, take {take:8,.0f} exp/s, heap {anon:6.0f} MB, "
                  f"mapped {file:6.0f} MB, file {disk:7.0f} MB; per transaction: put writes {put_kb:5.0f} KB "
                  f"and faults {faults[0]:5.1f} pages in, take+commit {take_kb:5.0f} KB, {faults[1]:5.1f} pages; "
                  f"B-tree depth {depth}, {free_pages:,} free pages  ({time.perf_counter() - t_fill:.0f} s so far)", flush=True)
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    chart(DOCS / "scaling-replay.svg", "Replay store: rates as it grows (priority mode)", "stored experiences (log)",
          "experiences/s", {"put (4 groups of 8 a transaction)": [(r[0], r[1]) for r in rows],
                            "take (batches of 256)": [(r[0], r[2]) for r in rows]}, logx=True)
    first, last = rows[0], rows[-1]
    return {f"replay put at {last[0]:,} / at {first[0]:,}": round(last[1] / first[1], 2),
            f"replay take at {last[0]:,} / at {first[0]:,}": round(last[2] / first[2], 2),
            f"replay put at {last[0]:,}, exp/s": round(last[1]), f"replay take at {last[0]:,}, exp/s": round(last[2]),
            f"replay heap at {first[0]:,}, MB": round(first[3]), f"replay heap at {last[0]:,}, MB": round(last[3]),
            f"replay file at {last[0]:,}, MB": round(last[5]),
            **{f"replay {what} at {r[0]:,}": round(r[i], 1) for r in (first, last) for i, what in (
                (6, "KB written per put transaction"), (7, "KB written per take+commit"),
                (8, "pages read from disk per put transaction"), (9, "pages read from disk per take+commit"),
                (10, "B-tree depth"), (11, "free pages"))}}


# ---- bus -------------------------------------------------------------------------------------

def bus_rates(counts: list[int], groups: int) -> dict[str, float]:
    """Groups/s end to end with ``n`` publisher processes (``bench/bus_throughput.py``'s
    children, each its share of ``groups`` under its own ids) and one consumer."""
    import bus_throughput as bt  # bench/, beside this script

    from bus.server import EmbeddedServer, free_port
    rows = []

    async def one(server, n: int) -> float:
        run_id = f"scale{n}-{int(time.time())}"
        common = [f"--url={server.url}", f"--run-id={run_id}", "--experiences=8", "--tokens=1024", "--prompt=256",
                  "--batch=64", "--concurrency=64"]
        per = groups // n
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "bench" / "bus_throughput.py"), "--role=bus-consume", *common,
            f"--groups={per * n}", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)]
        for k in range(n):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, str(ROOT / "bench" / "bus_throughput.py"), "--role=bus-produce", *common,
                f"--groups={per}", f"--id-prefix=p{k}-", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE))
        for p in procs:
            line = (await p.stdout.readline()).decode().strip()  # type: ignore[union-attr]
            if line != "READY":
                raise RuntimeError(f"bus child failed to start: {line!r}")
        t0 = time.time()
        for p in procs:
            p.stdin.write(b"GO\n")  # type: ignore[union-attr]
            await p.stdin.drain()  # type: ignore[union-attr]
        outs = [(await p.communicate())[0].decode() for p in procs]
        done = [x for x in outs[0].splitlines() if x.startswith("DONE ")]
        if not done:
            raise RuntimeError(f"bus consumer failed: {outs[0][-300:]!r}")
        await bt.drop_streams(server.url)
        return per * n / (float(done[0].split()[1]) - t0)

    async def run() -> None:
        with tempfile.TemporaryDirectory() as d, EmbeddedServer(d, port=free_port()) as server:
            for n in counts:
                rates = [await one(server, n) for _ in range(3)]
                rows.append((n, statistics.median(rates), min(rates), max(rates)))
                print(f"  {n} explorer process(es): {rows[-1][1]:7.0f} groups/s of 8 x 1024 tokens "
                      f"(3 rounds, {rows[-1][2]:.0f}-{rows[-1][3]:.0f})", flush=True)

    asyncio.run(run())
    chart(DOCS / "scaling-bus.svg", "Bus: groups/s with N explorer processes publishing (2 cores)",
          "explorer processes", "groups of 8 x 1024 tokens / s", {"end to end (median of 3)": [(r[0], r[1]) for r in rows]})
    return {**{f"bus with {n} explorer(s), groups/s": round(r) for n, r, _, _ in rows},
            f"bus with {rows[-1][0]} / with {rows[0][0]}": round(rows[-1][1] / rows[0][1], 2)}


# ---- weight sync -----------------------------------------------------------------------------

def sync(sizes_m: list[float]) -> dict[str, float]:
    import weight_sync as ws  # bench/, beside this script (spawned peers import it by name)
    rows = []
    for want in sizes_m:
        (_, nbytes, s, r, c), = ws.measure(want, ["float32"], 0, 2, "gloo")
        (_, _, ms, mc, mw), = ws.measure_memory(want, ["float32"], 3)
        m = nbytes / 4 / 1e6  # the model's real size: the smallest shape has ~32M (its embedding)
        rows.append((m, nbytes, s, r, c, ms, mc, mw))
        gb = nbytes / 1e9
        print(f"  {m:5.0f}M params ({gb:.2f} GB): gloo {s:.3f} s ({gb / s:.2f} GB/s, {c / s:.2f} of memcpy), "
              f"raw broadcast {r:.3f} s; memory {ms:.3f} s ({gb / ms:.2f} GB/s, {mc / ms:.2f} of memcpy, "
              f"{mw / ms:.2f} of memcpy on every core); memcpy {c:.3f} s ({gb / c:.2f} GB/s)", flush=True)
    chart(DOCS / "scaling-sync.svg", "Weight sync (float32), trainer -> explorer process",
          "parameters (millions)", "seconds", {"sync_method: memory": [(row[0], row[5]) for row in rows],
                                                "nccl (gloo on CPU)": [(row[0], row[2]) for row in rows],
                                                "one raw gloo broadcast": [(row[0], row[3]) for row in rows],
                                                "memcpy of the same bytes": [(row[0], row[4]) for row in rows]})
    out: dict[str, float] = {}
    for m, _, s, _, c, ms, mc, mw in rows:
        out[f"memory sync of {m:.0f}M params, s"] = round(ms, 3)
        out[f"memory sync of {m:.0f}M params / memcpy (rate)"] = round(mc / ms, 2)
        out[f"memory sync of {m:.0f}M params / memcpy on every core (rate, for information)"] = round(mw / ms, 2)
        out[f"gloo sync of {m:.0f}M params, s"] = round(s, 3)
        out[f"gloo sync of {m:.0f}M params / memcpy (rate, for information)"] = round(c / s, 2)
    per_gb = [row[5] / (row[1] / 1e9) for row in rows]
    out["memory sync s per GB, largest / smallest size"] = round(per_gb[-1] / per_gb[0], 2)
    return out


# ---- memory over a run -----------------------------------------------------------------------

def memory(minutes: float) -> dict[str, float]:
    import vs_trl as vs  # bench/, beside this script
    import yaml
    vs.WORK.mkdir(parents=True, exist_ok=True)
    data, sft = vs.assets()
    name = f"memory_{int(time.time())}"
    cfg_path = vs.trinity_config(data, sft, 100_000, "transformers", name)
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["explorer"]["eval_interval"] = 50
    cfg["trainer"]["save_interval"] = 100
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    p = subprocess.Popen([sys.executable, "-m", "roles.cli", "run", "--config", str(cfg_path)], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    samples: list[tuple[float, dict[str, float]]] = []
    t0 = time.time()
    try:
        while time.time() - t0 < minutes * 60 and p.poll() is None:
            _, rss = vs.by_process(p.pid)
            samples.append((time.time() - t0, {k: v for k, v in rss.items() if v >= 20}))
            time.sleep(10)
    finally:
        vs.stop_run(p)
    if p.returncode not in (0, -signal.SIGINT, 130, None) and time.time() - t0 < minutes * 60:
        raise RuntimeError(f"the run ended early (exit {p.returncode}); its logs are under {vs.WORK / 'ckpt'}")
    roles = sorted({k for _, s in samples for k in s if k not in ("run", "run:child")})
    warm = [s for t, s in samples if t >= minutes * 60 / 5]
    out: dict[str, float] = {}
    series = {}
    for role in roles:
        after = [s.get(role, 0.0) for s in warm]
        start, end = statistics.median(after[:6]), statistics.median(after[-6:])
        out[f"{role}: resident MB after warm-up"] = round(start)
        out[f"{role}: growth after warm-up, %"] = round(100 * (end - start) / max(start, 1e-9), 1)
        series[role] = [(t / 60, s.get(role, 0.0)) for t, s in samples]
        print(f"  {role:14} {start:7.0f} MB after warm-up -> {end:7.0f} MB at the end "
              f"({out[f'{role}: growth after warm-up, %']:+.1f}%)")
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "memory.json").write_text(json.dumps(series))  # the samples, to redraw the chart
    chart(DOCS / "scaling-memory.svg", f"Resident memory per role over a {minutes:g}-minute GRPO run",
          "minutes", "MB", series)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="replay,bus,sync,memory", help="which curves, comma separated")
    ap.add_argument("--replay-max", type=int, default=10_000_000)
    ap.add_argument("--explorers", default="1,2,4,8")
    ap.add_argument("--bus-groups", type=int, default=2400, help="groups per point (all publishers together)")
    ap.add_argument("--params-m", default="10,50,100,250,500",
                    help="model sizes to sync (the smallest real shape has ~32M parameters: its embedding)")
    ap.add_argument("--minutes", type=float, default=30.0)
    a = ap.parse_args()
    targets = {"replay": "put and take at the largest size >= 0.8 of their rate at 10k; heap flat",
               "bus": None, "sync": "a memory sync at >= 0.5 of memcpy's rate, time linear in bytes",
               "memory": "no role's resident memory growing > 5% after warm-up"}
    for part in a.only.split(","):
        print(f"{part}:", flush=True)
        if part == "replay":
            f = replay(a.replay_max)
            met = all(v >= 0.8 for k, v in f.items() if " / at " in k)
        elif part == "bus":
            f, met = bus_rates([int(x) for x in a.explorers.split(",")], a.bus_groups), None
        elif part == "sync":
            f = sync([float(x) for x in a.params_m.split(",")])
            met = all(v >= 0.5 for k, v in f.items() if k.endswith("/ memcpy (rate)"))
        elif part == "memory":
            f = memory(a.minutes)
            met = all(v <= 5.0 for k, v in f.items() if k.endswith("growth after warm-up, %"))
        else:
            ap.error(f"--only: unknown curve {part!r} (replay, bus, sync, memory)")
        record(f"scaling_{part}", f, target=targets[part], met=met)  # one record per curve

if __name__ == "__main__":
    main()
