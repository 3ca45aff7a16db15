"""Where rows come from: a dataset's files on disk, read into plain rows.

Two steps, each usable alone:

* :func:`resolve_data_files` turns ``(path, subset_name, split)`` into the list of files the seeds'
  ``datasets.load_dataset(path, name=subset_name, split=split)`` would read, without the
  ``datasets`` package (no hub, no cache dir): a downloaded ``gsm8k`` folder with
  ``main/train-00000-of-00001.parquet`` works as ``path=gsm8k, subset_name=main, split=train``.
* :func:`load_rows` reads those files (jsonl, json, parquet, arrow) into a :class:`RowSet`,
  checking that every row is a JSON object carrying the keys the config needs, each of the
  right kind (a prompt is a string). A bad row fails naming the file, the line and the key,
  or (with ``skip_invalid_rows``) is dropped and counted. :func:`check_rows` is the same pass
  before any process starts, streamed, keeping no row.

Why a module of its own: this part knows file layouts and file formats and nothing else; what a
row becomes (a task, chat messages), in which order and from which cursor is
:mod:`storage.tasksets`, which builds on this module. Nothing here imports from there;
:class:`TasksetError` lives here so that both raise the same error.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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


def iter_file_records(file: str | Path) -> Iterator[tuple[str, dict[str, Any] | None, str | None]]:
    """Yield ``(where, row, problem)`` for each row of one file, in file order: ``row`` a dict
    and ``problem`` None, or ``row`` None and ``problem`` what is wrong with that one row (not
    UTF-8, not JSON, not an object). ``where`` is ``"line N"`` (JSON lines, 1-based) or
    ``"row N"`` (0-based), for messages. A file that cannot be read at all raises
    :class:`TasksetError`.

    JSON lines are read one line at a time, never the whole file: a taskset can be larger than
    memory would like, and the pre-start check (:func:`check_rows`) reads every row of it. A
    ``.json`` file may be a list of records, a dict of equal-length columns (both parsed whole:
    there is no other way), or JSON lines (the hub stores some jsonl as ``.json``). Why rows are yielded with their problem rather than raised:
    ``skip_invalid_rows`` skips a line that is not JSON like a row without the prompt key."""
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
            yield f"row {i}", row, None
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
                    yield f"row {i}", row, None
        except pa.ArrowInvalid as e:
            raise TasksetError(f"{file}: not a readable arrow file: {e}") from e
        return
    if suffix not in (".jsonl", ".json"):
        raise TasksetError(
            f"{file}: unsupported file type {suffix!r}; expected one of {DATA_SUFFIXES}"
        )
    if suffix == ".json":  # one document, parsed whole; else JSON lines, streamed below
        try:
            doc = orjson.loads(file.read_bytes())
        except orjson.JSONDecodeError:
            doc = None  # maybe JSON lines under a .json name: read as lines
        if doc is not None:
            for where, row in _json_document_rows(file, doc):
                yield where, row, None
            return
    with open(file, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line.rstrip(b"\r\n"))
            except orjson.JSONDecodeError as e:
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as u:
                    yield f"line {lineno}", None, f"not UTF-8 text (byte {line[u.start]:#04x} at column {u.start + 1})"
                else:
                    yield f"line {lineno}", None, f"not JSON (column {e.pos + 1}: {e.msg})"
                continue
            if not isinstance(row, dict):
                yield f"line {lineno}", None, f"expected a JSON object, got {type(row).__name__}"
                continue
            yield f"line {lineno}", row, None


def iter_file_rows(file: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, row)`` for each row of one file (:func:`iter_file_records`); the first
    row that is not a JSON object raises :class:`TasksetError` naming the file and line."""
    for where, row, problem in iter_file_records(file):
        if row is None:
            raise TasksetError(f"{file}: {where}: {problem}")
        yield where, row


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


#: What a required key's value must be: anything but null (``any``), a string (``text``: a
#: prompt; a list or dict would reach the model as its Python text), chat messages
#: (``messages``: a list of objects with a string ``role``; ``messages_or_json``: or a JSON
#: string of one, as SFT/DPO files store them), or a finite number (``number``: a selector's
#: feature column).
ValueKind = Literal["any", "text", "messages", "messages_or_json", "number"]


