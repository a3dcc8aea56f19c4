"""The idempotency keys of a dedup window (``dedup.DedupKeys``) and the Broker's use of them."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from state_harness import (  # type: ignore[import-not-found]
    Harness,
    check_dedup,
    state_of,
    v7_snapshot,
)

from raftq.cluster.dedup import DedupKeys, key_digest
from raftq.cluster.state import Broker
from raftq.cluster.storage import StorageCorrupt

AT = 1_700_000_000_000


def digests(n: int, seed: int = 0) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(16) for _ in range(n)]


def test_the_table_agrees_with_a_dict_through_adds_expiries_grows_and_shrinks() -> None:
    rnd = random.Random(7)
    k = DedupKeys()
    model: dict[bytes, tuple[int, int]] = {}  # digest -> (seq, expires_at)
    pool, seq, now, sizes = digests(20_000), 1, AT, set()
    for step in range(400):
        now += rnd.randrange(0, 40)
        k.expire(now)
        model = {d: v for d, v in model.items() if v[1] > now}
        batch: dict[bytes, int] = {}
        for d in rnd.sample(pool, rnd.randrange(1, 120 if step < 250 else 5)):
            if d not in model:
                batch[d] = seq
                seq += 1
        exp = now + rnd.choice([100, 300, 1000])
        k.add(exp, batch)
        model.update({d: (s, exp) for d, s in batch.items()})
        sizes.add(len(k.buckets))
        assert len(k) == len(model)
        if step % 60 == 30:  # a restart: the next steps expire rows before the buckets exist
            k = DedupKeys.restore(k.dump())
            assert len(k) == len(model)
        if step % 40 == 0:
            check_dedup(k, now)
            assert all(k.get(d) == (model[d][0] if d in model else None) for d in pool)
    assert max(sizes) >= 512, "it grew"
    k.expire(now + 1000)
    assert len(k) == 0 and len(k.buckets) == 1, "and shrank back as the window emptied"
    assert all(k.get(d) is None for d in pool)


def test_a_restored_table_builds_its_buckets_for_the_keys_left_at_its_first_use() -> None:
    d = digests(300)
    rows = [[AT + 10 * r, b"".join(d[r * 100 : r * 100 + 100]), 1 + r * 100] for r in range(3)]
    k = DedupKeys.restore(rows)
    assert len(k) == 300 and k.dump() == rows and k.next_expiry() == AT
    assert k.expire(AT + 10) == 200 and len(k) == 100  # rows dropped, nothing built
    assert len(k.buckets) == 1
    assert k.get(d[0]) is None and k.get(d[250]) == 251  # the first use builds the rest
    assert sum(len(b) for b in k.buckets) == 100 * 24
    check_dedup(k, AT + 10)
    assert k.dump() == rows[2:]


def test_a_digest_a_snapshot_held_twice_stops_the_node_at_the_first_use() -> None:
    # ``dump`` never writes one twice; the restore leaves the check to the build (one find
    # a key), which raises what stops a node: a StorageError out of the apply.
    d = digests(3)
    rows = [[AT, d[0] + d[1], 1], [AT + 10, d[2] + d[0], 7]]
    k = DedupKeys.restore(rows)
    assert len(k) == 4 and k.dump() == rows
    with pytest.raises(StorageCorrupt, match="twice"):
        k.get(d[2])
    k = DedupKeys.restore(rows)
    assert k.expire(AT) == 2  # (gone before the build: nothing is held twice any more)
    assert k.get(d[0]) == 8 and k.get(d[1]) is None


def test_a_match_across_two_entries_is_not_a_key() -> None:
    k = DedupKeys()
    a, b = b"A" * 16, b"B" * 16
    k.add(AT + 10, {a: 1, b: 2})
    raw = bytes(k.buckets[0])
    across = raw[8:24]  # the end of a's digest and its seq
    into_b = raw[20:36]  # a's seq and the start of b
    assert raw.find(across) == 8 and raw.find(into_b) == 20
    assert k.get(across) is None and k.get(into_b) is None
    assert k.lookup("x")[1] is None
    # the same bytes as a key of their own, held further on: found there, deleted alone
    k.add(AT + 20, {across: 3, into_b: 4})
    assert (k.get(a), k.get(b), k.get(across), k.get(into_b)) == (1, 2, 3, 4)
    assert k.expire(AT + 10) == 2
    assert (k.get(a), k.get(b), k.get(across), k.get(into_b)) == (None, None, 3, 4)
    check_dedup(k, AT + 10)


def test_lookup_is_the_digest_and_get() -> None:
    k = DedupKeys()
    k.add(AT, {key_digest("k1"): 5})
    assert k.lookup("k1") == (key_digest("k1"), 5)
    assert k.lookup("k2") == (key_digest("k2"), None)
    assert len(key_digest("a key")) == 16 and key_digest("é") != key_digest("e")


def test_publishes_with_one_expiry_share_a_row_and_dump_merges_rows_by_expiry() -> None:
    k = DedupKeys()
    ds = digests(5)
    k.add(AT + 50, {ds[0]: 1})
    k.add(AT + 50, {ds[1]: 2, ds[2]: 3})  # the same entry: extends the row
    k.add(AT + 20, {ds[3]: 4})  # (a shorter window since)
    k.add(AT + 50, {ds[4]: 5})  # not the last row's expiry: a row of its own
    assert len(k.heap) == 3
    seqs = (1).to_bytes(8, "little") + (2).to_bytes(8, "little") + (3).to_bytes(8, "little")
    assert k.dump() == [
        [AT + 20, ds[3], 4],  # (consecutive seqs: the first)
        [AT + 50, ds[0] + ds[1] + ds[2] + ds[4], seqs + (5).to_bytes(8, "little")],
    ]
    again = DedupKeys.restore(k.dump())
    assert again.dump() == k.dump() and len(again.heap) == 2 and len(again) == 5
    assert again.expire(AT + 20) == 1 and again.get(ds[3]) is None and again.get(ds[4]) == 5


def test_restore_refuses_bad_rows() -> None:
    d = digests(2)
    eight = (1).to_bytes(8, "little")
    for rows in (
        [[AT, d[0], eight * 2]],  # one digest, two seqs
        [[AT, b"", 1]],  # no digest
        [[AT, d[0][:15], eight]],  # not a digest
    ):
        with pytest.raises(ValueError):
            DedupKeys.restore(rows)
    with pytest.raises(ValueError):
        DedupKeys.from_keys([(AT, ["a", "b"], [1])])


def test_the_snapshot_holds_16_bytes_a_key_and_round_trips(h: Harness) -> None:
    h.topic("t")
    for i in range(20):
        msgs = [{"payload": b"x", "key": f"key{i}.{j}"} for j in range(50)]  # (not numbered)
        h("publish", topic="t", messages=msgs)
        h.advance(1)
    snap = h.b.snapshot()
    obj = msgpack.unpackb(snap, raw=False)
    assert obj[0] == 9
    rows, high, legacy, records = obj[3][0][9]
    assert high == records == [] and legacy == 0
    assert len(rows) == 20 and all(len(r[1]) == 16 * 50 and r[2] == 50 * i + 1
                                   for i, r in enumerate(rows))  # fmt: skip
    # 16 B a key, and at most 16 B of framing a row (its list, expiry, bin header, first seq)
    # and the list's 3
    assert 16 * 1000 < len(msgpack.packb(rows)) <= 16 * 1000 + 20 * 16 + 3
    twin = Broker()
    twin.restore(snap)
    assert twin.snapshot() == snap and twin.digest() == h.b.digest()
    for b in (h.b, twin):  # and carry on alike: the oldest rows expire, the others answer
        res = b.apply(
            {
                "op": "publish",
                "topic": "t",
                "now": h.now + 101_000,
                "messages": [{"payload": b"y", "key": k} for k in ("key0.0", "key19.7", "new")],
            }
        )
        assert res["messages"] == [
            {"seq": 1001, "duplicate": False},
            {"seq": 19 * 50 + 8, "duplicate": True},
            {"seq": 1002, "duplicate": False},
        ]
    assert twin.snapshot() == h.b.snapshot()


def test_numbered_keys_snapshot_as_runs_and_round_trip(h: Harness) -> None:
    h.topic("t")
    for i in range(10):  # a producer's keys, 100 a publish
        msgs = [{"payload": b"x", "key": f"p1-e2-{100 * i + j + 1}"} for j in range(100)]
        h("publish", topic="t", messages=msgs)
        h.advance(1)
    snap = h.b.snapshot()
    rows, high, legacy, records = msgpack.unpackb(snap, raw=False)[3][0][9]
    assert rows == high == [] and legacy == 0 and [r[0] for r in records] == ["p1-e2"]
    (n0, seqs, exps), = records[0][1]  # fmt: skip
    assert n0 == 1 and seqs == [1, 1000]  # (consecutive: one stretch)
    assert exps == [x for i in range(10) for x in (h.now - (10 - i) * 1000 + 120_000, 100)]
    twin = Broker()
    twin.restore(snap)
    assert twin.snapshot() == snap and twin.digest() == h.b.digest()
    for b in (h.b, twin):
        res = b.apply(
            {
                "op": "publish",
                "topic": "t",
                "now": h.now + 111_000,  # the first two publishes' keys expired
                "messages": [
                    {"payload": b"y", "key": k} for k in ("p1-e2-3", "p1-e2-999", "p1-e2-1001")
                ],
            }
        )
        assert res["messages"] == [
            {"seq": 1001, "duplicate": False},
            {"seq": 999, "duplicate": True},
            {"seq": 1002, "duplicate": False},
        ]
    assert twin.snapshot() == h.b.snapshot()


def test_a_v8_snapshot_keeps_its_digests_and_later_records_ask_them(h: Harness) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"x", "key": f"p-{n}"} for n in (1, 2, 3)])
    old = Broker()
    old.restore(v7_snapshot(h.b, 8))  # every key a digest
    assert len(old.topics["t"].dedup.digests) == 3 and not old.topics["t"].dedup.records
    assert state_of(old) == state_of(h.b)
    h.advance(10)
    for b in (h.b, old):  # p-5 makes a record (two keys) that must still find p-2
        msgs = [{"payload": b"y", "key": k} for k in ("p-5", "p-6", "p-2")]
        res = b.apply({"op": "publish", "topic": "t", "now": h.now, "messages": msgs})
        assert [m["duplicate"] for m in res["messages"]] == [False, False, True]
    assert old.topics["t"].dedup.legacy_until == h.now - 10_000 + 120_000
    assert state_of(old) == state_of(h.b)


def test_a_v7_snapshot_converts_its_keys(h: Harness) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"a", "key": "k1"}, {"payload": b"b"}])
    h.advance(5)
    h("publish", topic="t", messages=[{"payload": b"c", "key": k} for k in ("k2", "k3", "k2")])
    old = v7_snapshot(h.b)
    assert msgpack.unpackb(old, raw=False)[3][0][9] == [
        [h.now - 5000 + 120_000, ["k1"], [1]],
        [h.now + 120_000, ["k2", "k3"], [3, 4]],
    ]
    b = Broker()
    b.restore(old)
    assert b.snapshot() == h.b.snapshot() and b.digest() == h.b.digest()
    res = b.apply(
        {
            "op": "publish",
            "topic": "t",
            "now": h.now + 116_000,
            "messages": [{"payload": b"d", "key": k} for k in ("k1", "k3")],
        }
    )
    assert res["messages"] == [{"seq": 5, "duplicate": False}, {"seq": 4, "duplicate": True}]


def test_keys_of_one_batch_dedup_against_each_other_without_a_window_too(h: Harness) -> None:
    for name, window in (("w", 120), ("nw", 0)):
        h.topic(name, dedup_window=window)
        msgs = [{"payload": b"p", "key": k} for k in ("a", "b", "a", "b", "c")]
        res = h("publish", topic=name, messages=msgs)
        assert [(m["seq"], m["duplicate"]) for m in res["messages"]] == [
            (1, False),
            (2, False),
            (1, True),
            (2, True),
            (3, False),
        ]
        assert len(h.b.topics[name].dedup) == (3 if window else 0)


SCRIPT = """
import sys
from raftq.cluster.state import Broker
b = Broker()
now = 1_700_000_000_000
b.apply({"op": "create_topic", "topic": "t", "now": now, "config": {"dedup_window": 30}})
out = []
for i in range(400):
    now += 250
    msgs = [{"payload": b"p", "key": f"k{(i * 37 + j) % 3000}"} for j in range(40)]
    res = b.apply({"op": "publish", "topic": "t", "now": now, "messages": msgs})
    out.append(sum(m["seq"] * (1 + m["duplicate"]) for m in res["messages"]))
t = b.topics["t"].dedup
print(b.digest(), sum(out), len(t), len(t.digests.buckets))
print(bytes(t.digests.buckets[0][:16]).hex())
"""


def _run(seed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, cwd=root
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_replicas_with_other_hash_seeds_hold_the_same_keys_in_other_buckets() -> None:
    a, b = _run("1"), _run("2")
    assert a[:4] == b[:4], "digest, results, keys held, bucket count: all the same"
    assert int(a[2]) > 1000 and int(a[3]) > 64
    assert a[4] != b[4], "while the keys sit in other buckets (the test would see a difference)"
