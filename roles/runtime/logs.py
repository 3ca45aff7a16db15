"""Logging for every role: pretty lines on a terminal, JSON lines in a file per role.

Why structlog on top of the standard library: the bus, nats-py, transformers and vLLM log
through ``logging``; routing everything through one stdlib handler pair keeps their lines in the
same per-role file as ours, while structlog gives our own events key=value context that stays
machine-readable in the JSON file (``<checkpoint_root_dir>/<project>/<name>/log/<role>.log``).
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

import structlog

_SHARED = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=False),
    structlog.processors.StackInfoRenderer(),
]


def setup_logging(
    role: str,
    level: str = "INFO",
    log_dir: str | Path | None = None,
    *,
    stream=None,
    pretty: bool | None = None,
) -> Path | None:
    """Configure logging for one role process; returns the log file path (if any).

    ``pretty`` defaults to "is the stream a terminal": a human at a terminal gets colours, a
    pipe (``trinity run`` collecting role output, honcho, CI) gets plain ``key=value`` lines.
    """
    stream = stream or sys.stderr
    if pretty is None:
        pretty = hasattr(stream, "isatty") and stream.isatty()
    numeric = getattr(logging, level.upper(), logging.INFO)

    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(role=role)

    console = logging.StreamHandler(stream)
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                # Python's own traceback: rich's (structlog's default) prints every frame's
                # locals, and one KeyError in the trainer filled 7,000 lines of a run's log
                structlog.dev.ConsoleRenderer(colors=pretty, exception_formatter=structlog.dev.plain_traceback),
            ],
        )
    )
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    root.addHandler(console)
    root.setLevel(numeric)

    path = None
    if log_dir is not None:
        path = Path(log_dir) / f"{role}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.handlers.WatchedFileHandler(path, encoding="utf-8")
        file_handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=_SHARED,
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.dict_tracebacks,
                    structlog.processors.JSONRenderer(),
                ],
            )
        )
        root.addHandler(file_handler)
    # chatty libraries stay at WARNING unless the user asked for DEBUG
    for name in ("nats", "asyncio", "urllib3", "filelock"):
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else logging.WARNING)
    return path
