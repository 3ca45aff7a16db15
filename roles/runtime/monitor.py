"""Where a role's metrics go besides the bus: ``monitor/metrics.jsonl`` always, plus the
``monitor.monitor_type`` backend (tensorboard by default, wandb or mlflow when installed).

Each role that produces metrics (explorer, trainer) opens its own :class:`Monitor`: no extra
process and no consumer to fall behind. ``metrics.jsonl`` is shared by the roles of a job;
every record is one ``write`` on a file opened for appending, which Linux keeps whole on a
local file system. Backends are imported only when selected, and a missing package is a clear
error naming the extra to install.

``monitor.monitor_args`` are the seed's: wandb's ``base_url``/``api_key`` and mlflow's
``username``/``password`` become the environment variables each library reads its server and
credentials from (they override those variables, as the seed's guide says), and mlflow's
``uri`` is its tracking URI. wandb also takes ``entity``, ``mode``, ``tags`` and ``notes``
(passed to ``wandb.init``); ``project``, ``name`` and ``group`` come from the config's
``project``/``name``. A key the selected backend does not take is a :class:`ConfigError`
naming ``monitor.monitor_args.<key>``, raised before the monitor opens anything (not a
``TypeError`` from inside ``wandb.init``, nor a setting silently dropped). tensorboard and
``none`` take no arguments and ignore them, so switching ``monitor_type`` on the command line
does not fail on the other backend's arguments left in the YAML.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from schemas.config import MonitorConfig, TrinityConfig
from schemas.data import Metric
from schemas.loader import ConfigError

#: wandb's arguments that are environment variables: wandb reads them when a run starts, and
#: its service process (``wandb-core``, started by ``wandb.init``) inherits them.
WANDB_ENV = {"base_url": "WANDB_BASE_URL", "api_key": "WANDB_API_KEY"}
#: wandb's arguments passed to ``wandb.init`` as they are. Not ``id``/``resume``: every role
#: opens its own run, and one id for all of them would make them write into one run.
WANDB_INIT = ("entity", "mode", "tags", "notes")
#: The values of ``wandb.init(mode=...)``.
WANDB_MODES = ("online", "offline", "disabled", "shared")
#: mlflow's credentials: its REST client reads them from these variables on every request.
MLFLOW_ENV = {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD"}
#: The tracking URI when neither ``monitor_args.uri`` nor ``MLFLOW_TRACKING_URI`` is set (the
#: seed's default: a local ``mlflow server``).
MLFLOW_DEFAULT_URI = "http://localhost:5000"


def monitor_args_problems(monitor: MonitorConfig) -> list[str]:
    """One line per ``monitor.monitor_args`` entry the selected backend cannot take, naming
    ``monitor.monitor_args.<key>`` (empty when all are usable). Pure, so a config check can
    call it before any role starts; a value of ``None`` counts as not set. Values are never
    echoed: ``api_key`` and ``password`` are secrets."""
    args = monitor.monitor_args or {}
    if monitor.monitor_type == "wandb":
        accepted = [*WANDB_ENV, *WANDB_INIT]
    elif monitor.monitor_type == "mlflow":
        accepted = ["uri", *MLFLOW_ENV]
    else:
        return []  # tensorboard and none take no arguments (see the module's docstring)
    problems = []
    for key, value in args.items():
        field = f"monitor.monitor_args.{key}"
        if key not in accepted:
            hint = " (set by the config's project/name)" if key in ("project", "name", "group") else ""
            problems.append(f"{field}: not an argument of monitor_type {monitor.monitor_type}{hint}; "
                            f"it takes {', '.join(accepted)}")
        elif value is None:
            continue
        elif key == "tags":
            if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                problems.append(f"{field}: must be a list of strings")
        elif not isinstance(value, str) or not value:
            problems.append(f"{field}: must be a non-empty string, got {type(value).__name__}")
        elif key == "mode" and value not in WANDB_MODES:
            problems.append(f"{field}: must be one of {', '.join(WANDB_MODES)}, got {value!r}")
    return problems


def metric_record(m: Metric) -> dict[str, Any]:
    """The JSON line of one metric (what ``trinity run`` reads back for progress and summary)."""
    return {"role": m.role, "kind": m.kind, "step": m.step, "taskset": m.taskset,
            "ts": m.created_at, "values": m.values}


def tag_values(m: Metric) -> dict[str, float]:
    """Flat ``kind[/taskset]/name`` tags, as tensorboard/wandb/mlflow show them."""
    prefix = m.kind + (f"/{m.taskset}" if m.taskset else "")
    return {f"{prefix}/{k}": float(v) for k, v in m.values.items()}


class Monitor:
    """``log(metric)`` appends to ``metrics.jsonl`` and forwards to the chosen backend."""

    def __init__(self, cfg: TrinityConfig, role: str) -> None:
        problems = monitor_args_problems(cfg.monitor)
        if problems:
            raise ConfigError(problems)
        self.dir = Path(cfg.checkpoint_job_dir) / "monitor"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.dir / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.kind = cfg.monitor.monitor_type
        self.backend: Any = None
        self.run_id = ""  #: mlflow's run
        args = {k: v for k, v in (cfg.monitor.monitor_args or {}).items() if v is not None}
        if self.kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError(f"monitor.monitor_type 'tensorboard' needs the tensorboard package ({e})") from e
            self.backend = SummaryWriter(str(self.dir / "tensorboard" / role))
        elif self.kind == "wandb":
            try:
                import wandb
            except ImportError as e:
                raise ImportError("monitor.monitor_type 'wandb': pip install 'trinity[wandb]'") from e
            for key, var in WANDB_ENV.items():
                if key in args:
                    os.environ[var] = args[key]
            self.backend = wandb.init(project=cfg.project, name=f"{cfg.name}/{role}", group=cfg.name,
                                      dir=str(self.dir), config={"role": role},
                                      **{k: args[k] for k in WANDB_INIT if k in args})
        elif self.kind == "mlflow":
            try:
                from mlflow import MlflowClient
            except ImportError as e:
                raise ImportError("monitor.monitor_type 'mlflow': pip install 'trinity[mlflow]'") from e
            for key, var in MLFLOW_ENV.items():
                if key in args:
                    os.environ[var] = args[key]
            # a client of its own, not mlflow's process-wide tracking URI and active run
            self.backend = MlflowClient(mlflow_tracking_uri(args))
            experiment = _mlflow_experiment(self.backend, cfg.project)
            run = self.backend.create_run(experiment, run_name=f"{cfg.name}/{role}", tags={"role": role})
            self.run_id = run.info.run_id

    def log(self, m: Metric) -> None:
        os.write(self.fd, (json.dumps(metric_record(m), default=float) + "\n").encode())
        if self.backend is None:
            return
        values = tag_values(m)
        if self.kind == "tensorboard":
            for k, v in values.items():
                self.backend.add_scalar(k, v, m.step)
            self.backend.flush()
        elif self.kind == "wandb":
            self.backend.log(values, step=m.step)
        elif self.kind == "mlflow":
            from mlflow.entities import Metric as MlflowMetric

            ms = int(m.created_at * 1000)
            self.backend.log_batch(self.run_id, metrics=[
                MlflowMetric(k.replace("/", "."), v, ms, m.step) for k, v in values.items()])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.backend is not None:
            if self.kind == "tensorboard":
                self.backend.close()
            elif self.kind == "wandb":
                self.backend.finish()
            elif self.kind == "mlflow":
                self.backend.set_terminated(self.run_id)
            self.backend = None


def mlflow_tracking_uri(args: dict[str, Any]) -> str:
    """``monitor_args.uri``, else ``MLFLOW_TRACKING_URI`` (where mlflow users already set it),
    else the seed's default, :data:`MLFLOW_DEFAULT_URI`."""
    return args.get("uri") or os.environ.get("MLFLOW_TRACKING_URI") or MLFLOW_DEFAULT_URI


