"""The wandb and mlflow monitors with the seed's ``monitor_args``, through the real libraries:
wandb in offline mode (its run directory under the job's ``monitor/``), mlflow on a local
SQLite store read back with ``MlflowClient``. No server is needed for either.

Every test removes the libraries' variables first and has them restored after it
(:func:`_clear_env`): the ``Monitor`` writes credentials into ``os.environ``, which is what is
checked, and must not leak them into the tests that run later in the same process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from roles.runtime.monitor import (
    MLFLOW_DEFAULT_URI,
    Monitor,
    mlflow_tracking_uri,
    monitor_args_problems,
)
from schemas.config import TrinityConfig
from schemas.data import Metric
from schemas.loader import ConfigError

# mlflow's SQLite store uses an SQLAlchemy 2.1 deprecation once per process: not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")

WANDB_VARS = ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DIR", "WANDB_ENTITY",
              "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_TAGS", "WANDB_NOTES")
MLFLOW_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
               "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")


def _clear_env(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> None:
    """Unset ``names`` now and restore them (set or unset) after the test, whoever writes them
    meanwhile: ``delenv`` alone does not record a variable that is not set, so a value the
    Monitor sets later would stay; ``setenv`` first records it."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _cfg(tmp_path: Path, monitor: dict) -> TrinityConfig:
    """A config as the loader makes it from YAML, with this ``monitor`` section."""
    import yaml

    from schemas.loader import load_config

    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump({"project": "p", "name": "n", "monitor": monitor,
                                 "checkpoint_root_dir": str(tmp_path / "ckpt"),
                                 "model": {"model_path": str(tmp_path)}}))
    return load_config(str(f), [], environ={}, dotenv_file=None).config


def _log_two_evals(mon: Monitor) -> None:
    mon.log(Metric(role="explorer", step=0, kind="eval", taskset="test", values={"accuracy": 0.25}))
    mon.log(Metric(role="explorer", step=5, kind="eval", taskset="test", values={"accuracy": 0.75}))


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No wandb variable from the machine; wandb's config and cache under tmp_path (not the
    user's ~/.config/wandb). Afterwards wandb's service process (``wandb-core``) is shut
    down with ``wandb.teardown()``, and must be gone: a test leaves no process behind."""
    import psutil
    import wandb

    _clear_env(monkeypatch, WANDB_VARS)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}  # e.g. the session's nats-server
    yield
    wandb.teardown()
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, f"left running: {[p.name() for p in alive]}"


@pytest.fixture
def mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch, MLFLOW_VARS)


def test_wandb_takes_the_seed_monitor_args_and_logs_offline(tmp_path, wandb_env):
    """The seed's ``base_url``/``api_key`` become WANDB_BASE_URL/WANDB_API_KEY (wandb.init had
    no such arguments: the role died with a TypeError); ``mode: offline`` needs no server."""
    import wandb

    key = "k" * 40
    cfg = _cfg(tmp_path, {"monitor_type": "wandb", "monitor_args": {
        "base_url": "http://localhost:8080", "api_key": key, "mode": "offline", "tags": ["seed"]}})
    mon = Monitor(cfg, "explorer")
    run = mon.backend
    assert os.environ["WANDB_BASE_URL"] == "http://localhost:8080"
    assert os.environ["WANDB_API_KEY"] == key
    assert run.settings.base_url == "http://localhost:8080"  # what wandb read from them
    assert run.settings.mode == "offline"
    assert (run.project, run.name, run.group, list(run.tags)) == ("p", "n/explorer", "n", ["seed"])
    _log_two_evals(mon)
    mon.close()
    # ``finish()`` can return before wandb's service has written its buffer to the run's file
    # (CI saw only the file's header under load); the service flushes and closes it as it exits
    wandb.teardown()
    # the offline run's file, under the job's monitor/ folder (what ``wandb sync`` uploads),
    # holds the metric: its records keep each history item's key and JSON value as text
    files = list((Path(cfg.checkpoint_job_dir) / "monitor/wandb").glob(f"offline-run-*/run-{run.id}.wandb"))
    assert len(files) == 1
    data = files[0].read_bytes()
    assert b"eval/test/accuracy" in data and b"0.25" in data and b"0.75" in data


def test_wandb_offline_from_the_environment_without_monitor_args(tmp_path, wandb_env, monkeypatch):
    """WANDB_MODE=offline as wandb users set it, no credentials anywhere: the run is written."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = _cfg(tmp_path, {"monitor_type": "wandb"})
    mon = Monitor(cfg, "trainer")
    assert mon.backend.settings.mode == "offline"
    assert "WANDB_API_KEY" not in os.environ
    _log_two_evals(mon)
    mon.close()
    assert list((Path(cfg.checkpoint_job_dir) / "monitor/wandb").glob("offline-run-*/run-*.wandb"))


