"""Where a role's metrics go besides the bus: ``monitor/metrics.jsonl`` always, plus the
``monitor.monitor_type`` backend (tensorboard by default, wandb or mlflow when installed).

Each role that produces metrics (explorer, trainer) opens its own :class:`Monitor`: no extra
process and no consumer to fall behind. ``metrics.jsonl`` is shared by the roles of a job;
every record is one ``write`` on a file opened for appending, which Linux keeps whole on a
local file system. Backends are imported only when selected, and a missing package is a clear
error naming the extra to install.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from schemas.config import TrinityConfig
from schemas.data import Metric


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
        self.dir = Path(cfg.checkpoint_job_dir) / "monitor"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.dir / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.kind = cfg.monitor.monitor_type
        self.backend: Any = None
        args = dict(cfg.monitor.monitor_args or {})
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
            self.backend = wandb.init(project=cfg.project, name=f"{cfg.name}/{role}", group=cfg.name,
                                      dir=str(self.dir), config={"role": role}, **args)
        elif self.kind == "mlflow":
            try:
                import mlflow
            except ImportError as e:
                raise ImportError("monitor.monitor_type 'mlflow': pip install 'trinity[mlflow]'") from e
            if args.get("uri"):
                mlflow.set_tracking_uri(args["uri"])
            mlflow.set_experiment(cfg.project)
            self.backend = mlflow.start_run(run_name=f"{cfg.name}/{role}")

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
            import mlflow

            mlflow.log_metrics({k.replace("/", ".") : v for k, v in values.items()}, step=m.step)

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
                import mlflow

                mlflow.end_run()
            self.backend = None


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


def summary(stages: list[TrinityConfig]) -> list[str]:
    """Eval accuracy at the start and the end of every stage that evaluated: the lines
    ``trinity run`` prints at the end, and the explorer does when honcho runs the roles."""
    out = []
    for s in stages:
        evals = [r for r in read_metrics(s.checkpoint_job_dir) if r["kind"] == "eval"]
        if not evals:
            continue
        # per eval taskset: its first evaluation, and its final one when that is another
        shown = []
        for name in dict.fromkeys(r["taskset"] for r in evals):
            mine = [r for r in evals if r["taskset"] == name]
            final = [r for r in mine if r["values"].get("final")]
            shown.append(("start", mine[0]))
            if final and final[-1] is not mine[0]:
                shown.append(("end", final[-1]))
        shown.sort(key=lambda x: x[0] == "end")  # every start line, then every end line
        for when, r in shown:
            v = r["values"]
            out.append(f"  {s.name.rsplit('/', 1)[-1]:<16} {when:<5} step {r['step']:<4} "
                       f"weights v{int(v.get('model_version', 0)):<4} {r['taskset'] or '':<10} "
                       f"accuracy {100 * v.get('accuracy', float('nan')):5.1f}%")
    return ["eval accuracy (each stage starts from the previous stage's final weights):", *out] if out else []
