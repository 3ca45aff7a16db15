"""The `trinity` CLI skeleton and `trinity config`, run as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
