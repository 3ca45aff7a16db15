"""Episodes: what the API records per agent run, and how its calls become experiences.

Every request names an episode (``/v1/episodes/<id>/...``). Each choice the engine returns is
recorded as a :class:`Call`: the prompt token ids exactly as the chat template rendered them,
the response token ids, the sampled tokens' log-probs, the model version and finish reason.
An episode ends one of three ways:

* a reward is posted (``close``): its calls become experiences, one group, published by the
  explorer like every other group (buffer, trainer and exactly-once all apply);
* a workflow owns it (``get_openai_client``) and takes its calls with
  ``extract_experience_from_history``; no reward is posted through the API then;
* it sees no request and no reward for ``episode_timeout`` seconds (``expire``): it is
  dropped, counted and logged, never trained.

How calls become experiences (:func:`calls_to_experiences`): one experience per call, or with
``enable_concatenated_multi_turn`` runs of calls where each call's prompt *starts with* the
previous call's prompt + response tokens are merged into one experience: the tokens between
(tool results, user turns, the template's turn markers) get action mask 0 and log-prob 0, the
model's own tokens mask 1. A call whose prompt does not extend the previous one (the agent
rewrote or trimmed its history, or the template re-renders the previous answer differently,
e.g. without its reasoning) starts a new experience: merging it would train on tokens the
model never sampled in that context.
"""

from __future__ import annotations

import collections
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roles.explorer.api.protocol import ApiError
from schemas.data import Experience, ExperienceGroup

#: Episode ids: what is safe in a URL path segment, a group id and a NATS message id.
EPISODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
#: Closed episode ids remembered (a reward posted twice, a closed episode reused).
CLOSED_MEMORY = 100_000


@dataclass
class Call:
    """One sampled choice of one request."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    model_version: int
    finish_reason: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    response_text: str = ""
    tool_calls: int = 0
    #: the text had a ``<tool_call>`` the parser could not read (it stayed text)
    tool_call_errors: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids


@dataclass
class Episode:
    id: str
    calls: list[Call] = field(default_factory=list)
    touched: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    #: a workflow's model handle that owns this episode (no reward through the API)
    owner: Any = None
    engine: Any = None
    defaults: dict[str, Any] = field(default_factory=dict)


def _experience(calls: list[Call], spans: list[tuple[int, int]]) -> Experience:
    """One experience from merged calls; ``spans`` are the model's token ranges in
    ``calls[-1].tokens`` (absolute positions)."""
    first, last = calls[0], calls[-1]
    tokens = last.tokens
    p = len(first.prompt_ids)
    mask = np.zeros(len(tokens) - p, dtype=bool)
    lps = np.zeros(len(tokens) - p, dtype=np.float32)
    have_lps = True
    for c, (a, b) in zip(calls, spans, strict=True):
        mask[a - p:b - p] = True
        if len(c.logprobs) == b - a:
            lps[a - p:b - p] = c.logprobs
        else:
            have_lps = False
    reasons = [c.finish_reason for c in calls]
    return Experience(
        id=uuid.uuid4().hex, task_id="", group_id="", run_id="",
        tokens=np.asarray(tokens, dtype=np.int32), prompt_length=p,
        logprobs=lps if have_lps else None, action_mask=mask,
        model_version=min(c.model_version for c in calls),
        response_truncated=last.finish_reason == "length",
        response_text=last.response_text, messages=list(last.messages),
        info={"finish_reason": reasons[-1], "calls": len(calls),
              "tool_calls": sum(c.tool_calls for c in calls),
              "tool_call_errors": sum(c.tool_call_errors for c in calls)},
    )


def calls_to_experiences(calls: list[Call], concatenate: bool) -> list[Experience]:
    """Experiences from an episode's calls, in order (see the module doc)."""
    out: list[Experience] = []
    run: list[Call] = []
    spans: list[tuple[int, int]] = []
    for c in calls:
        prev = run[-1].tokens if run else None
        if concatenate and prev is not None and c.prompt_ids[:len(prev)] == prev:
            run.append(c)
        else:
            if run:
                out.append(_experience(run, spans))
            run, spans = [c], []
        spans.append((len(c.prompt_ids), len(c.tokens)))
    if run:
        out.append(_experience(run, spans))
    return out


