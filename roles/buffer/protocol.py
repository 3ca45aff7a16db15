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

from schemas.data import BatchReply, BatchRequest, Commit

__all__ = ["BATCH_RPC", "COMMIT_RPC", "BatchReply", "BatchRequest", "Commit", "batch_key"]

BATCH_RPC = "batch"
COMMIT_RPC = "commit"


def batch_key(step: int) -> str:
    """Replay-store key of train step ``step``'s batch."""
    return f"step-{int(step)}"