@dataclass(frozen=True)
class RequiredKey:
    """A row key the config needs, the config field that named it (``format.prompt_key``,
    ``task_selector.feature_keys``: for messages), and what its value must be."""

    key: str
    field: str
    kind: ValueKind = "any"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _messages_problem(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"expected a list of chat messages, got {type(value).__name__} {_short(value)}"
    for j, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"message {j} is not an object with a string 'role': {_short(m)}"
    return None


def value_problem(value: Any, kind: ValueKind) -> str | None:
    """What is wrong with a present (non-null) value of a required key of ``kind``; None: fine."""
    if kind == "text" and not isinstance(value, str):
        return f"expected a string, got {type(value).__name__} {_short(value)}"
    if kind == "messages":
        return _messages_problem(value)
    if kind == "messages_or_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return f"expected a list of chat messages or a JSON string of one, got {_short(value)}"
        return _messages_problem(value)
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))
                             or not math.isfinite(value)):
        return f"expected a finite number, got {_short(value)}"
    return None


def row_problem(row: dict[str, Any], required: Sequence[RequiredKey]) -> str | None:
    """The first way ``row`` fails ``required`` (a key absent or null, or a value of the wrong
    kind), as ``"missing key 'k' (format.prompt_key)"``; None: the row is usable."""
    for r in required:
        value = row.get(r.key)
        if value is None:
            return f"missing key {r.key!r} ({r.field}); the row has {sorted(row)[:10]}"
        problem = value_problem(value, r.kind)
        if problem is not None:
            return f"key {r.key!r} ({r.field}): {problem}"
    return None


@dataclass
class RowSet:
    """The valid rows of a dataset, in file order, and what was dropped on the way.

    ``count`` is the number of valid rows (``rows`` stays empty when they were only counted:
    :func:`check_rows`); ``skipped_examples`` are the first skipped rows' messages, each
    naming its file and line."""

    rows: list[dict[str, Any]]
    files: list[Path]
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    count: int = 0

    def __len__(self) -> int:
        return len(self.rows)


Required = Sequence[RequiredKey] | Callable[[dict[str, Any]], Sequence[RequiredKey]]


def load_rows(
    files: Sequence[str | Path],
    required: Required = (),
    *,
    skip_invalid_rows: bool = False,
    keep: bool = True,
) -> RowSet:
    """Read every row of ``files``, one at a time; a bad row (not UTF-8, not JSON, not an
    object, a required key absent or null or of the wrong kind) fails with
    ``"<file>: <line>: <what>"``, or with ``skip_invalid_rows`` is skipped and counted.

    ``required`` may be a callable deciding per dataset from its first row (see
    :func:`storage.tasksets.task_required_keys`, where the prompt column depends on which
    columns exist). ``keep=False`` only counts the valid rows (:func:`check_rows`)."""
    rows: list[dict[str, Any]] = []
    count = skipped = 0
    examples: list[str] = []
    req: Sequence[RequiredKey] | None = None if callable(required) else required
    for file in files:
        for where, row, problem in iter_file_records(file):
            if row is not None:
                if req is None:
                    req = required(row)  # type: ignore[operator]
                problem = row_problem(row, req)
            if problem is not None:
                msg = f"{file}: {where}: {problem}"
                if not skip_invalid_rows:
                    raise TasksetError(msg + "; set skip_invalid_rows: true to skip such rows")
                skipped += 1
                if len(examples) < 10:
                    examples.append(msg)
                continue
            count += 1
            if keep:
                rows.append(row)  # type: ignore[arg-type]
    return RowSet(rows=rows, files=[Path(f) for f in files], skipped=skipped,
                  skipped_examples=examples, count=count)


def check_rows(
    files: Sequence[str | Path],
    required: Required = (),
    *,
    skip_invalid_rows: bool = False,
) -> RowSet:
    """Before any process starts, read every row of ``files`` as :func:`load_rows` will, in
    one streamed pass that keeps no row: raise :class:`TasksetError` at the first bad row
    (naming its file, line and key), or with ``skip_invalid_rows`` when no valid row is left.
    Returns the counts (valid, skipped). Why every row and not the first: a bad row further in
    otherwise fails the explorer mid-run, three times, and the run with it."""
    found = load_rows(files, required, skip_invalid_rows=skip_invalid_rows, keep=False)
    if found.count == 0:
        shown = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        if found.skipped:
            raise TasksetError(f"{shown}: no valid rows: all {found.skipped} skipped "
                               f"(skip_invalid_rows); the first: {found.skipped_examples[0]}")
        raise TasksetError(f"{shown}: no rows (the dataset is empty)")
    return found


def write_jsonl(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` to ``path`` as JSON lines (what :func:`load_rows` reads back), making
    its folder; the example ``prepare.py`` scripts and the tiny tasksets write their data so."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path
