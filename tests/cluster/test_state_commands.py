"""Every broker command and its error paths, one behaviour per test."""

from __future__ import annotations

from typing import Any

import pytest
from state_harness import Harness, legacy_snapshot, state_of  # type: ignore[import-not-found]

from raftq.cluster import errors as E
from raftq.cluster.dedup import key_digest
from raftq.cluster.state import Broker

# ---------------------------------------------------------------- topics


def test_topic_created_without_groups_gets_group_default(h: Harness) -> None:
    assert h("create_topic", topic="orders") == {"topic": "orders", "created": True}
    stats = h.b.topic_stats("orders")
    assert [g["group"] for g in stats["groups"]] == ["default"]


def test_topic_created_with_explicit_groups_has_exactly_those(h: Harness) -> None:
    h(
        "create_topic",
        topic="t",
        groups=[{"group": "a"}, {"group": "b", "config": {"max_attempts": 2}}],
    )
    assert [g["group"] for g in h.b.topic_stats("t")["groups"]] == ["a", "b"]
    assert h.gstats("t", "b")["config"]["max_attempts"] == 2


def test_topic_with_the_same_group_twice_is_group_exists_and_not_created(h: Harness) -> None:
    with pytest.raises(E.GroupExists):
        h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "a"}])
    assert h.b.list_topics() == []


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"groups": "default"}, "groups"),
        ({"groups": [5]}, "groups[]"),
        ({"groups": [{"group": "bad name"}]}, "group"),
        ({"groups": [{}]}, "group"),
        ({"groups": [{"group": "a", "config": [1]}]}, "config"),
        ({"groups": [{"group": "a", "config": {"max_attempts": -1}}]}, "max_attempts"),
        ({"config": "big"}, "config"),
    ],
)
def test_malformed_create_topic_is_invalid_argument_and_creates_nothing(
    h: Harness, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h("create_topic", topic="t", **fields)
    assert ei.value.field == field  # type: ignore[attr-defined]
    assert h.b.list_topics() == []


def test_topic_config_defaults(h: Harness) -> None:
    h.topic("t")
    assert h.b.topic_stats("t")["config"] == {
        "max_messages": 10_000_000,
        "max_bytes": 1 << 30,
        "max_message_bytes": 1 << 20,
        "overflow": "reject",
        "max_age": None,
        "dedup_window": 120,
        "labels": {},
    }


def test_group_config_defaults(h: Harness) -> None:
    h.topic("t")
    assert h.gstats()["config"] == {
        "visibility_timeout": 30,
        "max_attempts": 5,
        "backoff": [],
        "dead_letter_topic": "t.dlq",
        "ordered": False,
    }


def test_creating_an_existing_topic_is_topic_exists_unless_if_not_exists(h: Harness) -> None:
    h.topic("t")
    with pytest.raises(E.TopicExists) as ei:
        h("create_topic", topic="t")
    assert ei.value.code == "topic_exists"
    assert ei.value.topic == "t"  # type: ignore[attr-defined]
    assert h("create_topic", topic="t", if_not_exists=True) == {"topic": "t", "created": False}


@pytest.mark.parametrize(
    "spec",
    [
        {"config": {"max_messages": 0}},
        {"groups": [{"group": "g", "config": {"max_attempts": -1}}]},
        {"groups": [{"group": "-g"}]},
        {"groups": [{"group": "g", "config": {"colour": 1}}]},
    ],
)
def test_if_not_exists_on_an_existing_topic_is_created_false_whatever_the_spec(
    h: Harness, spec: dict[str, Any]
) -> None:
    """The existence check comes first, as in older versions: a replica of an older version
    must compute the same result, applied_commands and digest (the node refuses an invalid
    spec before it proposes, tests/node/test_api_input.py)."""
    h.topic("t")
    valid = Harness()
    valid.topic("t")
    res = h("create_topic", topic="t", if_not_exists=True, **spec)
    assert res == valid("create_topic", topic="t", if_not_exists=True)
    assert res == {"topic": "t", "created": False}
    assert h.b.applied_commands == 2
    assert h.b.digest() == valid.b.digest()


def test_if_not_exists_on_an_existing_group_is_created_false_whatever_the_config(
    h: Harness,
) -> None:
    """(As for a topic: what an older version computes.)"""
    h.topic("t")
    res = h("create_group", topic="t", group="default", if_not_exists=True,
            config={"visibility_timeout": 0})  # fmt: skip
    assert res == {"topic": "t", "group": "default", "created": False}
    assert h.b.applied_commands == 2


@pytest.mark.parametrize("name", ["a", "A9", "x" * 128, "a.b-c_d", "0"])
def test_valid_topic_names_are_accepted(h: Harness, name: str) -> None:
    assert h("create_topic", topic=name)["created"]


@pytest.mark.parametrize("name", ["", ".a", "-a", "_a", "a b", "a:b", "x" * 129, "é", 5, None, [1]])
def test_invalid_topic_names_are_invalid_name_naming_the_field(h: Harness, name: Any) -> None:
    with pytest.raises(E.InvalidName) as ei:
        h("create_topic", topic=name)
    assert ei.value.code == "invalid_name"
    assert ei.value.field == "topic"  # type: ignore[attr-defined]
    assert h.b.list_topics() == []


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"nope": 1}, "nope"),
        ({"max_messages": 0}, "max_messages"),
        ({"max_messages": "1"}, "max_messages"),
        ({"max_bytes": True}, "max_bytes"),
        ({"max_message_bytes": 0}, "max_message_bytes"),
        ({"max_bytes": 10, "max_message_bytes": 11}, "max_message_bytes"),
        ({"overflow": "block"}, "overflow"),
        ({"max_age": -1}, "max_age"),
        ({"max_age": float("nan")}, "max_age"),
        ({"dedup_window": -1}, "dedup_window"),
        ({"dedup_window": float("inf")}, "dedup_window"),
        ({"max_messages": 2**53}, "max_messages"),
        ({"max_bytes": 2**70}, "max_bytes"),
    ],
)
def test_bad_topic_config_is_invalid_argument_naming_the_field(
    h: Harness, config: dict[str, Any], field: str
) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h("create_topic", topic="t", config=config)
    assert ei.value.field == field  # type: ignore[attr-defined]
    assert h.b.list_topics() == []


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"visibility_timeout": 12 * 3600 + 1}, "visibility_timeout"),
        ({"max_attempts": -1}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"backoff": 5}, "backoff"),
        ({"backoff": [1, -1]}, "backoff"),
        ({"backoff": [1] * 33}, "backoff"),
        ({"dead_letter_topic": "t"}, "dead_letter_topic"),
        ({"dead_letter_topic": "bad name"}, "dead_letter_topic"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_group_config_is_invalid_argument_naming_the_field(
    h: Harness, config: dict[str, Any], field: str
) -> None:
    h.topic("t")
    with pytest.raises(E.InvalidArgument) as ei:
        h("create_group", topic="t", group="g", config=config)
    assert ei.value.field == field  # type: ignore[attr-defined]
    assert [g["group"] for g in h.b.topic_stats("t")["groups"]] == ["default"]


def test_visibility_timeout_of_twelve_hours_is_allowed(h: Harness) -> None:
    h.topic("t")
    h("create_group", topic="t", group="g", config={"visibility_timeout": 12 * 3600})


def test_update_topic_merges_config_and_validates(h: Harness) -> None:
    h.topic("t", max_messages=5)
    res = h("update_topic", topic="t", config={"overflow": "drop_oldest"})
    assert res["config"]["max_messages"] == 5
    assert res["config"]["overflow"] == "drop_oldest"
    with pytest.raises(E.InvalidArgument):
        h("update_topic", topic="t", config={"overflow": "x"})
    assert h.b.topic_stats("t")["config"]["overflow"] == "drop_oldest"


def test_unknown_topic_is_topic_not_found_carrying_the_name(h: Harness) -> None:
    for op in ("update_topic", "delete_topic", "publish", "purge", "redrive"):
        with pytest.raises(E.TopicNotFound) as ei:
            h(op, topic="ghost", messages=[{"payload": b"x"}])
        assert ei.value.topic == "ghost"  # type: ignore[attr-defined]
        assert ei.value.code == "topic_not_found"


def test_unknown_group_is_group_not_found_carrying_topic_and_group(h: Harness) -> None:
    h.topic("t")
    for op in ("update_group", "delete_group", "receive", "purge"):
        with pytest.raises(E.GroupNotFound) as ei:
            h(op, topic="t", group="ghost", consumer="c")
        assert (ei.value.topic, ei.value.group) == ("t", "ghost")  # type: ignore[attr-defined]


def test_delete_topic_makes_its_receipts_invalid(h: Harness) -> None:
    """(A receipt naming a topic that is not there is invalid, whether the topic was deleted or
    never was: nothing tells them apart.)"""
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive()
    assert h("delete_topic", topic="t") == {"topic": "t", "deleted": True}
    assert h.b.list_topics() == []
    res = h("ack", receipts=[d["receipt"]])
    assert res["acked"] == 0
    assert res["errors"][0]["code"] == "receipt_invalid"
    assert h("release", consumer="c1")["released"] == 0


# ---------------------------------------------------------------- groups


def test_group_created_latest_sees_only_messages_published_after_it(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"old")
    h("create_group", topic="t", group="g")
    h.publish("t", b"new")
    assert [d["payload"] for d in h.receive(group="g")] == [b"new"]


def test_group_created_earliest_includes_the_retained_backlog(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2", b"3")
    (d, *_) = h.receive(max=1)
    h("ack", receipts=[d["receipt"]])  # the only group settled seq 1: it is freed
    h("create_group", topic="t", group="g", start="earliest")
    assert [d["payload"] for d in h.receive(group="g")] == [b"2", b"3"]


def test_create_group_twice_is_group_exists_unless_if_not_exists(h: Harness) -> None:
    h.topic("t")
    with pytest.raises(E.GroupExists):
        h("create_group", topic="t", group="default")
    assert h("create_group", topic="t", group="default", if_not_exists=True)["created"] is False


def test_create_group_with_unknown_start_is_invalid_argument(h: Harness) -> None:
    h.topic("t")
    with pytest.raises(E.InvalidArgument) as ei:
        h("create_group", topic="t", group="g", start="middle")
    assert ei.value.field == "start"  # type: ignore[attr-defined]


def test_update_group_changes_only_given_fields(h: Harness) -> None:
    h.topic("t")
    res = h("update_group", topic="t", group="default", config={"max_attempts": 0})
    assert res["config"]["max_attempts"] == 0
    assert res["config"]["dead_letter_topic"] == "t.dlq"
    h("update_group", topic="t", group="default", config={"dead_letter_topic": None})
    assert h.gstats()["config"]["dead_letter_topic"] is None


def test_every_group_receives_every_message_and_consumers_in_a_group_compete(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"1", b"2", b"3", b"4")
    a1 = h.receive(group="a", consumer="x", max=2)
    a2 = h.receive(group="a", consumer="y", max=10)
    b1 = h.receive(group="b", consumer="x", max=10)
    assert [d["seq"] for d in a1] == [1, 2]
    assert [d["seq"] for d in a2] == [3, 4]
    assert [d["seq"] for d in b1] == [1, 2, 3, 4]


def test_deleting_a_group_frees_messages_only_it_still_needed(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"1", b"2")
    h("ack", receipts=[d["receipt"] for d in h.receive(group="a")])
    assert h.b.topic_stats("t")["messages"] == 2
    h.receive(group="b", max=1)  # one in flight, one fresh
    assert h("delete_group", topic="t", group="b")["deleted"]
    assert h.b.topic_stats("t")["messages"] == 0
    assert h("release", consumer="c1")["released"] == 0


def test_topic_with_an_empty_group_list_retains_messages_for_a_later_earliest_group(
    h: Harness,
) -> None:
    h("create_topic", topic="t", groups=[])
    h.publish("t", b"1")
    assert h.b.topic_stats("t")["messages"] == 1
    h("create_group", topic="t", group="late", start="earliest")
    assert [d["seq"] for d in h.receive(group="late")] == [1]


@pytest.mark.parametrize("groups", [None, []], ids=["with-default-group", "without-groups"])
def test_a_later_earliest_group_waits_out_a_publish_delay_too(
    h: Harness, groups: list[Any] | None
) -> None:
    h("create_topic", topic="t", **({} if groups is None else {"groups": groups}))
    h.publish("t", b"now")
    h.publish("t", b"later", delay=10)
    h.advance(1)
    h("create_group", topic="t", group="late", start="earliest")
    assert [d["payload"] for d in h.receive(group="late")] == [b"now"]
    assert h.gstats("t", "late")["delayed"] == 1
    restored = Broker()
    restored.restore(h.b.snapshot())
    h.advance(9)
    [d] = h.receive(group="late")
    assert (d["payload"], d["attempt"]) == (b"later", 1)
    h.b = restored  # the same from a snapshot taken while it waited
    [d] = h.receive(group="late")
    assert (d["payload"], d["attempt"]) == (b"later", 1)
    assert not h.b.topics["t"].publish_delays  # pruned once due


def test_a_publish_delay_already_over_is_fresh_for_a_later_earliest_group(h: Harness) -> None:
    h("create_topic", topic="t", groups=[])
    h.publish("t", b"x", delay=1)
    h.advance(2)
    h("create_group", topic="t", group="late", start="earliest")
    assert [d["payload"] for d in h.receive(group="late")] == [b"x"]


# ---------------------------------------------------------------- publish


def test_publish_assigns_increasing_seqs_without_gaps(h: Harness) -> None:
    h.topic("t")
    assert h.publish("t", b"a", b"b") == [1, 2]
    assert h.publish("t", b"c") == [3]


def test_published_message_keeps_payload_headers_and_publish_time(h: Harness) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"\x00\xff", "headers": {"k": "v"}}])
    (d,) = h.receive()
    assert (d["payload"], d["headers"], d["published_at"]) == (b"\x00\xff", {"k": "v"}, h.now)
    assert h.b.peek("t") == [
        {"seq": 1, "payload": b"\x00\xff", "headers": {"k": "v"}, "published_at": h.now}
    ]


