"""A worker: bill each order, up to ``--concurrency`` at a time, until SIGINT/SIGTERM.

    python examples/worker.py --concurrency 10          # RAFTQ_URL, RAFTQ_TOKEN from the env

``subscribe`` runs the handler in ``msg.process()``: the message is acked when the handler
returns and nacked (redelivered after ``--retry-delay`` seconds) when it raises. After
``--max-attempts`` deliveries a message goes to the dead-letter topic ``<topic>.dlq`` (see
dlq.py). On a signal the worker stops taking messages and lets running handlers finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal

from raftq.client import AsyncClient, AsyncMessage

log = logging.getLogger("worker")


async def bill(msg: AsyncMessage) -> None:
    order = json.loads(msg.payload)
    if order["amount"] <= 0:
        raise ValueError(f"order {order['id']}: amount {order['amount']} is not billable")
    await asyncio.sleep(0.01)  # the work: a call to the billing service
    print(f"billed order {order['id']} ({order['amount']}) seq={msg.seq}", flush=True)


async def work(
    url: str, topic: str, group: str, concurrency: int, args: argparse.Namespace
) -> None:
    def leader_changed(old: str | None, new: str) -> None:
        log.info("leader: %s -> %s", old, new)

    async with AsyncClient(url, on_leader_change=leader_changed) as client:
        await client.create_topic(topic, if_not_exists=True)
        config = {"max_attempts": args.max_attempts}
        await client.create_group(topic, group, config, start="earliest", if_not_exists=True)
        sub = await client.subscribe(
            topic, group, bill, concurrency=concurrency, nack_delay=args.retry_delay
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"working on {topic}/{group}", flush=True)
        ended = asyncio.ensure_future(sub.wait())
        waiting = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ended, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        await sub.stop()
        print("stopped", flush=True)
        if ended.done():
            ended.result()  # (the subscription failed: say why)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("RAFTQ_URL", "http://127.0.0.1:8001"))
    p.add_argument("--topic", default="orders")
    p.add_argument("--group", default="billing")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--retry-delay", type=float, default=1.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(work(args.url, args.topic, args.group, args.concurrency, args))


if __name__ == "__main__":
    main()
