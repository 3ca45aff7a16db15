"""How fast ``trinity studio`` answers on a real job: start-up and each page's API call.

    python bench/studio.py [--job checkpoints/quickstart/<name>] [--n 20]

Starts ``trinity studio`` on a free port over the job's checkpoint root, then times what each
view asks for (the page itself, the runs list, the run view's whole history, the builder's
schema and a validation of the quickstart config, a step of trajectories when the job kept
any), ``--n`` times each. Prints the median and the worst in milliseconds and the ratio of the
worst to the target (300 ms: a page that answers slower than that feels slow), and records the
worst figures in ``bench/results/studio.jsonl``. Default job: the newest under
``checkpoints/quickstart`` (run the README's quickstart first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_MS = 300.0

from bench.report import record  # noqa: E402
from bus.server import free_port  # noqa: E402

TOKEN = "bench-studio"


def _get(url: str, body: bytes | None = None) -> bytes:
    req = urllib.request.Request(url, data=body, headers={"X-Studio": "1", "Content-Type": "application/json",
                                                          "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", type=Path, default=None)
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    job = args.job or max((p for p in (ROOT / "checkpoints" / "quickstart").glob("*") if p.is_dir()),
                          key=lambda p: p.stat().st_mtime, default=None)
    if job is None or not job.is_dir():
        print("bench/studio.py: no quickstart job: run the README's quickstart first (or pass --job)")
        return 2
    root, key = job.parent.parent, f"{job.parent.name}/{job.name}"
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "roles.cli", "studio", "--port", str(port), "--checkpoint-root", str(root),
                             "--token", TOKEN],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                _get(base + "/")
                break
            except OSError:
                if time.monotonic() - t0 > 30:
                    raise
                time.sleep(0.05)
        start_s = time.monotonic() - t0
        print(f"trinity studio answered {start_s:.2f} s after start (target < 5 s)")
        detail = json.loads(_get(f"{base}/api/jobs/{key}"))
        quick = json.loads(_get(f"{base}/api/example?path=examples/quickstart/quickstart.yaml"))
        calls = {"page /": (base + "/", None), "runs list": (base + "/api/jobs", None),
                 "run view (history)": (f"{base}/api/jobs/{key}", None), "builder schema": (base + "/api/schema", None),
                 "validate quickstart": (base + "/api/validate", json.dumps({"doc": quick}).encode())}
        for stage in detail["stages"]:
            kept = json.loads(_get(f"{base}/api/jobs/{key}/steps?stage={stage['label']}"))["steps"]
            if kept:
                calls[f"trajectories {stage['label']} (step {kept[-1]})"] = (
                    f"{base}/api/jobs/{key}/steps/{kept[-1]}?stage={stage['label']}", None)
        if not any(k.startswith("trajectories") for k in calls):
            print("(this job kept no trajectories: it predates monitor.trajectory_steps)")
        print(f"job {key}: {sum(len(v) for v in detail['metrics'].values())} metric records")
        print(f"{'call':40} {'median ms':>10} {'worst ms':>10} {'worst/target':>13}")
        figures: dict[str, float] = {"start-up, s": round(start_s, 2)}
        for name, (url, body) in calls.items():
            _get(url, body)  # warm: the tokenizer loads once
            ms = []
            for _ in range(args.n):
                t = time.perf_counter()
                _get(url, body)
                ms.append((time.perf_counter() - t) * 1000)
            print(f"{name:40} {statistics.median(ms):10.1f} {max(ms):10.1f} {max(ms) / TARGET_MS:13.2f}")
            figures[f"{name.split(' (')[0]}, worst ms"] = round(max(ms), 1)
        record("studio", figures, target=f"start < 5 s, every call < {TARGET_MS:.0f} ms",
               met=start_s < 5 and all(v < TARGET_MS for k, v in figures.items() if k.endswith("ms")))
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
