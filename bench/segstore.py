"""Micro-benchmark of the payload store and the compact index (issue 22; not a test).

    .venv/bin/python bench/segstore.py [--messages 1000000] [--index-sizes 1000000,10000000]
                                       [--payload 100] [--dir DIR]
                                       [--batch-messages 300000] [--only-batches]

Measures on one core, through the real file system (``OsDisk``):

- append_batch: the cost per message of ``append_batch`` (one record per call) for batches of
  1, 10 and 100 messages of 100 B and 1 KiB (no headers; then 100 x 100 B with a header map on
  one in ten), with reads of the same messages one by one, by ``read_batch`` of 100 (where the
  store has it) and at random; ``--versus <other checkout>`` runs each case with the other
  checkout's store and then this one's, in fresh processes (the A/B);
- append: ``SegmentStore.append`` of --messages x --payload bytes (a header map on every tenth),
  then one ``sync()`` (fdatasync of every segment); messages/s and MB/s, sync time;
- read: every message read back in seq order, and 200k at random (page cache warm);
- compaction: two records in three freed, then every candidate compacted;
- restore: ``truncate_to`` + ``MsgIndex.restore`` from the sidecars (what a restart does
  before replaying the journal), and the size of the index's part of a snapshot (``dump()``);
- memory per message of ``MsgIndex`` at each --index-sizes (``nbytes`` and tracemalloc),
  against today's ``Topic.msgs`` + ``refs`` (a tuple and list slots per message, payload
  excluded), and per key of ``dedup.DedupKeys`` against a dict of str keys + heap rows
  (``bench/dedup.py`` has more on the keys).

Numbers are noisy on a shared machine: run it twice.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from typing import Any

from raftq.cluster.dedup import DedupKeys, key_digest
from raftq.cluster.msgindex import MsgIndex
from raftq.cluster.segstore import SegmentStore
from raftq.cluster.storage import OsDisk

AT = 1_700_000_000_000


def _batches(n: int, batch: int, payload: bytes, headers_every: int) -> list[list[Any]]:
    hdrs = {"trace": "abc123", "kind": "order"}
    items = [
        (payload, hdrs if headers_every and i % headers_every == 0 else None) for i in range(n)
    ]
    return [items[i : i + batch] for i in range(0, n, batch)]


def bench_append(n: int, payload_size: int, batch: int, headers_every: int, directory: str) -> None:
    """``append_batch`` of ``batch`` messages at a time; the cost per message, then reads."""
    shutil.rmtree(directory, ignore_errors=True)
    payload = os.urandom(payload_size)
    batches = _batches(n, batch, payload, headers_every)
    s = SegmentStore(OsDisk(), directory)
    s.truncate_to([])
    where: list[tuple[int, int, int]] = []
    seq = 1
    gc.collect()
    t0 = time.perf_counter()
    done = []
    for items in batches:
        done.append((seq, s.append_batch("bench.1", seq, AT + seq, items)))
        seq += len(items)
    t1 = time.perf_counter()
    for first, (locs, shares) in done:
        where.extend(zip(range(first, first + len(locs)), locs, shares, strict=True))
    s.sync()
    t2 = time.perf_counter()
    disk = s.retained_bytes()[1]
    hdr = f", headers on 1 in {headers_every}" if headers_every else ""
    print(
        f"append_batch {batch:>3} x {payload_size:>4} B{hdr}: {1e6 * (t1 - t0) / n:6.3f} us/msg"
        f" ({n / (t1 - t0):>10,.0f} msg/s, {disk / (t1 - t0) / 1e6:6.1f} MB/s);"
        f" sync {1000 * (t2 - t1):.0f} ms; {(disk - n * payload_size) / n:.1f} B/msg overhead"
    )
    t0 = time.perf_counter()
    for q, loc, share in where:
        s.read("bench.1", q, loc, share)
    t1 = time.perf_counter()
    line = f"  read one by one in seq order {1e6 * (t1 - t0) / n:6.3f} us/msg"
    if hasattr(s, "read_batch"):
        t0 = time.perf_counter()
        for i in range(0, n, 100):
            s.read_batch("bench.1", where[i : i + 100])
        t1 = time.perf_counter()
        line += f"; read_batch of 100 {1e6 * (t1 - t0) / n:6.3f} us/msg"
    rnd = random.Random(1)
    picks = [where[rnd.randrange(n)] for _ in range(min(n, 100_000))]
    t0 = time.perf_counter()
    for q, loc, share in picks:
        s.read("bench.1", q, loc, share)
    t1 = time.perf_counter()
    print(f"{line}; at random {1e6 * (t1 - t0) / len(picks):6.3f} us/msg")
    s.close()


def _versus(other: str, case: tuple[int, int, int], n: int) -> None:
    """One case with the other checkout's store, then with this one's (fresh processes)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for label, root in (("before", other), ("after ", here)):
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(root), "cluster"))
        cmd = [sys.executable, os.path.abspath(__file__), "--case", ",".join(map(str, case))]
        out = subprocess.run(
            [*cmd, "--batch-messages", str(n)], env=env, check=True, capture_output=True, text=True
        ).stdout
        print("\n".join(f"{label} {line}" for line in out.splitlines()))


