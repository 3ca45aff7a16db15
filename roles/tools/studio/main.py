"""``trinity studio``: serve the app (``roles/tools/studio/app.py``) until Ctrl-C."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
from pathlib import Path

from aiohttp import web

from roles.tools.studio.app import make_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(args: argparse.Namespace) -> int:
    root = Path(args.checkpoint_root or os.environ.get("TRINITY_CHECKPOINT_ROOT_DIR") or "./checkpoints")
    loopback = is_loopback(args.host)
    token = args.token or secrets.token_urlsafe(18)
    read_only = args.read_only or (not loopback and not args.allow_run)
    app = make_app(root.resolve(), token, args.nats_url, loopback, read_only=read_only)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown}:{args.port}/?token={token}"
    mode = "read-only: it cannot save or run" if read_only else "Run starts trinity run, which runs the config's code as you"
    print(f"trinity studio: {url} (jobs under {root.resolve()}; {mode}; Ctrl-C stops)", flush=True)
    # shutdown_timeout: what a request still in flight gets on Ctrl-C/SIGTERM (aiohttp's default
    # is 60 s); the run views' event streams end at once (Studio.pause)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=2.0)
    return 0