def _mlflow_experiment(client: Any, name: str) -> str:
    """The id of experiment ``name``, created when missing. The roles of a run start together:
    another one may create it between the look-up and the creation, then its id is used."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def read_metrics(job_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of a job's ``metrics.jsonl`` (a torn last line is skipped)."""
    path = Path(job_dir) / "monitor" / "metrics.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def summary(stages: list[TrinityConfig],
            dead: dict[str, tuple[int, list[str]]] | None = None) -> list[str]:
    """Eval accuracy at the start and the end of every stage that evaluated: the lines
    ``trinity run`` prints at the end, and the explorer does when honcho runs the roles.
    ``dead``: by stage run id, how many messages its dead-letter stream holds and their first
    reasons (``bus.dead_letters``; ``trinity run`` reads them), listed after the accuracy."""
    out, flags = [], []
    for s in stages:
        records = read_metrics(s.checkpoint_job_dir)
        flags += no_signal(s.name.rsplit("/", 1)[-1], records)
        flags += dead_letter_lines(s.name.rsplit("/", 1)[-1], *(dead or {}).get(s.run_id, (0, [])))
        evals = [r for r in records if r["kind"] == "eval"]
        if not evals:
            continue
        shown = eval_points(evals)
        shown.sort(key=lambda x: x[0] == "end")  # every start line, then every end line
        for when, r in shown:
            v = r["values"]
            out.append(f"  {s.name.rsplit('/', 1)[-1]:<16} {when:<5} step {r['step']:<4} "
                       f"weights v{int(v.get('model_version', 0)):<4} {r['taskset'] or '':<10} "
                       f"accuracy {100 * v.get('accuracy', float('nan')):5.1f}%")
    head = ["eval accuracy (each stage starts from the previous stage's final weights):", *out] if out else []
    return head + flags


