"""Trim a run's streams to what is still needed, so a long run's nats-server stays flat.

Streams use limits retention: every message stays until a limit removes it, which is what
lets a restarted role resume from its ack floor and ``trinity inspect --tail`` show history.
Without a limit, nats-server's store and memory grew with the run (+19% in 30 minutes). An
age or byte limit would drop the oldest messages whether or not they were consumed; instead,
:func:`trim_streams` purges only what every durable consumer of a stream has acknowledged,
keeping the newest ``keep`` for inspection, and nothing past the position a reader without
a durable consumer saved (``readers``). Nothing a role has yet to read is ever purged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .subjects import KINDS, names


def purge_below(last_seq: int, ack_floors: list[int], keep: int) -> int:
    """The first sequence to keep on a stream whose last is ``last_seq``: above every
    durable consumer's ack floor (``ack_floors``: the last sequence each has acknowledged,
    all before it too) and leaving the newest ``keep`` messages. 1 purges nothing."""
    upto = last_seq - keep + 1
    if ack_floors:
        upto = min(upto, min(ack_floors) + 1)
    return max(upto, 1)


async def trim_streams(js: Any, run_id: str, keep: int, readers: Mapping[str, int] | None = None) -> dict[str, int]:
    """Purge, on each stream of run ``run_id``, the messages :func:`purge_below` allows;
    returns how many went, per stream kind (those that lost some). ``keep < 0``: none.
    ``readers``: per stream kind, the last sequence used by a reader that keeps its own
    position instead of a durable consumer (the leading explorer's cursor, for ``done`` and
    ``feedback``): nothing after it is purged either."""
    if keep < 0:
        return {}
    purged: dict[str, int] = {}
    for kind in KINDS:
        stream = names(run_id).stream(kind)
        info = await js.stream_info(stream)
        floors = [(c.ack_floor.stream_seq or 0) if c.ack_floor else 0
                  for c in await js.consumers_info(stream) if c.config.durable_name]
        if readers and kind in readers:
            floors.append(readers[kind])
        first = purge_below(info.state.last_seq, floors, keep)
        if first > info.state.first_seq and info.state.messages:
            before = info.state.messages
            await js.purge_stream(stream, seq=first)
            purged[kind] = before - (await js.stream_info(stream)).state.messages
    return purged
