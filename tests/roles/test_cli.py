"""The `trinity` CLI skeleton and `trinity config`, run as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GSM8K = "examples/grpo_gsm8k/gsm8k.yaml"


def trinity(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "roles.cli", *args],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120,
    )


def test_help_lists_every_command():
    out = trinity("--help").stdout
    for cmd in ("run", "config", "explorer", "trainer", "buffer", "synchronizer", "server", "inspect", "convert", "debug"):
        assert cmd in out


def test_config_prints_resolved_yaml_with_derived_train_batch_size():
    r = trinity("config", "--config", GSM8K)
    assert r.returncode == 0, r.stderr
    assert "train_batch_size: 1024" in r.stdout


def test_env_overrides_yaml_and_sources_show_it():
    r = trinity("config", "--config", GSM8K, "--sources", env={"TRINITY_BUFFER__BATCH_SIZE": "4"})
    assert r.returncode == 0, r.stderr
    assert "batch_size: 4  # env TRINITY_BUFFER__BATCH_SIZE" in r.stdout
    assert "train_batch_size: 32  # derived" in r.stdout


def test_misspelled_key_fails_naming_it():
    r = trinity("config", "--set", "algoritm.algorithm_type=grpo")
    assert r.returncode == 2
    assert "algoritm: unknown key" in r.stderr and "did you mean 'algorithm'" in r.stderr


def test_missing_config_file_fails_naming_it():
    r = trinity("config", "--config", "no/such.yaml")
    assert r.returncode == 2 and "no/such.yaml" in r.stderr


def test_server_then_inspect_then_sigterm(tmp_path):
    import signal
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(TRINITY_NATS__URL=f"nats://127.0.0.1:{port}", TRINITY_CHECKPOINT_ROOT_DIR=str(tmp_path))
    server = subprocess.Popen([sys.executable, "-m", "roles.cli", "server"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        r = trinity("inspect", env={k: env[k] for k in ("TRINITY_NATS__URL", "TRINITY_CHECKPOINT_ROOT_DIR")})
        assert r.returncode == 0, r.stderr
        assert "Trinity-RFT" in r.stdout or "Trinity-RFT.rft" in r.stdout
        assert (tmp_path / "nats").is_dir()  # JetStream store under <checkpoint_root_dir>/nats
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


def test_inspect_without_a_server_says_which_url():
    r = trinity("inspect", env={"TRINITY_NATS__URL": "nats://127.0.0.1:1", "TRINITY_NATS__CONNECT_WAIT": "0.5"})
    assert r.returncode == 1 and "127.0.0.1:1" in r.stderr


def test_convert_reports_a_missing_dir(tmp_path):
    r = trinity("convert", "--checkpoint-dir", str(tmp_path / "nope"))
    assert r.returncode == 2 and f"--checkpoint-dir: {tmp_path / 'nope'} does not exist" in r.stderr


def test_freeze_heap_takes_live_objects_out_of_full_collections() -> None:
    import gc

    from roles.runtime.cpu_tuning import freeze_heap

    before = gc.get_freeze_count()
    try:
        freeze_heap()
        assert gc.get_freeze_count() > max(before, 1000)  # the imported modules at least
    finally:
        gc.unfreeze()


def test_keep_freed_memory_applies_on_glibc() -> None:
    import platform

    from roles.runtime.cpu_tuning import keep_freed_memory

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt's thresholds are glibc's")
    assert keep_freed_memory() and keep_freed_memory()  # idempotent


#: A role process (``trinity <role>``) whose stages are replaced by ``stages``: what runs once
#: config loading, the pre-start checks and the process tuning are done.
ROLE_WITH_STAGES = """
import gc, sys
import roles.launch.stages

async def stages(*args, **kwargs):
    {stages}
    return 0

roles.launch.stages.run_stages = stages
from roles.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_role(role: str, stages: str, tmp_path: Path, *sets: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_") and k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, "-c", ROLE_WITH_STAGES.format(stages=stages), role, "--config", GSM8K,
                           "--set", f"checkpoint_root_dir={tmp_path}", *(a for s in sets for a in ("--set", s))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("error", ["KeyError('version')", "ValueError('bad value')", "FileNotFoundError('x.bin')"])
def test_a_role_that_fails_mid_run_exits_1_with_its_traceback(tmp_path, error):
    """The error taxonomy: exit 2 ("the config is wrong, a restart cannot help": ``trinity run``
    stops the run) is only for config loading and the pre-start checks. Past them, any error (a
    ``KeyError`` from a malformed value once ended a run with a mislabelled "config error") exits
    1 with its traceback in the role's log, and ``trinity run`` restarts the role."""
    import json

    r = run_role("synchronizer", f"raise {error}", tmp_path)
    kind = error.split("(")[0]
    assert r.returncode == 1, r.stderr
    assert "role_failed_mid_run" in r.stderr and "role=synchronizer" in r.stderr and kind in r.stderr
    records = [json.loads(line) for line in next(tmp_path.glob("**/log/synchronizer.log")).read_text().splitlines()]
    failed = [rec for rec in records if rec["event"] == "role_failed_mid_run"]
    assert failed and failed[0]["exception"][0]["exc_type"] == kind  # the traceback, as structured frames
    assert any(f["name"] == "stages" for f in failed[0]["exception"][0]["frames"])


@pytest.mark.parametrize(("setting", "gpus", "tuned"), [("auto", 0, True), ("auto", 2, False), ("false", 0, False),
                                                        ("true", 2, True)])
def test_cpu_tuning_applies_where_the_setting_says(tmp_path, setting, gpus, tuned):
    """``cluster.cpu_tuning``: a role process tunes itself for a small shared CPU machine (a
    frozen import heap, one torch thread per 4 cores) on CPU nodes by default, where it was
    measured to help, and on GPU nodes only when asked."""
    r = run_role("synchronizer", "import torch; print('tuning', gc.get_freeze_count() > 0, torch.get_num_threads())",
                 tmp_path, f"cluster.cpu_tuning={setting}", f"cluster.gpu_per_node={gpus}")
    assert r.returncode == 0, r.stderr
    frozen, threads = r.stdout.split("tuning ", 1)[1].split()[:2]
    assert frozen == str(tuned)
    if tuned:  # untuned: torch's own default, whatever this machine makes it
        assert int(threads) == max(1, (os.cpu_count() or 1) // 4)


@pytest.mark.unit
def test_cpu_bfloat16_only_where_the_cpu_has_it_natively(monkeypatch):
    """CPU engines and the trainer compute in bfloat16 only where the CPU multiplies it natively
    (emulated, it is slower than float32); TRINITY_CPU_BF16 overrides; float16 never runs on a CPU."""
    import torch

    from roles.runtime.cpu_tuning import BF16_FLAGS, cpu_bf16, cpu_dtype

    monkeypatch.delenv("TRINITY_CPU_BF16", raising=False)
    flags = open("/proc/cpuinfo").read().split()
    native = any(f in flags for f in BF16_FLAGS) and torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert cpu_bf16() == native
    assert cpu_dtype("bfloat16") == ("bfloat16" if native else "float32")
    monkeypatch.setenv("TRINITY_CPU_BF16", "1")
    assert cpu_bf16() and cpu_dtype("bfloat16") == "bfloat16"
    assert cpu_dtype("float16") == cpu_dtype("float32") == cpu_dtype("auto") == "float32"
    monkeypatch.setenv("TRINITY_CPU_BF16", "0")
    assert not cpu_bf16() and cpu_dtype("bfloat16") == "float32"