def dead_letter_lines(stage: str, count: int, reasons: list[str]) -> list[str]:
    """The summary's lines for a stage whose dead-letter stream holds ``count`` messages:
    the count, then the first distinct ``reasons``. Empty when there are none: a run whose
    experience went to the dead-letter stream must not end on an accuracy alone."""
    if count <= 0:
        return []
    return [f"WARNING {stage}: {count} message(s) dead-lettered (trinity inspect --stream dlq --tail N shows them); first reasons:",
            *(f"    {r}" for r in reasons)]


def eval_points(evals: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``("start", record)`` per eval taskset (its first evaluation) and ``("end", record)``
    (its final one, when that is another: a bench stage's one evaluation is its start)."""
    shown = []
    for name in dict.fromkeys(r["taskset"] for r in evals):
        mine = [r for r in evals if r["taskset"] == name]
        final = [r for r in mine if r["values"].get("final")]
        shown.append(("start", mine[0]))
        if final and final[-1] is not mine[0]:
            shown.append(("end", final[-1]))
    return shown


def no_signal(stage: str, records: list[dict[str, Any]]) -> list[str]:
    """The warning for a stage whose rollouts never gave the trainer anything to learn from:
    at no step did the episodes of one task get different rewards (``groups_with_signal`` 0
    throughout), so every group-relative advantage was 0. Empty when the stage had signal or
    ran no grouped rollouts."""
    steps = [r for r in records if r["kind"] == "rollout" and "groups_with_signal" in r["values"]]
    if not steps or any(r["values"]["groups_with_signal"] > 0 for r in steps):
        return []
    rewards = [r["values"].get("reward_mean", float("nan")) for r in steps]
    return [
        f"WARNING {stage}: no learning signal: in all {len(steps)} steps every task's episodes got "
        f"the same reward (reward mean {min(rewards):.3f}-{max(rewards):.3f}), so every advantage "
        "was 0 and training changed nothing. The policy gets every task right or every one wrong: "
        "check that the warm-up taught the answer format, that the reward function scores what "
        "you expect (trinity debug), or raise repeat_times or the rollout temperature."
    ]
