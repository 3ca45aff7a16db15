"""Trinity-RFT's ``get_logger``: a standard :mod:`logging` logger under ``trinity``."""

from __future__ import annotations

import logging


def get_logger(name: str | None = None, level: int | str | None = None, in_ray_actor: bool = False) -> logging.Logger:
    """A logger named ``name`` under ``trinity`` (``in_ray_actor`` is accepted and unused:
    there are no Ray actors here)."""
    logger = logging.getLogger(name if name and name.startswith("trinity") else f"trinity.{name or 'plugin'}")
    if level is not None:
        logger.setLevel(level)
    return logger
