"""Data-Juicer operators, run in-process: the ``data_juicer`` experience operator and the task
pipeline (``data_processor.task_pipeline``).

Trinity-RFT sends data to a Data-Juicer server; here the real ``py-data-juicer`` package
(``pip install -e ".[data-juicer]"``) runs in the buffer process (experiences) or before the
explorer reads its tasksets (tasks): no server to start, nothing to keep in step. A recipe is
Data-Juicer's own: a ``process:`` list of ``{op_name: args}`` (``config_path`` names such a
YAML file) or the same list inline as ``operators``. Filters compute their stats (written into
the experience's ``info`` or the row's ``__dj__stats__``, where ``reward_shaping_mapper`` or a
selector's ``feature_keys`` can use them) and drop what they reject; mappers rewrite text,
which makes sense for task rows only (an experience's tokens are what it trained on).

Without the package every use fails at config check, naming it. Data-Juicer installs some
operators' own extra packages the first time they run (its lazy loader): ops that need a
model or a word list download it; the ones used in the tests need nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

PACKAGE = "py-data-juicer"
log = logging.getLogger("trinity.juicer")


def _dj() -> Any:
    try:
        import data_juicer.ops as ops
    except ImportError as e:
        raise ValueError(f"the data_juicer operators need the {PACKAGE} package: "
                         f"pip install -e \".[data-juicer]\" ({e})") from e
    return ops


def recipe(config_path: str | None = None, operators: Sequence[Any] | None = None) -> list[dict[str, dict]]:
    """The ``process:`` list of a Data-Juicer recipe file, or ``operators`` given inline, as
    ``[{op_name: args}]`` (an op written without arguments gets ``{}``)."""
    if (config_path is None) == (operators is None):
        raise ValueError("args: set one of config_path (a Data-Juicer recipe) or operators (its process list)")
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise ValueError(f"args.config_path: no Data-Juicer recipe at {path}")
        operators = (yaml.safe_load(path.read_text()) or {}).get("process")
        if not operators:
            raise ValueError(f"args.config_path: {path} has no 'process' list of operators")
    out = []
    for i, item in enumerate(operators or []):
        if isinstance(item, str):
            item = {item: {}}
        if not isinstance(item, dict) or len(item) != 1:
            raise ValueError(f"recipe operator {i}: one {{op_name: args}} mapping per operator, got {item!r}")
        (name, args), = item.items()
        out.append({name: dict(args or {})})
    return out


@functools.lru_cache(maxsize=16)
def _load(key: str) -> list[tuple[str, Any]]:
    ops = _dj()
    process = json.loads(key)
    known = ops.OPERATORS.modules
    for i, item in enumerate(process):
        (name,) = item
        if name not in known:
            raise ValueError(f"recipe operator {i}: {name!r} is not a Data-Juicer operator")
    return [(next(iter(item)), op) for item, op in zip(process, ops.load_ops(process), strict=True)]


def load(process: list[dict[str, dict]], *, rows_only: bool = False) -> list[tuple[str, Any]]:
    """Build the operators once per recipe (a process keeps them). ``rows_only`` refuses
    mappers and other ops that rewrite text (experiences)."""
    ops = _dj()
    built = _load(json.dumps(process, sort_keys=True))
    for i, (name, op) in enumerate(built):
        if rows_only and not isinstance(op, ops.Filter):
            raise ValueError(f"recipe operator {i}: {name} is a {type(op).__bases__[0].__name__}; on experiences only "
                             "Data-Juicer filters run (their stats shape rewards; text rewrites belong to tasks)")
        if not isinstance(op, ops.Filter | ops.Mapper):
            raise ValueError(f"recipe operator {i}: {name}: only Data-Juicer filters and mappers run in-process")
    return built


def run(built: list[tuple[str, Any]], rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[bool]]:
    """Apply the operators in order to ``rows`` (dicts with the ops' ``text_key``). Returns
    the rows, each with its stats under ``__dj__stats__``, and per row whether every filter
    kept it. With a mapper in the recipe the rows a filter rejects are dropped at once (a
    mapper may split or merge rows), so every returned row is kept."""
    from data_juicer.utils.constant import Fields

    ops = _dj()
    rows = [dict(r) | {Fields.stats: dict(r.get(Fields.stats) or {})} for r in rows]
    kept = [True] * len(rows)
    drop = any(not isinstance(op, ops.Filter) for _, op in built)
    for _, op in built:
        if not rows:
            break
        as_batch = {k: [r.get(k) for r in rows] for k in rows[0]}
        if isinstance(op, ops.Filter):
            if op.is_batched_op():
                batch = op.compute_stats(as_batch)
                rows = [{k: batch[k][i] for k in batch} for i in range(len(rows))]
                verdict = [bool(v) for v in op.process(batch)]
            else:
                rows = [op.compute_stats(r) for r in rows]
                verdict = [bool(op.process(r)) for r in rows]
            if drop:
                rows = [r for r, v in zip(rows, verdict, strict=True) if v]
                kept = [True] * len(rows)
            else:
                kept = [k and v for k, v in zip(kept, verdict, strict=True)]
        elif op.is_batched_op():
            batch = op.process(as_batch)
            rows = [{k: batch[k][i] for k in batch} for i in range(len(next(iter(batch.values()))))]
            kept = [True] * len(rows)
        else:
            rows = [op.process(r) for r in rows]
    return rows, kept


def stats_of(row: dict[str, Any]) -> dict[str, float]:
    """The numeric stats Data-Juicer computed for a row."""
    from data_juicer.utils.constant import Fields

    return {k: float(v) for k, v in (row.get(Fields.stats) or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def run_task_pipeline(cfg: Any) -> Path | None:
    """``data_processor.task_pipeline``: run its operators over its ``inputs`` and write the
    training taskset (``<job>/task_pipeline/train.jsonl``, each kept row with its stats as
    columns). Done once per recipe and inputs (a fingerprint beside the output): the launcher
    runs it before any process starts, and an explorer started alone finds it done. None when
    the config has no task pipeline."""
    from schemas.derive import task_pipeline_dir
    from storage.datafiles import load_rows, write_jsonl

    tp = cfg.data_processor.task_pipeline
    if tp is None or not tp.inputs:
        return None
    where = "data_processor.task_pipeline"
    try:
        process = recipe(tp.config_path, None if tp.config_path else [{op.name: op.args} for op in tp.operators])
    except ValueError as e:
        raise ValueError(f"{where}: {e}".replace("args.", "")) from e
    if tp.target_fields:  # the field the operators read, unless an op names its own
        process = [{name: {"text_key": tp.target_fields[0], **args}} for item in process for name, args in item.items()]
    h = hashlib.sha256(json.dumps(process, sort_keys=True).encode())
    for i, f in enumerate(tp.inputs):
        if not Path(f).is_file():
            raise ValueError(f"{where}.inputs[{i}]: no file {f}")
        h.update(Path(f).read_bytes())
    out_dir = Path(task_pipeline_dir(cfg))
    out, stamp = out_dir / "train.jsonl", out_dir / ".fingerprint"
    if out.exists() and stamp.exists() and stamp.read_text() == h.hexdigest():
        return out
    rows = load_rows(list(tp.inputs)).rows
    try:
        done, kept = run(load(process), rows)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{where}: {e}") from e
    from data_juicer.utils.constant import Fields

    result = [{k: v for k, v in r.items() if k != Fields.stats} | stats_of(r) for r, k in zip(done, kept, strict=True) if k]
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out, result)
    stamp.write_text(h.hexdigest())
    log.info("task pipeline: %d of %d rows kept -> %s", len(result), len(rows), out)
    return out
