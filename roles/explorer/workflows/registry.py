"""Workflow names -> classes, and loading a user's workflow by module path or plugin dir.

A taskset names its workflow (``default_workflow_type``). The name is one of the built-ins
below, a ``module.path:ClassName`` / ``module.path.ClassName`` importable from ``sys.path``,
or a name registered by a module in ``TRINITY_PLUGIN_DIRS`` (colon-separated folders whose
``*.py`` files are imported at start, each may call :func:`register_workflow`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from roles.explorer.workflows.base import Workflow
from roles.explorer.workflows.math import MathBoxedWorkflow, MathWorkflow

WORKFLOWS: dict[str, type[Workflow]] = {
    "math_workflow": MathWorkflow,
    "math_boxed_workflow": MathBoxedWorkflow,
}


def register_workflow(name: str) -> Callable[[type[Workflow]], type[Workflow]]:
    """Class decorator: make a workflow available under ``name``."""

    def deco(cls: type[Workflow]) -> type[Workflow]:
        WORKFLOWS[name] = cls
        return cls

    return deco


def load_plugin_dirs(dirs: str | list[str] | None = None) -> list[str]:
    """Import every ``*.py`` in the plugin folders (default: ``$TRINITY_PLUGIN_DIRS``)."""
    if dirs is None:
        dirs = os.environ.get("TRINITY_PLUGIN_DIRS", "")
    if isinstance(dirs, str):
        dirs = [d for d in dirs.split(os.pathsep) if d]
    loaded = []
    for d in dirs:
        folder = Path(d)
        if not folder.is_dir():
            raise FileNotFoundError(f"plugin dir {d}: not a folder")
        for f in sorted(folder.glob("*.py")):
            name = f"trinity_plugin_{folder.name}_{f.stem}"
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, f)
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[name] = mod
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            loaded.append(str(f))
    return loaded


def get_workflow(name: str) -> type[Workflow]:
    """The workflow class for ``name``; a clear KeyError naming what was tried."""
    if name in WORKFLOWS:
        return WORKFLOWS[name]
    if ":" in name or "." in name:
        mod_name, _, cls_name = name.partition(":") if ":" in name else name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError) as e:
            raise KeyError(f"workflow {name!r}: cannot import {cls_name} from {mod_name}: {e}") from e
        if not (isinstance(cls, type) and issubclass(cls, Workflow)):
            raise KeyError(f"workflow {name!r}: {cls!r} is not a Workflow subclass")
        WORKFLOWS[name] = cls
        return cls
    raise KeyError(f"unknown workflow {name!r}; known: {sorted(WORKFLOWS)} (or module.path:Class)")
