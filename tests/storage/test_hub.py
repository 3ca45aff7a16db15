"""Hub ids as model and dataset paths (``storage/hub.py``, ``roles/launch/checks.py``), against a real
Hugging Face cache built here offline in the library's own layout::

    <HF_HOME>/hub/models--Org--Name/{blobs/<sha256>, refs/<branch or tag>, snapshots/<commit>/<file>}

(``datasets--Org--Name`` for datasets; snapshot files are symlinks to the blobs, as
``hf download`` leaves them). ``HF_HUB_OFFLINE=1`` throughout: nothing here reaches a network,
and nothing of ``huggingface_hub`` is replaced.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from schemas.config import FormatConfig, TasksetConfig
from schemas.loader import ConfigError
from storage.hub import HubError, HubId, hub_origin, parse_hub_id, resolve
from storage.tasksets import TaskReader

ROOT = Path(__file__).resolve().parents[2]
MAIN = "a" * 40  #: commit of refs/main
OLD = "b" * 40  #: an older commit, tagged v1
ROWS = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(5)]
#: gsm8k's README front matter (abridged): how load_dataset, and our reader, find the files.
GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
# gsm8k
"""


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty hub cache under a fresh ``HF_HOME``, offline; yields ``<HF_HOME>/hub``.

    ``huggingface_hub.constants`` reads the environment once, when first imported (another
    test may have imported it already): reloading it makes the library read this environment
    as a fresh process would, and again at the end to read the original one."""
    import huggingface_hub.constants as constants

    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    importlib.reload(constants)
    yield home / "hub"
    monkeypatch.undo()
    importlib.reload(constants)


def cache_repo(hub: Path, repo_type: str, repo_id: str, commit: str, files: dict[str, bytes],
               refs: tuple[str, ...] = ("main",)) -> Path:
    """Put ``files`` (snapshot-relative name -> content) into the cache as ``commit`` of
    ``repo_id``, each a symlink to its blob, with ``refs`` pointing at it; return the snapshot."""
    repo = hub / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def folder_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def parquet_bytes(rows: list[dict], tmp: Path) -> bytes:
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    return tmp.read_bytes()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (random-weight) Qwen2 model folder: what ``hf download`` would have fetched."""
    from storage.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def cached(hub: Path, tiny_model: Path, tmp_path: Path) -> dict[str, Path]:
    """The cache holds ``Org/Tiny`` (main, and an older commit tagged v1) and ``openai/gsm8k``
    in its hub layout (``main/train-00000-of-00001.parquet``, README configs)."""
    model_files = folder_files(tiny_model)
    gsm8k = {
        "README.md": GSM8K_README.encode(),
        "main/train-00000-of-00001.parquet": parquet_bytes(ROWS, tmp_path / "train.parquet"),
        "main/test-00000-of-00001.parquet": parquet_bytes(ROWS[:2], tmp_path / "test.parquet"),
    }
    sft = {"train.jsonl": b'{"question": "1+1=?", "answer": "2"}\n'}
    return {
        "model": cache_repo(hub, "model", "Org/Tiny", MAIN, model_files),
        "model_v1": cache_repo(hub, "model", "Org/Tiny", OLD, {"config.json": model_files["config.json"]},
                               refs=("v1",)),
        "gsm8k": cache_repo(hub, "dataset", "openai/gsm8k", MAIN, gsm8k),
        "sft": cache_repo(hub, "dataset", "Org/Sft", MAIN, sft),
    }


# ------------------------------------------------------------------------------------------
# storage.hub
# ------------------------------------------------------------------------------------------


def test_what_counts_as_a_hub_id() -> None:
    assert parse_hub_id("Qwen/Qwen2.5-1.5B-Instruct") == HubId("Qwen/Qwen2.5-1.5B-Instruct")
    assert parse_hub_id("openai/gsm8k@refs/convert/parquet") == HubId("openai/gsm8k", "refs/convert/parquet")
    assert parse_hub_id("Org/Name@v1").download_command("dataset") == (  # type: ignore[union-attr]
        "hf download Org/Name --repo-type dataset --revision v1")
    for local in ("/abs/model", "./rel/model", "~/model", "a/b/c", "gpt2", "data/train.jsonl",
                  "Org/a--b", "Org/../x", "sqlite:///x.db", "Org/Name@"):
        assert parse_hub_id(local) is None, local


