"""The project's modules import each other without cycles, and in layers.

Layers: ``roles -> {ops, storage, bus} -> schemas``. ``schemas`` says what flows and imports
none of the others; ``bus``, ``storage`` and ``ops`` each build on ``schemas`` only (not on
each other, and never on ``roles``); ``roles`` may use them all.

Why read the source with ``ast`` rather than import it: an import cycle often works by luck
of order (a function-level import, a name bound before the module that needs it is
imported) and breaks when someone moves a line; the source shows every import, whichever
runs first. Every ``import`` and ``from ... import`` counts, at any depth of the file
(function-level, ``if TYPE_CHECKING:``). What an import starts, as Python runs it:

* ``import a.b.c`` and ``from a.b.c import name`` run ``a.b.c`` and, before it, the package
  inits ``a`` and ``a.b``; ``from a.b import c`` runs ``a.b.c`` when that is a module.
* A package init is not counted for a module inside that package: Python has started it
  before the module (importing ``a.b.c`` always runs ``a`` first), so the module never
  causes it. An explicit ``from a import name`` inside ``a`` still counts.
* A package init with a module-level ``__getattr__`` (PEP 562 lazy names, as ``bus`` has)
  may import any of its submodules on attribute access: it counts as importing all of them.

Not seen: ``importlib.import_module`` with a computed name (``bus.__getattr__``, covered by the
rule above; workflow plugins named in a config).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bus", "roles", "storage", "schemas", "ops")

#: top-level package -> the top-level packages it may import (itself included)
ALLOWED = {
    "schemas": {"schemas"},
    "bus": {"bus", "schemas"},
    "storage": {"storage", "schemas"},
    "ops": {"ops", "schemas"},
    "roles": set(PACKAGES),
}


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package init), for every .py file of ``packages``."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            out[".".join(parts)] = (f, is_pkg)
    return out


def imports_of(
    name: str, mods: dict[str, tuple[Path, bool]], packages: tuple[str, ...]
) -> list[tuple[str, int]]:
    """(project module imported, line) for every import statement in ``name``'s file."""
    path, is_pkg = mods[name]
    tree = ast.parse(path.read_text(), str(path))
    here = name if is_pkg else name.rpartition(".")[0]  # what a relative import is relative to
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"  # `from a import b` with a module a.b
                found.append((sub if sub in mods else module, node.lineno))
    return [(m, line) for m, line in found if m.split(".")[0] in packages]


def _has_lazy_names(path: Path) -> bool:
    """Whether a module defines a module-level ``__getattr__`` (PEP 562)."""
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules importing it runs (see the module doc for the rules)."""
    mods = find_modules(root, packages)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        parts = name.split(".")
        started_before = {".".join(parts[:i]) for i in range(1, len(parts) + int(is_pkg))}
        runs: set[str] = set()
        for target, line in imports_of(name, mods, packages):
            assert target in mods, f"{path}:{line}: imports {target}, which is no module here"
            tparts = target.split(".")
            inits = {".".join(tparts[:i]) for i in range(1, len(tparts))} & mods.keys()
            runs |= inits - started_before  # (a namespace package has no init to run)
            runs.add(target)
        if is_pkg and _has_lazy_names(path):
            runs |= {m for m in mods if m.rpartition(".")[0] == name}  # its direct submodules
        runs.discard(name)
        graph[name] = runs
    return graph


def cycle_through(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A shortest import chain from ``start`` back to itself, or None."""
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        m = todo.popleft()
        for nxt in sorted(graph[m]):
            if nxt == start:
                chain = [m]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [start, *reversed(chain[:-1]), start]
            if nxt not in came_from:
                came_from[nxt] = m
                todo.append(nxt)
    return None


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One chain per cycle (a module on a cycle already reported is not reported again)."""
    cycles: list[list[str]] = []
    seen: set[str] = set()
    for m in sorted(graph):
        if m in seen:
            continue
        chain = cycle_through(m, graph)
        if chain:
            cycles.append(chain)
            seen |= set(chain)
    return cycles


def test_no_import_cycle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 50  # the project's modules were found
    assert find_cycles(graph) == [], "import cycles (each a chain of modules back to itself)"


def test_layers() -> None:
    mods = find_modules(ROOT, PACKAGES)
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {name} imports {target}"
        for name, (path, _) in mods.items()
        for target, line in imports_of(name, mods, PACKAGES)
        if target.split(".")[0] not in ALLOWED[name.split(".")[0]]
    ]
    assert wrong == [], "imports across the layers roles -> {ops, storage, bus} -> schemas"


def test_the_check_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: a cycle through a function-level relative import is found, a
    submodule of an eager package init is not mistaken for one, and a lazy package
    ``__getattr__`` counts as importing its submodules."""

    def write(rel: str, text: str) -> None:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    write("p/__init__.py", "from p.a import f\n")  # an eager init: runs p.a
    write("p/a.py", "from p import b\n\ndef f():\n    from .c import g\n")
    write("p/b.py", "import q.x\n")  # runs q (a lazy init) first
    write("p/c.py", "from . import a\n")  # p.a -> p.c -> p.a, one way only in a function
    write("q/__init__.py", "def __getattr__(name):\n    import importlib\n")
    write("q/x.py", "X = 1\n")
    write("q/y.py", "from r.z import Z\n")
    write("r/z.py", "import q\n")  # q -> q.y (lazily) -> r.z -> q
    graph = import_graph(tmp_path, ("p", "q", "r"))
    assert graph["p"] == {"p.a"} and graph["p.a"] == {"p.b", "p.c"}  # no p.a -> p
    assert graph["p.b"] == {"q", "q.x"} and graph["p.c"] == {"p.a"}
    assert graph["q"] == {"q.x", "q.y"} and graph["q.y"] == {"r.z"}  # r: no init
    assert graph["r.z"] == {"q"}
    assert find_cycles(graph) == [["p.a", "p.c", "p.a"], ["q", "q.y", "r.z", "q"]]


