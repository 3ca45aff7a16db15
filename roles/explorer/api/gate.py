"""Requests and weight loads take turns on the engines.

Why: a weight load in the middle of a request would give one completion tokens from two
models, and its experience one wrong ``model_version``. Requests share the gate; a load takes
it alone, after the requests in flight have answered. A waiting load goes first: requests that
arrive meanwhile wait for it, so a busy server cannot starve weight sync.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class WeightGate:
    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._requests = 0
        self._loading = False
        self._waiting_loads = 0

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._loading and not self._waiting_loads)
            self._requests += 1
        try:
            yield
        finally:
            async with self._cond:
                self._requests -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting_loads += 1
            try:
                await self._cond.wait_for(lambda: not self._loading and not self._requests)
            finally:
                self._waiting_loads -= 1
            self._loading = True
        try:
            yield
        finally:
            async with self._cond:
                self._loading = False
                self._cond.notify_all()


class GatedEngine:
    """An engine whose weight loads take the gate alone (what the sync client is given).

    Everything else is the engine's own: generation goes through the server, which holds
    the gate shared around each request."""

    def __init__(self, engine: object, gate: WeightGate) -> None:
        self.engine = engine
        self.gate = gate

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    async def load_checkpoint(self, path: str, version: int) -> None:
        async with self.gate.exclusive():
            await self.engine.load_checkpoint(path, version)  # type: ignore[attr-defined]

    async def update_weights(self, named_tensors: list, version: int) -> None:
        async with self.gate.exclusive():
            await self.engine.update_weights(named_tensors, version)  # type: ignore[attr-defined]

    async def receive_weights(self) -> int:
        async with self.gate.exclusive():
            return await self.engine.receive_weights()  # type: ignore[attr-defined]
