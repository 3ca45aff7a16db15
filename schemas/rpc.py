"""The batch request/reply between trainer and buffer (``trinity.<run>.rpc.batch``/``commit``).

A request names the train step; the buffer answers with the experiences of that step, each as
its stored codec bytes (no re-encoding). The step is the key of the batch in the replay store
(``step-N``), so asking again for an uncommitted step returns the same experiences: that is
how a restarted trainer neither skips nor repeats experience. ``commit`` tells the buffer that
every step up to N is checkpointed, so those batches can never be asked for again. The bodies
are :class:`schemas.data.BatchRequest`, :class:`~schemas.data.BatchReply` and
:class:`~schemas.data.Commit`, encoded by :mod:`schemas.codec` like every other bus message.
"""

from __future__ import annotations

from schemas import codec
from schemas.data import BatchReply, BatchRequest, Commit, Experience

__all__ = ["BATCH_RPC", "COMMIT_RPC", "RPCS", "BatchReply", "BatchRequest", "Commit", "batch_key", "experiences"]

BATCH_RPC = "batch"
COMMIT_RPC = "commit"
#: Every request/reply of a run (``trinity.<run>.rpc.<name>``): name, request, reply, caller,
#: server, what it does (``docs/protocol.md`` is generated from it).
RPCS = (
    (BATCH_RPC, BatchRequest, BatchReply, "trainer", "buffer",
     "the experiences of a train step; asked again, the same ones until committed"),
    (COMMIT_RPC, Commit, Commit, "trainer", "buffer",
     "every step up to upto is checkpointed: its batches are never served again"),
)


def batch_key(step: int) -> str:
    """Replay-store key of train step ``step``'s batch."""
    return f"step-{int(step)}"


def experiences(reply: BatchReply) -> list[Experience]:
    """A batch reply's experiences, decoded, each with its ``info["use_count"]``."""
    out = []
    for raw, uc in zip(reply.items, reply.use_counts, strict=True):
        e = codec.decode(raw, Experience)
        e.info["use_count"] = uc
        out.append(e)
    return out
