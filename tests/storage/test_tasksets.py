"""Tasksets and data files: layouts, format keys, bad rows, order, epochs, a resumable cursor."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.config import ExperienceBufferConfig, FormatConfig, TaskSelectorConfig, TasksetConfig
from storage.datafiles import TasksetError, load_rows, resolve_data_files
from storage.tasksets import (
    DatasetReader,
    TaskReader,
    dataset_reader_from_config,
    epoch_order,
    format_row,
    task_required_keys,
)

ROWS = [
    {"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(23)
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def gsm8k_dir(tmp_path: Path) -> Path:
    """A folder shaped like a downloaded openai/gsm8k: <subset>/<split>-NNNNN-of-NNNNN.parquet,
    two shards for train, plus another subset that must not be read."""
    root = tmp_path / "gsm8k"
    _write_parquet(root / "main" / "train-00000-of-00002.parquet", ROWS[:10])
    _write_parquet(root / "main" / "train-00001-of-00002.parquet", ROWS[10:])
    _write_parquet(root / "main" / "test-00000-of-00001.parquet", ROWS[:3])
    _write_parquet(root / "socratic" / "train-00000-of-00001.parquet", ROWS[:1])
    return root


def _cfg(path: Path, **kw) -> TasksetConfig:
    base = dict(
        name="gsm8k",
        path=str(path),
        format=FormatConfig(prompt_key="question", response_key="answer"),
        default_workflow_type="math_workflow",
    )
    base.update(kw)
    return TasksetConfig(**base)


def test_resolve_hf_layout(gsm8k_dir: Path) -> None:
    files = resolve_data_files(gsm8k_dir, "main", "train")
    assert [f.name for f in files] == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    assert [f.name for f in resolve_data_files(gsm8k_dir, "main", "test")] == [
        "test-00000-of-00001.parquet"
    ]
    with pytest.raises(TasksetError, match="split='validation'"):
        resolve_data_files(gsm8k_dir, "main", "validation")


def test_resolve_other_layouts(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "a" / "data" / "train-00000.jsonl", ROWS)
    assert resolve_data_files(tmp_path / "a", None, "train")[0].name == "train-00000.jsonl"
    _write_jsonl(tmp_path / "b" / "test.jsonl", ROWS)
    _write_jsonl(tmp_path / "b" / "train.jsonl", ROWS)
    assert resolve_data_files(tmp_path / "b", None, "test")[0].name == "test.jsonl"
    _write_jsonl(tmp_path / "c" / "sub" / "train" / "x.jsonl", ROWS)
    assert resolve_data_files(tmp_path / "c", "sub", "train")[0].name == "x.jsonl"
    _write_jsonl(tmp_path / "d" / "whatever.jsonl", ROWS)
    assert resolve_data_files(tmp_path / "d", None, "train")[0].name == "whatever.jsonl"
    # The README's configs block (hub datasets) wins over folder patterns.
    e = tmp_path / "e"
    _write_parquet(e / "weird" / "part-a.parquet", ROWS)
    (e / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n"
        "    path: weird/part-*\n---\n# card\n"
    )
    assert resolve_data_files(e, "main", "train")[0].name == "part-a.parquet"


def test_parquet_hf_layout_and_jsonl_give_same_tasks(gsm8k_dir: Path, tmp_path: Path) -> None:
    jsonl = _write_jsonl(tmp_path / "gsm8k.jsonl", ROWS)
    for selector in ("sequential", "shuffle"):
        sel = TaskSelectorConfig(selector_type=selector, seed=7)
        a = TaskReader.from_config(
            _cfg(gsm8k_dir, subset_name="main", task_selector=sel), batch_size=4, total_epochs=2
        )
        b = TaskReader.from_config(_cfg(jsonl, task_selector=sel), batch_size=4, total_epochs=2)
        ta = [t for batch in a for t in batch]
        tb = [t for batch in b for t in batch]
        assert len(ta) == len(tb) == (2 * len(ROWS)) // 4 * 4
        for x, y in zip(ta, tb, strict=True):
            assert (x.task_id, x.raw, x.index, x.epoch, x.workflow) == (
                y.task_id,
                y.raw,
                y.index,
                y.epoch,
                y.workflow,
            )
            assert x.raw == ROWS[x.index]
    assert ta[0].task_id == "gsm8k/" + str(ta[0].index)
    assert ta[0].format["prompt_key"] == "question"


def test_json_forms(tmp_path: Path) -> None:
    records = tmp_path / "r.json"
    records.write_text(json.dumps(ROWS))
    columns = tmp_path / "c.json"
    columns.write_text(json.dumps({k: [r[k] for r in ROWS] for k in ROWS[0]}))
    lines = tmp_path / "l.json"
    lines.write_text("\n".join(json.dumps(r) for r in ROWS))
    for f in (records, columns, lines):
        assert load_rows([f]).rows == ROWS


def test_missing_key_names_file_row_and_key(tmp_path: Path) -> None:
    rows = [dict(r) for r in ROWS[:5]]
    del rows[3]["answer"]
    f = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TasksetError) as e:
        TaskReader.from_config(_cfg(f), batch_size=2)
    msg = str(e.value)
    assert str(f) in msg and "line 4" in msg and "'answer'" in msg and "response_key" in msg
    reader = TaskReader.from_config(_cfg(f, skip_invalid_rows=True), batch_size=2)
    assert reader.dataset_size == 4 and reader.rowset.skipped == 1
    # parquet nulls count as missing too, reported by 0-based row
    p = _write_parquet(tmp_path / "bad.parquet", [{"question": "q", "answer": None}] + ROWS[:2])
    with pytest.raises(TasksetError, match=r"bad.parquet: row 0: missing key 'answer'"):
        load_rows(
            [p], task_required_keys(FormatConfig(prompt_key="question", response_key="answer"))
        )


def _bad_rows_file(path: Path) -> tuple[Path, int]:
    """A taskset whose good rows are interleaved with one row of every bad kind: not JSON,
    not UTF-8, not an object, no prompt key, a list prompt, a dict prompt. Returns the file
    and the number of good rows."""
    good = [json.dumps(r).encode() for r in ROWS[:4]]
    bad = [b'{"question": "2+2=?"', b'{"question": "\xff", "answer": "1"}', b"[1, 2]",
           b'{"answer": "1"}', b'{"question": ["1+1=?"], "answer": "2"}',
           b'{"question": {"q": "1+1=?"}, "answer": "2"}']
    lines = [good[0], *bad[:3], good[1], b"", good[2], *bad[3:], good[3]]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, len(good)


def test_skip_invalid_rows_skips_and_counts_every_kind_of_bad_row(tmp_path: Path, caplog) -> None:
    """Without ``skip_invalid_rows`` the first bad row fails, named by file and line, before
    start (``check_taskset``) as in the reader. With it, every bad row is skipped, a line that
    is not JSON as well as a row without the prompt key, and counted: one warning naming the
    first (however often the reader is built: eval readers are rebuilt at every evaluation) and
    a ``<taskset>/skipped_rows`` metric."""
    from storage.scheduler import TaskScheduler
    from storage.tasksets import check_taskset

    f, n_good = _bad_rows_file(tmp_path / "bad.jsonl")
    for fail in (lambda: check_taskset(_cfg(f)), lambda: TaskReader.from_config(_cfg(f), batch_size=2)):
        with pytest.raises(TasksetError, match=r"bad.jsonl: line 2: not JSON \(column 21: .*skip_invalid_rows: true"):
            fail()
    counted = check_taskset(_cfg(f, skip_invalid_rows=True))
    assert (counted.count, counted.skipped, counted.rows) == (n_good, 6, [])
    with caplog.at_level("WARNING", logger="storage.tasksets"):
        reader = TaskReader.from_config(_cfg(f, skip_invalid_rows=True), batch_size=2)
        TaskReader.from_config(_cfg(f, skip_invalid_rows=True), batch_size=2, is_eval=True)
    assert [r.raw for b in reader for r in b] == ROWS[:4]
    assert reader.rowset.skipped == 6
    assert [e.split(": ", 2)[1:] for e in reader.rowset.skipped_examples] == [
        ["line 2", "not JSON (column 21: unexpected end of data)"],
        ["line 3", "not UTF-8 text (byte 0xff at column 15)"],
        ["line 4", "expected a JSON object, got list"],
        ["line 8", "missing key 'question' (format.prompt_key); the row has ['answer']"],
        ["line 9", "key 'question' (format.prompt_key): expected a string, got list ['1+1=?']"],
        ["line 10", "key 'question' (format.prompt_key): expected a string, got dict {'q': '1+1=?'}"],
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"taskset 'gsm8k': skipped 6 invalid row(s) of 10 (skip_invalid_rows); "
                        f"the first: {f}: line 2: not JSON (column 21: unexpected end of data)"]
    assert TaskScheduler([reader], [lambda step: 1.0], 2).metrics() == {"gsm8k/drawn": 4.0, "gsm8k/skipped_rows": 6.0}
    # nothing valid left: refused before start even with skip_invalid_rows
    only_bad = tmp_path / "only_bad.jsonl"
    only_bad.write_bytes(b'{"answer": "1"}\n[1]\n')
    with pytest.raises(TasksetError, match=r"no valid rows: all 2 skipped \(skip_invalid_rows\); the first: .*line 1"):
        check_taskset(_cfg(only_bad, skip_invalid_rows=True))


def test_parquet_and_json_rows_are_checked_every_one(tmp_path: Path) -> None:
    """A bad row is named by its 0-based row in parquet and JSON-document files too."""
    from storage.tasksets import check_taskset

    rows = ROWS[:3] + [dict(ROWS[3], question=["1+1=?"])]
    p = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([dict(r, question=str(r["question"])) for r in rows[:3]]
                                        + [{"question": None, "answer": "1", "level": 0}]), p)
    with pytest.raises(TasksetError, match=r"t.parquet: row 3: missing key 'question' \(format.prompt_key\)"):
        check_taskset(_cfg(p))
    j = tmp_path / "t.json"
    j.write_text(json.dumps(rows))
    with pytest.raises(TasksetError, match=r"t.json: row 3: key 'question' \(format.prompt_key\): expected a string"):
        check_taskset(_cfg(j))


def test_the_pre_start_check_streams_a_large_taskset(tmp_path: Path) -> None:
    """``check_taskset`` reads every row of a JSON-lines taskset one line at a time and keeps
    none: its memory does not grow with the file (here 10 MB, checked with < 1 MB)."""
    import tracemalloc

    from storage.tasksets import check_taskset

    f = tmp_path / "big.jsonl"
    f.write_text((json.dumps({"question": "What is 12345 + 67890? " + "x" * 300, "answer": "80235"}) + "\n") * 30_000)
    assert f.stat().st_size > 10_000_000
    tracemalloc.start()
    try:
        counted = check_taskset(_cfg(f))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert counted.count == 30_000 and peak < 1_000_000, peak


def test_cursor_resume_neither_repeats_nor_skips(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "t.jsonl", ROWS)
    sel = TaskSelectorConfig(selector_type="shuffle", seed=3)
    full = TaskReader.from_config(_cfg(f, task_selector=sel), batch_size=5, total_steps=11)
    expected = [(t.index, t.epoch) for batch in full for t in batch]
    assert len(expected) == 55  # total_steps * batch_size, spanning 3 epochs of 23
    # each epoch is a permutation of all rows, and epochs differ
    assert sorted(i for i, e in expected if e == 0) == list(range(23))
    assert [i for i, e in expected if e == 0] != [i for i, e in expected if e == 1]

    first = TaskReader.from_config(_cfg(f, task_selector=sel), batch_size=5, total_steps=11)
    got = [(t.index, t.epoch) for _ in range(4) for t in first.read_batch()]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["epoch"] == 0 and state["index"] == 20
    resumed = TaskReader.from_config(_cfg(f, task_selector=sel), batch_size=5, total_steps=11)
    resumed.load_state_dict(state)
    got += [(t.index, t.epoch) for batch in resumed for t in batch]
    assert got == expected
    # also via TasksetConfig.index (what the loader sets from the checkpoint)
    via_index = TaskReader.from_config(
        _cfg(f, task_selector=sel, index=20), batch_size=5, total_steps=11
    )
    assert [(t.index, t.epoch) for t in via_index.read_batch()] == expected[20:25]
    # a changed dataset is refused
    small = TaskReader.from_config(
        _cfg(_write_jsonl(tmp_path / "s.jsonl", ROWS[:5]), task_selector=sel), batch_size=5
    )
    with pytest.raises(TasksetError, match="dataset_size"):
        small.load_state_dict(state)


def test_drop_last_and_eval(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "t.jsonl", ROWS)
    train = TaskReader.from_config(_cfg(f), batch_size=10)
    assert [len(b) for b in train] == [10, 10] and train.read_batch() == []
    ev = TaskReader.from_config(_cfg(f), batch_size=10, total_epochs=5, is_eval=True)
    batches = list(ev)
    assert [len(b) for b in batches] == [10, 10, 3] and all(t.is_eval for t in batches[0])
    assert len(train) == 2 and len(ev) == 3


def test_random_selector_and_workflow_key(tmp_path: Path) -> None:
    order = epoch_order("random", 10, seed=1, epoch=0)
    assert len(order) == 10 and len(set(order.tolist())) < 10  # with replacement
    assert (epoch_order("random", 10, 1, 0) == order).all()
    rows = [dict(r, wf="custom" if r["level"] == 0 else None) for r in ROWS]
    f = _write_jsonl(tmp_path / "w.jsonl", rows)
    cfg = _cfg(
        f, format=FormatConfig(prompt_key="question", response_key="answer", workflow_key="wf")
    )
    tasks = TaskReader.from_config(cfg, batch_size=23).read_batch()
    assert {t.workflow for t in tasks if t.raw["level"] == 0} == {"custom"}
    assert {t.workflow for t in tasks if t.raw["level"] != 0} == {"math_workflow"}


def test_format_row_sft_dpo_messages(tmp_path: Path) -> None:
    plain = FormatConfig(
        prompt_type="plaintext", prompt_key="q", response_key="a", system_prompt="be brief"
    )
    out = format_row({"q": "hi", "a": "yo"}, plain)
    assert out.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]
    per_row = plain.model_copy(update={"system_prompt_key": "sys"})
    assert format_row({"q": "hi", "a": "yo", "sys": "S"}, per_row).messages[0]["content"] == "S"
    dpo = format_row({"q": "hi", "chosen": "good", "rejected": "bad"}, plain, "dpo")
    assert dpo.messages[-1]["role"] == "user" and dpo.chosen[0]["content"] == "good"
    msgs = FormatConfig(prompt_type="messages", messages_key="m", tools_key="tools")
    row = {"m": json.dumps([{"role": "user", "content": "x"}]), "tools": [{"name": "f"}]}
    out = format_row(row, msgs)
    assert out.messages == [{"role": "user", "content": "x"}] and out.tools == [{"name": "f"}]

    rows = [
        {
            "m": [{"role": "user", "content": "x"}],
            "chosen": [{"role": "assistant", "content": "c"}],
            "rejected": [{"role": "assistant", "content": "r"}],
        }
    ] * 4
    f = _write_jsonl(tmp_path / "dpo" / "train.jsonl", rows)
    cfg = ExperienceBufferConfig(name="dpo", storage_type="file", path=str(f.parent), format=msgs)
    reader = dataset_reader_from_config(cfg, batch_size=2, kind="dpo")
    batch = reader.read_batch()
    assert len(batch) == 2 and batch[0].rejected[0]["content"] == "r"
    bad = _write_jsonl(tmp_path / "dpo2" / "train.jsonl", [{"m": []}])
    cfg2 = cfg.model_copy(update={"path": str(bad.parent)})
    with pytest.raises(TasksetError, match=r"line 1: missing key 'chosen' \(format.chosen_key\)"):
        dataset_reader_from_config(cfg2, batch_size=1, kind="dpo")


def test_messages_taskset_uses_messages_column(tmp_path: Path) -> None:
    rows = [{"message": [{"role": "user", "content": str(i)}]} for i in range(3)] + [{"other": 1}]
    f = _write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.raises(
        TasksetError, match=r"line 4: missing key 'message' \(format.messages_key\)"
    ):
        load_rows([f], task_required_keys(FormatConfig()))


def test_dataset_reader_plain(tmp_path: Path) -> None:
    reader = DatasetReader(ROWS, batch_size=4, transform=lambda i, r, e: i, total_steps=3)
    assert [b for b in reader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert reader.exhausted and reader.cursor.offset == 12
