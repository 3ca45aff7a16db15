"""The same mistake gives the same clear error whichever command the user ran: every entry
point that loads a configuration checks the files it reads (``roles/launch/checks.py``) before any
work, exits 2 and names the config key and the path.

Most commands run through ``roles.cli.main`` in this process (the check comes before anything
heavy starts); ``trinity debug`` on the quickstart without its assets (a newcomer who skipped
``prepare.py``) runs as a real process, as in the issue that asked for this.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from roles.cli import main

ROOT = Path(__file__).resolve().parents[2]

#: Every command that reads ``model.model_path`` (config only warns: it prints, it runs nothing).
MODEL_READERS = ["run", "explorer", "trainer", "buffer", "debug"]
#: Every command that connects to the bus: a missing TLS file is named the same way.
BUS_USERS = ["run", "explorer", "trainer", "buffer", "synchronizer", "inspect", "server"]


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """``trinity <command> --config FILE`` in this process: (exit code, stdout + stderr)."""
    for k in [k for k in os.environ if k.startswith("TRINITY_")]:
        monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)

    def run(command: list[str], config: Path, *sets: str) -> tuple[int, str]:
        args = [*command, "--config", str(config), "--dotenv", str(tmp_path / "no.env")]
        for s in sets:
            args += ["--set", s]
        rc = main(args)
        out = capsys.readouterr()
        return rc, out.out + out.err

    return run


def _config(tmp_path: Path, model: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text('{"question": "1+1=?", "answer": "2"}\n')
    fmt = {"prompt_key": "question", "response_key": "answer"}
    cfg = {
        "project": "p", "name": "n", "mode": "both", "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(model)},
        "buffer": {"explorer_input": {"taskset": {"name": "t", "path": str(data), "split": "train",
                                                  "format": fmt}}},
        "nats": {"url": "nats://127.0.0.1:1", "connect_wait": 0.5},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _command(name: str) -> list[str]:
    return ["debug", "--module", "workflow"] if name == "debug" else [name]


@pytest.mark.parametrize("name", MODEL_READERS)
def test_a_missing_model_is_named_by_every_command_that_reads_it(tmp_path, cli, name):
    missing = tmp_path / "no_model"
    rc, out = cli(_command(name), _config(tmp_path, missing))
    assert rc == 2, out
    assert f"trinity {name}: invalid configuration:\n  model.model_path: {missing} does not exist" in out
    assert not (tmp_path / "ckpt").exists(), "work started before the check"


def test_trinity_config_warns_with_the_same_words(tmp_path, cli):
    missing = tmp_path / "no_model"
    rc, out = cli(["config"], _config(tmp_path, missing))
    assert rc == 0, out
    assert f"warning: model.model_path: {missing} does not exist" in out


@pytest.mark.parametrize("name", BUS_USERS)
def test_a_missing_tls_file_is_named_by_every_command_that_connects(tmp_path, cli, name):
    model = tmp_path / "model"
    model.mkdir()  # exists: the bus's file is the only mistake
    ca = tmp_path / "no_ca.pem"
    rc, out = cli(_command(name), _config(tmp_path, model), f"nats.tls_ca_file={ca}")
    assert rc == 2, out
    assert f"nats.tls_ca_file: {ca} does not exist" in out


def test_convert_names_its_missing_option(tmp_path, capsys):
    rc = main(["convert", "--checkpoint-dir", str(tmp_path), "--base-model-dir", str(tmp_path / "nope")])
    assert rc == 2
    assert f"--base-model-dir: {tmp_path / 'nope'} does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_trinity_debug_on_the_quickstart_without_its_assets_names_model_path(tmp_path):
    """Run from a folder without ``examples/quickstart/_build``: the quickstart's relative paths
    point nowhere, as on a fresh clone before ``prepare.py``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    r = subprocess.run(
        [sys.executable, "-m", "roles.cli", "debug", "--config",
         str(ROOT / "examples/quickstart/quickstart.yaml"), "--module", "workflow"],
        cwd=tmp_path, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "model.model_path: examples/quickstart/_build/model does not exist" in r.stderr
    assert "Traceback" not in r.stderr
