"""Fixtures of the API tests: the tool-calling tiny model, a transformers engine on it, and a
started :class:`roles.explorer.api.ApiServer` whose rewarded episodes land in a list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .tool_model import build_tool_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from storage.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tool_model(tmp_path_factory.mktemp("toolmodel") / "model")


def make_engine(model: Path, **kw: Any) -> Any:
    from roles.explorer.engines.hf import HFEngine
    from schemas.config import InferenceModelConfig

    kw.setdefault("max_model_len", 512)
    return HFEngine(InferenceModelConfig(model_path=str(model), engine_type="transformers", **kw), "hf-0")


@pytest.fixture(scope="session")
def engine(tool_model: Path) -> Any:
    return make_engine(tool_model)


class Published(list):
    """The groups the server published; ``fail`` makes the next publishes raise."""

    fail = False

    async def __call__(self, group: Any) -> bool:
        if self.fail:
            raise ConnectionError("bus unavailable (test)")
        dup = any(g.group_id == group.group_id for g in self)
        self.append(group)
        return dup


@pytest.fixture
async def api(engine: Any):
    """A started server (free port) over ``engine``; ``api.published`` holds the groups."""
    from roles.explorer.api import ApiServer
    from schemas.config import OpenAIApiConfig

    async def start(**cfg: Any) -> Any:
        server = ApiServer(OpenAIApiConfig(port=0, **cfg), [engine], "tiny", "run", Published())
        server.published = server.publish
        await server.start()
        started.append(server)
        return server

    started: list[Any] = []
    yield start
    for s in started:
        await s.stop()
