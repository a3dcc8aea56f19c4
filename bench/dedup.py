"""Cost of the idempotency keys of a dedup window (``dedup.DedupKeys``; issue 22; not a test).

    .venv/bin/python bench/dedup.py [--keys 1000000] [--topics 100] [--per-topic 10000]

Memory per key (tracemalloc of the structure built as ``_op_publish`` builds it: 16-byte
digests of uuid strings, one ``add`` per publish command) for one topic of --keys keys in
publishes of 100 keys, of 1 key (entries of 50 publishes share an expiry, so a row), and of
1 key each with its own expiry (the worst case: a row per key); then --topics topics of
--per-topic keys; against main's layout (a dict of str keys and one heap row per publish; the
key strings counted too). Snapshot bytes per key (``msgpack`` of ``dump()``). CPU per key of
``get`` (a miss and a hit), ``add``, ``expire``, ``dump`` and ``restore`` (rows; the buckets
are built at the first use), against the dict. Then the topic's whole table
(``keys.TopicKeys``) as ``_op_publish`` drives it (lookup then add): the clients' numbered
keys (``<producer>-<epoch>-<n>``) in publishes of 100 and of 1, and uuid keys, against the
digest table alone; bytes per key (``nbytes``) and snapshot bytes per key.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import random
import time
import tracemalloc
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack

from raftq.cluster.dedup import DedupKeys, key_digest
from raftq.cluster.keys import TopicKeys

AT = 1_700_000_000_000


def uuids(n: int, seed: int = 1) -> list[str]:
    rnd = random.Random(seed)
    return [str(uuid.UUID(int=rnd.getrandbits(128))) for _ in range(n)]


def traced(build: Callable[[], Any]) -> tuple[Any, int]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj = build()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return obj, used


def build_new(digests: list[bytes], per_publish: int, per_entry: int) -> DedupKeys:
    """``add`` per publish; ``per_entry`` publishes share a ``now`` (one entry)."""
    k = DedupKeys()
    for p, b in enumerate(range(0, len(digests), per_publish)):
        k.add(
            AT + p // per_entry, {d: b + i + 1 for i, d in enumerate(digests[b : b + per_publish])}
        )
    return k


def build_old(keys: list[str], per_publish: int) -> Any:
    """main's layout: dict key -> seq, heap rows (expires_at, first seq, [keys])."""
    d: dict[str, int] = {}
    heap: list[Any] = []
    for b in range(0, len(keys), per_publish):
        batch = {k: b + i + 1 for i, k in enumerate(keys[b : b + per_publish])}
        d.update(batch)
        heapq.heappush(heap, (AT + b, b + 1, list(batch)))
    return d, heap


def memory(n: int) -> None:
    print(f"memory per key, {n:,} keys in one topic (uuid keys; tracemalloc):")
    keys = uuids(n)
    ds = [key_digest(k) for k in keys]
    for label, per_publish, per_entry in (
        ("100 a publish", 100, 1),
        ("1 a publish, 50 publishes an entry", 1, 50),
        ("1 a publish, an entry each (worst)", 1, 1),
    ):
        k, used = traced(partial(build_new, ds, per_publish, per_entry))
        snap = len(msgpack.packb(k.dump(), use_bin_type=True))
        print(
            f"  {label:<36} {used / n:6.1f} B/key ({len(k.buckets):,} buckets,"
            f" {len(k.heap):,} rows); snapshot {snap / n:5.1f} B/key"
        )
        del k
    for label, per_publish in (("100 a publish", 100), ("1 a publish", 1)):
        strs = uuids(n)  # the key strings are new objects in a publish: counted
        _, used = traced(partial(build_old, strs, per_publish))
        _, str_bytes = traced(lambda: uuids(n))
        print(
            f"  main (dict + rows), {label:<16} {(used + str_bytes) / n:6.1f} B/key"
            f" (of which key strings {str_bytes / n:.1f})"
        )


def many_topics(topics: int, per_topic: int) -> None:
    ds = [key_digest(k) for k in uuids(topics * per_topic, seed=2)]

    def build() -> list[DedupKeys]:
        out = []
        for t in range(topics):
            out.append(build_new(ds[t * per_topic : (t + 1) * per_topic], 100, 1))
        return out

    ks, used = traced(build)
    n = topics * per_topic
    empty, used0 = traced(lambda: [DedupKeys() for _ in range(topics)])
    print(
        f"{topics} topics x {per_topic:,} keys: {used / n:6.1f} B/key;"
        f" an empty DedupKeys {used0 / topics:.0f} B"
    )
    del ks, empty


