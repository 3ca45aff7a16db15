"""``<job_dir>/run.json``: what ``trinity run`` is doing, for tools that look at a job folder.

Why a file: the studio's runs list and run view, and ``trinity inspect --config X``, must find a
run as itself. The bus knows a run only by its id; a job folder knows its stages, but not
whether it is live, which roles were restarted, or that ``continue_from_checkpoint: false``
renamed it to ``<name>_<timestamp>``. ``trinity run`` rewrites this small record (atomically:
a temporary file renamed over it) whenever a role starts, exits or restarts, and, when it
renames a run, leaves ``latest_run.json`` in the original folder pointing at the new one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from schemas.config import TrinityConfig
from schemas.redact import redact_url

RECORD = "run.json"
LATEST = "latest_run.json"


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def read(path: str | Path) -> dict[str, Any] | None:
    """A JSON record, or None when absent or torn."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def job_dir_of(stages: list[TrinityConfig]) -> Path:
    """The folder of the whole job: a staged job's stages live in ``<job>/<stage>``."""
    d = Path(stages[0].checkpoint_job_dir)
    return d.parent if len(stages) > 1 or "/" in stages[0].name else d


class RunRecord:
    """The record one ``trinity run`` keeps of itself (see the module doc)."""

    def __init__(self, stages: list[TrinityConfig], config_file: str | None, renamed_from: str | None) -> None:
        self.path = job_dir_of(stages) / RECORD
        s0 = stages[0]
        self.data: dict[str, Any] = {
            "project": s0.project,
            "name": s0.name.split("/", 1)[0],
            "config_file": config_file and os.path.abspath(config_file),
            "renamed_from": renamed_from and os.path.abspath(renamed_from),
            "pid": os.getpid(),  # how the studio finds the run it started
            "started_at": time.time(),
            "ended_at": None,
            "state": "running",  # then done, failed or stopped (exit code 0, 1/2, 130)
            "exit_code": None,
            "nats_url": redact_url(s0.nats.url),
            "stages": [{"label": s.name.rsplit("/", 1)[-1], "mode": s.mode, "run_id": s.run_id,
                        "dir": os.path.abspath(s.checkpoint_job_dir), "model_path": s.model.model_path,
                        "total_steps": s.trainer.total_steps or s.buffer.total_steps} for s in stages],
            "roles": {},
        }

    def role(self, role: str, state: str, restarts: int = 0, exit_code: int | None = None) -> None:
        """A role started (``running``), finished, failed or is restarting. The first call
        also points the renamed run's original folder at this one (:func:`mark_renamed`)."""
        if not self.data["roles"] and self.data["renamed_from"]:
            mark_renamed(self.data["renamed_from"], self.data["name"])
        self.data["roles"][role] = {"state": state, "restarts": restarts, "exit_code": exit_code, "at": time.time()}
        _write(self.path, self.data)

    def end(self, exit_code: int) -> None:
        """The run ended; nothing is written for a run that never started a role (a wrong
        token, say: no job folder is made for it)."""
        if not self.data["roles"]:
            return
        state = {0: "done", 130: "stopped"}.get(exit_code, "failed")
        self.data.update(state=state, exit_code=exit_code, ended_at=time.time())
        _write(self.path, self.data)


def mark_renamed(original_job_dir: str | Path, new_name: str) -> None:
    """``continue_from_checkpoint: false`` gave this run a new name: say so where a tool
    that reads the config (with the old name) will look."""
    _write(Path(original_job_dir) / LATEST, {"name": new_name, "at": time.time()})


def renamed_to(root: str | Path, project: str, name: str) -> str | None:
    """The name of the newest run ``trinity run`` made from job ``<root>/<project>/<name>``
    by renaming it, else None."""
    rec = read(Path(root) / project / name / LATEST)
    return rec.get("name") if rec else None


def latest_name(cfg: TrinityConfig) -> str | None:
    """:func:`renamed_to` for the job ``cfg`` names (a stage's name is ``<name>/<stage>``)."""
    return renamed_to(cfg.checkpoint_root_dir, cfg.project, cfg.name.split("/", 1)[0])


def inspected_stage(stages: list[TrinityConfig], index: int | None = None) -> TrinityConfig:
    """The stage a tool shows by default: ``index`` when given, else the last one whose job
    folder exists (the running or last run one), else the first."""
    if index is not None:
        return stages[index]
    started = [s for s in stages if Path(s.checkpoint_job_dir).is_dir()]
    return started[-1] if started else stages[0]