def bench_store(n: int, payload_size: int, directory: str) -> None:
    payload = os.urandom(payload_size)
    hdrs = {"trace": "abc123", "kind": "order"}
    s = SegmentStore(OsDisk(), directory)
    s.truncate_to([])
    ix = MsgIndex()
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        h = hdrs if i % 10 == 0 else None
        loc, length = s.append("bench.1", i, AT + i, payload, h)
        ix.append(loc, length, payload_size, AT + i, 1)
    t1 = time.perf_counter()
    epoch, marks = s.marks()
    s.sync()
    t2 = time.perf_counter()
    disk = s.retained_bytes()[1]
    print(
        f"append  {n:>10,} x {payload_size} B: {n / (t1 - t0):>10,.0f} msg/s"
        f" {disk / (t1 - t0) / 1e6:7.1f} MB/s; sync {1000 * (t2 - t1):.0f} ms;"
        f" {disk / 1e6:.1f} MB in {len(marks[0][2])} segments"
        f" ({(disk - n * payload_size) / n:.1f} B overhead/msg)"
    )
    t0 = time.perf_counter()
    for seq in range(1, n + 1):
        loc, length, _, _ = ix.get(seq) or (0, 0, 0, 0)
        s.read("bench.1", seq, loc, length)
    t1 = time.perf_counter()
    print(f"read    in seq order:        {n / (t1 - t0):>10,.0f} msg/s")
    rnd = random.Random(1)
    picks = [rnd.randrange(1, n + 1) for _ in range(min(n, 200_000))]
    t0 = time.perf_counter()
    for seq in picks:
        loc, length, _, _ = ix.get(seq) or (0, 0, 0, 0)
        s.read("bench.1", seq, loc, length)
    t1 = time.perf_counter()
    print(f"read    at random:           {len(picks) / (t1 - t0):>10,.0f} msg/s")

    for seq in (q for q in range(1, n + 1) if q % 3):  # two in three acked
        loc, length, _ = ix.remove(seq) or (0, 0, 0)
        s.free("bench.1", loc, length)
    t0 = time.perf_counter()
    moved = 0
    for key, segno in s.candidates():
        m = s.compact(key, segno, ix.is_live)
        ix.relocate(m)
        moved += len(m)
    t1 = time.perf_counter()
    print(
        f"compact {moved:>10,} live records moved: {moved / max(t1 - t0, 1e-9):>10,.0f} rec/s"
        f" ({s.retained_bytes()[1] / 1e6:.1f} MB left)"
    )
    epoch, marks = s.marks()
    s.sync()
    s.commit(epoch)
    dumped = ix.dump()
    s.close()

    t0 = time.perf_counter()
    again = SegmentStore(OsDisk(), directory)
    again.truncate_to(marks)
    t1 = time.perf_counter()
    restored = MsgIndex.restore(dumped, again.columns("bench.1"))
    t2 = time.perf_counter()
    assert restored.next_seq == ix.next_seq and restored.get(n) == ix.get(n)
    print(
        f"restore truncate_to {1000 * (t1 - t0):.0f} ms; index of {len(restored):,} positions"
        f" from sidecars {1000 * (t2 - t1):.0f} ms; its snapshot part {len(dumped[2]):,} B"
    )
    again.close()


