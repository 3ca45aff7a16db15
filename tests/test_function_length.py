"""No function in the project's packages is longer than a reader can hold: 150 lines.

Why a test: the one that grew past it (``schemas.derive.derive``, 333 lines of config rules
one after another) hid which rule read which earlier one; split into named steps, the order
and what each step fills show in the calling function. The source is read with ``ast``, so a
nested function counts inside its parent too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bus", "roles", "storage", "schemas", "ops")
LIMIT = 150

pytestmark = pytest.mark.unit


def long_functions(root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    """``path:line name (N lines)`` of every function over ``limit`` lines."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_longer_than_150_lines() -> None:
    assert not long_functions(), "split these into named steps: " + ", ".join(long_functions())


def test_the_check_sees_a_long_method(tmp_path: Path) -> None:
    (tmp_path / "ops").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "ops" / "m.py").write_text(f"class A:\n    async def f(self):\n{body}\n")
    assert long_functions(tmp_path) == [f"ops/m.py:2 f ({LIMIT + 1} lines)"]
