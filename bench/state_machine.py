"""Micro-benchmark of the broker state machine on one core (not a test).

    .venv/bin/python bench/state_machine.py [--messages 1000000] [--profile publish|receive]

Measures, through the same path a replica uses (``entry.encode_entry`` on the leader,
``entry.apply_entry`` = decode + ``Broker.apply_batch`` on every replica):

- publish: entries of one publish of 100 messages x 100 bytes; messages applied per second
  (and, for group commit of small requests, entries of 100 one-message publish commands);
- receive+ack: ``receive max=100`` then ``ack`` of those 100 receipts; pairs per second;
- snapshot and restore of ``--messages`` retained messages, and the snapshot size;
- memory per retained message beyond its payload (tracemalloc, and the RSS delta).

Targets: >= 200k publish-applies/s, >= 80k receive+ack pairs/s, snapshot of 1M retained
messages <= 2 s, memory <= payload + ~200 B. Numbers are noisy on a shared machine: run it twice.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import resource
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from raftq.cluster.entry import apply_entry, encode_entry
from raftq.cluster.state import Broker

NOW = 1_700_000_000_000
BATCH = 100
PAYLOAD = 100


def new_broker() -> Broker:
    b = Broker()
    b.apply({"op": "create_topic", "topic": "t", "now": NOW})
    return b


def publish_entries(n_batches: int, start_now: int = NOW, keyed: bool = False) -> list[bytes]:
    """Entries of one publish of BATCH messages; ``keyed``: each with its own idempotency key
    (a uuid-shaped string, as the clients make)."""
    payload = bytes(range(PAYLOAD))
    plain = [{"payload": payload}] * BATCH

    def msgs(i: int) -> list[dict[str, Any]]:
        if not keyed:
            return plain
        return [{"payload": payload, "key": uuid_key(i * BATCH + j)} for j in range(BATCH)]

    return [
        encode_entry(start_now + i, [{"op": "publish", "topic": "t", "messages": msgs(i)}])
        for i in range(n_batches)
    ]


def uuid_key(n: int) -> str:
    """A uuid-shaped key, distinct for every n (deterministic)."""
    h = f"{n * 0x9E3779B97F4A7C15 % (1 << 128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def bench_publish(n_batches: int) -> dict[str, float]:
    b = new_broker()
    entries = publish_entries(n_batches)
    gc.collect()
    t0 = time.perf_counter()
    for data in entries:
        apply_entry(b, data)
    dt = time.perf_counter() - t0
    assert b.topic_stats("t")["messages"] == n_batches * BATCH
    return {"messages_per_s": n_batches * BATCH / dt, "entries_per_s": n_batches / dt}


def bench_publish_small(n_batches: int) -> dict[str, float]:
    """Group commit of small requests: 100 publish commands of one message in each entry."""
    b = new_broker()
    payload = bytes(range(PAYLOAD))
    cmds = [{"op": "publish", "topic": "t", "messages": [{"payload": payload}]}] * BATCH
    entries = [encode_entry(NOW + i, cmds) for i in range(n_batches)]
    gc.collect()
    t0 = time.perf_counter()
    for data in entries:
        apply_entry(b, data)
    dt = time.perf_counter() - t0
    assert b.topic_stats("t")["messages"] == n_batches * BATCH
    return {"messages_per_s": n_batches * BATCH / dt}


def bench_receive_ack(n_batches: int) -> dict[str, float]:
    b = new_broker()
    for data in publish_entries(n_batches):
        apply_entry(b, data)
    now = NOW + n_batches
    token = b"\x07" * 16
    gc.collect()
    t0 = time.perf_counter()
    pairs = 0
    for _ in range(n_batches):
        now += 1
        cmd: dict[str, Any] = {"op": "receive", "topic": "t", "group": "default"}
        cmd.update(consumer="c1", max=BATCH, token=token)
        (res,) = apply_entry(b, encode_entry(now, [cmd]))
        receipts = [d["receipt"] for d in res["deliveries"]]
        (ack,) = apply_entry(b, encode_entry(now, [{"op": "ack", "receipts": receipts}]))
        pairs += ack["acked"]
    dt = time.perf_counter() - t0
    assert pairs == n_batches * BATCH and b.topic_stats("t")["messages"] == 0
    return {"pairs_per_s": pairs / dt}


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def bench_snapshot(n_messages: int) -> dict[str, float]:
    gc.collect()
    rss0 = rss_bytes()
    b = new_broker()
    for i in range(n_messages // BATCH):  # one entry at a time: the log is not counted
        apply_entry(b, publish_entries(1, NOW + i)[0])
    gc.collect()
    rss1 = rss_bytes()
    t0 = time.perf_counter()
    snap = b.snapshot()
    t_snap = time.perf_counter() - t0
    other = Broker()
    t0 = time.perf_counter()
    other.restore(snap)
    t_restore = time.perf_counter() - t0
    assert other.topic_stats("t")["messages"] == n_messages
    return {
        "messages": n_messages,
        "snapshot_s": t_snap,
        "restore_s": t_restore,
        "snapshot_mb": len(snap) / 1e6,
        "rss_overhead_per_msg_b": (rss1 - rss0) / n_messages - PAYLOAD,
    }


def bench_memory(n_messages: int) -> dict[str, float]:
    """tracemalloc: bytes allocated per retained message beyond its payload, with the
    entries decoded one at a time as a replica would (the encoded log is not counted)."""
    b = new_broker()
    entries = publish_entries(n_messages // BATCH)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for data in entries:
        apply_entry(b, data)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"overhead_per_msg_b": (after - before) / n_messages - PAYLOAD}


def profile(fn: Callable[[], Any]) -> None:
    prof = cProfile.Profile()
    prof.runcall(fn)
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000, help="retained, for snapshot")
    ap.add_argument("--batches", type=int, default=2000, help="batches of 100 per rate test")
    ap.add_argument("--profile", choices=["publish", "receive"])
    args = ap.parse_args()
    if args.profile == "publish":
        profile(lambda: bench_publish(args.batches))
        return
    if args.profile == "receive":
        profile(lambda: bench_receive_ack(args.batches))
        return
    pub = bench_publish(args.batches)
    print(
        f"publish       {pub['messages_per_s']:>12,.0f} messages/s "
        f"({pub['entries_per_s']:,.0f} entries of {BATCH} x {PAYLOAD} B)   target >= 200,000"
    )
    small = bench_publish_small(args.batches)
    print(
        f"publish       {small['messages_per_s']:>12,.0f} messages/s "
        f"(entries of {BATCH} publish commands of 1 message each)"
    )
    ra = bench_receive_ack(args.batches)
    print(f"receive+ack   {ra['pairs_per_s']:>12,.0f} pairs/s   target >= 80,000")
    mem = bench_memory(min(args.messages, 200_000))
    print(
        f"memory        {mem['overhead_per_msg_b']:>12,.0f} B per retained message beyond "
        f"its payload (tracemalloc)   target <= ~200"
    )
    snap = bench_snapshot(args.messages)
    print(
        f"snapshot      {snap['snapshot_s']:>12.3f} s for {snap['messages']:,} retained "
        f"messages ({snap['snapshot_mb']:.0f} MB)   target <= 2 s"
    )
    print(f"restore       {snap['restore_s']:>12.3f} s")
    print(
        f"memory (RSS)  {snap['rss_overhead_per_msg_b']:>12,.0f} B per retained message "
        "beyond its payload"
    )


if __name__ == "__main__":
    main()
