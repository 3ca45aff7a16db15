"""Poison during a real run: messages that decode but cannot be stored or trained, and bytes
that do not decode at all, go to the dead-letter stream with their reason; the run trains
every valid group exactly once and exits 0."""

from __future__ import annotations

import asyncio

import nats
import pytest

from bus.publish import H_ERROR, H_MSG_ID, H_ORIG_ID
from bus.subjects import names
from tests.helpers import wait_for

from .helpers import running, steps_log, tiny_run_config
from .poison import poison_messages
from .test_run_e2e import _trained_exactly_once

pytestmark = pytest.mark.slow

RUN = "t.r"


def _poison() -> dict[str, bytes]:
    """One message of each kind the issue names, by Nats-Msg-Id."""
    return poison_messages(RUN, "poison")


async def _inject(url: str, messages: dict[str, bytes]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for mid, data in messages.items():
        await js.publish(names(RUN).subject("exp"), data, headers={H_MSG_ID: mid})
    await nc.close()


async def _dead_letters(url: str) -> dict[str, str]:
    """Original message id -> error header of every message in the run's DLQ."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = names(RUN).stream("dlq")
    n = (await js.stream_info(stream)).state.messages
    out = {}
    for seq in range(1, n + 1):
        m = await js.get_msg(stream, seq)
        out[m.headers[H_ORIG_ID]] = m.headers[H_ERROR]
    await nc.close()
    return out


def test_poison_is_quarantined_and_the_run_finishes(
    tmp_path, tiny_model, arith, nats_server_factory
):
    server = nats_server_factory()
    cfg = tiny_run_config(
        tmp_path / "c.yaml", model=tiny_model, data=arith, port=server.port, stages=False
    )
    job = tmp_path / "ckpt/t/r"
    log = tmp_path / "run.log"
    poison = _poison()
    with running("run", "--config", str(cfg), log=log) as p:  # once the trainer has taken a step, the streams exist and the buffer consumes
        wait_for("train step 1", lambda: steps_log(job), p, log=log)
        asyncio.run(_inject(server.url, poison))
    text = log.read_text()
    assert p.returncode == 0, text[-4000:]
    assert "restart" not in text, "a role was restarted"
    _trained_exactly_once(job)  # every valid group, once; no poison among the trained ids
    dead = asyncio.run(_dead_letters(server.url))
    assert sorted(dead) == sorted(poison), dead
    assert "ExperienceGroup.group_id: must not be empty" in dead["poison-empty-group-id"]
    assert "experiences[0].id: 500 bytes, longer than 480" in dead["poison-long-id"]
    assert "model_version: must be in [0, 2**63)" in dead["poison-huge-version"]
    assert "experiences[1].reward: must be finite, got nan" in dead["poison-nan-reward"]
    assert (
        "experiences[0].tokens: token id 1000000 is past the model's vocabulary"
        in (dead["poison-vocab"])
    )
    assert dead["poison-garbage"].startswith("CodecError")
