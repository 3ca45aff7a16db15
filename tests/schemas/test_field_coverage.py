"""Nothing accepted is silently ignored: every field of the settings model is either read by
the code or listed in ``schemas.config.UNUSED_FIELDS`` (and then warned about when set).

"Read" is judged from the source: the field's name appears as an attribute or a string in the
code that acts on the config (``roles/``, ``storage/``, ``bus/``, ``ops/``, and
``schemas/derive.py``, which moves values between fields), never in the model's own
definition (``schemas/config.py``) or the loader, which mention every field. A name shared
with another object passes by it; the test guards against a new field that nothing reads.
"""

from __future__ import annotations

import ast
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from schemas.config import UNUSED_FIELDS, TrinityConfig
from schemas.derive import unused_settings

ROOT = Path(__file__).resolve().parents[2]
READERS = [*(ROOT / d for d in ("roles", "storage", "bus", "ops")), ROOT / "schemas" / "derive.py"]


def _models(annotation: object) -> list[tuple[str, type[BaseModel]]]:
    """The settings models inside a field's type, with the path suffix each one takes:
    ``""`` (the model itself, or Optional), ``"[]"`` (list items), ``"{}"`` (dict values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple):
        return [("[]" + s, m) for a in args for s, m in _models(a)]
    if origin is dict:
        return [("{}" + s, m) for s, m in _models(args[-1])]
    if origin in (typing.Union, types.UnionType):
        return [x for a in args for x in _models(a)]
    return []


#: Names of unused fields that other objects also use (a field of another section, a dict
#: key the code reads from elsewhere): the scan cannot tell them apart.
COMMON_NAMES = {"name", "storage_type", "capacity", "max_read_timeout", "replay_buffer", "chosen_key",
                "rejected_key", "tools_key", "enable_concatenated_multi_turn", "chat_template",
                "enable_thinking", "workflow_key", "reward_fn_key", "logprobs", "enable_progress_bar",
                "save_input"}


def field_paths(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted path, field name)`` of every leaf field reachable from ``model``."""
    out = []
    for name, f in model.model_fields.items():
        path = f"{prefix}{name}"
        subs = _models(f.annotation)
        if not subs or name == "stages":  # stages are merged into whole configs by the loader
            out.append((path, name))
            continue
        for suffix, sub in subs:
            out += field_paths(sub, f"{path}{suffix}.")
    return out


def names_in_code() -> set[str]:
    names: set[str] = set()
    for base in READERS:
        for f in [base] if base.is_file() else base.rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    names.add(node.value)
                elif isinstance(node, ast.keyword) and node.arg:
                    names.add(node.arg)
    return names


def _declared_unused(path: str) -> bool:
    """The field, or a section it belongs to, is in UNUSED_FIELDS."""
    parts = path.split(".")
    return any(".".join(parts[:i]) in UNUSED_FIELDS for i in range(1, len(parts) + 1))


def test_every_field_is_read_or_declared_unused():
    read = names_in_code()
    paths = field_paths(TrinityConfig)
    assert len(paths) > 300, "the walk missed the nested sections"
    silent = [p for p, name in paths if name not in read and not _declared_unused(p)]
    assert not silent, f"fields neither read by the code nor in UNUSED_FIELDS: {silent}"


def test_unused_fields_exist_and_are_not_read():
    """Each UNUSED_FIELDS entry names a real field, and one the code does not read under a
    name of its own (then it belongs out of the list)."""
    paths = [p for p, _ in field_paths(TrinityConfig)]
    unknown = [u for u in UNUSED_FIELDS if not any(p == u or p.startswith(u + ".") for p in paths)]
    assert not unknown, unknown
    read = names_in_code()
    leaves = {u.rsplit(".", 1)[-1].rstrip("[]{}") for u in UNUSED_FIELDS}
    assert not (leaves & read) - COMMON_NAMES, sorted((leaves & read) - COMMON_NAMES)


def test_setting_an_unused_field_warns_naming_it():
    cfg = TrinityConfig.model_validate({
        "model": {"trust_remote_code": True},
        "trainer": {"save_strategy": "single_node"},
        "buffer": {"explorer_input": {"eval_tasksets": [
            {"name": "t", "path": "/x", "format": {"chosen_key": "c", "image_key": "img"}}]},
            "trainer_input": {"auxiliary_buffers": {"sft": {"path": "/x", "capacity": 5}}}},
    })
    warned = dict(unused_settings(cfg))
    assert set(warned) == {
        "model.trust_remote_code", "trainer.save_strategy",
        "buffer.explorer_input.eval_tasksets[0].format.chosen_key",
        "buffer.explorer_input.eval_tasksets[0].format.image_key",
        "buffer.trainer_input.auxiliary_buffers.sft.capacity",
    }, warned
    assert unused_settings(TrinityConfig()) == []  # defaults ask for nothing
