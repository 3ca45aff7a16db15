"""How a role process gets its configuration: the loader plus warnings said once.

Roles call :func:`load` with their parsed CLI arguments; it reads the same sources as
``trinity config`` (so what you print is what runs) and logs each warning about ignored
Trinity-RFT sections once, naming the key.
"""

from __future__ import annotations

import argparse
import sys

from schemas.loader import LoadedConfig, load_config


def load(args: argparse.Namespace, *, quiet: bool = False) -> LoadedConfig:
    """Load the configuration named by ``--config``/``--set``/``--dotenv`` (and the env)."""
    loaded = load_config(
        getattr(args, "config", None),
        getattr(args, "overrides", []) or [],
        dotenv_file=getattr(args, "dotenv", ".env"),
    )
    if not quiet:
        for w in loaded.warnings:
            print(f"warning: {w}", file=sys.stderr)
    return loaded
