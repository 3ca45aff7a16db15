"""Helpers every test tier shares. One way to wait: :func:`wait_for` (one way to pick a port is
:func:`bus.server.free_port`)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(what: str, cond: Callable[[], T], *procs: subprocess.Popen, log: Path | None = None,
             timeout: float = 600, pause: float = 0.1) -> T:
    """Poll ``cond`` until it returns something truthy, and return that. Fails naming ``what``
    when ``timeout`` seconds pass, or at once when one of ``procs`` exits first (with the tail
    of ``log``, the processes' output): waiting out the timeout for a process that is gone
    only hides why. The timeout is a ceiling for a hung run, not a speed check: keep it
    generous (a busy machine is slow, not broken)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        for p in procs:
            if p.poll() is not None:
                tail = log.read_text(errors="replace")[-4000:] if log is not None else ""
                raise AssertionError(f"waiting for {what}: {p.args} exited with {p.returncode}\n{tail}")
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:] if log is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{tail}")
        time.sleep(pause)
