"""The config builder's server side: the form (made from the config schema), validation by the
loader ``trinity config`` uses, saving, and starting ``trinity run``.

The form is data, not code: :func:`form_schema` walks :class:`schemas.config.TrinityConfig`
and gives each field its dotted path, kind, default, choices and docstring, so a field added to
the schema shows up in the studio with its help text and nothing here changes. Fields whose
value is a list or a free mapping of sections (``stages``, ``eval_tasksets``, operators) are
edited as YAML text.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from schemas.config import TrinityConfig
from schemas.loader import ConfigError, load_yaml, to_yaml

#: The fields of the beginner view: what a first run changes (Trinity-RFT's studio shows a
#: similar set in its beginner mode). Everything is in the expert view.
BEGINNER = (
    "project", "name", "mode", "checkpoint_root_dir", "continue_from_checkpoint",
    "model.model_path", "model.max_model_len", "model.max_response_tokens",
    "algorithm.algorithm_type", "algorithm.repeat_times", "algorithm.optimizer.lr",
    "buffer.batch_size", "buffer.total_epochs", "buffer.total_steps",
    "buffer.explorer_input.taskset.name", "buffer.explorer_input.taskset.path",
    "buffer.explorer_input.taskset.split", "buffer.explorer_input.default_workflow_type",
    "buffer.explorer_input.default_reward_fn_type", "buffer.explorer_input.eval_tasksets",
    "explorer.eval_interval", "explorer.rollout_model.engine_type", "explorer.rollout_model.engine_num",
    "synchronizer.sync_method", "synchronizer.sync_interval", "trainer.trainer_type", "trainer.save_interval",
    "monitor.monitor_type", "stages",
)


def _section(tp: Any) -> type[BaseModel] | None:
    """The section class of a field typed ``Section`` or ``Section | None``."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 and all(a in (models[0], type(None)) for a in args) else None


def _kind(tp: Any) -> tuple[str, list[Any]]:
    """The form control of a leaf type, and its choices."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
        typing.Union, types.UnionType) else [tp]
    if len(args) == 1:
        a = args[0]
        if typing.get_origin(a) is Literal:
            return "enum", list(typing.get_args(a))
        if a is bool:
            return "bool", []
        if a is int:
            return "int", []
        if a is float:
            return "float", []
        if a is str:
            return "str", []
    if all(a in (int, float) for a in args):
        return "float", []
    return "yaml", []


def form_schema(model: type[BaseModel] = TrinityConfig, prefix: str = "") -> list[dict[str, Any]]:
    """The form: a tree of sections and fields, each with path, kind, default, choices, help."""
    out = []
    for name, f in model.model_fields.items():
        path = f"{prefix}{name}"
        sec = _section(f.annotation)
        if sec is not None:
            out.append({"path": path, "kind": "section", "help": f.description or "",
                        "fields": form_schema(sec, f"{path}.")})
            continue
        kind, choices = _kind(f.annotation)
        default = None if f.is_required() else f.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        out.append({"path": path, "kind": kind, "choices": choices, "default": _jsonable(default),
                    "help": f.description or "", "beginner": path in BEGINNER})
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json")
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v if v is None or isinstance(v, str | int | float | bool) else str(v)


def examples(root: Path) -> list[str]:
    """The example configs under ``root/examples`` (relative paths), to start a config from."""
    base = root / "examples"
    return sorted(str(p.relative_to(root)) for p in base.rglob("*.yaml") if "_build" not in p.parts) if base.is_dir() else []


def read_example(root: Path, rel: str) -> dict[str, Any]:
    """An example's YAML as the user wrote it (interpolations kept, comments dropped)."""
    if rel not in examples(root):
        raise FileNotFoundError(f"no example {rel!r}")
    return load_yaml((root / rel).read_text()) or {}


def field_of(problem: str) -> str:
    """The dotted field a loader problem names (``a.b[0].c: why`` -> ``a.b``'s form path,
    ``a.b[0].c``), or "" when it names none."""
    head = problem.split(":", 1)[0].split(" ", 1)[0]
    return head if head and all(c.isalnum() or c in "._[]-" for c in head) and ":" in problem else ""


#: Seconds a check may take before its process is killed and started again.
VALIDATE_TIMEOUT = 120.0