def test_duplicate_key_within_window_stores_nothing_and_returns_original_seq(h: Harness) -> None:
    h.topic("t")
    r1 = h("publish", topic="t", messages=[{"payload": b"a", "key": "k1"}])
    h.advance(119)
    r2 = h("publish", topic="t", messages=[{"payload": b"b", "key": "k1"}, {"payload": b"c"}])
    assert r1["messages"] == [{"seq": 1, "duplicate": False}]
    assert r2["messages"] == [{"seq": 1, "duplicate": True}, {"seq": 2, "duplicate": False}]
    stats = h.b.topic_stats("t")
    assert (stats["messages"], stats["published_total"], stats["duplicates_total"]) == (2, 2, 1)


def test_duplicate_key_inside_one_batch_refers_to_the_first(h: Harness) -> None:
    h.topic("t")
    res = h("publish", topic="t", messages=[{"payload": b"a", "key": "k"}] * 3)
    assert res["messages"] == [
        {"seq": 1, "duplicate": False},
        {"seq": 1, "duplicate": True},
        {"seq": 1, "duplicate": True},
    ]


def test_key_is_new_again_once_the_dedup_window_has_passed(h: Harness) -> None:
    h.topic("t", dedup_window=10)
    h("publish", topic="t", messages=[{"payload": b"a", "key": "k"}])
    h.advance(10)
    res = h("publish", topic="t", messages=[{"payload": b"a", "key": "k"}])
    assert res["messages"] == [{"seq": 2, "duplicate": False}]


