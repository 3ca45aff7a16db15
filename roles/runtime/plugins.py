"""User code the configuration names: plugin folders, loaded before the config is resolved.

``TRINITY_PLUGIN_DIRS`` (folders separated by ``:``): every ``*.py`` in them is imported once
per process, by every entry point that loads a configuration (``roles/runtime/config.py``), before
the algorithm is resolved and the names are checked. So a file there may register anything a
configuration names by string, and ``trinity config`` accepts it exactly where the roles use it:

* a workflow: ``@register_workflow("name")`` (``roles.explorer.workflows``);
* an algorithm part: ``@ops.registry.register("policy_loss_fn" | "advantage_fn" | "kl_fn" |
  "entropy_loss_fn" | "reward_fn" | "sample_strategy", "name")``;
* an experience operator: ``roles.buffer.pipeline.OPERATORS["name"] = fn``.

A part can also be named as ``package.module:function`` without a plugin folder
(``ops.registry.get`` imports it); a workflow as ``package.module:Class``. Such a path
resolves against the working directory too (``importable_working_dir``), as Trinity-RFT's
example configs expect (``examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow``,
run from its repository's root).

Why in every process: the buffer computes advantages and samples batches, the trainer computes
losses, the explorer runs workflows and rewards; each must find the same names the config
check found. A plugin that fails to import is a configuration error naming the file.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from pathlib import Path

#: Folders of plugin files, separated by ``os.pathsep``.
PLUGIN_DIRS_ENV = "TRINITY_PLUGIN_DIRS"


class PluginError(ValueError):
    """A plugin folder that does not exist, or a plugin file that raised on import."""


def importable_working_dir() -> None:
    """Put the working directory on ``sys.path`` (last: it shadows nothing installed). Why: the
    role processes run as ``python -m roles.cli``, which puts it first by itself, while the
    ``trinity`` console script does not; without this, ``trinity config`` refused a dotted path
    into the user's own folders that the roles then import."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def load_plugin_dirs(dirs: str | list[str] | None = None) -> list[str]:
    """Import every ``*.py`` in the plugin folders (default: ``$TRINITY_PLUGIN_DIRS``), each
    file once per process; returns the files imported now."""
    if dirs is None:
        dirs = os.environ.get(PLUGIN_DIRS_ENV, "")
    if isinstance(dirs, str):
        dirs = [d for d in dirs.split(os.pathsep) if d]
    loaded = []
    for d in dirs:
        folder = Path(d)
        if not folder.is_dir():
            raise PluginError(f"{PLUGIN_DIRS_ENV}: {d} is not a folder")
        for f in sorted(folder.glob("*.py")):
            name = f"trinity_plugin_{folder.resolve().name}_{f.stem}"
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, f)
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[name] = mod
            try:
                spec.loader.exec_module(mod)  # type: ignore[union-attr]
            except Exception as e:
                del sys.modules[name]
                where = traceback.extract_tb(e.__traceback__)[-1]
                raise PluginError(f"{PLUGIN_DIRS_ENV}: {f}: {type(e).__name__}: {e} "
                                  f"({where.filename}:{where.lineno})") from e
            loaded.append(str(f))
    return loaded
