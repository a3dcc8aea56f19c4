"""Publish orders to a topic as fast as the cluster takes them.

    python examples/producer.py --count 1000            # RAFTQ_URL, RAFTQ_TOKEN from the env

``publish_nowait`` returns at once with a future of the sequence number; past ``max_pending``
unanswered messages it waits for answers, so a fast producer is slowed to the cluster's pace
instead of queueing without bound. Every message carries an idempotency key, so the client's
retries (leader change, a dropped connection) store each one once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from raftq.client import AsyncClient


async def produce(url: str, topic: str, count: int, invalid: int) -> int:
    async with AsyncClient(url, max_pending=1000) as client:
        await client.create_topic(topic, if_not_exists=True)
        futures = []
        for i in range(count + invalid):
            order = {"id": i, "amount": 10 + i % 90 if i < count else -1}
            body = json.dumps(order).encode()
            futures.append(await client.publish_nowait(topic, body, headers={"kind": "order"}))
        seqs = await asyncio.gather(*futures)
    print(f"published {len(seqs)} orders to {topic} (seq {min(seqs)}..{max(seqs)})")
    return len(seqs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("RAFTQ_URL", "http://127.0.0.1:8001"))
    p.add_argument("--topic", default="orders")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--invalid", type=int, default=0, help="orders the worker will refuse")
    args = p.parse_args()
    asyncio.run(produce(args.url, args.topic, args.count, args.invalid))


if __name__ == "__main__":
    main()