def test_a_shortened_dedup_window_expires_newer_keys_before_older_ones(h: Harness) -> None:
    h.topic("t", dedup_window=100)
    h("publish", topic="t", messages=[{"payload": b"a", "key": "old"}])
    h("update_topic", topic="t", config={"dedup_window": 10})
    h("publish", topic="t", messages=[{"payload": b"b", "key": "new"}])
    h.advance(10)
    again = h("publish", topic="t", messages=[{"payload": b"c", "key": k} for k in ("new", "old")])
    assert again["messages"] == [{"seq": 3, "duplicate": False}, {"seq": 1, "duplicate": True}]


def test_keys_of_one_publish_expire_together_as_one_entry(h: Harness) -> None:
    # Memory per keyed message is a table entry: a batch adds one expiry row, not one per key.
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"x", "key": f"k{i}"} for i in range(250)])
    t = h.b.topics["t"]
    assert len(t.dedup) == 250 and len(t.dedup.digests.heap) == 1
    h.advance(120)
    h("tick")
    assert not len(t.dedup) and not t.dedup.digests.heap


def test_zero_dedup_window_disables_dedup(h: Harness) -> None:
    h.topic("t", dedup_window=0)
    h("publish", topic="t", messages=[{"payload": b"a", "key": "k"}])
    res = h("publish", topic="t", messages=[{"payload": b"a", "key": "k"}])
    assert res["messages"] == [{"seq": 2, "duplicate": False}]


def test_message_too_large_rejects_the_whole_batch(h: Harness) -> None:
    h.topic("t", max_message_bytes=4)
    with pytest.raises(E.MessageTooLarge) as ei:
        h("publish", topic="t", messages=[{"payload": b"ok"}, {"payload": b"12345"}])
    assert (ei.value.size, ei.value.limit) == (5, 4)  # type: ignore[attr-defined]
    assert h.b.topic_stats("t")["messages"] == 0


def test_publish_to_full_reject_topic_fails_whole_batch_and_stores_nothing(h: Harness) -> None:
    h.topic("t", max_messages=3)
    h.publish("t", b"1", b"2")
    before = h.b.snapshot()
    with pytest.raises(E.TopicFull) as ei:
        h("publish", topic="t", messages=[{"payload": b"3", "key": "k"}, {"payload": b"4"}])
    assert ei.value.code == "topic_full"
    assert ei.value.topic == "t"  # type: ignore[attr-defined]
    assert h.b.snapshot() == before
    assert h.publish("t", b"3", key="k") == [3]  # the key was not remembered


def test_byte_limit_of_reject_topic_counts_payload_bytes(h: Harness) -> None:
    h.topic("t", max_bytes=10, max_message_bytes=10)
    h.publish("t", b"x" * 6)
    with pytest.raises(E.TopicFull):
        h.publish("t", b"x" * 5)
    h.publish("t", b"x" * 4)


def test_drop_oldest_topic_drops_oldest_and_counts_them(h: Harness) -> None:
    h("create_topic", topic="t", config={"max_messages": 2, "overflow": "drop_oldest"})
    h.publish("t", b"1", b"2")
    (d, *_) = h.receive(max=1)
    h.publish("t", b"3")
    stats = h.b.topic_stats("t")
    assert (stats["messages"], stats["dropped_overflow_total"], stats["first_seq"]) == (2, 1, 2)
    assert h.gstats()["dropped_total"] == 1
    assert h("ack", receipts=[d["receipt"]])["errors"][0]["code"] == "receipt_stale"
    assert [x["seq"] for x in h.receive()] == [2, 3]


def test_batch_larger_than_the_limit_is_rejected_even_for_drop_oldest(h: Harness) -> None:
    h("create_topic", topic="t", config={"max_messages": 2, "overflow": "drop_oldest"})
    with pytest.raises(E.TopicFull):
        h.publish("t", b"1", b"2", b"3")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "x",
        [b"x"],
        [{"payload": "text"}],
        [{}],
        [{"payload": b"x", "headers": {"k": 1}}],
        [{"payload": b"x", "headers": ["k"]}],
        [{"payload": b"x", "headers": {str(i): "v" for i in range(65)}}],
        [{"payload": b"x", "headers": {"k": "v" * 4097}}],
        [{"payload": b"x", "key": 5}],
        [{"payload": b"x", "key": "k" * 257}],
        [{"payload": b"x", "delay": -1}],
        [{"payload": b"x", "delay": "1"}],
        [{"payload": b"ok"}, {"payload": 1}],
    ],
)
def test_malformed_publish_is_invalid_argument_and_stores_nothing(
    h: Harness, messages: Any
) -> None:
    h.topic("t")
    before = h.b.snapshot()
    with pytest.raises(E.InvalidArgument):
        h("publish", topic="t", messages=messages)
    assert h.b.snapshot() == before


def test_delayed_message_is_not_delivered_before_its_delay(h: Harness) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"later", "delay": 5}, {"payload": b"now"}])
    assert [d["payload"] for d in h.receive()] == [b"now"]
    assert h.gstats()["delayed"] == 1
    h.advance(4.999)
    assert h.receive() == []
    h.advance(0.001)
    (d,) = h.receive()
    assert (d["payload"], d["attempt"]) == (b"later", 1)


# ---------------------------------------------------------------- receive


def test_first_deliveries_come_in_seq_order_and_respect_max(h: Harness) -> None:
    h.topic("t")
    h.publish("t", *[b"%d" % i for i in range(5)])
    assert [d["seq"] for d in h.receive(max=2)] == [1, 2]
    assert [d["seq"] for d in h.receive(max=10)] == [3, 4, 5]
    assert h.receive() == []


def test_in_flight_message_is_not_delivered_to_another_consumer(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    assert len(h.receive(consumer="a")) == 1
    assert h.receive(consumer="b") == []
    assert h.gstats()["in_flight"] == 1


def test_visibility_timeout_redelivers_with_the_next_attempt(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d1,) = h.receive()
    assert d1["deadline"] == h.now + 30_000
    h.advance(29.999)
    assert h.receive() == []
    h.advance(0.001)
    (d2,) = h.receive(consumer="c2")
    assert (d2["seq"], d2["attempt"]) == (1, 2)
    assert d2["receipt"] != d1["receipt"]
    assert h.gstats()["timed_out_total"] == 1


def test_receive_visibility_overrides_the_group_timeout(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive(visibility=2)
    assert d["deadline"] == h.now + 2000


def test_redeliveries_once_available_go_before_newer_messages(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2", b"3")
    first = h.receive(max=2)
    h("nack", receipts=[first[1]["receipt"]])
    h("nack", receipts=[first[0]["receipt"]])
    assert [(d["seq"], d["attempt"]) for d in h.receive(max=3)] == [(2, 2), (1, 2), (3, 1)]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"token": b"short"}, "token"),
        ({"token": "x" * 16}, "token"),
        ({"token": None}, "token"),
        ({"max": 0}, "max"),
        ({"max": 1001}, "max"),
        ({"consumer": ""}, "consumer"),
        ({"consumer": 7}, "consumer"),
        ({"visibility": 0}, "visibility"),
        ({"visibility": 12 * 3600 + 1}, "visibility"),
    ],
)
def test_bad_receive_is_invalid_argument_and_delivers_nothing(
    h: Harness, fields: dict[str, Any], field: str
) -> None:
    h.topic("t")
    h.publish("t", b"x")
    before = h.b.snapshot()
    cmd = {"topic": "t", "group": "default", "consumer": "c", "token": h.token(), **fields}
    with pytest.raises(E.InvalidArgument) as ei:
        h("receive", **cmd)
    assert ei.value.field == field  # type: ignore[attr-defined]
    assert h.b.snapshot() == before