class EpisodeBook:
    """Open episodes by id, and the ids of closed ones."""

    def __init__(self, timeout: float, concatenate: bool) -> None:
        self.timeout = timeout
        self.concatenate = concatenate
        self.open: dict[str, Episode] = {}
        self.closed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.expired = 0

    def new_id(self, prefix: str = "ep") -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    def get(self, eid: str, create: bool = True) -> Episode:
        """The open episode ``eid`` (opened on first use when ``create``)."""
        if not EPISODE_ID.fullmatch(eid):
            raise ApiError(400, f"episode id {eid[:80]!r}: 1-128 characters of letters, digits, "
                                "'.', '_', ':', '@', '-' (starting with a letter or digit)",
                           "episode_id", "invalid_episode_id")
        if eid in self.closed:
            raise ApiError(409, f"episode {eid}: already closed (its reward was posted); "
                                "open a new episode id", "episode_id", "episode_closed")
        ep = self.open.get(eid)
        if ep is None:
            if not create:
                raise ApiError(404, f"episode {eid}: unknown (no request was made in it, or it "
                                    "expired)", "episode_id", "episode_not_found")
            ep = self.open[eid] = Episode(eid)
        ep.touched = time.monotonic()
        return ep

    def own(self, owner: Any, engine: Any, defaults: dict[str, Any]) -> str:
        """A new episode whose calls a workflow's model handle takes (no reward via the API)."""
        eid = self.new_id("wf")
        self.open[eid] = Episode(eid, owner=owner, engine=engine, defaults=dict(defaults))
        return eid

    def take(self, eid: str) -> list[Experience]:
        """An owned episode's calls so far as experiences; the episode stays open, empty."""
        ep = self.open.get(eid)
        if ep is None:
            return []
        calls, ep.calls = ep.calls, []
        return calls_to_experiences(calls, self.concatenate)

    def release(self, eid: str) -> None:
        """Forget an owned episode (its workflow is done)."""
        self.open.pop(eid, None)

    def group(self, eid: str, reward: float, info: dict[str, Any], run_id: str) -> ExperienceGroup:
        """The group a reward closes ``eid`` into (the episode stays open until
        :meth:`closed_by` after the group is stored: a failed publish loses nothing)."""
        ep = self.get(eid, create=False)
        if ep.owner is not None:
            raise ApiError(409, f"episode {eid}: belongs to a workflow, which returns its "
                                "experiences itself", "episode_id", "episode_owned")
        if ep.in_flight:
            raise ApiError(409, f"episode {eid}: {ep.in_flight} request(s) still running; post "
                                "the reward after they answered", "episode_id", "episode_busy")
        if not ep.calls:
            raise ApiError(404, f"episode {eid}: no completed request to reward", "episode_id",
                           "episode_empty")
        exps = calls_to_experiences(ep.calls, self.concatenate)
        for i, e in enumerate(exps):
            e.id, e.task_id, e.group_id, e.run_id = f"{eid}/{i}", eid, eid, run_id
            e.reward = float(reward)
            e.info.update(info)
        return ExperienceGroup(group_id=eid, task_id=eid, run_id=run_id,
                               model_version=min(e.model_version for e in exps), experiences=exps,
                               taskset="openai_api")

    def closed_by(self, eid: str) -> None:
        self.open.pop(eid, None)
        self.closed[eid] = None
        while len(self.closed) > CLOSED_MEMORY:
            self.closed.popitem(last=False)

    def expire(self) -> list[Episode]:
        """Drop open API episodes idle for ``timeout`` seconds; return them."""
        cutoff = time.monotonic() - self.timeout
        gone = [ep for ep in self.open.values()
                if ep.owner is None and not ep.in_flight and ep.touched < cutoff]
        for ep in gone:
            del self.open[ep.id]
        self.expired += len(gone)
        return gone