def test_a_model_id_resolves_to_its_snapshot_and_loads(cached: dict[str, Path]) -> None:
    from transformers import AutoConfig, AutoTokenizer

    path = resolve("Org/Tiny", "model.model_path")
    assert Path(path) == cached["model"].resolve()
    assert hub_origin(path) == f"Org/Tiny@{MAIN}"
    assert AutoConfig.from_pretrained(path).model_type == "qwen2"
    assert AutoTokenizer.from_pretrained(path)("12").input_ids  # the symlinked blobs are read


def test_a_revision_picks_its_snapshot(cached: dict[str, Path]) -> None:
    assert Path(resolve("Org/Tiny@v1", "model.model_path")) == cached["model_v1"].resolve()
    assert Path(resolve(f"Org/Tiny@{OLD}", "model.model_path")) == cached["model_v1"].resolve()
    assert Path(resolve("Org/Tiny@main", "model.model_path")) == cached["model"].resolve()


def test_a_dataset_id_resolves_and_the_taskset_reader_reads_it(cached: dict[str, Path]) -> None:
    path = resolve("openai/gsm8k", "buffer.explorer_input.taskset.path", "dataset")
    assert Path(path) == cached["gsm8k"].resolve()
    fmt = FormatConfig(prompt_key="question", response_key="answer")
    for split, rows in (("train", ROWS), ("test", ROWS[:2])):
        cfg = TasksetConfig(name="gsm8k", path=path, subset_name="main", split=split, format=fmt,
                            default_workflow_type="math_workflow")
        tasks = TaskReader.from_config(cfg, batch_size=len(rows), is_eval=True).read_batch()
        assert [t.raw["question"] for t in tasks] == [r["question"] for r in rows]


def test_a_missing_id_names_the_key_and_the_download_command(hub: Path) -> None:
    with pytest.raises(HubError) as e:
        resolve("Org/Missing", "model.model_path", download=True)  # offline: no download
    msg = str(e.value)
    assert msg.startswith("model.model_path: Org/Missing does not exist")
    assert "`hf download Org/Missing`" in msg and "HF_HUB_OFFLINE" in msg and str(hub) in msg
    with pytest.raises(HubError, match=r"`hf download openai/gsm8k --repo-type dataset --revision v9`"):
        resolve("openai/gsm8k@v9", "buffer.explorer_input.taskset.path", "dataset")


def test_a_missing_revision_of_a_cached_repo_is_missing_too(cached: dict[str, Path]) -> None:
    with pytest.raises(HubError, match=r"--revision v2`"):
        resolve("Org/Tiny@v2", "model.model_path")