# ---------------------------------------------------------------- ack


def test_acked_message_is_never_delivered_again(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive()
    assert h("ack", receipts=[d["receipt"]]) == {"acked": 1, "errors": []}
    h.advance(3600)
    assert h.receive() == []
    stats = h.gstats()
    assert (stats["acked_total"], stats["in_flight"], stats["pending"]) == (1, 0, 0)
    assert h.b.topic_stats("t")["messages"] == 0


def test_ack_with_receipt_of_earlier_attempt_is_rejected_and_changes_nothing(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d1,) = h.receive()
    h.advance(30)
    (d2,) = h.receive()
    before = h.b.snapshot()
    for op, extra in (("ack", {}), ("nack", {}), ("extend", {"seconds": 60}), ("term", {})):
        res = h(op, receipts=[d1["receipt"]], **extra)
        assert res["errors"] == [
            {
                "receipt": d1["receipt"],
                "code": "receipt_stale",
                "message": res["errors"][0]["message"],
                "details": {"receipt": d1["receipt"]},
            }
        ]
        assert (
            "is for attempt 1 of message 1, but attempt 2 is in flight"
            in (res["errors"][0]["message"])
        )
    assert _same_but_counter(h, before)
    assert h("ack", receipts=[d2["receipt"]])["acked"] == 1


def _same_but_counter(h: Harness, before: bytes) -> bool:
    """Only the applied-commands counter may differ after rejected receipts."""
    other = Broker()
    other.restore(before)
    other.applied_commands = h.b.applied_commands
    return bool(other.snapshot() == h.b.snapshot())


def test_ack_with_a_forged_mac_is_receipt_invalid(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive()
    forged = d["receipt"][:-4] + ("0000" if not d["receipt"].endswith("0000") else "1111")
    res = h("ack", receipts=[forged])
    assert res["acked"] == 0
    assert res["errors"][0]["code"] == "receipt_invalid"
    assert h.gstats()["in_flight"] == 1


@pytest.mark.parametrize(
    "receipt",
    [
        5,
        None,
        ["t"],
        "",
        "garbage",
        "t:default:1:1",
        "t:default:x:1:ab",
        "t:default:1:-1:ab",
        "t:default:\u00b2:1:ab",  # a unicode digit
        "t:default:" + "9" * 5000 + ":1:ab",
        "t:default:1:1:ab:extra",
    ],
)
def test_malformed_receipt_is_receipt_invalid(h: Harness, receipt: Any) -> None:
    h.topic("t")
    h.publish("t", b"x")
    h.receive()
    res = h("ack", receipts=[receipt])
    assert res["acked"] == 0
    assert res["errors"][0]["code"] == "receipt_invalid"


def test_ack_naming_an_unknown_topic_or_group_is_invalid_and_a_gone_delivery_stale(
    h: Harness,
) -> None:
    h.topic("t")
    res = h("ack", receipts=["nope:default:1:1:ab", "t:nope:1:1:ab", "t:default:1:1:ab"])
    assert [e["code"] for e in res["errors"]] == [
        "receipt_invalid",
        "receipt_invalid",
        "receipt_stale",
    ]
    assert "topic 'nope'" in res["errors"][0]["message"]
    assert "group 'nope' of topic 't'" in res["errors"][1]["message"]


def test_ack_batch_settles_the_good_receipts_and_reports_each_bad_one(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2")
    d = h.receive()
    res = h("ack", receipts=[d[0]["receipt"], "junk", d[1]["receipt"], d[0]["receipt"]])
    assert res["acked"] == 2
    assert [(e["receipt"], e["code"]) for e in res["errors"]] == [
        ("junk", "receipt_invalid"),
        (d[0]["receipt"], "receipt_stale"),
    ]


@pytest.mark.parametrize("op", ["ack", "nack", "extend", "term"])
@pytest.mark.parametrize("receipts", [None, [], "r", {"r": 1}])
def test_receipts_must_be_a_non_empty_list(h: Harness, op: str, receipts: Any) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h(op, receipts=receipts, seconds=1)
    assert ei.value.field == "receipts"  # type: ignore[attr-defined]


def test_message_is_freed_only_when_every_group_settled_it(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"x")
    h("ack", receipts=[d["receipt"] for d in h.receive(group="a")])
    assert h.b.topic_stats("t")["messages"] == 1
    h("ack", receipts=[d["receipt"] for d in h.receive(group="b")])
    assert h.b.topic_stats("t")["messages"] == 0


# ---------------------------------------------------------------- nack, extend, term, release


def test_nack_makes_the_message_available_at_once(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive()
    assert h("nack", receipts=[d["receipt"]]) == {"nacked": 1, "dead_lettered": 0, "errors": []}
    (d2,) = h.receive()
    assert d2["attempt"] == 2


def test_nack_with_delay_holds_the_message_back(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive()
    h("nack", receipts=[d["receipt"]], delay=10)
    assert h.gstats()["delayed"] == 1
    h.advance(9.9)
    assert h.receive() == []
    h.advance(0.1)
    assert [x["attempt"] for x in h.receive()] == [2]


def test_nack_without_delay_follows_the_group_backoff(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"backoff": [1, 5]}}])
    h.publish("t", b"x")
    delays = []
    for _ in range(3):
        (d,) = h.receive(group="g")
        h("nack", receipts=[d["receipt"]])
        waited = 0.0
        while not h.gstats("t", "g")["pending"]:
            h.advance(0.5)
            h("tick")
            waited += 0.5
        delays.append(waited)
    assert delays == [1, 5, 5]


def test_bad_nack_delay_is_invalid_argument(h: Harness) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h("nack", receipts=["a:b:1:1:c"], delay=-1)
    assert ei.value.field == "delay"  # type: ignore[attr-defined]


def test_nack_past_max_attempts_dead_letters_with_history_headers(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"max_attempts": 2}}])
    h("publish", topic="t", messages=[{"payload": b"x", "headers": {"h": "1"}}])
    published = h.now
    (d,) = h.receive(group="g")
    assert h("nack", receipts=[d["receipt"]])["dead_lettered"] == 0
    (d,) = h.receive(group="g")
    assert h("nack", receipts=[d["receipt"]])["dead_lettered"] == 1
    assert h.receive(group="g") == []
    (dl,) = h.receive(topic="t.dlq")
    assert dl["payload"] == b"x"
    assert dl["headers"] == {
        "h": "1",
        "x-raftq-dlq-topic": "t",
        "x-raftq-dlq-group": "g",
        "x-raftq-dlq-seq": "1",
        "x-raftq-dlq-attempts": "2",
        "x-raftq-dlq-reason": "nack",
        "x-raftq-dlq-published-at": str(published),
    }
    stats = h.gstats("t", "g")
    assert (stats["dead_lettered_total"], stats["acked_total"]) == (1, 0)
    assert h.b.topic_stats("t")["messages"] == 0


