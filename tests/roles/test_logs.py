"""Per-role log files are JSON lines; stdlib and structlog records both land there."""

from __future__ import annotations

import io
import json
import logging

import structlog

from roles.runtime.logs import setup_logging


def test_role_log_file_gets_json_lines_from_structlog_and_stdlib(tmp_path):
    stream = io.StringIO()
    path = setup_logging("explorer", "DEBUG", tmp_path / "log", stream=stream)
    structlog.get_logger("trinity.test").info("published", group="g1", tokens=42)
    logging.getLogger("nats.aio").warning("reconnecting")
    logging.getLogger("trinity.quiet").debug("debug line")
    for h in logging.getLogger().handlers:
        h.flush()
    assert path == tmp_path / "log" / "explorer.log"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    first = records[0]
    assert first["event"] == "published" and first["group"] == "g1" and first["tokens"] == 42
    assert first["role"] == "explorer" and first["level"] == "info" and "timestamp" in first
    assert any(r["event"] == "reconnecting" and r["level"] == "warning" for r in records)
    assert any(r["event"] == "debug line" for r in records)
    assert "published" in stream.getvalue()  # the console got it too


def test_level_filters(tmp_path):
    path = setup_logging("trainer", "WARNING", tmp_path, stream=io.StringIO())
    structlog.get_logger("x").info("hidden")
    structlog.get_logger("x").error("shown")
    for h in logging.getLogger().handlers:
        h.flush()
    events = [json.loads(line)["event"] for line in path.read_text().splitlines()]
    assert events == ["shown"]
