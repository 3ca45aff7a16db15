"""SIGTERM/SIGINT as a request to finish, for every role process.

Why its own module: the stage loop (:mod:`roles.stages`) imports each role's main to run it,
and the role mains need this too; kept here, below both, no module imports back the one that
imports it.
"""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop`` (the role then finishes cleanly) instead of killing."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread / not POSIX
            pass
