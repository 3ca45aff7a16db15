"""The batch request/reply between trainer and buffer (``trinity.<run>.rpc.batch``/``commit``).

A request names the train step; the buffer answers with the experiences of that step, each as
its stored codec bytes (no re-encoding). The step is the key of the batch in the replay store
(``step-N``), so asking again for an uncommitted step returns the same experiences: that is
how a restarted trainer neither skips nor repeats experience. ``commit`` tells the buffer that
every step up to N is checkpointed, so those batches can never be asked for again.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from schemas import codec
from schemas.data import Experience

BATCH_RPC = "batch"
COMMIT_RPC = "commit"


def batch_key(step: int) -> str:
    """Replay-store key of train step ``step``'s batch."""
    return f"step-{int(step)}"


@dataclass
class BatchRequest:
    step: int
    n: int
    trainer_version: int = 0
    timeout: float | None = None

    def pack(self) -> bytes:
        return msgpack.packb({"step": self.step, "n": self.n, "trainer_version": self.trainer_version,
                              "timeout": self.timeout})

    @classmethod
    def unpack(cls, data: bytes) -> BatchRequest:
        try:
            d = msgpack.unpackb(data)
            req = cls(int(d["step"]), int(d["n"]), int(d.get("trainer_version", 0)), d.get("timeout"))
        except Exception as e:
            raise ValueError(f"batch request: not a msgpack map with step and n ({e})") from e
        if req.step < 1 or req.n < 1:
            raise ValueError(f"batch request: step {req.step} and n {req.n} must be >= 1")
        return req


@dataclass
class BatchReply:
    step: int
    items: list[bytes]
    use_counts: list[int]
    requested: int
    #: No more experience will come (the explorer finished and everything is served, or a
    #: dataset's epochs are done): the trainer trains on what it got and finishes.
    exhausted: bool = False

    @property
    def partial(self) -> bool:
        return len(self.items) < self.requested

    def pack(self) -> bytes:
        return msgpack.packb({"step": self.step, "items": self.items, "use_counts": self.use_counts,
                              "requested": self.requested, "exhausted": self.exhausted})

    @classmethod
    def unpack(cls, data: bytes) -> BatchReply:
        d = msgpack.unpackb(data)
        return cls(int(d["step"]), list(d["items"]), list(d["use_counts"]), int(d["requested"]),
                   bool(d.get("exhausted", False)))

    def experiences(self) -> list[Experience]:
        out = []
        for raw, uc in zip(self.items, self.use_counts, strict=True):
            e = codec.decode(raw, Experience)
            e.info["use_count"] = uc
            out.append(e)
        return out
