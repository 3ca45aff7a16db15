"""Poison for the experience stream: one message of each kind that once stopped a run (it
decoded, then failed in the buffer or the trainer), built by editing a valid group's wire
form. Used by tests/run/test_poison.py and bench/chaos.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from schemas import codec
from schemas.data import Experience, ExperienceGroup


def group_envelope(run_id: str, gid: str, tokens: list[int]) -> dict[str, Any]:
    """A valid two-experience group as a msgpack-ready envelope, to edit field by field."""
    exps = [
        Experience(id=f"{gid}/{i}", task_id=gid, group_id=gid, run_id=run_id,
                   tokens=np.array(tokens, np.int32), prompt_length=2,
                   logprobs=np.zeros(len(tokens) - 2, np.float32), reward=1.0)
        for i in range(2)
    ]
    g = ExperienceGroup(group_id=gid, task_id=gid, run_id=run_id, experiences=exps)
    return msgpack.unpackb(codec.encode(g), raw=False, ext_hook=msgpack.ExtType)


def _empty_group_id(p: dict) -> None:
    p["group_id"] = ""
    for e in p["experiences"]:
        e["group_id"] = ""


def _long_id(p: dict) -> None:
    p["experiences"][0]["id"] = "x" * 500


def _huge_version(p: dict) -> None:
    p["model_version"] = 2**63
    for e in p["experiences"]:
        e["model_version"] = 2**63


def _nan_reward(p: dict) -> None:
    p["experiences"][1]["reward"] = float("nan")


#: kind -> how a valid payload is made poisonous
EDITS: dict[str, Callable[[dict], None]] = {
    "empty-group-id": _empty_group_id,
    "long-id": _long_id,
    "huge-version": _huge_version,
    "nan-reward": _nan_reward,
}


def poison_messages(run_id: str, prefix: str) -> dict[str, bytes]:
    """One message of each kind, by Nats-Msg-Id ``<prefix>-<kind>``: the edits above, a token
    id past any tiny vocabulary (decodes and validates: only the model's vocabulary refuses
    it), and garbage bytes."""
    out = {}
    for kind, edit in EDITS.items():
        env = group_envelope(run_id, f"{prefix}-{kind}", [1, 2, 3, 4])
        edit(env["payload"])
        out[f"{prefix}-{kind}"] = msgpack.packb(env)
    out[f"{prefix}-vocab"] = msgpack.packb(group_envelope(run_id, f"{prefix}-vocab", [1, 2, 10**6, 4]))
    out[f"{prefix}-garbage"] = b"\x93not a message"
    return out
