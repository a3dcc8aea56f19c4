"""The node-wide retained-bytes limit (the ``cluster_settings`` command, ``storage_full``)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from state_harness import Harness, legacy_snapshot  # type: ignore[import-not-found]

from raftq.cluster import errors as E
from raftq.cluster.state import Broker


def limit(h: Harness, n: int | None) -> Any:
    return h("cluster_settings", config={"max_retained_bytes": n})


def test_a_publish_past_the_limit_over_all_topics_is_storage_full_and_stores_nothing(
    h: Harness,
) -> None:
    h.topic("a")
    h.topic("b")
    assert limit(h, 10) == {"settings": {"max_retained_bytes": 10}, "retained_bytes": 0}
    h.publish("a", b"12345")
    h.publish("b", b"1234")
    before = h.b.snapshot()
    with pytest.raises(E.StorageFull) as e:
        h("publish", topic="b", messages=[{"payload": b"1"}, {"payload": b"2", "key": "k"}])
    assert e.value.details == {"retained_bytes": 9, "max_retained_bytes": 10, "bytes": 2}
    assert h.b.snapshot() == before  # nothing stored, not even the idempotency key
    assert h.publish("b", b"x") == [2]  # exactly at the limit is allowed
    assert h.b.storage()["retained_bytes"] == 10


def test_a_retry_whose_messages_are_all_duplicates_answers_its_seqs_at_the_limit(
    h: Harness,
) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"abc", "key": "k1"}])
    limit(h, 3)
    res = h("publish", topic="t", messages=[{"payload": b"abc", "key": "k1"}])
    assert res["messages"] == [{"seq": 1, "duplicate": True}]


def test_acks_nacks_and_receives_work_at_the_limit_and_free_room(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"aaaa", b"bbbb")
    limit(h, 8)
    with pytest.raises(E.StorageFull):
        h.publish("t", b"c")
    d1, d2 = h.receive()
    assert h("nack", receipts=[d2["receipt"]])["nacked"] == 1
    assert h("ack", receipts=[d1["receipt"]])["acked"] == 1
    assert h.publish("t", b"cccc") == [3]


def test_dead_letters_and_redrive_bypass_the_limit(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"max_attempts": 1}}])
    h.publish("t", b"x" * 10)
    h("create_group", topic="t", group="other", start="earliest")  # keeps the original too
    limit(h, 10)
    (d,) = h.receive(group="g")
    assert h("nack", receipts=[d["receipt"]])["dead_lettered"] == 1
    assert h.b.topic_stats("t.dlq")["messages"] == 1  # stored, past the limit
    assert h.b.storage()["retained_bytes"] == 20
    assert h("redrive", topic="t.dlq")["redriven"] == 1
    assert h.receive(group="g")[0]["payload"] == b"x" * 10
    with pytest.raises(E.StorageFull):
        h.publish("t", b"y")


def test_a_drop_oldest_topic_rolls_at_the_limit_as_its_own_max_bytes_drops_first(
    h: Harness,
) -> None:
    h.topic("ring", max_bytes=8, max_message_bytes=4, overflow="drop_oldest")
    h.topic("other")
    limit(h, 10)
    h.publish("other", b"zz")
    for i in range(10):  # the ring holds at most 8 bytes: the sum stays at 10
        h.publish("ring", b"%04d" % i)
    assert h.b.topic_stats("ring")["messages"] == 2
    assert h.b.storage()["retained_bytes"] == 10
    with pytest.raises(E.StorageFull):  # (a reject topic gets no such credit)
        h.publish("other", b"z")
    limit(h, 9)  # below what the ring may hold: refused before its overflow drops anything
    with pytest.raises(E.StorageFull):
        h.publish("ring", b"0010")
    assert h.b.topic_stats("ring")["messages"] == 2


def test_lowering_the_limit_deletes_nothing_and_null_lifts_it(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"abcdef")
    limit(h, 2)
    assert h.b.topic_stats("t")["messages"] == 1
    with pytest.raises(E.StorageFull):
        h.publish("t", b"g")
    assert limit(h, None) == {"settings": {"max_retained_bytes": None}, "retained_bytes": 6}
    assert h.publish("t", b"g") == [2]


def test_deleting_or_purging_a_topic_gives_its_bytes_back(h: Harness) -> None:
    h.topic("a")
    h.topic("b")
    h.publish("a", b"12345")
    h.publish("b", b"12345")
    limit(h, 10)
    h("delete_topic", topic="a")
    h("purge", topic="b")
    assert h.b.storage()["retained_bytes"] == 0
    h.publish("b", b"0123456789")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"max_retained_bytes": -1}, "max_retained_bytes"),
        ({"max_retained_bytes": "1GiB"}, "max_retained_bytes"),
        ({"max_retained_bytes": True}, "max_retained_bytes"),
        ({"max_bytes": 5}, "max_bytes"),
    ],
)
def test_bad_settings_are_invalid_argument_and_change_nothing(
    h: Harness, config: dict[str, object], field: str
) -> None:
    limit(h, 100)
    with pytest.raises(E.InvalidArgument) as e:
        h("cluster_settings", config=config)
    assert e.value.details["field"] == field
    assert h.b.settings == {"max_retained_bytes": 100}


def test_the_setting_survives_a_snapshot(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"abc")
    limit(h, 5)
    snap = h.b.snapshot()
    assert msgpack.unpackb(snap)[6] == {"max_retained_bytes": 5}
    copy = Broker()
    copy.restore(snap)
    assert copy.snapshot() == snap
    assert copy.storage() == {"settings": {"max_retained_bytes": 5}, "retained_bytes": 3}
    with pytest.raises(E.StorageFull):
        copy.apply({"op": "publish", "now": h.now, "topic": "t", "messages": [{"payload": b"xyz"}]})
    limit(h, None)
    assert msgpack.unpackb(h.b.snapshot())[6] == {}


def test_a_v6_snapshot_with_the_setting_restores(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"abc")
    limit(h, 5)
    copy = Broker()
    copy.restore(legacy_snapshot(h.b, 6))
    assert copy.storage() == {"settings": {"max_retained_bytes": 5}, "retained_bytes": 3}
