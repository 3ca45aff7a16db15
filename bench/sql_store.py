"""What the SQL experience store costs the buffer: its ingest (pipeline, replay store, the
moment after which the bus is acknowledged) with and without the mirror, in one run.

The buffer ingests ``--groups`` groups of ``--group-size`` experiences of ``--tokens`` tokens
(``BufferService.ingest``, one call per ``--per-call`` groups, as the consumer's fetches come)
into a fresh replay store, once alone and once with ``storage_type: sql`` on a SQLite file
beside it; then the mirror's own time to have every row in the database. The database is
written off the ack path, by a thread, with the store's own encoding; that thread still takes
CPU (and the GIL) beside the ingest, so a saturated buffer ingests slower. Target, a floor for
what a user feels: with the mirror the buffer ingests at least 1000 experiences/s of 1024
tokens, 20x what the quickstart produces (43/s).

Run: ``.venv/bin/python bench/sql_store.py [--groups 256]``
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from replay_throughput import make_groups  # bench/replay_throughput.py, beside this script
from report import record

from roles.buffer.pipeline import Pipeline
from roles.buffer.service import BufferService
from storage.replay import ReplayStore
from storage.sql import SqlMirror


def ingest(base: Path, groups: list, per_call: int, mirrored: bool) -> tuple[float, float]:
    """Seconds the ingest took, and seconds until the database held every row (0: no mirror)."""
    store = ReplayStore(base / "replay", capacity=0, map_size=4 << 30)
    mirror = SqlMirror(f"sqlite:///{base / 'exp.db'}", store) if mirrored else None
    service = BufferService(store, Pipeline(), mirror=mirror)
    n = sum(len(g.experiences) for g in groups)
    t0 = time.perf_counter()
    for i in range(0, len(groups), per_call):
        service.ingest(groups[i:i + per_call])
    t_ingest = time.perf_counter() - t0
    t_rows = 0.0
    if mirror is not None:
        while mirror.written < n:
            time.sleep(0.01)
        t_rows = time.perf_counter() - t0
        mirror.close()
    store.close()
    return t_ingest, t_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=256)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--per-call", type=int, default=4, help="groups per ingest call")
    args = ap.parse_args()
    groups = make_groups(args.groups * args.group_size, args.group_size, args.tokens, args.tokens // 4)
    n = args.groups * args.group_size
    runs = {"alone": [], "sql": []}
    for k in range(3):  # alternated, best of three each
        for name in ("alone", "sql"):
            base = Path(tempfile.mkdtemp(prefix=f"sql-bench-{name}-{k}-"))
            try:
                runs[name].append(ingest(base, groups, args.per_call, name == "sql"))
            finally:
                shutil.rmtree(base, ignore_errors=True)
    alone = min(t for t, _ in runs["alone"])
    with_sql = min(t for t, _ in runs["sql"])
    rows = min(r for _, r in runs["sql"])
    ratio = alone / with_sql
    print(f"SQL experience store: {n} experiences x {args.tokens} tokens, groups of {args.group_size}, "
          f"{args.per_call} groups per ingest call (best of 3 each)")
    print(f"  buffer ingest alone:            {n / alone:10.0f} exp/s")
    print(f"  buffer ingest with the mirror:  {n / with_sql:10.0f} exp/s   ratio {ratio:.2f} (target >= 1000 exp/s)")
    print(f"  every row in SQLite after:      {rows:10.2f} s ({n / rows:.0f} exp/s)")
    record("sql_store", {"ingest alone, experiences/s": round(n / alone),
                         "ingest with the SQL store, experiences/s": round(n / with_sql),
                         "ingest with / without": round(ratio, 2),
                         "all rows written, experiences/s": round(n / rows)},
           target="ingest with the SQL store >= 1000 experiences/s", met=n / with_sql >= 1000)


if __name__ == "__main__":
    main()
