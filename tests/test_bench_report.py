"""``docs/benchmarks.md`` is written from the benches' records (``bench/report.py``): it must be
what the records say, and a record carries the stamps that make a figure mean something."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


BENCHES = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name not in ("report.py", "trl_grpo.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHES)
def test_every_bench_starts(script):
    """Each bench imports what it needs and parses its arguments (``--help``): a bench nobody
    ran for a while must not have rotted (bench/lora.py imported a helper a refactor removed).
    ``trl_grpo.py`` runs in TRL's own virtualenv (``vs_trl.py`` makes it) and is left out."""
    p = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "usage:" in p.stdout
