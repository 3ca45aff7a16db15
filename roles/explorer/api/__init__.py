"""The explorer's OpenAI-compatible API: agents drive rollouts over HTTP (``server.py``);
each call is recorded per episode (``episodes.py``) and becomes experience."""

from roles.explorer.api.gate import GatedEngine, WeightGate
from roles.explorer.api.server import ApiServer

__all__ = ["ApiServer", "GatedEngine", "WeightGate"]