def _traced(build: object) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    obj = build() if callable(build) else None
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return obj, used


def bench_index(n: int) -> None:
    def new_index() -> MsgIndex:
        ix = MsgIndex()
        for i in range(n):
            ix.append(i << 7, 132, 100, AT + i // 100, 2)
        return ix

    ix, used = _traced(new_index)
    assert isinstance(ix, MsgIndex)
    print(
        f"MsgIndex    {n:>11,} messages: {ix.nbytes() / n:5.1f} B/msg (arrays),"
        f" {used / n:5.1f} B/msg traced"
    )
    del ix
    if n <= 2_000_000:  # today's layout, for comparison (payload bytes shared, not counted)

        def old_layout() -> tuple[list[object], list[int]]:
            msgs: list[object] = []
            refs: list[int] = []
            p = b"x" * 100
            for i in range(n):
                msgs.append((p, AT + i // 100, None))
                refs.append(2)
            return msgs, refs

        _, used = _traced(old_layout)
        print(f"  (today: Topic.msgs + refs {used / n:5.1f} B/msg beyond the payload)")


def bench_dedup(n: int) -> None:
    keys = [str(uuid.UUID(int=random.Random(i).getrandbits(128))) for i in range(n)]

    def new() -> DedupKeys:
        k = DedupKeys()
        for b in range(0, n, 100):
            k.add(AT + b, {key_digest(keys[i]): i + 1 for i in range(b, min(b + 100, n))})
        return k

    def old() -> tuple[dict[str, int], list[tuple[int, int, list[str]]]]:
        d: dict[str, int] = {}
        heap = []
        for b in range(0, n, 100):
            batch = keys[b : b + 100]
            for i, key in enumerate(batch):
                d[key] = b + i + 1
            heap.append((AT + b, b + 1, list(batch)))
        return d, heap

    _, used_new = _traced(new)
    _, used_old = _traced(old)
    print(
        f"DedupKeys   {n:>11,} keys (uuid strings, 100 a publish): {used_new / n:5.1f} B/key;"
        f" today's dict of str keys + rows {used_old / n:5.1f} B/key + the key strings"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--index-sizes", default="1000000,10000000")
    ap.add_argument("--dedup-keys", type=int, default=1_000_000)
    ap.add_argument("--batch-messages", type=int, default=300_000)
    ap.add_argument("--only-batches", action="store_true", help="skip everything else")
    ap.add_argument(
        "--versus",
        metavar="CHECKOUT",
        help="A/B: run each append_batch case with the store of CHECKOUT (another checkout of"
        " raftq), then with this one's, each in a fresh process, alternating",
    )
    ap.add_argument("--case", help=argparse.SUPPRESS)  # size,batch,headers_every (--versus)
    ap.add_argument("--dir", default=None, help="where the segments go (default: a temp dir)")
    args = ap.parse_args()
    directory = tempfile.mkdtemp(prefix="raftq-segbench-", dir=args.dir)
    cases = [(size, batch, 0) for size in (100, 1024) for batch in (1, 10, 100)]
    cases.append((100, 100, 10))
    try:
        if args.case:
            size, batch, every = map(int, args.case.split(","))
            bench_append(args.batch_messages, size, batch, every, directory)
            return
        for case in cases:
            if args.versus:
                _versus(args.versus, case, args.batch_messages)
            else:
                bench_append(args.batch_messages, *case[:2], case[2], directory)
        if args.only_batches or args.versus:
            return
        shutil.rmtree(directory, ignore_errors=True)
        bench_store(args.messages, args.payload, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    for size in args.index_sizes.split(","):
        bench_index(int(size))
    bench_dedup(args.dedup_keys)


if __name__ == "__main__":
    main()