def test_a_local_path_is_left_untouched(cached: dict[str, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Org" / "Tiny").mkdir(parents=True)  # a local folder wins over the cached id
    assert resolve("Org/Tiny", "model.model_path") == "Org/Tiny"
    for value in (str(tmp_path / "nope"), "a/b/c", "data/train.jsonl", ""):
        assert resolve(value, "model.model_path") == value  # not ids: the checks say "does not exist"


# ------------------------------------------------------------------------------------------
# the config: resolved once when it loads, checked by the commands that read it
# ------------------------------------------------------------------------------------------


def write_config(tmp_path: Path, model: str = "Org/Tiny", taskset: str = "openai/gsm8k") -> Path:
    fmt = {"prompt_key": "question", "response_key": "answer"}
    taskset_cfg = {"name": "gsm8k", "path": taskset, "subset_name": "main", "split": "train",
                   "format": fmt, "default_workflow_type": "math_workflow"}
    cfg = {
        "project": "p", "name": "n", "mode": "both", "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": model},
        "explorer": {"auxiliary_models": [
            {"model_path": "Org/Tiny@v1", "engine_type": "transformers"},
            {"model_path": "Org/Tiny", "engine_type": "external"}]},  # a name on a server
        "buffer": {"batch_size": 2, "explorer_input": {
            "taskset": taskset_cfg,
            "eval_tasksets": [dict(taskset_cfg, name="gsm8k-eval", split="test", path=f"{taskset}@main")]}},
        "nats": {"url": "nats://127.0.0.1:1", "connect_wait": 0.5},
        "stages": [
            {"stage_name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"},
             "buffer": {"total_steps": 1, "trainer_input": {"experience_buffer": {
                 "name": "sft", "path": "Org/Sft", "format": dict(fmt, prompt_type="plaintext")}}}},
            {"stage_name": "rft"},
        ],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def load_args(config: Path, tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(config=str(config), overrides=[], dotenv=str(tmp_path / "no.env"))


@pytest.fixture
def no_trinity_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("TRINITY_")]:
        monkeypatch.delenv(k)


@pytest.mark.usefixtures("no_trinity_env")
def test_loading_a_config_points_every_hub_id_at_the_cache(cached: dict[str, Path], tmp_path: Path) -> None:
    from roles.launch.checks import check_inputs
    from roles.runtime.config import load

    loaded = load(load_args(write_config(tmp_path), tmp_path), quiet=True)
    model, gsm8k, sft = (str(cached[k].resolve()) for k in ("model", "gsm8k", "sft"))
    for cfg in (loaded.config, *loaded.stages):
        assert cfg.model.model_path == model
        assert cfg.model.critic_model_path == model  # derived from model_path: follows it
        assert cfg.explorer.rollout_model.model_path == model
        assert cfg.buffer.explorer_input.taskset.path == gsm8k  # type: ignore[union-attr]
        assert cfg.buffer.explorer_input.eval_tasksets[0].path == gsm8k
        teacher, served = cfg.explorer.auxiliary_models
        assert teacher.model_path == str(cached["model_v1"].resolve()) and served.model_path == "Org/Tiny"
    assert loaded.stages[0].buffer.trainer_input.experience_buffer.path == sft  # type: ignore[union-attr]
    assert check_inputs(loaded.stages, "run") == ([], [])  # every dataset opened, first row read
    loaded.stages[1].buffer.explorer_input.eval_tasksets[0].split = "validation"
    (problem,), _ = check_inputs(loaded.stages, "run")  # a message about a snapshot names the id
    assert problem.startswith(f"stages[1] (rft).buffer.explorer_input.eval_tasksets[0] (hub openai/gsm8k@{MAIN}): ")
    assert "split='validation'" in problem


@pytest.mark.usefixtures("no_trinity_env")
def test_preflight_names_an_uncached_id_with_its_key(cached: dict[str, Path], tmp_path: Path) -> None:
    from roles.launch.checks import preflight
    from roles.runtime.config import load

    loaded = load(load_args(write_config(tmp_path, model="Org/Missing"), tmp_path), quiet=True)
    assert loaded.config.model.model_path == "Org/Missing"  # left as written, for the message
    with pytest.raises(ConfigError) as e:
        preflight(loaded.stages, "trainer")
    (line,) = e.value.problems
    assert "stages[0] (sft).model.model_path: Org/Missing does not exist" in line
    assert "`hf download Org/Missing`" in line


# ------------------------------------------------------------------------------------------
# end to end: the trinity command, as a user runs it
# ------------------------------------------------------------------------------------------


def trinity(*args: str, hf_home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRINITY_") and k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "roles.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_trinity_config_and_run_with_hub_ids(cached: dict[str, Path], hub: Path, tmp_path: Path) -> None:
    r = trinity("config", "--config", str(write_config(tmp_path)), "--stage", "1", hf_home=hub.parent)
    assert r.returncode == 0, r.stderr
    printed = yaml.safe_load(r.stdout)
    assert printed["model"]["model_path"] == str(cached["model"].resolve())
    assert printed["buffer"]["explorer_input"]["taskset"]["path"] == str(cached["gsm8k"].resolve())
    assert "does not exist" not in r.stderr, r.stderr

    uncached = write_config(tmp_path, taskset="openai/gsm8k-nope")
    r = trinity("config", "--config", str(uncached), hf_home=hub.parent)  # config only warns
    assert r.returncode == 0, r.stderr
    assert ("warning: stages[1] (rft).buffer.explorer_input.taskset.path: openai/gsm8k-nope does not exist"
            in r.stderr)
    r = trinity("run", "--config", str(uncached), hf_home=hub.parent)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "stages[1] (rft).buffer.explorer_input.taskset.path: openai/gsm8k-nope does not exist" in r.stderr
    assert "`hf download openai/gsm8k-nope --repo-type dataset`" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "ckpt").exists()