def test_nothing_of_ours_imports_the_trinity_plugin_api() -> None:
    """``trinity`` (Trinity-RFT's plugin API, ``roles/compat/trinity``) sits above everything:
    it imports ``roles``, ``ops`` and ``schemas``; none of them may import it back."""
    compat = ROOT / "roles" / "compat"
    mods = find_modules(ROOT, PACKAGES)
    wrong = []
    for path, _ in mods.values():
        if path.is_relative_to(compat):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "trinity"]
    assert wrong == []
    assert (compat / "trinity" / "__init__.py").is_file()


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_package_is_in_the_layers(pkg: str) -> None:
    assert (ROOT / pkg / "__init__.py").is_file() and pkg in ALLOWED


def _imports_own_module(node: ast.AST) -> bool:
    for n in ast.walk(node):
        names = [n.module or ""] if isinstance(n, ast.ImportFrom) and not n.level else \
            [a.name for a in n.names] if isinstance(n, ast.Import) else []
        if any(name.split(".")[0] in PACKAGES for name in names) or (isinstance(n, ast.ImportFrom) and n.level):
            return True
    return False


def test_no_import_error_of_trinitys_own_modules_is_swallowed():
    """An ``except ImportError`` around an import of trinity's own modules must raise: a broken
    module is a bug to see at once. The explorer once caught one around its sync client and
    explored on without weight sync, on weights that never changed. (An optional third-party
    package, ``deepspeed`` or ``wandb``, may still be tried and fall back.)"""
    swallowed = []
    for path, _ in find_modules(ROOT, PACKAGES).values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Try) or not _imports_own_module(ast.Module(node.body, [])):
                continue
            for h in node.handlers:
                caught = {n.id for n in ast.walk(h.type) if isinstance(n, ast.Name)} if h.type else {"*"}
                if caught & {"ImportError", "ModuleNotFoundError", "Exception", "*"} and \
                        not any(isinstance(n, ast.Raise) for n in ast.walk(h)):
                    swallowed.append(f"{path.relative_to(ROOT)}:{h.lineno}")
    assert not swallowed, f"ImportError of trinity's own modules swallowed at {swallowed}"


#: ``roles``' floors, top (1) to bottom (6): a module imports only its own floor and those
#: below (``roles/__init__.py`` says what each holds). The four roles share floor 4 and never
#: import one another: they talk over the bus. ``compat`` (the ``trinity`` plugin API) is above
#: them all.
FLOORS = {
    "compat": 0,
    "cli": 1,
    "tools": 2,
    "launch": 3,
    "explorer": 4, "buffer": 4, "trainer": 4, "synchronizer": 4,
    "weightsync": 5,
    "runtime": 6,
}


def _room(module: str) -> str | None:
    """The folder (or ``cli``) of ``roles`` a module sits in; None outside ``roles``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "roles" and len(parts) > 1 else None


def test_every_module_of_roles_is_on_a_floor() -> None:
    rooms = {_room(m) for m in find_modules(ROOT, PACKAGES)} - {None}
    assert rooms <= FLOORS.keys(), f"modules of roles outside every floor: {sorted(rooms - FLOORS.keys())}"


def test_roles_floors_import_only_downwards() -> None:
    mods = find_modules(ROOT, PACKAGES)
    wrong = []
    for name, (path, _) in mods.items():
        room = _room(name)
        if room is None:
            continue
        for target, line in imports_of(name, mods, PACKAGES):
            there = _room(target)
            if there is None or there == room:
                continue
            if FLOORS[there] < FLOORS[room] or (FLOORS[there] == FLOORS[room] == 4):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} ({room}) imports {target} ({there})")
    assert wrong == [], "imports up the floors of roles, or from one role into another"
    assert max(FLOORS.values()) <= 6
