"""``docs/benchmarks.md`` is written from the benches' records (``bench/report.py``): it must be
what the records say, and a record carries the stamps that make a figure mean something."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmarks_page_is_generated_from_the_records():
    report = _report()
    assert report.PAGE.read_text() == report.render(), "docs/benchmarks.md is stale: run `python bench/report.py`"


def test_a_record_is_stamped_and_the_page_shows_its_spread(tmp_path, monkeypatch):
    report = _report()
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "codec.py"), "--groups", "3"])
    for v in (10.0, 12.5):
        report.record("codec", {"encode+decode, us/experience": v}, target="< 1 ms", met=True)
    rows = [json.loads(line) for line in (tmp_path / "codec.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert rows[0]["command"] == "python bench/codec.py --groups 3"
    assert {"date", "commit", "cpu", "cores", "gpu", "torch"} <= set(rows[0])
    page = report.render()
    assert "| encode+decode, us/experience | 12.5 | 10 - 12.5 |" in page
    assert "Target: < 1 ms (met in the latest run)." in page
