"""Where rows come from: a dataset's files on disk, read into plain rows.

Two steps, each usable alone:

* :func:`resolve_data_files` turns ``(path, subset_name, split)`` into the list of files the seeds'
  ``datasets.load_dataset(path, name=subset_name, split=split)`` would read, without the
  ``datasets`` package (no hub, no cache dir): a downloaded ``gsm8k`` folder with
  ``main/train-00000-of-00001.parquet`` works as ``path=gsm8k, subset_name=main, split=train``.
* :func:`load_rows` reads those files (jsonl, json, parquet, arrow) into a :class:`RowSet`,
  checking that every row carries the keys the format needs. A bad row fails naming the file,
  the row and the key, or (with ``skip_invalid_rows``) is dropped and counted.

Why a module of its own: this part knows file layouts and file formats and nothing else; what a
row becomes (a task, chat messages), in which order and from which cursor is
:mod:`storage.tasksets`, which builds on this module. Nothing here imports from there;
:class:`TasksetError` lives here so that both raise the same error.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

#: File suffixes read as data, in the order tried when a folder holds several kinds.
DATA_SUFFIXES: tuple[str, ...] = (".parquet", ".jsonl", ".json", ".arrow")


class TasksetError(ValueError):
    """A taskset/dataset cannot be read as configured; the message names the file, row, key."""


# --------------------------------------------------------------------------------------------
# locating files
# --------------------------------------------------------------------------------------------


def _data_files_in(folder: Path, stem_glob: str = "*") -> list[Path]:
    """Data files directly in ``folder`` whose name matches ``stem_glob`` + a data suffix.

    Only one kind of file is returned (the first suffix of :data:`DATA_SUFFIXES` present), so
    a folder holding both ``train.jsonl`` and a parquet export of it is not read twice."""
    if not folder.is_dir():
        return []
    for suffix in DATA_SUFFIXES:
        found = sorted(p for p in folder.glob(stem_glob + suffix) if p.is_file())
        if found:
            return found
    return []


def _readme_data_files(root: Path, subset_name: str | None, split: str) -> list[Path] | None:
    """Files named by the ``configs:`` block of a hub dataset's README front matter.

    Hub datasets (gsm8k among them) declare ``config_name`` -> ``data_files`` -> ``split`` ->
    ``path`` globs there; honouring it reads exactly what ``load_dataset`` reads. Returns None
    when the README has no usable block (then the folder patterns apply)."""
    readme = root / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"\A---\s*\n(.*?)\n---\s*\n", text, re.S)
    if not m:
        return None
    try:
        import yaml

        meta = yaml.safe_load(m.group(1)) or {}
    except Exception:  # noqa: BLE001 - a malformed README must not stop the folder patterns
        return None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    if not isinstance(configs, list):
        return None
    chosen = None
    for c in configs:
        if not isinstance(c, dict):
            continue
        name = c.get("config_name", "default")
        if name == (subset_name or "default") or (subset_name is None and c.get("default")):
            chosen = c
            break
    if chosen is None:
        return None
    data_files = chosen.get("data_files")
    patterns: list[str] = []
    if isinstance(data_files, str):
        patterns = [data_files] if split == "train" else []
    elif isinstance(data_files, list):
        for entry in data_files:
            if isinstance(entry, dict) and entry.get("split") == split:
                p = entry.get("path")
                patterns += [p] if isinstance(p, str) else list(p or [])
    elif isinstance(data_files, dict):
        p = data_files.get(split)
        patterns = [p] if isinstance(p, str) else list(p or [])
    files: list[Path] = []
    for pattern in patterns:
        files += sorted(p for p in root.glob(pattern) if p.is_file() and p.suffix in DATA_SUFFIXES)
    return files or None


def resolve_data_files(
    path: str | Path, subset_name: str | None = None, split: str = "train"
) -> list[Path]:
    """The data files of ``split`` (and ``subset_name``) under ``path``, in shard order.

    ``path`` may be a single file (then subset and split are ignored) or a folder. For a folder
    the first of these that matches wins (``{s}`` = subset, ``{x}`` = split):

    1. the ``configs:`` block of ``README.md`` (hub datasets);
    2. ``{s}/{x}-*.*``, ``{s}/{x}/*.*``, ``{s}/{x}.*`` (``gsm8k/main/train-*.parquet``);
    3. ``data/{x}-*.*``, ``{x}-*.*``, ``{x}/*.*``, ``{x}.*`` (no subset, or files at the top);
    4. for ``split == "train"`` only: every data file directly in the folder (the
       ``load_dataset`` rule for files whose names carry no split).
    """
    root = Path(path).expanduser()
    if root.is_file():
        if root.suffix not in DATA_SUFFIXES:
            raise TasksetError(
                f"{root}: unsupported file type {root.suffix!r}; expected one of {DATA_SUFFIXES}"
            )
        return [root]
    if not root.exists():
        raise TasksetError(f"{root}: no such file or directory")
    from_readme = _readme_data_files(root, subset_name, split)
    if from_readme:
        return from_readme
    tried: list[str] = []
    bases = [root / subset_name] if subset_name else []
    bases.append(root)
    for base in bases:
        candidates = [(base, f"{split}-*"), (base / split, "*"), (base, split)]
        if base == root:
            candidates.insert(0, (root / "data", f"{split}-*"))
        for folder, stem in candidates:
            tried.append(str(folder / (stem + ".{parquet,jsonl,json,arrow}")))
            found = _data_files_in(folder, stem)
            if found:
                return found
    if split == "train" and not subset_name:
        found = _data_files_in(root)
        if found:
            return found
    raise TasksetError(
        f"{root}: no data files for subset_name={subset_name!r} split={split!r}; tried "
        + ", ".join(tried)
    )


# --------------------------------------------------------------------------------------------
# reading rows
# --------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Make a value from parquet/arrow plain data (the codec carries no datetime/Decimal)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value


def _needs_plain(schema: Any) -> bool:
    """True when an arrow schema holds types whose Python values are not plain data."""
    import pyarrow as pa

    def bad(t: Any) -> bool:
        if pa.types.is_temporal(t) or pa.types.is_decimal(t):
            return True
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return bad(t.value_type)
        if pa.types.is_struct(t):
            return any(bad(t.field(i).type) for i in range(t.num_fields))
        if pa.types.is_map(t):
            return bad(t.key_type) or bad(t.item_type)
        return False

    return any(bad(f.type) for f in schema)


def _iter_arrow_batches(batches: Iterator[Any], schema: Any) -> Iterator[dict[str, Any]]:
    plain = _needs_plain(schema)
    for batch in batches:
        for row in batch.to_pylist():
            yield _plain(row) if plain else row


def iter_file_rows(file: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, row)`` for each row of one file; ``where`` is ``"line N"`` (jsonl, 1-based)
    or ``"row N"`` (0-based), for error messages.

    A ``.json`` file may be a list of records, a dict of equal-length columns, or JSON lines (the
    hub stores some jsonl as ``.json``)."""
    file = Path(file)
    suffix = file.suffix
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(file)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for bad files
            raise TasksetError(f"{file}: not a readable parquet file: {e}") from e
        for i, row in enumerate(
            _iter_arrow_batches(pf.iter_batches(batch_size=4096), pf.schema_arrow)
        ):
            yield f"row {i}", row
        return
    if suffix == ".arrow":
        import pyarrow as pa

        try:
            with pa.memory_map(str(file)) as src:
                try:
                    reader = pa.ipc.open_stream(src)
                except pa.ArrowInvalid:
                    reader = pa.ipc.open_file(src)
                    batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    batches = iter(reader)
                for i, row in enumerate(_iter_arrow_batches(batches, reader.schema)):
                    yield f"row {i}", row
        except pa.ArrowInvalid as e:
            raise TasksetError(f"{file}: not a readable arrow file: {e}") from e
        return
    if suffix not in (".jsonl", ".json"):
        raise TasksetError(
            f"{file}: unsupported file type {suffix!r}; expected one of {DATA_SUFFIXES}"
        )
    data = file.read_bytes()
    if suffix == ".json":
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            doc = None  # maybe JSON lines under a .json name: fall through
        if doc is not None:
            yield from _json_document_rows(file, doc)
            return
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise TasksetError(f"{file}: line {lineno}: invalid JSON: {e}") from e
        if not isinstance(row, dict):
            raise TasksetError(
                f"{file}: line {lineno}: expected a JSON object, got {type(row).__name__}"
            )
        yield f"line {lineno}", row


def _json_document_rows(file: Path, doc: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(doc, list):
        for i, row in enumerate(doc):
            if not isinstance(row, dict):
                raise TasksetError(
                    f"{file}: row {i}: expected a JSON object, got {type(row).__name__}"
                )
            yield f"row {i}", row
        return
    if isinstance(doc, dict) and doc and all(isinstance(v, list) for v in doc.values()):
        lengths = {k: len(v) for k, v in doc.items()}
        if len(set(lengths.values())) != 1:
            raise TasksetError(f"{file}: columns have different lengths: {lengths}")
        keys = list(doc)
        for i in range(next(iter(lengths.values()))):
            yield f"row {i}", {k: doc[k][i] for k in keys}
        return
    if isinstance(doc, dict):  # one object = one row
        yield "row 0", doc
        return
    raise TasksetError(
        f"{file}: expected a list of objects or a dict of columns, got {type(doc).__name__}"
    )


@dataclass(frozen=True)
class RequiredKey:
    """A row key the format needs, and the format field that named it (for error messages)."""

    key: str
    field: str


@dataclass
class RowSet:
    """The valid rows of a dataset, in file order, and what was dropped on the way."""

    rows: list[dict[str, Any]]
    files: list[Path]
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)


def _missing(row: dict[str, Any], key: str) -> bool:
    return row.get(key) is None


def load_rows(
    files: Sequence[str | Path],
    required: Sequence[RequiredKey] | Callable[[dict[str, Any]], Sequence[RequiredKey]] = (),
    *,
    skip_invalid_rows: bool = False,
) -> RowSet:
    """Read every row of ``files``; a row lacking a required key (absent or null) fails with
    ``"<file>: <row>: missing key 'k' (format.<field>)"``, or is skipped and counted.

    ``required`` may be a callable deciding per dataset from its first row (see
    :func:`storage.tasksets.task_required_keys`, where the prompt column depends on which
    columns exist)."""
    rows: list[dict[str, Any]] = []
    skipped = 0
    examples: list[str] = []
    req: Sequence[RequiredKey] | None = None if callable(required) else required
    for file in files:
        for where, row in iter_file_rows(file):
            if req is None:
                req = required(row)  # type: ignore[operator]
            bad = next((r for r in req if _missing(row, r.key)), None)
            if bad is not None:
                msg = f"{file}: {where}: missing key {bad.key!r} (format.{bad.field})"
                if not skip_invalid_rows:
                    raise TasksetError(msg + "; set skip_invalid_rows: true to skip such rows")
                skipped += 1
                if len(examples) < 10:
                    examples.append(msg)
                continue
            rows.append(row)
    return RowSet(
        rows=rows, files=[Path(f) for f in files], skipped=skipped, skipped_examples=examples
    )


def check_first_row(
    files: Sequence[str | Path],
    required: Sequence[RequiredKey] | Callable[[dict[str, Any]], Sequence[RequiredKey]] = (),
    *,
    skip_invalid_rows: bool = False,
) -> None:
    """Fail fast, before any process starts, the way :func:`load_rows` would fail later: raise
    :class:`TasksetError` when ``files`` hold no row at all, or when the first row lacks a
    required key (not checked with ``skip_invalid_rows``, which drops such rows). Reads one
    row, not the dataset."""
    for file in files:
        for where, row in iter_file_rows(file):
            if skip_invalid_rows:
                return
            req = required(row) if callable(required) else required
            bad = next((r for r in req if _missing(row, r.key)), None)
            if bad is not None:
                raise TasksetError(
                    f"{file}: {where}: missing key {bad.key!r} (format.{bad.field}); the row "
                    f"has {sorted(row)[:10]}"
                )
            return
    shown = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
    raise TasksetError(f"{shown}: no rows (the dataset is empty)")


def write_jsonl(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` to ``path`` as JSON lines (what :func:`load_rows` reads back), making
    its folder; the example ``prepare.py`` scripts and the tiny tasksets write their data so."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path
