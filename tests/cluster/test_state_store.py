"""The Broker keeps payloads and headers in its segment store (issue 22, step 2): what each
command reads, appends and frees there, compaction, snapshots without payloads, restore."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import msgpack
import pytest
from state_harness import (  # type: ignore[import-not-found]
    T0,
    Harness,
    check_invariants,
    legacy_snapshot,
    messages,
    state_of,
    twin,
)

from raftq.cluster import errors as E
from raftq.cluster.memdisk import MemDisk
from raftq.cluster.segstore import SegmentStore
from raftq.cluster.state import Broker
from raftq.cluster.storage import OsDisk, StorageError

SEG = 4096  # small segments: rolls, retirement and compaction within a few hundred messages


def small_store(disk: Any = None, directory: str = "/mem/store") -> SegmentStore:
    s = SegmentStore(disk or MemDisk(), directory, segment_bytes=SEG, flush_bytes=512)
    s.truncate_to([])
    return s


def live_records(b: Broker, topic: str) -> int:
    return sum(s[2] for s in b.store.stats(b.topics[topic].key))


def test_the_broker_holds_no_payload_bytes_only_the_store_does(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    marker = b"payload-kept-on-disk-" * 3
    h("publish", topic="t", messages=[{"payload": marker + b"%d" % i} for i in range(50)])
    h.receive(group="a", max=5)
    store = h.b.store
    seen: set[int] = {id(store)}
    todo: list[Any] = [h.b]
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        assert not (isinstance(o, bytes) and o.startswith(marker)), "a payload in the Broker"
        todo.extend(gc.get_referents(o))
    assert live_records(h.b, "t") == 50


def test_receive_and_peek_read_payload_and_headers_from_the_store(h: Harness) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"a", "headers": {"x": "1"}}, {"payload": b"b"}])
    ds = h.receive()
    assert [(d["payload"], d["headers"]) for d in ds] == [(b"a", {"x": "1"}), (b"b", {})]
    peek = h.b.peek("t")
    assert [(m["payload"], m["headers"]) for m in peek] == [(b"a", {"x": "1"}), (b"b", {})]
    h("ack", receipts=[d["receipt"] for d in ds])
    assert live_records(h.b, "t") == 0 and h.b.store.retained_bytes()[0] == 0


def test_a_follower_reads_nothing_read_false_gives_no_payload(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    cmd = {"op": "receive", "topic": "t", "group": "default", "consumer": "c", "max": 5}
    [res] = h.b.apply_batch(h.now, [{**cmd, "token": b"k" * 16}], read=False)
    [d] = res["deliveries"]
    assert d["seq"] == 1 and "payload" not in d and "headers" not in d


def test_payloads_are_read_after_the_whole_batch_even_when_a_later_command_freed_them(
    h: Harness,
) -> None:
    h.topic("t", max_messages=1, overflow="drop_oldest")
    h.publish("t", b"first")
    cmds: list[dict[str, Any]] = [
        {"op": "receive", "topic": "t", "group": "default", "consumer": "c", "token": b"k" * 16},
        {"op": "publish", "topic": "t", "messages": [{"payload": b"second"}]},  # drops seq 1
    ]
    res = h.b.apply_batch(h.now, cmds)
    assert res[0]["deliveries"][0]["payload"] == b"first"
    assert live_records(h.b, "t") == 1
    check_invariants(h.b)


def test_dead_letters_and_redrive_move_records_between_streams(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"max_attempts": 1}}])
    h("publish", topic="t", messages=[{"payload": b"p", "headers": {"a": "b"}}])
    [d] = h.receive(group="g")
    h("nack", receipts=[d["receipt"]])
    assert live_records(h.b, "t") == 0 and live_records(h.b, "t.dlq") == 1
    [dl] = h.b.peek("t.dlq")
    assert dl["payload"] == b"p" and dl["headers"]["a"] == "b"
    assert dl["headers"]["x-raftq-dlq-reason"] == "nack"
    assert h("redrive", topic="t.dlq")["redriven"] == 1
    assert live_records(h.b, "t") == 1 and live_records(h.b, "t.dlq") == 0
    [again] = h.receive(group="g")
    assert again["payload"] == b"p" and again["headers"]["x-raftq-redrives"] == "1"


def test_purge_clears_the_stream_and_delete_drops_it_for_good(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"a", b"b")
    key = h.b.topics["t"].key
    h("purge", topic="t")
    assert h.b.store.stats(key) == [] and h.b.store.retained_bytes() == (0, 0)
    h.publish("t", b"c")
    assert [d["payload"] for d in h.receive()] == [b"c"]
    h("delete_topic", topic="t")
    assert h.b.store.stats(key) == []
    h.topic("t")
    assert h.b.topics["t"].key != key  # a new incarnation, a new stream
    h.publish("t", b"d")
    assert [m["payload"] for m in h.b.peek("t")] == [b"d"]


def test_a_group_purge_frees_only_what_no_other_group_needs(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"1", b"2", b"3")
    h("purge", topic="t", group="a")
    assert live_records(h.b, "t") == 3
    h("purge", topic="t", group="b")
    assert live_records(h.b, "t") == 0


def _workload(b: Broker, now: int) -> list[dict[str, Any]]:
    """Commands that roll, free and retire segments of several streams."""
    cmds: list[dict[str, Any]] = [
        {"op": "create_topic", "topic": "t", "groups": [{"group": "g"}]},
        {"op": "create_topic", "topic": "u"},
    ]
    for i in range(40):
        msgs = [{"payload": b"m%d-%d" % (i, j) * 7, "headers": {"i": str(j)}} for j in range(10)]
        cmds.append({"op": "publish", "topic": "t" if i % 3 else "u", "messages": msgs})
    return cmds


def _receipts(res: dict[str, Any], keep: int) -> list[str]:
    return [d["receipt"] for d in res["deliveries"] if d["seq"] % keep]


def test_twins_fed_the_same_commands_have_equal_digests_and_equal_store_files() -> None:
    disks = [MemDisk(), MemDisk()]
    brokers = [Broker(small_store(d)) for d in disks]
    now = T0
    for b in brokers:
        b.apply_batch(now, _workload(b, now))
    recv = {"op": "receive", "topic": "t", "group": "g", "consumer": "c", "max": 200}
    for _ in range(2):
        now += 1000
        results = [b.apply_batch(now, [{**recv, "token": b"k" * 16}]) for b in brokers]
        assert results[0] == results[1]
        acks = {"op": "ack", "receipts": _receipts(results[0][0], 4)}  # leaves 1 in 4
        for b in brokers:
            b.apply_batch(now, [acks])
    assert brokers[0].digest() == brokers[1].digest()
    assert disks[0].files == disks[1].files and disks[0].files
    # compaction: the same commands on both, the same outcome
    cands = brokers[0].compaction_candidates()
    assert cands and cands == brokers[1].compaction_candidates()
    now += 1
    results = [b.apply_batch(now, cands) for b in brokers]
    assert results[0] == results[1] and all(r["compacted"] for r in results[0])
    assert brokers[0].digest() == brokers[1].digest()
    assert disks[0].files == disks[1].files
    for b in brokers:
        check_invariants(b)
    assert messages(brokers[0]) == messages(brokers[1])


def test_compaction_moves_live_records_and_keeps_their_payloads() -> None:
    b = Broker(small_store())
    b.apply_batch(T0, _workload(b, T0))
    before = messages(b)
    recv = {"op": "receive", "topic": "u", "group": "default", "consumer": "c", "max": 500}
    [res] = b.apply_batch(T0 + 1, [{**recv, "token": b"k" * 16}])
    b.apply_batch(T0 + 1, [{"op": "ack", "receipts": _receipts(res, 5)}])
    cands = b.compaction_candidates()
    assert cands and all(c["topic"] == "u" for c in cands)
    seg_before = b.store.retained_bytes()[1]
    for c in cands:
        assert b.apply({**c, "now": T0 + 2})["compacted"] is True
        again = b.apply({**c, "now": T0 + 2})  # not a candidate any more: nothing happens
        assert again["compacted"] is False
    assert b.store.retained_bytes()[1] < seg_before
    check_invariants(b)
    after = messages(b)
    assert after["t"] == before["t"]
    assert after["u"] == [m for m in before["u"] if m["seq"] % 5 == 0]


@pytest.mark.parametrize(
    "cmd, error",
    [
        ({"topic": "nope", "segment": 0}, E.TopicNotFound),
        ({"topic": "t", "segment": "0"}, E.InvalidArgument),
        ({"topic": "t", "segment": -1}, E.InvalidArgument),
        ({"topic": "t"}, E.InvalidArgument),
        ({"topic": 5, "segment": 0}, E.InvalidArgument),
    ],
)
def test_a_bad_compact_command_is_a_4xx_and_changes_nothing(
    h: Harness, cmd: dict[str, Any], error: type[Exception]
) -> None:
    h.topic("t")
    h.publish("t", b"x")
    before = h.b.digest()
    with pytest.raises(error):
        h("compact", **cmd)
    assert h.b.digest() == before
    [res] = h.b.apply_batch(h.now, [{"op": "compact", **cmd}])
    assert res["error"]["code"] in ("topic_not_found", "invalid_argument", "invalid_name")


def test_the_snapshot_size_follows_topics_not_the_backlog(tmp_path: Path) -> None:
    sizes = []
    for n, d in ((1, "one"), (100_000, "many")):
        store = SegmentStore(OsDisk(), str(tmp_path / d))
        store.truncate_to([])
        b = Broker(store)
        b.apply({"op": "create_topic", "topic": "t", "now": T0})
        for i in range(0, n, 1000):
            msgs = [{"payload": b"x" * 100} for _ in range(min(1000, n - i))]
            b.apply({"op": "publish", "topic": "t", "messages": msgs, "now": T0})
        sizes.append(len(b.snapshot()))
    assert sizes[1] < sizes[0] + 4096, sizes  # 10 MB of payloads: a few hundred bytes more


def test_restore_truncates_the_store_and_the_replay_writes_the_same_bytes(
    tmp_path: Path,
) -> None:
    def store() -> SegmentStore:
        return SegmentStore(OsDisk(), str(tmp_path / "store"), segment_bytes=SEG)

    s = store()
    s.truncate_to([])
    b = Broker(s)
    b.apply_batch(T0, _workload(b, T0)[:20])
    snap = b.snapshot()
    later = _workload(b, T0)[20:]
    b.apply_batch(T0 + 5, later)
    s.sync()
    want, want_msgs = b.digest(), messages(b)
    # a restart: a new store on the same files, the snapshot, then the journal's rest
    r = Broker()
    r.use_store(store())
    assert Broker.snapshot_marks(snap) == msgpack.unpackb(snap, raw=False)[7]
    r.restore(snap)
    check_invariants(r)
    r.apply_batch(T0 + 5, later)
    assert r.digest() == want and messages(r) == want_msgs


def test_a_v6_snapshot_converts_to_v7_keeping_every_message(h: Harness) -> None:
    b_cfg = {"group": "b", "config": {"ordered": True}}
    h("create_topic", topic="t", groups=[{"group": "a"}, b_cfg])
    h(
        "publish",
        topic="t",
        messages=[{"payload": b"%d" % i, "ordering_key": "k"} for i in range(9)],
    )
    h("publish", topic="t", messages=[{"payload": b"h", "headers": {"x": "y"}, "key": "id1"}])
    [d] = h.receive(group="a", max=1)
    h("ack", receipts=[d["receipt"]])
    h.receive(group="b", max=3)
    for version in (3, 4, 5, 6):
        old = Broker()
        old.restore(legacy_snapshot(h.b, version))
        check_invariants(old)
        assert messages(old) == messages(h.b)
        if version >= 5:
            assert state_of(old) == state_of(h.b)
    old = twin(h.b)
    assert old.digest() == h.b.digest()


@pytest.mark.parametrize("where", ["append_open", "seal"])
def test_a_storage_error_from_the_store_propagates_out_of_apply_and_apply_batch(
    h: Harness, where: str
) -> None:
    """From an append, or from writing the open records at the end of the batch."""
    h.topic("t")
    calls = []

    def broken(*args: Any) -> Any:
        calls.append(True)
        raise StorageError("/x/t.0~00000000.seg: write failed: disk full (ENOSPC)")

    setattr(h.b.store, where, broken)
    cmd = {"op": "publish", "topic": "t", "messages": [{"payload": b"x"}]}
    with pytest.raises(StorageError):
        h.b.apply_batch(h.now, [cmd])
    with pytest.raises(StorageError):
        h.b.apply({**cmd, "now": h.now})
    assert len(calls) == 2


def test_use_store_only_swaps_the_store_of_an_empty_broker(h: Harness) -> None:
    h.topic("t")
    with pytest.raises(RuntimeError):
        h.b.use_store(small_store())
    b = Broker()
    s = small_store()
    b.use_store(s)
    assert b.store is s


def test_an_in_memory_store_lets_go_of_retired_segments_at_once() -> None:
    disk = MemDisk()
    b = Broker(small_store(disk))
    b.apply({"op": "create_topic", "topic": "t", "now": T0})
    recv = {"op": "receive", "topic": "t", "group": "default", "consumer": "c", "max": 100}
    for i in range(30):
        msgs = [{"payload": b"%d" % i * 50} for _ in range(100)]
        b.apply({"op": "publish", "topic": "t", "messages": msgs, "now": T0})
        res = b.apply({**recv, "now": T0, "token": b"k" * 16})
        b.apply({"op": "ack", "receipts": [d["receipt"] for d in res["deliveries"]], "now": T0})
    assert disk.nbytes() < 3 * SEG  # (30 x 100 x ~140 B went through it)


def test_an_entry_of_one_message_publishes_is_one_record_per_topic(h: Harness) -> None:
    h.topic("t")
    h.topic("u")
    one: list[dict[str, Any]] = [{"payload": b"m%d" % i} for i in range(50)]
    one[7]["headers"] = {"h": "7"}
    pub = [
        {"op": "publish", "topic": "t" if i % 5 else "u", "messages": [m]}
        for i, m in enumerate(one)
    ]
    res = h.b.apply_batch(h.now, pub)
    assert all("error" not in r for r in res)
    for topic, n in (("t", 40), ("u", 10)):
        key = h.b.topics[topic].key
        locs = {h.b.topics[topic].index.get(seq)[0] for seq in range(1, n + 1)}
        assert len(locs) == 1, f"{topic}: {len(locs)} records"
        assert live_records(h.b, topic) == n and len(h.b.store.stats(key)) == 1
    peek = h.b.peek("t", limit=40)
    assert [m["payload"] for m in peek] == [b"m%d" % i for i in range(50) if i % 5]
    assert peek[5]["headers"] == {"h": "7"}
    h.b.apply_batch(h.now + 1, pub[:2])  # the next entry: a record of its own
    assert h.b.topics["t"].index.get(41)[0] not in locs
    check_invariants(h.b)
