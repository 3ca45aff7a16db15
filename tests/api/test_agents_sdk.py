"""An agent framework from PyPI (the OpenAI Agents SDK) drives trinity's API unchanged: its
requests pass the server's strict checks, its calls are recorded, and its reward closes the
episode into a group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("agents")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples/agents"))

from sdk_agent import episode  # noqa: E402


async def test_the_agents_sdk_runs_an_episode_through_the_api(api):
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    server = await api()
    out = await episode(server.url, "3+4?", "7")
    (group,) = server.published
    assert group.group_id == out["episode"] and len(group.experiences) == out["experiences"] >= 1
    assert all(e.reward == out["reward"] for e in group.experiences)
    assert server.stats.errors == 0
