"""Replay store throughput for 1024-token experiences, against raw LMDB as the baseline.

Measures, in one run on the same disk:

* store writes: ``ReplayStore.put_groups`` (encode + payload + index records + ready index, one
  transaction per call), experiences/s and MB/s;
* raw writes: ``txn.put(id, bytes)`` of the same encoded bytes, same transaction size;
* store takes: ``take_batch`` (select by index, update use counts, batch record, decode),
  FIFO and priority mode, experiences/s;
* raw reads: ``txn.get(id)`` of the same bytes, one read transaction per batch;
* and the ratios store/raw. Both environments commit with fsync (``sync=True``).

Run: ``.venv/bin/python bench/replay_throughput.py [--experiences 4096]``
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import lmdb
import numpy as np
from report import record  # bench/report.py, beside this script

from schemas.codec import decode, encode
from schemas.data import Experience, ExperienceGroup
from storage.replay import ReplayStore


def make_groups(n_exp: int, group_size: int, tokens: int, prompt: int) -> list[ExperienceGroup]:
    rng = np.random.default_rng(0)
    groups = []
    for g in range(n_exp // group_size):
        gid = f"group-{g:07d}"
        exps = []
        for i in range(group_size):
            r = tokens - prompt
            exps.append(
                Experience(
                    id=f"{gid}-{i}",
                    task_id=f"task-{g}",
                    group_id=gid,
                    run_id="bench",
                    tokens=rng.integers(0, 150_000, tokens, dtype=np.int32),
                    prompt_length=prompt,
                    logprobs=rng.standard_normal(r).astype(np.float32),
                    action_mask=np.ones(r, dtype=bool),
                    advantages=rng.standard_normal(r).astype(np.float32),
                    reward=float(rng.random()),
                    model_version=g % 8,
                )
            )
        groups.append(
            ExperienceGroup(
                group_id=gid,
                task_id=f"task-{g}",
                run_id="bench",
                model_version=g % 8,
                experiences=exps,
            )
        )
    return groups


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiences", type=int, default=4096)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups-per-write", type=int, default=4, help="groups per put_groups call")
    ap.add_argument("--batch", type=int, default=256, help="experiences per take_batch")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--dir", type=Path, default=None, help="where to put the stores (default: tmp)")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="replay-bench-", dir=args.dir))
    try:
        groups = make_groups(args.experiences, args.group_size, args.tokens, args.prompt)
        n = sum(len(g.experiences) for g in groups)
        t0 = time.perf_counter()
        encoded = [(e.id.encode(), encode(e)) for g in groups for e in g.experiences]
        t_encode = time.perf_counter() - t0
        size = sum(len(b) for _, b in encoded)
        mb = size / 1e6
        gpw = args.groups_per_write
        per_write = gpw * args.group_size

        # ---- raw LMDB baseline: the same bytes, the same transaction sizes ----
        env = lmdb.open(str(base / "raw"), map_size=4 << 30, max_dbs=2, readahead=False)
        db = env.open_db(b"payload")
        t0 = time.perf_counter()
        for i in range(0, n, per_write):
            with env.begin(write=True) as txn:
                for k, v in encoded[i : i + per_write]:
                    txn.put(k, v, db=db)
        t_raw_put = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = 0
        for i in range(0, n, args.batch):
            with env.begin() as txn:
                for k, _ in encoded[i : i + args.batch]:
                    got += len(txn.get(k, db=db))
        t_raw_get = time.perf_counter() - t0
        assert got == size
        t0 = time.perf_counter()
        for i in range(0, n, args.batch):
            with env.begin() as txn:
                blobs = [txn.get(k, db=db) for k, _ in encoded[i : i + args.batch]]
            for b in blobs:
                decode(b, expect=Experience)
        t_raw_get_decode = time.perf_counter() - t0
        env.close()

        # ---- the store ----
        results = {}
        for mode, encoded_take in (("fifo", False), ("fifo", True), ("priority", False)):
            name = f"{mode}{', bytes' if encoded_take else ''}"
            store = ReplayStore(
                base / name.replace(", ", "-"),
                mode=mode,
                capacity=0,
                reuse_cooldown_time=None,
                map_size=4 << 30,
            )
            t0 = time.perf_counter()
            for i in range(0, len(groups), gpw):
                store.put_groups(groups[i : i + gpw])
            t_put = time.perf_counter() - t0
            take = store.take_batch_encoded if encoded_take else store.take_batch
            t0 = time.perf_counter()
            taken = 0
            step = 0
            while True:
                batch = take(str(step), args.batch)
                if not batch:
                    break
                store.commit_batch(str(step))
                taken += len(batch)
                step += 1
            t_take = time.perf_counter() - t0
            assert taken == n, (taken, n)
            store.close()
            results[name] = (t_put, t_take)

        print(
            f"replay throughput: {n} experiences x {args.tokens} tokens, "
            f"{size / n / 1024:.1f} KiB each encoded ({mb:.1f} MB), groups of {args.group_size}, "
            f"{per_write} experiences per write txn, {args.batch} per take"
        )
        print(f"  encode only (schemas.codec):      {rate(n, t_encode):10.0f} exp/s")
        print(
            f"  raw LMDB put (baseline):          {rate(n, t_raw_put):10.0f} exp/s "
            f"{rate(mb, t_raw_put):8.1f} MB/s"
        )
        print(
            f"  raw LMDB get (baseline):          {rate(n, t_raw_get):10.0f} exp/s "
            f"{rate(mb, t_raw_get):8.1f} MB/s"
        )
        print(
            f"  raw LMDB get + decode (baseline): {rate(n, t_raw_get_decode):10.0f} exp/s "
            f"{rate(mb, t_raw_get_decode):8.1f} MB/s"
        )
        for name, (t_put, t_take) in results.items():
            base_take = t_raw_get if name.endswith("bytes") else t_raw_get_decode
            what = "raw get" if name.endswith("bytes") else "raw get+decode"
            print(
                f"  store put_groups [{name:14s}]: {rate(n, t_put):10.0f} exp/s "
                f"{rate(mb, t_put):8.1f} MB/s   ratio to raw put {t_raw_put / t_put:5.2f}"
            )
            print(
                f"  store take_batch [{name:14s}]: {rate(n, t_take):10.0f} exp/s "
                f"{rate(mb, t_take):8.1f} MB/s   ratio to {what} {base_take / t_take:5.2f}"
            )
        print(
            "  (ratio = store rate / raw LMDB rate on the same bytes in this run; store puts"
            " include encoding, takes include selection, use-count updates, batch record and"
            " commit_batch; [.., bytes] = take_batch_encoded, no decode)"
        )
        figures: dict[str, float] = {f"raw LMDB put, experiences/s ({args.tokens} tokens each)": round(rate(n, t_raw_put))}
        for name, (t_put, t_take) in results.items():
            base_take = t_raw_get if name.endswith("bytes") else t_raw_get_decode
            figures[f"store put_groups [{name}], experiences/s"] = round(rate(n, t_put))
            figures[f"store take_batch [{name}], experiences/s"] = round(rate(n, t_take))
            figures[f"take_batch [{name}] / raw {'get' if name.endswith('bytes') else 'get+decode'}"] = round(
                base_take / t_take, 2)
        record("replay_throughput", figures)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
