"""Weight sync throughput: a full sync of a ~100M-parameter model, trainer process to explorer
process, over gloo (CPU) or NCCL (GPU), next to two limits measured in the same run.

    python bench/weight_sync.py [--params-m 100] [--dtypes float32,bfloat16] [--bucket-mb 0]

Prints, per dtype: the full sync (``WeightSender.send`` -> ``WeightReceiver.receive``: the
metadata once, then every tensor), one raw ``broadcast`` of a single flat tensor of the same
bytes on the same group (the transport's limit), and a plain memory copy of those bytes. The
target is a sync at >= 0.7 of the raw broadcast. Then the same weights through shared memory
(``sync_method: memory``: the trainer writes them, the explorer copies them out, each over the
machine's cores), against a memory copy of the same bytes on one thread (the issue's "memcpy";
target >= 0.5: it copies twice) and, printed beside it, on every core.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from report import record  # noqa: E402  (bench/report.py)

from bus.server import free_port  # noqa: E402
from roles.weightsync.weights import WeightReceiver, WeightSender  # noqa: E402
from schemas.state import Rendezvous  # noqa: E402
from storage.shared_weights import copy_tensors  # noqa: E402


def model_shapes(params_m: float) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of a Qwen2 model of about ``params_m`` million parameters (meta
    device: nothing is allocated)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layers = max(1, round((params_m - 25) / 7.1))  # hidden 768: ~7.1M per layer, 24.6M embedding
    cfg = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
                      num_attention_heads=12, num_key_value_heads=12, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def _raw(pg, nbytes: int, rank: int, dev) -> float:
    flat = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if rank == 0:
        flat.fill_(7)
    pg.broadcast(torch.zeros(1, device=dev), 0).wait()  # line up both sides
    t0 = time.perf_counter()
    pg.broadcast(flat, 0).wait()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _peer(rank: int, rdv: dict, shapes, dtypes, bucket_bytes: int, repeats: int, q) -> None:
    torch.set_num_threads(1)
    r = Rendezvous.from_dict(rdv)
    if r.backend == "nccl":  # trainer on GPU 0, explorer on GPU 1: NCCL wants a GPU per rank
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    if rank == 0:
        side = WeightSender(r, timeout=300)
    else:
        side = WeightReceiver(r, rank, timeout=300)
    side.connect()
    for dt in dtypes:
        dtype = getattr(torch, dt)
        named = [(n, torch.randn(s, dtype=dtype, device=dev)) for n, s in shapes] if rank == 0 else None
        nbytes = sum(torch.Size(s).numel() for _, s in shapes) * torch.empty((), dtype=dtype).element_size()
        sync_t, raw_t = [], []
        for i in range(repeats):
            side.pg.broadcast(torch.zeros(1, device=dev), 0).wait()
            t0 = time.perf_counter()
            if rank == 0:
                side.send(named, i, bucket_bytes=bucket_bytes)
            else:
                side.receive()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            sync_t.append(time.perf_counter() - t0)
            raw_t.append(_raw(side.pg, nbytes, rank, dev))
        if rank == 1:
            src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
            dst = torch.empty_like(src)
            copy_t = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                dst.copy_(src)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                copy_t.append(time.perf_counter() - t0)
            q.put((dt, nbytes, min(sync_t), min(raw_t), min(copy_t)))


def measure(params_m: float, dtypes: list[str], bucket_bytes: int, repeats: int,
            backend: str) -> list[tuple[str, int, float, float, float]]:
    """Per dtype: (dtype, bytes, full sync s, raw broadcast s, memcpy s), best of ``repeats``,
    from two fresh processes (trainer and explorer side)."""
    shapes = model_shapes(params_m)
    rdv = Rendezvous(0.0, "127.0.0.1", free_port(), 2, backend, "bench").to_dict()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, rdv, shapes, dtypes, bucket_bytes, repeats, q)) for r in (0, 1)]
    return _collect(procs, q, len(dtypes))


def _collect(procs: list, q, n: int) -> list:
    """Start ``procs`` and return the ``n`` rows they put on ``q``; a peer that dies ends the
    bench instead of hanging it."""
    for p in procs:
        p.start()
    rows: list = []
    while len(rows) < n:
        try:
            rows.append(q.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"a peer failed (exit codes {dead}); its error is above") from None
    for p in procs:
        p.join(60)
    return rows


def _memory_peer(role: str, shapes, dtype: str, repeats: int, to_reader, to_writer, q) -> None:
    """One end of ``sync_method: memory``: the trainer writes its slot, the explorer copies
    it out into tensors of its own as the transformers engine's ``update_weights`` does
    (``copy_tensors``: the machine's cores); torch itself on one thread each side."""
    from storage.shared_weights import SharedSlot, read_whole

    torch.set_num_threads(1)
    dt = getattr(torch, dtype)
    if role == "trainer":
        slot = SharedSlot("bench")
        named = [(n, torch.randn(s, dtype=dt)) for n, s in shapes]
        for i in range(repeats):
            to_writer.get()  # the reader is ready
            t0 = time.perf_counter()
            slot.write(named, i, i + 1)
            to_reader.put((slot.path, i, i + 1, time.perf_counter() - t0))
        to_writer.get()  # the reader is done with the slot
        slot.close()
        return
    own = {n: torch.empty(s, dtype=dt) for n, s in shapes}
    syncs = []
    for _ in range(repeats):
        to_writer.put("ready")
        path, version, seq, wrote = to_reader.get()
        t0 = time.perf_counter()
        with read_whole(path, version, seq) as tensors:
            copy_tensors((own[n], t) for n, t in tensors)
        syncs.append(wrote + time.perf_counter() - t0)
    to_writer.put("done")
    nbytes = sum(t.numel() * t.element_size() for t in own.values())
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    copies, wide = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        copy_tensors([(dst, src)])
        wide.append(time.perf_counter() - t0)
    q.put((dtype, nbytes, min(syncs), min(copies), min(wide)))


def measure_memory(params_m: float, dtypes: list[str], repeats: int) -> list[tuple[str, int, float, float, float]]:
    """Per dtype: (dtype, bytes, full sync s, memcpy s on one thread, on every core), best of
    ``repeats`` (the first sync
    also allocates the slot's pages), through shared memory between two fresh processes."""
    shapes = model_shapes(params_m)
    ctx = mp.get_context("spawn")
    rows = []
    for dt in dtypes:
        q, to_reader, to_writer = ctx.Queue(), ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=_memory_peer, args=(r, shapes, dt, repeats, to_reader, to_writer, q))
                 for r in ("trainer", "explorer")]
        rows += _collect(procs, q, 1)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params-m", type=float, default=100.0, help="model size in millions of parameters")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--bucket-mb", type=float, default=0.0, help="bucket size (0: one broadcast per tensor)")
    ap.add_argument("--repeats", type=int, default=3, help="take the best of N")
    ap.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    a = ap.parse_args(argv)
    if a.backend == "nccl" and torch.cuda.device_count() < 2:
        ap.error(f"--backend nccl needs two GPUs (trainer and explorer each on its own; NCCL refuses "
                 f"two ranks on one GPU), this machine has {torch.cuda.device_count()}: use --backend gloo")
    shapes = model_shapes(a.params_m)
    n_params = sum(torch.Size(s).numel() for _, s in shapes)
    dtypes = a.dtypes.split(",")
    try:
        rows = measure(a.params_m, dtypes, int(a.bucket_mb * 2**20), a.repeats, a.backend)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"weight sync, {a.backend}, {len(shapes)} tensors, {n_params / 1e6:.1f}M params, "
          f"bucket {a.bucket_mb:g} MB, best of {a.repeats}, trainer process -> explorer process")
    print(f"{'dtype':9} {'GB':>6} | {'sync s':>7} {'GB/s':>6} | {'raw bcast s':>11} {'GB/s':>6} | "
          f"{'memcpy s':>8} {'GB/s':>6} | sync/raw")
    for dt, nbytes, s, r, c in rows:
        gb = nbytes / 1e9
        print(f"{dt:9} {gb:6.3f} | {s:7.3f} {gb / s:6.2f} | {r:11.3f} {gb / r:6.2f} | "
              f"{c:8.3f} {gb / c:6.2f} | {r / s:.2f}")
    figures: dict[str, float] = {}
    for dt, nbytes, s, r, _ in rows:
        figures[f"{dt}: full sync of {n_params / 1e6:.0f}M params, s"] = round(s, 3)
        figures[f"{dt}: full sync, GB/s"] = round(nbytes / 1e9 / s, 2)
        figures[f"{dt}: sync / raw broadcast (rate ratio)"] = round(r / s, 2)
    record("weight_sync", figures, target="a sync at >= 0.7 of the raw broadcast",
           met=all(r / s >= 0.7 for _, _, s, r, _ in rows))
    mem = measure_memory(a.params_m, dtypes, a.repeats)
    cores = os.cpu_count()
    print(f"sync_method: memory (shared memory, each side's copy over the {cores} cores), best of {a.repeats}")
    print(f"{'dtype':9} {'GB':>6} | {'sync s':>7} {'GB/s':>6} | {'memcpy s':>8} {'GB/s':>6} | sync/memcpy | "
          f"{'memcpy ' + str(cores) + ' cores s':>16} | sync/that")
    for dt, nbytes, s, c, w in mem:
        gb = nbytes / 1e9
        print(f"{dt:9} {gb:6.3f} | {s:7.3f} {gb / s:6.2f} | {c:8.3f} {gb / c:6.2f} | {c / s:11.2f} | {w:16.3f} | {w / s:.2f}")
    figures = {}
    for dt, _, s, c, w in mem:
        figures[f"{dt}: memory sync / memcpy (rate ratio)"] = round(c / s, 2)
        figures[f"{dt}: memory sync / memcpy on every core (rate ratio)"] = round(w / s, 2)
    record("weight_sync_memory", figures, target="a sync at >= 0.5 of memcpy (one thread)",
           met=all(c / s >= 0.5 for _, _, s, c, _ in mem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
