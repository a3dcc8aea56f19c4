"""Look at the dead letters of a topic, and send them back once the cause is fixed.

    python examples/dlq.py --topic orders               # list what is in orders.dlq
    python examples/dlq.py --topic orders --redrive     # move them back to orders

A message that failed ``max_attempts`` times (or was ``term``-ed) goes to ``<topic>.dlq``, with
headers saying why (``x-raftq-dlq-*``). ``redrive`` publishes them to their topic again, where
every group gets them anew.
"""

from __future__ import annotations

import argparse
import os

from raftq.client import Client, TopicNotFound


def show(url: str, topic: str, redrive: bool, limit: int) -> int:
    dlq = f"{topic}.dlq"
    with Client(url) as client:
        try:
            dead = client.peek(dlq, limit=limit)
        except TopicNotFound:
            print(f"{dlq}: no dead letters yet")
            return 0
        for m in dead:
            why = {k: v for k, v in m.get("headers", {}).items() if k.startswith("x-raftq-dlq")}
            print(f"seq={m['seq']} {m['payload'].decode(errors='replace')} {why}")
        print(f"{len(dead)} dead letter(s) in {dlq}")
        if redrive and dead:
            res = client.redrive(dlq)
            print(f"redrove {res['redriven']} to {topic}")
        return len(dead)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("RAFTQ_URL", "http://127.0.0.1:8001"))
    p.add_argument("--topic", default="orders")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--redrive", action="store_true")
    args = p.parse_args()
    show(args.url, args.topic, args.redrive, args.limit)


if __name__ == "__main__":
    main()
