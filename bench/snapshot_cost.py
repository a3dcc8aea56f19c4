"""``Broker.snapshot_cost`` against the time ``Broker.snapshot`` takes (not a test).

    .venv/bin/python bench/snapshot_cost.py

The Raft binding serializes a state whose estimate is under ``INLINE_SNAPSHOT_US`` on its tick
thread (no fork), so the estimate must not be low by much where it matters: in-flight
deliveries, idempotency keys, retained messages. Builds one state of each kind (store on disk
in a temporary directory) and prints the estimate, the time taken (best of 3) and their ratio.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable

from raftq.cluster.segstore import SegmentStore
from raftq.cluster.state import Broker
from raftq.cluster.storage import OsDisk

NOW = 1_700_000_000_000


def broker(tmp: str) -> Broker:
    store = SegmentStore(OsDisk(), tempfile.mkdtemp(dir=tmp))
    store.truncate_to([])
    b = Broker(store)
    b.apply({"op": "create_topic", "topic": "t", "now": NOW})
    b.apply({"op": "create_group", "topic": "t", "group": "g", "now": NOW})
    return b


def publish(b: Broker, n: int, keyed: bool) -> None:
    for i in range(0, n, 1000):
        msgs = [
            {"payload": b"x" * 10, **({"key": str(uuid.uuid4())} if keyed else {})}
            for _ in range(min(1000, n - i))
        ]
        b.apply({"op": "publish", "topic": "t", "now": NOW + 1 + i // 1000, "messages": msgs})


def receive(b: Broker, n: int) -> None:
    for _ in range(0, n, 1000):
        b.apply({"op": "receive", "topic": "t", "group": "g", "consumer": "c", "max": 1000,
                 "now": NOW + 10**6, "token": os.urandom(16)})  # fmt: skip


def row(label: str, build: Callable[[Broker], None], tmp: str) -> None:
    b = broker(tmp)
    build(b)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        b.snapshot()
        best = min(best, time.perf_counter() - t0)
    est = b.snapshot_cost()
    print(f"  {label:<34} estimate {est / 1e3:7.1f} ms  took {best * 1e3:7.1f} ms"
          f"  took/estimate {best * 1e6 / est:4.2f}")  # fmt: skip


def in_flight(n: int) -> Callable[[Broker], None]:
    def build(b: Broker) -> None:
        publish(b, n, False)
        receive(b, n)

    return build


def main() -> None:
    print("Broker.snapshot_cost (estimate) against Broker.snapshot (best of 3):")
    with tempfile.TemporaryDirectory() as tmp:
        row("empty topic and group", lambda b: None, tmp)
        row("1M retained messages", lambda b: publish(b, 1_000_000, False), tmp)
        row("200k idempotency keys", lambda b: publish(b, 200_000, True), tmp)
        row("100k in flight", in_flight(100_000), tmp)
        row("10k in flight", in_flight(10_000), tmp)


if __name__ == "__main__":
    main()