def test_extend_moves_the_deadline_and_keeps_the_receipt(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive()
    h.advance(20)
    res = h("extend", receipts=[d["receipt"]], seconds=60)
    assert res == {"extended": 1, "deadline": h.now + 60_000, "errors": []}
    h.advance(59)
    assert h.receive() == []
    assert h("ack", receipts=[d["receipt"]])["acked"] == 1


@pytest.mark.parametrize("seconds", [None, 0, -1, "5", 12 * 3600 + 1])
def test_bad_extend_seconds_is_invalid_argument(h: Harness, seconds: Any) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h("extend", receipts=["a:b:1:1:c"], seconds=seconds)
    assert ei.value.field == "seconds"  # type: ignore[attr-defined]


def test_term_dead_letters_at_once_with_the_reason(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    (d,) = h.receive()
    assert h("term", receipts=[d["receipt"]], reason="poison") == {"terminated": 1, "errors": []}
    (dl,) = h.receive(topic="t.dlq")
    assert dl["headers"]["x-raftq-dlq-reason"] == "term: poison"
    assert dl["headers"]["x-raftq-dlq-attempts"] == "1"
    assert h.gstats()["dead_lettered_total"] == 1


def test_term_with_a_non_string_reason_is_invalid_argument(h: Harness) -> None:
    with pytest.raises(E.InvalidArgument):
        h("term", receipts=["a:b:1:1:c"], reason=5)


def test_dead_lettering_with_the_dead_letter_topic_disabled_drops_the_message(
    h: Harness,
) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"dead_letter_topic": None}}])
    h.publish("t", b"x")
    (d,) = h.receive(group="g")
    h("term", receipts=[d["receipt"]])
    assert h.b.list_topics() == ["t"]
    assert h.b.topic_stats("t")["messages"] == 0
    assert h.gstats("t", "g")["dead_lettered_total"] == 1


def test_dead_letter_topic_is_created_on_demand_with_a_default_group_that_never_dead_letters(
    h: Harness,
) -> None:
    h.topic("t")
    h.publish("t", b"x")
    assert "t.dlq" not in h.b.list_topics()
    h("term", receipts=[h.receive()[0]["receipt"]])
    cfg = h.gstats("t.dlq")["config"]
    assert (cfg["max_attempts"], cfg["dead_letter_topic"]) == (0, None)


def test_release_makes_all_in_flight_messages_of_a_consumer_available_at_once(
    h: Harness,
) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"1", b"2", b"3")
    h.receive(group="a", consumer="gone", max=2)
    h.receive(group="b", consumer="gone", max=1)
    h.receive(group="b", consumer="other", max=1)
    assert h("release", consumer="gone") == {
        "consumer": "gone",
        "released": 3,
        "dead_lettered": 0,
    }
    assert [(d["seq"], d["attempt"]) for d in h.receive(group="a")] == [(1, 2), (2, 2), (3, 1)]
    assert [(d["seq"], d["attempt"]) for d in h.receive(group="b")] == [(1, 2), (3, 1)]
    assert h.gstats("t", "b")["in_flight"] == 3


def test_release_counts_the_attempt_and_dead_letters_when_attempts_are_used_up(
    h: Harness,
) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"max_attempts": 1}}])
    h.publish("t", b"x")
    h.receive(group="g", consumer="gone")
    assert h("release", consumer="gone")["dead_lettered"] == 1
    assert h.receive(topic="t.dlq")[0]["headers"]["x-raftq-dlq-reason"] == "released"


def test_release_of_an_unknown_consumer_releases_nothing(h: Harness) -> None:
    assert h("release", consumer="nobody")["released"] == 0
    with pytest.raises(E.InvalidArgument):
        h("release", consumer=None)


def test_release_with_topics_releases_only_deliveries_on_matching_topics(h: Harness) -> None:
    for name in ("orders", "orders.eu", "orders.us", "ordersx.eu", "audit"):
        h.topic(name)
        h.publish(name, b"x")
        h.receive(name, consumer="gone")
    res = h("release", consumer="gone", topics=["orders.*", "audit"])
    assert res == {"consumer": "gone", "released": 3, "dead_lettered": 0}
    released = {n: h.gstats(n)["in_flight"] == 0 for n in h.b.list_topics()}
    assert released == {
        "orders": False,
        "orders.eu": True,
        "orders.us": True,
        "ordersx.eu": False,
        "audit": True,
    }
    assert h("release", consumer="gone", topics=["*"])["released"] == 2


def test_release_with_an_empty_topics_list_releases_nothing(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    h.receive(consumer="gone")
    assert h("release", consumer="gone", topics=[])["released"] == 0
    assert h.gstats()["in_flight"] == 1


@pytest.mark.parametrize(
    "topics",
    [None, "t", ["t*"], [5], ["t", "*.t"], ["t"] * 65],
    ids=["none", "a-string", "glob", "int", "star-first", "too-many"],
)
def test_release_with_bad_topics_is_invalid_argument_and_releases_nothing(
    h: Harness, topics: Any
) -> None:
    h.topic("t")
    h.publish("t", b"x")
    h.receive(consumer="gone")
    before = h.b.snapshot()
    with pytest.raises(E.InvalidArgument) as ei:
        h("release", consumer="gone", topics=topics)
    assert ei.value.field == "topics"  # type: ignore[attr-defined]
    assert h.b.snapshot() == before


# ---------------------------------------------------------------- timeouts and tick


def test_timeout_past_max_attempts_dead_letters(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"max_attempts": 2}}])
    h.publish("t", b"x")
    for _ in range(2):
        assert len(h.receive(group="g")) == 1
        h.advance(30)
        h("tick")
    assert h.receive(group="g") == []
    stats = h.gstats("t", "g")
    assert (stats["timed_out_total"], stats["dead_lettered_total"]) == (2, 1)
    headers = h.receive(topic="t.dlq")[0]["headers"]
    assert headers["x-raftq-dlq-reason"] == "visibility_timeout"
    assert headers["x-raftq-dlq-attempts"] == "2"


def test_max_attempts_zero_never_dead_letters(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "g", "config": {"max_attempts": 0}}])
    h.publish("t", b"x")
    for attempt in range(1, 21):
        (d,) = h.receive(group="g")
        assert d["attempt"] == attempt
        h("nack", receipts=[d["receipt"]])
    assert "t.dlq" not in h.b.list_topics()


