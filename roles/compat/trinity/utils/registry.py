"""Trinity-RFT's ``Registry`` over one of this project's name maps.

``register_module`` stores the user's class under its name here *and* installs an adapter of
it where our roles look names up (the workflow map, ``ops.registry``), so a config names it
exactly as a built-in. One map per kind stays the only truth: ``get`` answers from it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any


def where(obj: Any) -> str:
    """``Class in /path/file.py``: how an error names a user's class."""
    try:
        return f"{obj.__qualname__} in {inspect.getfile(obj)}"
    except (TypeError, AttributeError, OSError):  # a class typed at a prompt has no file
        return getattr(obj, "__qualname__", repr(obj))


class Registry:
    """Names -> the user's classes, as Trinity-RFT's registry (``register_module``, ``get``,
    ``modules``, ``name``); ``install(name, cls, force)`` puts the class's adapter into our map,
    ``ours()`` is that map (the built-in names live there), ``check(cls)`` says what is wrong
    with a class offered, ``view(name, part)`` shows a built-in part as upstream's code uses one."""

    def __init__(self, name: str, install: Callable[[str, type, bool], None],
                 ours: Callable[[], Mapping[str, Any]], check: Callable[[type], str | None] | None = None,
                 view: Callable[[str, Any], Any] | None = None) -> None:
        self._name = name
        self._install = install
        self._ours = ours
        self._check = check or (lambda cls: None)
        self._view = view or (lambda name, part: part)  # a built-in part as upstream's code expects it
        self._modules: dict[str, type] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def modules(self) -> dict[str, type]:
        """The classes registered through this registry (the built-ins are our own classes)."""
        return {k: v for k, v in self._modules.items() if k in self._ours()}

    def get(self, module_key: str | None) -> Any:
        """The class registered as ``module_key``; a built-in name gives our own part; a dotted
        path ``pkg.module.Class`` is imported and registered under that path."""
        if module_key is None:
            return None
        if module_key in self.modules:
            return self._modules[module_key]
        if module_key in self._ours():
            return self._view(module_key, self._ours()[module_key])
        if "." in module_key:
            path, _, attr = module_key.rpartition(".")
            try:
                cls = getattr(importlib.import_module(path), attr)
            except (ImportError, AttributeError) as e:
                raise ImportError(f"{self._name}: cannot import {attr} from {path}: {e}") from e
            self._register(module_key, cls, False)
            return cls
        raise ValueError(f"{self._name}: no module {module_key!r}; known: {', '.join(sorted(self._ours()))}")

    def register_module(self, module_name: str | None = None, module_cls: type | None = None,
                        force: bool = False, lazy: bool = False) -> Any:
        """Register ``module_cls`` as ``module_name`` (its class name when None); without a
        class, a decorator. A name already taken (a built-in too) is refused unless ``force``."""
        if not (module_name is None or isinstance(module_name, str)):
            raise TypeError(f"{self._name}: module_name must be None or a str, got {type(module_name).__name__}")
        if module_cls is not None:
            self._register(module_name, module_cls, force)
            return module_cls

        def deco(cls: type) -> type:
            self._register(module_name, cls, force)
            return cls

        return deco

    def _register(self, module_name: str | None, cls: type, force: bool) -> None:
        name = module_name or cls.__name__
        wrong = self._check(cls)
        if wrong:
            raise TypeError(f"{self._name} {name!r}: {where(cls)}: {wrong}")
        taken = self.modules.get(name) or self._ours().get(name)  # ours is the truth: a name removed there is free
        if taken is not None and taken is not cls and not force:
            raise KeyError(f"{self._name} {name!r} is already registered ({where(taken)}); {where(cls)} "
                           "registers it again: rename it, or pass force=True to replace it")
        self._install(name, cls, force)
        self._modules[name] = cls
        cls._name = name