def _serve_checks(conn: Any) -> None:
    """The checker process: :func:`check` each config it is sent, until the studio closes the
    pipe. Its output goes nowhere: what a config's code prints is no result, and holding the
    studio's own stdout would keep whoever reads it waiting after the studio exited."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    while True:
        try:
            doc = conn.recv()
        except EOFError:  # the studio is gone
            return
        conn.send(check(doc))


class Checker:
    """:func:`check` in one child process of its own, kept warm between calls: loading a config
    imports its code (plugin folders, ``module:attr`` names), and the studio process must
    never run it (a name like ``this:nope`` ran ``import this`` there). A check that hangs is
    killed after :data:`VALIDATE_TIMEOUT` s and the next one starts a new process."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.conn: Any = None
        self.lock = asyncio.Lock()  # one check at a time over the one pipe

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the studio's state
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve_checks, args=(child,), name="studio-checker", daemon=True)
        self.proc.start()
        child.close()

    def _ask(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.conn.send(doc)
        return self.conn.recv()

    async def check(self, doc: dict[str, Any]) -> dict[str, Any]:
        async with self.lock:
            if self.proc is None or not self.proc.is_alive():
                self._start()
            try:
                return await asyncio.wait_for(asyncio.to_thread(self._ask, doc), VALIDATE_TIMEOUT)
            except (asyncio.TimeoutError, EOFError, OSError) as e:
                self.close()
                why = f"took over {VALIDATE_TIMEOUT:.0f} s" if isinstance(e, asyncio.TimeoutError) else "failed"
                return {"ok": False, "problems": [{"field": "", "message": f"checking the config {why}"}],
                        "warnings": [], "yaml": yaml.safe_dump(doc, sort_keys=False), "resolved": ""}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.proc = None


def keep_env_references(raw: Any, resolved: Any) -> Any:
    """``resolved`` with every value the user wrote as ``${oc.env:...}`` shown as written: the
    page must not show the studio's environment (API keys) to whoever can open it."""
    if isinstance(raw, str) and "${oc.env:" in raw:
        return raw
    if isinstance(raw, dict) and isinstance(resolved, dict):
        return {k: keep_env_references(raw[k], v) if k in raw else v for k, v in resolved.items()}
    if isinstance(raw, list) and isinstance(resolved, list) and len(raw) == len(resolved):
        return [keep_env_references(a, b) for a, b in zip(raw, resolved, strict=True)]
    return resolved


def check(doc: dict[str, Any]) -> dict[str, Any]:
    """Load ``doc`` (a config as YAML would give it) exactly as ``trinity config`` does:
    ``{ok, problems: [{field, message}], warnings, yaml, resolved}``."""
    from roles.launch.checks import check_inputs
    from roles.runtime.config import load

    text = yaml.safe_dump(doc, sort_keys=False)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        loaded = load(argparse.Namespace(config=f.name, overrides=[], dotenv=None), quiet=True)
        problems, missing = check_inputs(loaded.stages or [loaded.config], "config")
        if problems:
            raise ConfigError(problems)
    except ConfigError as e:
        said = [p.replace(f.name, "the form") for p in e.problems]
        return {"ok": False, "problems": [{"field": field_of(p), "message": p} for p in said],
                "warnings": [], "yaml": text, "resolved": ""}
    finally:
        os.unlink(f.name)
    warnings = list(loaded.warnings) + [f"{m} (trinity run needs it)" for m in missing]
    resolved = keep_env_references(doc, yaml.safe_load(to_yaml(loaded)))
    return {"ok": True, "problems": [], "warnings": warnings, "yaml": text,
            "resolved": yaml.safe_dump(resolved, sort_keys=False)}


def save(doc: dict[str, Any], path: str, cwd: Path) -> Path:
    """Write ``doc`` as YAML to ``path`` (relative to the studio's folder, inside it)."""
    target = (cwd / path).resolve()
    if not path.endswith((".yaml", ".yml")) or not target.is_relative_to(cwd.resolve()):
        raise ValueError(f"path: {path!r} must be a .yaml file inside {cwd}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def start_run(config: Path, log_dir: Path) -> tuple[subprocess.Popen, Path]:
    """``trinity run --config <config>`` in the background, and the file its output goes to;
    the run writes ``<job>/run.json`` with this process's pid, which is how the studio finds it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{config.stem}-{time.strftime('%Y%m%d%H%M%S')}.log"
    with open(path, "a") as log:  # the child has its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "roles.cli", "run", "--config", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return proc, path