def test_tick_fires_due_deadlines_and_reports_now(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    h.receive()
    h.advance(31)
    assert h("tick") == {"now": h.now}
    assert h.gstats()["pending"] == 1
    assert h.b.next_due() is None


def test_time_never_goes_back(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x")
    h.advance(10)
    h("tick")
    h.now -= 5000
    assert h("tick") == {"now": h.now + 5000}
    (d,) = h.receive()
    assert d["deadline"] == h.now + 5000 + 30_000


def test_command_without_integer_now_is_rejected(h: Harness) -> None:
    for now in (None, "1", -1, 1.5, True, 2**53, 2**70):
        with pytest.raises(E.InvalidArgument) as ei:
            h.b.apply({"op": "tick", "now": now})
        assert ei.value.field == "now"  # type: ignore[attr-defined]


def test_next_due_names_the_earliest_deadline_delay_or_retention(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x", key="k")  # dedup expiry needs no tick
    assert h.b.next_due() is None
    h.receive(visibility=7)
    assert h.b.next_due() == h.now + 7000
    h("publish", topic="t", messages=[{"payload": b"y", "delay": 3}])
    assert h.b.next_due() == h.now + 3000
    h("update_topic", topic="t", config={"max_age": 2})
    assert h.b.next_due() == h.now + 2000


def test_next_due_ignores_deadlines_of_settled_deliveries(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"x", b"y")
    (d1,) = h.receive(max=1, visibility=5)
    (d2,) = h.receive(max=1, visibility=9)
    h("ack", receipts=[d1["receipt"]])
    assert h.b.next_due() == h.now + 9000
    h("ack", receipts=[d2["receipt"]])
    assert h.b.next_due() is None


# ---------------------------------------------------------------- retention, purge, redrive


def test_max_age_retention_drops_old_messages_and_counts_them(h: Harness) -> None:
    h("create_topic", topic="t", config={"max_age": 60}, groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"1")
    (d,) = h.receive(group="a")
    h.advance(30)
    h.publish("t", b"2")
    h.advance(30)
    h("tick")
    stats = h.b.topic_stats("t")
    assert (stats["messages"], stats["expired_total"], stats["first_seq"]) == (1, 1, 2)
    assert h.gstats("t", "a")["dropped_total"] == 1
    assert h.gstats("t", "b")["dropped_total"] == 1
    assert h("ack", receipts=[d["receipt"]])["errors"][0]["code"] == "receipt_stale"
    assert [x["seq"] for x in h.receive(group="b")] == [2]


def test_purge_topic_removes_every_message_and_delivery(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2", b"3")
    (d, *_) = h.receive(max=1)
    assert h("purge", topic="t") == {"topic": "t", "purged": 3}
    assert h.gstats()["purged_total"] == 3
    assert h.receive() == []
    assert h.gstats()["in_flight"] == 0
    assert h("ack", receipts=[d["receipt"]])["errors"][0]["code"] == "receipt_stale"
    assert h.publish("t", b"4") == [4]
    assert [x["seq"] for x in h.receive()] == [4]


def test_purge_group_settles_its_backlog_only(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"1", b"2")
    h.receive(group="a", max=1)
    assert h("purge", topic="t", group="a") == {"topic": "t", "group": "a", "purged": 2}
    assert h.gstats("t", "a")["purged_total"] == 2
    assert h.receive(group="a") == []
    assert len(h.receive(group="b")) == 2
    assert h.b.topic_stats("t")["messages"] == 2


def test_redrive_moves_dead_letters_back_to_their_source_group_only(h: Harness) -> None:
    h("create_topic", topic="t", groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"x")
    h("term", receipts=[h.receive(group="a")[0]["receipt"]], reason="bug")
    h("ack", receipts=[h.receive(group="b")[0]["receipt"]])
    assert h("redrive", topic="t.dlq") == {"topic": "t.dlq", "redriven": 1, "skipped": 0}
    assert h.b.topic_stats("t.dlq")["messages"] == 0
    assert h.receive(group="b") == []
    (d,) = h.receive(group="a")
    assert (d["seq"], d["attempt"], d["payload"]) == (2, 1, b"x")
    assert d["headers"]["x-raftq-redrives"] == "1"
    assert d["headers"]["x-raftq-dlq-reason"] == "term: bug"
    assert d["headers"]["x-raftq-dlq-seq"] == "1"
    h("term", receipts=[d["receipt"]])
    h("redrive", topic="t.dlq")
    assert h.receive(group="a")[0]["headers"]["x-raftq-redrives"] == "2"


def test_redrive_skips_dead_letters_whose_source_is_gone_and_respects_max(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2", b"3")
    h("term", receipts=[d["receipt"] for d in h.receive()])
    assert h("redrive", topic="t.dlq", max=2)["redriven"] == 2
    h("delete_topic", topic="t")
    assert h("redrive", topic="t.dlq") == {"topic": "t.dlq", "redriven": 0, "skipped": 1}
    with pytest.raises(E.InvalidArgument):
        h("redrive", topic="t.dlq", max=0)


def test_redrive_tolerates_a_forged_redrive_counter(h: Harness) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"x", "headers": {"x-raftq-redrives": "²"}}])
    h("term", receipts=[h.receive()[0]["receipt"]])
    assert h("redrive", topic="t.dlq")["redriven"] == 1
    assert h.receive()[0]["headers"]["x-raftq-redrives"] == "1"


# ---------------------------------------------------------------- queries


def test_may_deliver_says_no_only_when_a_receive_would_deliver_nothing(h: Harness) -> None:
    assert h.b.may_deliver("nope", "default")  # the receive reports the missing topic
    h.topic("t")
    assert h.b.may_deliver("t", "nope")  # ... or the missing group
    assert not h.b.may_deliver("t", "default")  # empty
    h.publish("t", b"1")
    assert h.b.may_deliver("t", "default")  # fresh
    d = h.receive(max=1)
    assert not h.b.may_deliver("t", "default")  # all in flight
    h("nack", receipts=[d[0]["receipt"]], delay=0)
    assert h.b.may_deliver("t", "default")  # ready again
    d = h.receive(max=1)
    h("nack", receipts=[d[0]["receipt"]], delay=60)
    assert not h.b.may_deliver("t", "default")  # only delayed


def test_group_stats_count_each_state_and_the_oldest_age(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2", b"3", b"4")
    h.advance(5)
    d = h.receive(max=2)
    h("nack", receipts=[d[0]["receipt"]], delay=60)
    stats = h.gstats()
    assert {k: stats[k] for k in ("pending", "in_flight", "delayed", "oldest_age_ms")} == {
        "pending": 2,
        "in_flight": 1,
        "delayed": 1,
        "oldest_age_ms": 5000,
    }
    assert (stats["delivered_total"], stats["nacked_total"]) == (2, 1)


def test_topic_stats_report_size_and_totals(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"abc", b"de")
    stats = h.b.topic_stats("t")
    assert (stats["messages"], stats["bytes"], stats["first_seq"], stats["last_seq"]) == (
        2,
        5,
        1,
        2,
    )
    assert stats["published_total"] == 2
    with pytest.raises(E.TopicNotFound):
        h.b.topic_stats("nope")
    with pytest.raises(E.GroupNotFound):
        h.b.group_stats("t", "nope")


def test_peek_reads_without_delivering(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2", b"3")
    assert [m["seq"] for m in h.b.peek("t", from_seq=2, limit=5)] == [2, 3]
    assert [m["seq"] for m in h.b.peek("t", limit=1)] == [1]
    assert h.gstats()["pending"] == 3
    with pytest.raises(E.InvalidArgument):
        h.b.peek("t", limit=0)
    with pytest.raises(E.InvalidArgument):
        h.b.peek("t", from_seq="2")
    with pytest.raises(E.TopicNotFound):
        h.b.peek("nope")


# ---------------------------------------------------------------- dispatch, errors, snapshot


@pytest.mark.parametrize("op", [None, "explode", 5, ["publish"]])
def test_unknown_op_is_invalid_argument(h: Harness, op: Any) -> None:
    with pytest.raises(E.InvalidArgument) as ei:
        h.b.apply({"op": op, "now": h.now})
    assert ei.value.field == "op"  # type: ignore[attr-defined]
    assert h.b.applied_commands == 0


def test_apply_batch_returns_one_result_per_command_with_errors_in_place(h: Harness) -> None:
    res = h.b.apply_batch(
        h.now, [{"op": "create_topic", "topic": "t"}, "junk", {"op": "create_topic", "topic": "t"}]
    )
    assert res[0] == {"topic": "t", "created": True}
    assert res[1]["error"]["code"] == "invalid_argument"
    assert res[2]["error"] == {
        "code": "topic_exists",
        "message": "topic 't' already exists",
        "details": {"topic": "t"},
    }


def test_every_error_code_round_trips_through_its_wire_form() -> None:
    for code, cls in E.ERRORS_BY_CODE.items():
        err = cls("boom", topic="t", size=3)
        back = E.from_wire(err.to_wire())
        assert type(back) is cls
        assert back.code == code
        assert (back.message, back.details) == ("boom", {"topic": "t", "size": 3})
    assert type(E.from_wire({"code": "what"})) is E.BrokerError
    odd = E.from_wire({"code": "topic_full", "message": "m", "details": {"message": 1, "code": 2}})
    assert (type(odd), odd.code, odd.message) == (E.TopicFull, "topic_full", "m")
    assert type(E.from_wire({"code": "topic_full", "details": [1]})) is E.TopicFull
    assert issubclass(E.ReceiptStale, E.ReceiptError)
    assert issubclass(E.MessageTooLarge, E.InvalidArgument)


def test_snapshot_restore_is_an_exact_round_trip(h: Harness) -> None:
    h("create_topic", topic="t", config={"max_age": 600}, groups=[{"group": "a"}, {"group": "b"}])
    h.publish("t", b"1", b"2", b"3", key="k")
    h.publish("t", b"4", b"5", headers={"x": "y"})
    h("publish", topic="t", messages=[{"payload": b"6", "delay": 9}])
    d = h.receive(group="a", max=3)
    h("ack", receipts=[d[0]["receipt"]])
    h("nack", receipts=[d[1]["receipt"]], delay=3)
    h("term", receipts=[d[2]["receipt"]])
    h.receive(group="b", max=2, consumer="z")
    snap = h.b.snapshot()
    other = Broker()
    other.restore(snap)
    assert other.snapshot() == snap
    assert other.digest() == h.b.digest()
    # and it keeps behaving the same
    for b in (h.b, other):
        b.apply({"op": "tick", "now": h.now + 31_000})
        b.apply({"op": "release", "consumer": "c1", "now": h.now + 31_000})
    assert other.snapshot() == h.b.snapshot()


def test_a_version_2_snapshot_with_one_dedup_row_per_key_still_restores(h: Harness) -> None:
    import msgpack

    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"a", "key": "k1"}, {"payload": b"b"}])
    h("publish", topic="t", messages=[{"payload": b"c", "key": "k2"}])  # same expiry as k1
    h.advance(5)
    h("publish", topic="t", messages=[{"payload": b"d", "key": "k3"}])
    version, now, applied, topics = msgpack.unpackb(legacy_snapshot(h.b, 3), raw=False)
    assert version == 3
    for t in topics:  # the version 2 layout: [key, seq, expires_at] per key
        t[7] = [[k, s, exp] for exp, keys, seqs in t[7] for k, s in zip(keys, seqs, strict=True)]
    old = Broker()
    old.restore(msgpack.packb([2, now, applied, topics], use_bin_type=True))
    for b in (old, h.b):
        got = [b.topics["t"].dedup.digests.get(key_digest(k)) for k in ("k1", "k2", "k3", "k4")]
        assert got == [1, 3, 4, None] and len(b.topics["t"].dedup) == 3
    assert state_of(old) == state_of(h.b)  # (converted: same state, maybe another layout)
    again = [{"payload": b"x", "key": k} for k in ("k1", "k3")]
    for b in (h.b, old):
        res = b.apply({"op": "publish", "topic": "t", "now": h.now + 117_000, "messages": again})
        assert [m["duplicate"] for m in res["messages"]] == [False, True]  # k1 expired, k3 not
    assert state_of(old) == state_of(h.b)


def test_restore_rejects_an_unknown_snapshot_version() -> None:
    import msgpack

    with pytest.raises(ValueError, match="version"):
        Broker().restore(msgpack.packb([99, 0, 0, []]))


@pytest.mark.parametrize("data", [b"", b"junk", b"\x94\x01\x00\x00\x91\x01"])
def test_restore_of_a_corrupt_snapshot_is_value_error_and_keeps_the_state(
    h: Harness, data: bytes
) -> None:
    h.topic("t")
    h.publish("t", b"x")
    before = h.b.snapshot()
    with pytest.raises(ValueError, match="snapshot"):
        h.b.restore(data)
    assert h.b.snapshot() == before


def test_results_do_not_alias_the_state(h: Harness) -> None:
    h.topic("t")
    h("publish", topic="t", messages=[{"payload": b"x", "headers": {"a": "b"}}])
    before = h.b.snapshot()
    h.b.peek("t")[0]["headers"]["a"] = "changed"
    h.gstats()["config"]["backoff"].append(1)
    h.b.topic_stats("t")["config"]["max_messages"] = 1
    assert h.b.snapshot() == before
    (d,) = h.receive()
    d["headers"]["a"] = "changed"
    assert h.b.peek("t")[0]["headers"] == {"a": "b"}


@pytest.mark.parametrize("name", [None, 5, ["t"], {"t": 1}, "bad name"])
def test_queries_with_a_bad_name_raise_broker_errors(h: Harness, name: Any) -> None:
    h.topic("t")
    with pytest.raises(E.InvalidName):
        h.b.topic_stats(name)
    with pytest.raises(E.InvalidName):
        h.b.group_stats(name, "default")
    with pytest.raises(E.InvalidName):
        h.b.group_stats("t", name)
    with pytest.raises(E.InvalidName):
        h.b.peek(name)


def test_acked_deliveries_do_not_accumulate_deadline_entries(h: Harness) -> None:
    h.check = False  # 30k commands
    h.topic("t")
    for i in range(10_000):
        h.publish("t", b"x")
        (d,) = h.receive(max=1)
        if i % 10:
            h("ack", receipts=[d["receipt"]])
        else:
            h("extend", receipts=[d["receipt"]], seconds=100)  # stays in flight
    assert h.gstats()["in_flight"] == 1000
    assert len(h.b._deadlines) <= 2 * 1000 + 4096 + 1
    h.advance(100)
    h("tick")
    assert (h.gstats()["in_flight"], h.gstats()["timed_out_total"]) == (0, 1000)


def test_earliest_group_keeps_what_older_groups_settle_after_it_was_created(h: Harness) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2", b"3")
    d = h.receive(max=3)
    h("ack", receipts=[d[1]["receipt"]])  # seq 2 is gone before the new group exists
    h("create_group", topic="t", group="e", start="earliest")
    assert h.gstats("t", "e")["pending"] == 2
    h("ack", receipts=[d[0]["receipt"], d[2]["receipt"]])
    assert h.b.topic_stats("t")["messages"] == 2  # pinned by e
    e = h.receive(group="e")
    assert [x["seq"] for x in e] == [1, 3]
    h("ack", receipts=[e[0]["receipt"]])
    assert [m["seq"] for m in h.b.peek("t")] == [3]
    h("ack", receipts=[e[1]["receipt"]])
    assert h.b.topic_stats("t")["messages"] == 0


def test_two_earliest_groups_both_get_the_backlog_and_deleting_one_frees_only_its_share(
    h: Harness,
) -> None:
    h.topic("t")
    h.publish("t", b"1", b"2")
    h("create_group", topic="t", group="e1", start="earliest")
    h.publish("t", b"3")
    h("create_group", topic="t", group="e2", start="earliest")
    h("purge", topic="t", group="default")
    assert [x["seq"] for x in h.receive(group="e2", max=1)] == [1]
    assert h.b.topic_stats("t")["messages"] == 3
    h("delete_group", topic="t", group="e1")
    assert h.b.topic_stats("t")["messages"] == 3  # e2 still needs all three
    assert h("purge", topic="t", group="e2")["purged"] == 3
    assert h.b.topic_stats("t")["messages"] == 0


def test_earliest_group_on_a_topic_without_groups_gets_everything_retained(h: Harness) -> None:
    h("create_topic", topic="t", groups=[])
    h.publish("t", b"1", b"2")
    h("create_group", topic="t", group="e", start="earliest")
    h("create_group", topic="t", group="f", start="earliest")
    d = h.receive(group="e")
    h("ack", receipts=[x["receipt"] for x in d])
    assert h.b.topic_stats("t")["messages"] == 2
    h("ack", receipts=[x["receipt"] for x in h.receive(group="f")])
    assert h.b.topic_stats("t")["messages"] == 0


def test_next_due_of_retention_follows_the_oldest_message_left(h: Harness) -> None:
    h.topic("t", max_age=10)
    h.publish("t", b"a")
    first = h.now
    h.advance(4)
    h.publish("t", b"b")
    assert h.b.next_due() == first + 10_000
    (d, _) = h.receive()
    h("ack", receipts=[d["receipt"]])  # "a" leaves: "b" is the oldest now
    assert h.b.next_due() == first + 14_000
    h("purge", topic="t")
    assert h.b.next_due() is None


def test_a_shortened_max_age_expires_at_the_next_command(h: Harness) -> None:
    h.topic("t", max_age=600)
    h.topic("other")
    h.publish("t", b"a")
    h.advance(10)
    h("update_topic", topic="t", config={"max_age": 5})
    h.publish("other", b"x")  # any command: the expiry does not wait for one on "t"
    assert h.b.topic_stats("t")["expired_total"] == 1


def test_commands_check_only_the_topics_whose_expiry_is_due(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    for cls_fn in ("_expire_messages", "_expire_keys"):
        orig = getattr(Broker, cls_fn)

        def spy(self: Broker, t: Any, now: int, orig: Any = orig) -> None:
            checked.append(t.name)
            orig(self, t, now)

        monkeypatch.setattr(Broker, cls_fn, spy)
    h.check = False
    for i in range(300):
        h.topic(f"t{i}", max_age=60, dedup_window=30)
        h("publish", topic=f"t{i}", messages=[{"payload": b"x", "key": "k"}])
    for _ in range(100):
        h.advance(0.1)
        h.publish("t0", b"y")
    assert checked == []
    h.advance(30)
    h("tick")
    assert len(checked) == 300  # the keys
    h.advance(30)
    h("tick")
    assert len(checked) == 600 and h.b.topic_stats("t7")["expired_total"] == 1


def test_deleted_topics_do_not_leave_expiry_entries_behind(h: Harness) -> None:
    h.check = False
    for i in range(3000):  # short-lived topics, each with a key and a 10-day max_age
        h.topic(f"tmp{i % 7}", max_age=864_000)
        h("publish", topic=f"tmp{i % 7}", messages=[{"payload": b"x", "key": "k"}])
        h("delete_topic", topic=f"tmp{i % 7}")
    for index in (h.b._aging, h.b._dedup_expiry):
        assert not index.at and len(index.heap) <= 1024


# ---------------------------------------------------------------- found by review


def test_a_group_whose_messages_all_come_delayed_keeps_no_skip_entries(h: Harness) -> None:
    # A scheduler topic: every message delayed, each taken and acked when due. The group's
    # skip set (and every snapshot) used to grow by one entry per message, for ever.
    h.topic("jobs")
    for _ in range(300):
        h.publish("jobs", b"job", delay=1)
        h.advance(1.5)
        h("tick")
        done = h.receive("jobs", "default", max=10)
        assert len(done) == 1
        h("ack", receipts=[d["receipt"] for d in done])
    g = h.b.topics["jobs"].groups["default"]
    assert len(g.skip) <= 1 and g.fresh == 0


def test_redrives_to_one_group_leave_no_skip_entries_in_a_caught_up_one(h: Harness) -> None:
    groups = [{"group": "a", "config": {"max_attempts": 1}}, {"group": "b"}]
    h("create_topic", topic="t", groups=groups)
    h.publish("t", *[b"m"] * 200)
    for g, op in (("a", "term"), ("b", "ack")):
        for _ in range(20):
            h(op, receipts=[d["receipt"] for d in h.receive("t", g)])
    for _ in range(200):  # b is caught up and takes no part in these
        assert h("redrive", topic="t.dlq", max=1)["redriven"] == 1
    assert len(h.b.topics["t"].groups["b"].skip) <= 1
    assert len(h.receive("t", "a", max=1000)) == 200


def test_a_retry_of_stored_messages_gets_its_results_even_from_a_full_topic(h: Harness) -> None:
    h.topic("t", max_messages=5)
    first = h("publish", topic="t", messages=[{"payload": b"a", "key": "k1"}])["messages"]
    h.publish("t", b"x", b"x", b"x", b"x")
    h("update_topic", topic="t", config={"max_messages": 3})  # now over its limit
    again = h("publish", topic="t", messages=[{"payload": b"a", "key": "k1"}])["messages"]
    assert again == [{"seq": first[0]["seq"], "duplicate": True}]
    # drop_oldest: a retry that stores nothing drops nothing either
    h("update_topic", topic="t", config={"overflow": "drop_oldest"})
    h("publish", topic="t", messages=[{"payload": b"a", "key": "k1"}])
    assert h.b.topic_stats("t")["messages"] == 5


def test_redrive_moves_each_dead_letter_once_even_if_headers_name_the_dlq_itself(
    h: Harness,
) -> None:
    h.topic("d")
    loop = {"x-raftq-dlq-topic": "d", "x-raftq-dlq-group": "default"}
    h("publish", topic="d", messages=[{"payload": b"p", "headers": loop}])
    assert h("redrive", topic="d", max=100) == {"topic": "d", "redriven": 0, "skipped": 1}
    assert h.b.topic_stats("d")["messages"] == 1


def test_a_longest_name_ending_in_dlq_gets_a_dead_letter_topic_of_its_own(h: Harness) -> None:
    topic = "q" * 124 + ".dlq"
    h("create_topic", topic=topic)
    dlq = h.gstats(topic)["config"]["dead_letter_topic"]
    assert dlq != topic and len(dlq) <= 128


def test_a_late_earliest_group_and_acks_below_its_pin_keep_the_invariants(h: Harness) -> None:
    h("create_topic", topic="u", groups=[{"group": "A"}])
    h.publish("u", b"1", b"2", b"3")
    ds = h.receive("u", "A", max=3)
    h("ack", receipts=[ds[1]["receipt"], ds[2]["receipt"]])
    h("create_group", topic="u", group="E", start="earliest")
    h("ack", receipts=[ds[0]["receipt"]])
    (e,) = h.receive("u", "E", max=1)
    assert e["payload"] == b"1"
    h("ack", receipts=[e["receipt"]])  # the harness checks the invariants after each command


def test_overview_sums_every_topic_and_group(h: Harness) -> None:
    h.topic("a")
    h("create_group", topic="a", group="g2")
    h.topic("b")
    h.publish("a", b"1", b"2", b"3")
    h.publish("b", b"4")
    h.receive("a", max=1)
    h("nack", receipts=[h.receive("b")[0]["receipt"]], delay=60)
    ov = h.b.overview()
    stats = [h.b.topic_stats(n) for n in ("a", "b")]
    groups = [g for t in stats for g in t["groups"]]
    assert ov["totals"] == {
        "topics": 2,
        "groups": 3,
        "messages": 4,
        "bytes": 4,
        "pending": sum(g["pending"] for g in groups),
        "delayed": 1,
        "in_flight": 1,
    }
    # (unsettled: a's default group 3 (one in flight), g2 3; b's one delayed)
    assert (ov["unsettled"], ov["retained"]) == ({"a": 6, "b": 1}, {"a": 3, "b": 1})
    assert ov["topic_counters"]["published"] == 4
    assert ov["group_counters"]["delivered"] == 2
    assert ov["group_counters"]["nacked"] == 1