def test_mlflow_takes_uri_and_credentials_and_logs_every_step(tmp_path, mlflow_env):
    """``uri`` is the tracking URI; ``username``/``password`` land in the variables mlflow's
    REST client reads. Experiment = project, run = ``<name>/<role>``, one value per step."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = _cfg(tmp_path, {"monitor_type": "mlflow", "monitor_args": {
        "uri": uri, "username": "alice", "password": "s3cret"}})
    mon = Monitor(cfg, "explorer")
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3cret"
    _log_two_evals(mon)
    mon.close()
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("p")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "n/explorer" and run.info.status == "FINISHED"
    assert run.data.tags["role"] == "explorer"
    history = client.get_metric_history(run.info.run_id, "eval.test.accuracy")
    assert [(h.step, h.value) for h in history] == [(0, 0.25), (5, 0.75)]


def test_mlflow_second_role_joins_the_experiment_and_env_uri_is_used(tmp_path, mlflow_env, monkeypatch):
    """No ``uri``: MLFLOW_TRACKING_URI is used; a second role's run goes into the experiment
    the first one created."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cfg = _cfg(tmp_path, {"monitor_type": "mlflow"})
    for role in ("explorer", "trainer"):
        mon = Monitor(cfg, role)
        _log_two_evals(mon)
        mon.close()
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("p").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["n/explorer", "n/trainer"]


def test_mlflow_tracking_uri_precedence(mlflow_env, monkeypatch):
    assert mlflow_tracking_uri({}) == MLFLOW_DEFAULT_URI == "http://localhost:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert mlflow_tracking_uri({}) == "http://env:5000"
    assert mlflow_tracking_uri({"uri": "http://args:5000"}) == "http://args:5000"


def test_an_argument_the_backend_does_not_take_is_named_before_anything_opens(tmp_path):
    """A ConfigError (what every role reports with exit 2) naming each bad key, raised before
    the monitor folder or a backend run exists; secrets are not echoed."""
    cfg = _cfg(tmp_path, {"monitor_type": "wandb", "monitor_args": {
        "base_url": "http://localhost:8080", "project": "other", "bogus": 1, "api_key": 12345,
        "mode": "later"}})
    with pytest.raises(ConfigError) as e:
        Monitor(cfg, "explorer")
    msg = str(e.value)
    assert "monitor.monitor_args.project: not an argument of monitor_type wandb" in msg
    assert "set by the config's project/name" in msg
    assert "monitor.monitor_args.bogus" in msg
    assert "monitor.monitor_args.api_key: must be a non-empty string, got int" in msg
    assert "12345" not in msg
    assert "monitor.monitor_args.mode: must be one of online, offline, disabled, shared" in msg
    assert len(e.value.problems) == 4  # base_url is fine
    assert not (Path(cfg.checkpoint_job_dir) / "monitor").exists()

    mlflow = _cfg(tmp_path, {"monitor_type": "mlflow", "monitor_args": {"tracking_uri": "x", "uri": "y"}})
    problems = monitor_args_problems(mlflow.monitor)
    assert problems == ["monitor.monitor_args.tracking_uri: not an argument of monitor_type mlflow; "
                        "it takes uri, username, password"]
    # the other backend's arguments left in the YAML: tensorboard takes none and ignores them
    tb = _cfg(tmp_path, {"monitor_type": "tensorboard", "monitor_args": {"base_url": "x"}})
    assert monitor_args_problems(tb.monitor) == []
