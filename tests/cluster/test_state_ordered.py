"""Ordering keys and ordered groups, first-receive times and topic labels (the state machine
support of SQS FIFO queues, message groups and queue attributes)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from state_harness import (  # type: ignore[import-not-found]
    Harness,
    check_invariants,
    legacy_snapshot,
)

from raftq.cluster import errors as E
from raftq.cluster import topics
from raftq.cluster.state import Broker


@pytest.fixture
def h() -> Harness:
    return Harness()


def ordered(h: Harness, **config: Any) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"ordered": True, **config}}])


def pub(h: Harness, *keyed: tuple[str | None, bytes], **extra: Any) -> list[int]:
    msgs = [{"payload": p, **({} if k is None else {"ordering_key": k}), **extra} for k, p in keyed]
    res = h("publish", topic="t", messages=msgs)
    return [m["seq"] for m in res["messages"]]


def recv(h: Harness, n: int = 10, consumer: str = "c1", **kw: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = h.receive("t", "g", consumer=consumer, max=n, **kw)
    return out


def seqs(ds: list[dict[str, Any]]) -> list[int]:
    return [d["seq"] for d in ds]


def ack(h: Harness, *ds: dict[str, Any]) -> None:
    assert h("ack", receipts=[d["receipt"] for d in ds])["acked"] == len(ds)


def test_an_ordered_group_holds_back_a_key_while_one_of_it_is_in_flight(h: Harness) -> None:
    ordered(h)
    pub(h, ("a", b"a1"))
    first = recv(h)
    assert seqs(first) == [1] and first[0]["ordering_key"] == "a"
    pub(h, ("a", b"a2"), ("b", b"b1"), (None, b"x"), ("a", b"a3"))
    assert seqs(recv(h)) == [3, 4]  # b1 and the unkeyed one; a2 and a3 wait for a1
    assert recv(h) == []
    assert h.gstats("t", "g")["pending"] == 2
    ack(h, *first)
    again = recv(h)
    assert seqs(again) == [2, 5]  # a2 and a3 together: none of "a" is held now
    assert [d["ordering_key"] for d in again] == ["a", "a"]


def test_one_receive_takes_several_of_a_key_in_order_but_stops_at_max(h: Harness) -> None:
    ordered(h)
    pub(h, ("k", b"1"), ("k", b"2"), ("k", b"3"))
    assert seqs(recv(h, n=2)) == [1, 2]
    assert recv(h) == []  # 3 waits: 1 and 2 are held


def test_a_failed_message_is_redelivered_before_the_later_ones_of_its_key(h: Harness) -> None:
    ordered(h, visibility_timeout=5)
    pub(h, ("k", b"1"))
    (d1,) = recv(h)
    pub(h, ("k", b"2"), ("k", b"3"))
    assert recv(h) == []
    assert h("nack", receipts=[d1["receipt"]])["nacked"] == 1
    # the ready run of the key: 1 again, then the two that waited, in order
    ds = recv(h)
    assert [(d["seq"], d["attempt"]) for d in ds] == [(1, 2), (2, 1), (3, 1)]
    # a timeout of the first sends them all back; they come back in order
    h.advance(6)
    ds = recv(h, n=1)
    assert [(d["seq"], d["attempt"]) for d in ds] == [(1, 3)]
    ack(h, *ds)
    assert [(d["seq"], d["attempt"]) for d in recv(h)] == [(2, 2), (3, 2)]


def test_a_nack_with_delay_keeps_the_key_blocked_until_it_is_redelivered(h: Harness) -> None:
    ordered(h)
    pub(h, ("k", b"1"), ("j", b"j"))
    d1, _ = recv(h)
    pub(h, ("k", b"2"))
    h("nack", receipts=[d1["receipt"]], delay=10)
    assert recv(h) == []
    h.advance(10)
    assert seqs(recv(h)) == [1, 3]


def test_a_release_redelivers_the_first_of_the_key_first(h: Harness) -> None:
    ordered(h)
    pub(h, ("k", b"1"))
    recv(h, consumer="gone")
    pub(h, ("k", b"2"))
    assert h("release", consumer="gone")["released"] == 1
    assert [(d["seq"], d["attempt"]) for d in recv(h)] == [(1, 2), (2, 1)]


def test_dead_lettering_unblocks_the_key_and_the_dead_letter_keeps_its_key(h: Harness) -> None:
    ordered(h, max_attempts=1)
    pub(h, ("k", b"1"))
    (d1,) = recv(h)
    pub(h, ("k", b"2"))
    assert h("nack", receipts=[d1["receipt"]])["dead_lettered"] == 1
    assert seqs(recv(h)) == [2]
    (dead,) = h.receive("t.dlq", "default")
    assert dead["ordering_key"] == "k" and dead["payload"] == b"1"
    # redrive brings it back with its key, as a new message behind the held one
    assert h("redrive", topic="t.dlq")["redriven"] == 1
    assert recv(h) == []  # 2 is still in flight
    assert [m.get("ordering_key") for m in h.b.peek("t")] == ["k", "k"]


def test_a_group_without_ordered_ignores_ordering_keys(h: Harness) -> None:
    h.topic("t")
    h(
        "publish",
        topic="t",
        messages=[{"payload": b"%d" % i, "ordering_key": "k"} for i in range(3)],
    )
    (d,) = h.receive(max=1)
    ds = h.receive()
    assert [x["seq"] for x in ds] == [2, 3]
    assert d["ordering_key"] == "k"


def test_a_delayed_message_keeps_its_place_in_its_key(h: Harness) -> None:
    ordered(h)
    pub(h, ("k", b"1"), ("k", b"2"))
    pub(h, ("k", b"3"), delay=5)
    pub(h, ("k", b"4"))
    h.advance(5)
    # 3's delay ran out before the cursor reached it: it is fresh again, in its place
    assert seqs(recv(h)) == [1, 2, 3, 4]


def test_a_delayed_first_message_holds_back_the_later_ones_of_its_key(h: Harness) -> None:
    ordered(h)
    pub(h, ("k", b"1"), delay=5)
    pub(h, ("k", b"2"), ("j", b"j"))
    assert seqs(recv(h)) == [3]
    h.advance(5)
    assert seqs(recv(h)) == [1, 2]


def test_turning_ordered_off_and_on_keeps_every_message(h: Harness) -> None:
    ordered(h)
    pub(h, ("k", b"1"))
    (d1,) = recv(h)
    pub(h, ("k", b"2"), ("k", b"3"), ("j", b"4"))
    assert seqs(recv(h, n=1)) == [4]
    out = h("update_group", topic="t", group="g", config={"ordered": False})
    assert out["config"]["ordered"] is False
    assert seqs(recv(h)) == [2, 3]  # set aside while ordered; plain ready messages now
    h("update_group", topic="t", group="g", config={"ordered": True})
    assert h.gstats("t", "g")["config"]["ordered"] is True
    pub(h, ("k", b"5"))
    assert recv(h) == []  # 1, 2, 3 of "k" are in flight
    ack(h, d1)
    assert recv(h) == []
    h.advance(30)  # 2, 3 and 4 time out; the first of "k" is 2 now
    assert [(d["seq"], d["attempt"]) for d in recv(h)] == [(2, 2), (3, 2), (5, 1), (4, 2)]


def test_a_receive_sets_aside_a_bounded_number_of_blocked_messages(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topics, "MAX_BLOCKED_PER_RECEIVE", 3)
    ordered(h)
    pub(h, ("k", b"0"))
    recv(h)
    pub(h, *[("k", b"%d" % i) for i in range(7)], ("j", b"j"))
    assert recv(h) == [] and recv(h) == []  # 3 + 3 set aside, no more per receive
    assert seqs(recv(h)) == [9]


def test_first_received_at_is_the_first_delivery_time_while_the_message_is_held(
    h: Harness,
) -> None:
    h.topic("t", dedup_window=0)
    h.publish("t", b"x")
    t0 = h.now
    (d,) = h.receive()
    assert d["first_received_at"] == t0 and "ordering_key" not in d
    h("nack", receipts=[d["receipt"]])
    h.advance(3)
    (d,) = h.receive()
    assert d["attempt"] == 2 and d["first_received_at"] == t0
    ack(h, d)
    assert h.b.topics["t"].groups["default"].first == {}


def test_a_duplicate_publish_answers_the_original_seq(h: Harness) -> None:
    ordered(h)
    first = h("publish", topic="t", messages=[{"payload": b"1", "key": "d", "ordering_key": "k"}])
    h.advance(100)
    again = h("publish", topic="t", messages=[{"payload": b"1", "key": "d", "ordering_key": "k"}])
    assert again["messages"] == [{"seq": first["messages"][0]["seq"], "duplicate": True}]
    assert h.b.topics["t"].count == 1


@pytest.mark.parametrize("okey", ["", "x" * 129, 7, None])
def test_a_bad_ordering_key_is_refused_naming_it(h: Harness, okey: Any) -> None:
    h.topic("t")
    msg: dict[str, Any] = {"payload": b"x", "ordering_key": okey}
    if okey is None:
        msg["ordering_key"] = ["k"]
    with pytest.raises(E.InvalidArgument) as ei:
        h("publish", topic="t", messages=[{"payload": b"ok"}, msg])
    assert ei.value.field == "messages[1].ordering_key"  # type: ignore[attr-defined]
    assert h.b.topics["t"].count == 0


def test_ordered_must_be_a_boolean(h: Harness) -> None:
    h.topic("t")
    with pytest.raises(E.InvalidArgument) as ei:
        h("update_group", topic="t", group="default", config={"ordered": "yes"})
    assert ei.value.field == "ordered"  # type: ignore[attr-defined]


def test_topic_labels_are_kept_returned_and_replaced(h: Harness) -> None:
    h.topic("t", labels={"sqs:tag:env": "prod", "a": ""})
    assert h.b.topic_stats("t")["config"]["labels"] == {"sqs:tag:env": "prod", "a": ""}
    out = h("update_topic", topic="t", config={"labels": {"b": "2"}})
    assert out["config"]["labels"] == {"b": "2"}
    out["config"]["labels"]["c"] = "3"  # (an answer is a copy)
    assert h.b.topic_stats("t")["config"]["labels"] == {"b": "2"}
    h("update_topic", topic="t", config={"labels": {}})
    assert h.b.topic_stats("t")["config"]["labels"] == {}
    assert "labels" not in h.b.topics["t"].config  # stored as before labels existed


@pytest.mark.parametrize(
    "labels",
    [
        {str(i): "" for i in range(65)},
        {"": "x"},
        {"k" * 129: "x"},
        {"k": "v" * 2049},
        {"k": 1},
        ["k"],
    ],
)
def test_bad_labels_are_refused_naming_labels(h: Harness, labels: Any) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h.topic("t", labels=labels)
    assert ei.value.field == "labels"  # type: ignore[attr-defined]
    assert h.b.list_topics() == []


def _version(b: Broker) -> int:
    v: int = msgpack.unpackb(b.snapshot())[0]
    return v


def test_the_snapshot_is_v9_whatever_the_state_holds(h: Harness) -> None:
    h.topic("t")
    assert _version(h.b) == 9
    h.publish("t", b"y", ordering_key="k")
    h.advance(1)
    h("purge", topic="t")
    assert _version(h.b) == 9 and msgpack.unpackb(h.b.snapshot())[5] is True  # keys were used


def test_an_ordered_group_carries_on_identically_after_a_restore(h: Harness) -> None:
    ordered(h)
    pub(h, ("k", b"1"), ("j", b"2"))
    ds = recv(h, n=1)
    pub(h, ("k", b"3"), ("k", b"4"), (None, b"5"))
    recv(h, n=1)
    h("nack", receipts=[ds[0]["receipt"]])
    twin = Broker()
    twin.restore(h.b.snapshot())
    assert twin.snapshot() == h.b.snapshot()
    cmd = {"op": "receive", "topic": "t", "group": "g", "consumer": "c", "max": 10}
    cmd.update(now=h.now, token=b"t" * 16)
    assert twin.apply(cmd) == h.b.apply(cmd)
    assert twin.snapshot() == h.b.snapshot()
    assert twin.topics["t"].groups["g"].kq == h.b.topics["t"].groups["g"].kq


def _as_v4(snap: bytes) -> bytes:
    """A v5 snapshot in the layout of v4 (what a node of an older version writes)."""
    obj = msgpack.unpackb(snap, strict_map_key=False)
    assert obj[0] == 5 and not obj[5], "no ordering key used"
    for row in obj[3]:
        for grow in row[9]:
            grow.pop()  # first-receive times of the failed ones
            grow[7] = [e[:4] for e in grow[7]]  # inflight rows without theirs
            assert not grow[1].get("ordered")
    return msgpack.packb([4, *obj[1:5]], use_bin_type=True)


def test_a_snapshot_of_the_previous_version_restores_with_first_receive_times(
    h: Harness,
) -> None:
    h.topic("t", dedup_window=0)
    h.publish("t", b"a", b"b")
    t0 = h.now
    a, _ = h.receive()
    h("nack", receipts=[a["receipt"]])  # a waits to go again, b is in flight
    h.advance(1)
    h("tick")
    snap_now = h.now
    h.advance(1)
    old = Broker()
    old.restore(_as_v4(legacy_snapshot(h.b, 5)))
    check_invariants(old)
    cmd = {"op": "receive", "topic": "t", "group": "default", "consumer": "c2", "max": 10}
    [d] = old.apply({**cmd, "now": h.now, "token": b"k" * 16})["deliveries"]
    assert (d["seq"], d["attempt"]) == (1, 2)
    assert d["first_received_at"] == snap_now  # the snapshot's now: v4 did not keep t0
    assert old.topics["t"].groups["default"].inflight[2][3] == snap_now
    check_invariants(old)
    # the replica that applied the log knows the real time
    [d] = h("receive", topic="t", group="default", consumer="c2", max=10)["deliveries"]
    assert d["first_received_at"] == t0
