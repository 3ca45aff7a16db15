"""The job folders under a checkpoint root, read for the studio: what runs exist, their stages,
metrics, sync events and the experiences of each kept step.

Everything here reads files the roles write (``run.json``, ``monitor/metrics.jsonl``,
``monitor/sync_events.jsonl``, ``trajectories/``); nothing writes. A job is
``<root>/<project>/<name>``; its stages are the job itself (one stage) or its subfolders with a
``monitor/`` folder. A run that ``continue_from_checkpoint: false`` renamed to
``<name>_<timestamp>`` is its own folder, so it is listed as itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roles.launch.runrecord import RECORD, read
from schemas.config import NAME_PART, run_id_of
from storage.trajectories import read_step, steps

#: A job or stage path segment as it appears in a URL: names made only of these.
#: A project or job name the studio reads: what the config accepts (no ``..``, no separator).
SAFE = NAME_PART


def inside(root: Path, path: Path) -> bool:
    """Is ``path``, symlinks resolved, inside ``root``? The studio serves nothing else: a job
    folder, a stage folder a ``run.json`` names, or a symlink could otherwise point anywhere."""
    return path.resolve().is_relative_to(root.resolve())


@dataclass
class Stage:
    label: str
    dir: Path
    mode: str = ""
    run_id: str = ""
    model_path: str = ""
    total_steps: int | None = None


@dataclass
class Job:
    project: str
    name: str
    dir: Path
    stages: list[Stage]
    record: dict[str, Any] | None = None
    state: str = "unknown"
    figures: dict[str, Any] = field(default_factory=dict)
    #: Known only by its streams (no job folder here): records come from the bus.
    bus_only: bool = False

    @property
    def key(self) -> str:
        return f"{self.project}/{self.name}"


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_job(root: Path, project: str, name: str, with_figures: bool = True) -> Job | None:
    """The job ``<root>/<project>/<name>``, or None when it is not one (``with_figures``: read
    its metrics for :func:`figures` too)."""
    d = root / project / name
    if not (SAFE.fullmatch(project) and SAFE.fullmatch(name)) or not d.is_dir() or not inside(root, d):
        return None
    rec = read(d / RECORD)
    if rec:
        stages = [Stage(s["label"], Path(s["dir"]), s.get("mode", ""), s.get("run_id", ""), s.get("model_path", ""),
                        s.get("total_steps")) for s in rec["stages"] if inside(root, Path(s["dir"]))]
        state = rec.get("state", "unknown")
        if state == "running" and not _alive(rec.get("pid")):
            state = "stopped"  # trinity run was killed without writing its end
    elif (d / "monitor").is_dir():
        stages, state = [Stage(name, d, "", run_id_of(project, name))], "unknown"
    else:
        subs = sorted((p for p in d.iterdir() if (p / "monitor").is_dir() and inside(root, p)), key=lambda p: p.stat().st_mtime)
        stages = [Stage(p.name, p, "", run_id_of(project, f"{name}/{p.name}")) for p in subs]
        state = "unknown"
    if not stages:
        return None
    job = Job(project, name, d, stages, rec, state)
    if with_figures:
        job.figures = figures(job)
    return job


#: The ``project`` of a run the studio knows only from the bus (``/run/_bus/<run_id>``).
BUS = "_bus"


def bus_job(run_id: str) -> Job:
    """A run seen only on the bus: one stage, named by its run id."""
    return Job(BUS, run_id, Path(), [Stage(run_id, Path(), "", run_id)], state="on the bus",
               figures={"updated": 0, "stages": []}, bus_only=True)


def find_jobs(root: Path, with_figures: bool = True) -> list[Job]:
    """Every job under ``root``, newest first (``with_figures``: see :func:`load_job`; without,
    in no particular order)."""
    out = []
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name != "nats" and SAFE.fullmatch(p.name):
                for n in p.iterdir():
                    if n.is_dir() and SAFE.fullmatch(n.name) and (job := load_job(root, p.name, n.name, with_figures)):
                        out.append(job)
    return sorted(out, key=lambda j: -j.figures.get("updated", 0)) if with_figures else out


def read_jsonl(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Records of a JSON-lines file from byte ``offset``, and the offset after the last whole
    line (a line being written is left for next time)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out, offset + end


def metrics(stage: Stage, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    return read_jsonl(stage.dir / "monitor" / "metrics.jsonl", offset)


def sync_events(stage: Stage, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    return read_jsonl(stage.dir / "monitor" / "sync_events.jsonl", offset)


def figures(job: Job, records: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The numbers a runs list shows: last train step, last rollout reward, first and last eval
    accuracy per taskset, when the job last wrote. ``records``: each stage's metric records
    when the caller has read them already (else they are read here)."""
    out: dict[str, Any] = {"updated": 0 if job.bus_only else job.dir.stat().st_mtime, "stages": []}
    for s in job.stages:
        recs = records[s.label] if records is not None else metrics(s)[0]
        f: dict[str, Any] = {"label": s.label}
        for r in recs:
            if r["kind"] == "train":
                f["train_step"] = r["step"]
            elif r["kind"] == "rollout":
                f["reward"] = r["values"].get("reward_mean")
            elif r["kind"] == "eval" and "accuracy" in r["values"]:
                acc = f.setdefault("eval", {}).setdefault(r.get("taskset") or "eval", [None, None])
                if acc[0] is None:
                    acc[0] = r["values"]["accuracy"]
                acc[1] = r["values"]["accuracy"]
            out["updated"] = max(out["updated"], r.get("ts", 0))
        out["stages"].append(f)
    return out


def kept_steps(stage: Stage) -> list[int]:
    return steps(stage.dir)


def experiences(stage: Stage, step: int) -> list[Any]:
    return read_step(stage.dir, step)
