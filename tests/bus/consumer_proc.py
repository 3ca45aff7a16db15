"""A consumer in its own process, for crash tests: fetch one delivery, optionally ack it
(confirmed), print what happened, then wait to be SIGKILLed.

    python consumer_proc.py URL RUN_ID DURABLE {hold|ack} ACK_WAIT
"""

from __future__ import annotations

import asyncio
import sys


async def main(url: str, run_id: str, durable: str, mode: str, ack_wait: float) -> None:
    import bus
    from schemas.config import NatsConfig

    cfg = NatsConfig(url=url, ack_wait=ack_wait, connect_wait=5)
    nc = await bus.connect(cfg, name=f"proc-{durable}")
    c = await bus.Consumer(nc, cfg, run_id, "exp", durable).start()
    items: list = []
    while not items:
        items = await c.fetch(1, timeout=2)
    if mode == "ack":
        assert await c.ack(items)
        print(f"ACKED {items[0].msg_id}", flush=True)
    else:
        print(f"GOT {items[0].msg_id}", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    url, run_id, durable, mode, ack_wait = sys.argv[1:6]
    asyncio.run(main(url, run_id, durable, mode, float(ack_wait)))