def best(f: Callable[[], Any], rounds: int = 5) -> float:
    out = float("inf")
    for _ in range(rounds):
        gc.collect()
        t0 = time.process_time()
        f()
        out = min(out, time.process_time() - t0)
    return out


def cpu(n: int) -> None:
    print(f"CPU per key ({n:,} keys held, 100 a publish; best of 5, process_time):")
    keys = uuids(n, seed=3)
    misses = uuids(100_000, seed=4)
    ds = [key_digest(k) for k in keys]
    k = build_new(ds, 100, 1)
    d = {key: i for i, key in enumerate(keys)}
    probe = keys[:: max(1, n // 100_000)][:100_000]
    m = len(misses)
    r: dict[str, float] = {}
    r["digest"] = best(lambda: [key_digest(x) for x in misses]) / m
    r["get miss (digest given)"] = (
        best(lambda: [k.get(key_digest(x)) for x in misses]) / m - r["digest"]
    )
    r["get hit (digest given)"] = (
        best(lambda: [k.get(key_digest(x)) for x in probe]) / len(probe) - r["digest"]
    )
    r["dict get (main)"] = best(lambda: [d.get(x) for x in misses]) / m

    def add_expire() -> tuple[float, float]:
        kk = build_new(ds[:150_000], 100, 1)  # 32,768 buckets: 100k more fit without a grow
        extra = [key_digest(x) for x in misses]
        t0 = time.process_time()
        for p, b in enumerate(range(0, m, 100)):
            kk.add(AT + 10**6 + p, {dd: b + i for i, dd in enumerate(extra[b : b + 100])})
        t1 = time.process_time()
        kk.expire(AT + 10**6 + m)  # the 150k older and these
        t2 = time.process_time()
        return (t1 - t0) / m, (t2 - t1) / (m + 150_000)

    pairs = [add_expire() for _ in range(5)]
    r["add, 100 a publish (no grow)"] = min(p[0] for p in pairs)
    r["expire (row by row, shrinking to 0)"] = min(p[1] for p in pairs)
    r["build from empty, with grows (add)"] = best(lambda: build_new(ds, 100, 1), 3) / n
    dumped = k.dump()
    r["dump"] = best(k.dump, 3) / n
    r["restore (rows only)"] = best(lambda: DedupKeys.restore(dumped), 3) / n
    r["restore and first get (the build)"] = (
        best(lambda: DedupKeys.restore(dumped).get(ds[0]), 3) / n
    )
    for name, sec in r.items():
        print(f"  {name:<38} {sec * 1e9:7.0f} ns")


def whole_table(n: int) -> None:
    print(f"TopicKeys against DedupKeys alone ({n:,} keys, lookup + add a key, perf_counter):")
    prefix = f"{random.Random(5).getrandbits(64):016x}-{random.Random(6).getrandbits(32):08x}"
    numbered = [f"{prefix}-{i}" for i in range(1, n + 1)]
    uuid_keys = uuids(n, seed=7)

    def fill(k: Any, keys: list[str], per: int) -> float:
        seq = 1
        t0 = time.perf_counter()
        for j in range(0, len(keys), per):
            batch = {}
            for key in keys[j : j + per]:
                tok, _ = k.lookup(key)
                batch[tok] = seq
                seq += 1
            k.add(AT, batch)
        return (time.perf_counter() - t0) / len(keys)

    for name, keys, per in (
        ("client keys, 100 a publish", numbered, 100),
        ("client keys, 1 a publish", numbered, 1),
        ("uuid keys, 100 a publish", uuid_keys, 100),
    ):
        gc.collect()
        alone = fill(DedupKeys(), keys, per)
        gc.collect()
        k = TopicKeys()
        both = fill(k, keys, per)
        snap = len(msgpack.packb(k.dump())) / n
        print(
            f"  {name:<28} DedupKeys {alone * 1e9:5.0f} ns, TopicKeys {both * 1e9:5.0f} ns;"
            f" {k.nbytes() / n:5.1f} B a key, {snap:4.1f} in a snapshot"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--per-topic", type=int, default=10_000)
    ap.add_argument("--skip-cpu", action="store_true")
    args = ap.parse_args()
    memory(args.keys)
    many_topics(args.topics, args.per_topic)
    if not args.skip_cpu:
        cpu(args.keys)
        whole_table(args.keys)


if __name__ == "__main__":
    main()
