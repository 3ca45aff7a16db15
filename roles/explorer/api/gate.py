"""Requests and weight loads take turns on the engines.

Why: a weight load in the middle of a request would give one completion tokens from two
models, and its experience one wrong ``model_version``. Requests share the gate; loads take it
from them, after the requests in flight have answered. A waiting load goes first: requests that
arrive meanwhile wait for it, so a busy server cannot starve weight sync.

Loads share the gate with each other: the engines receive one broadcast together (each
engine's workers are ranks of one collective group, and gloo's broadcast forwards through
them), so a load that waited for another engine's load to end waited for itself. With 4
engines it hung until the sync timeout, and the explorer kept its old weights.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class WeightGate:
    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._requests = 0
        self._loads = 0
        self._waiting_loads = 0

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._loads and not self._waiting_loads)
            self._requests += 1
        try:
            yield
        finally:
            async with self._cond:
                self._requests -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def load(self) -> AsyncIterator[None]:
        """Held while one engine loads weights: no request runs meanwhile; other loads may."""
        async with self._cond:
            self._waiting_loads += 1
            try:
                await self._cond.wait_for(lambda: not self._requests)
            finally:
                self._waiting_loads -= 1
            self._loads += 1
        try:
            yield
        finally:
            async with self._cond:
                self._loads -= 1
                self._cond.notify_all()


class GatedEngine:
    """An engine whose weight loads take the gate from requests (what the sync client is given).

    Everything else is the engine's own: generation goes through the server, which holds
    the gate shared around each request."""

    def __init__(self, engine: object, gate: WeightGate) -> None:
        self.engine = engine
        self.gate = gate

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    async def load_checkpoint(self, path: str, version: int) -> None:
        async with self.gate.load():
            await self.engine.load_checkpoint(path, version)  # type: ignore[attr-defined]

    async def update_weights(self, named_tensors: list, version: int) -> None:
        async with self.gate.load():
            await self.engine.update_weights(named_tensors, version)  # type: ignore[attr-defined]

    async def receive_weights(self) -> int:
        async with self.gate.load():
            return await self.engine.receive_weights()  # type: ignore[attr-defined]
