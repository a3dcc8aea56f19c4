"""The fast paths of a publish give what the plain one gives.

A client's batch whose keys are its producer's next ones skips their lookups
(``TopicKeys.next_keys``); the keys model itself is fuzzed in test_keys.py.


An entry's run of one-message publishes to one topic (a producer that does not batch, its
publishes group-committed) goes through ``_publish_run`` when that cannot differ from
``_op_publish`` one command at a time. Random entries are applied to two brokers, one of them
with the run path turned off; every result and the state after every entry must match (the
keys compared as the keys held, not their layout: digests or runs)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from state_harness import check_invariants, state_of  # type: ignore[import-not-found]

from raftq.cluster.entry import apply_entry, encode_entry
from raftq.cluster.errors import InvalidArgument
from raftq.cluster.state import Broker

T0 = 1_700_000_000_000

TOPICS: dict[str, dict[str, Any]] = {
    "plain": {},
    "ring": {"max_messages": 30, "overflow": "drop_oldest", "dedup_window": 2},
    "capped": {"max_messages": 40, "max_bytes": 2000, "overflow": "reject"},
    "nowindow": {"dedup_window": 0, "max_message_bytes": 60, "max_age": 3},
}


class OneByOne(Broker):
    def _publish_run(self, cmds: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        return None


class Counting(Broker):
    runs = 0

    def _publish_run(self, cmds: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        got = super()._publish_run(cmds)
        self.runs += got is not None
        return got


def publish(rng: random.Random, topic: str, n: int) -> dict[str, Any]:
    m: dict[str, Any] = {"payload": b"p" * rng.choice([1, 10, 50, 70])}
    r = rng.random()
    if r < 0.4:
        m["key"] = f"prod-1-{n}"  # a producer's numbered keys (runs)
    elif r < 0.55:
        m["key"] = f"prod-1-{rng.randint(1, max(1, n))}"  # a retry of one of them
    elif r < 0.65:
        m["key"] = f"order-{rng.randint(1, 30)}"  # other keys (digests), repeated
    elif r < 0.67:
        m["key"] = "k" * 300  # too long: refused
    elif r < 0.69:
        m["headers"] = {"h": "v"}  # not plain: one by one
    elif r < 0.7:
        m["delay"] = 1
    return {"op": "publish", "topic": topic, "messages": [m]}


def entry_commands(rng: random.Random, n: int, receipts: list[str]) -> list[dict[str, Any]]:
    topics = list(TOPICS)
    cmds: list[dict[str, Any]] = []
    topic = rng.choice(topics)
    for _ in range(rng.randint(1, 40)):
        r = rng.random()
        if r < 0.8:
            if rng.random() < 0.1:
                topic = rng.choice([*topics, "missing"])
            n += 1
            cmds.append(publish(rng, topic, n))
        elif r < 0.87:
            cmds.append({"op": "receive", "topic": rng.choice(topics), "group": "g",
                         "consumer": "c", "max": rng.randint(1, 20),
                         "token": rng.randbytes(16)})  # fmt: skip
        elif r < 0.94 and receipts:
            take = rng.sample(receipts, min(len(receipts), rng.randint(1, 10)))
            cmds.append({"op": "ack", "receipts": take})
        elif r < 0.96:
            cmds.append({"op": "purge", "topic": rng.choice(topics)})
        elif r < 0.98:
            limit = rng.choice([None, 3000, 20000])
            cmds.append({"op": "cluster_settings", "config": {"max_retained_bytes": limit}})
        else:
            cmds.append({"op": "publish", "topic": topic, "messages": [{"payload": b"a"}] * 3})
    return cmds


@pytest.mark.parametrize("seed", range(12))
def test_runs_of_one_message_publishes_match_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    a, b = Counting(), OneByOne()
    now = T0
    setup = [{"op": "create_topic", "topic": name, "config": cfg,
              "groups": [{"group": "g", "config": {"visibility_timeout": 1}}]}
             for name, cfg in TOPICS.items()]  # fmt: skip
    for br in (a, b):
        apply_entry(br, encode_entry(now, setup))
    receipts: list[str] = []
    n = 0
    for _ in range(150):
        now += rng.choice([0, 5, 100, 700])
        cmds = entry_commands(rng, n, receipts)
        n += len(cmds)
        data = encode_entry(now, cmds)
        got_a, got_b = apply_entry(a, data), apply_entry(b, data)
        assert got_a == got_b
        for res in got_a:
            receipts += [d["receipt"] for d in res.get("deliveries", ())]
        receipts = receipts[-50:]
        assert state_of(a) == state_of(b)
        check_invariants(a)
    assert a.runs > 50, "the run path was hardly taken: the test tests nothing"


def test_a_run_is_one_record_and_one_keys_add() -> None:
    """The point of it: 100 one-message publishes with the clients' keys cost about what one
    publish of 100 messages does (one index extend, the keys one stretch)."""
    b = Counting()
    b.apply({"op": "create_topic", "topic": "t", "now": T0})
    cmds = [{"op": "publish", "topic": "t", "messages": [{"payload": b"x", "key": f"p-1-{i}"}]}
            for i in range(1, 101)]  # fmt: skip
    cmds[50] = dict(cmds[49])  # a retry of the one before, in the same entry
    got = apply_entry(b, encode_entry(T0 + 1, cmds))
    assert b.runs == 1
    assert [r["messages"][0]["seq"] for r in got] == [*range(1, 51), 50, *range(51, 100)]
    assert got[50]["messages"][0]["duplicate"] is True
    t = b.topics["t"]
    assert t.count == 99 and t.counters["duplicates"] == 1
    assert t.dedup.nruns == 99 and len(t.dedup.digests) == 0
    assert b.store.stats(t.key)[0][2] == 99


def test_a_group_with_only_delayed_messages_left_goes_one_by_one() -> None:
    """Nothing fresh but a delayed message skipped: one by one, a publish of a duplicate moves
    the group's cursor to the end before the next publish adds a message; the run must too."""
    run, one = Counting(), OneByOne()
    brokers: list[Broker] = [run, one]
    results = []
    for br in brokers:
        br.apply({"op": "create_topic", "topic": "t", "now": T0,
                  "groups": [{"group": "g"}]})  # fmt: skip
        pub = {"op": "publish", "topic": "t", "now": T0}
        br.apply({**pub, "messages": [{"payload": b"a", "key": "k-1"}]})
        br.apply({**pub, "messages": [{"payload": b"d", "delay": 30}]})
        br.apply({"op": "receive", "topic": "t", "group": "g", "consumer": "c", "max": 10,
                  "token": b"\x01" * 16, "now": T0})  # fmt: skip
        g = br.topics["t"].groups["g"]
        assert not g.fresh and g.skip
        cmds = [
            {"op": "publish", "topic": "t", "messages": [{"payload": b"a", "key": "k-1"}]},
            {"op": "publish", "topic": "t", "messages": [{"payload": b"b", "key": "k-2"}]},
        ]
        results.append(apply_entry(br, encode_entry(T0 + 1, cmds)))
    assert results[0] == results[1]
    assert state_of(run) == state_of(one)
    assert run.runs == 0


def test_a_batch_of_next_keys_that_grow_too_long_is_refused() -> None:
    """A producer's next keys skip their lookups, not the length check: ``p-99`` fits in
    256 characters, ``p-100`` does not."""
    b = Broker()
    b.apply({"op": "create_topic", "topic": "t", "now": T0})
    p = "p" * 253

    def pub(*ns: int) -> dict[str, Any]:
        msgs = [{"payload": b"x", "key": f"{p}-{n}"} for n in ns]
        return b.apply({"op": "publish", "topic": "t", "messages": msgs, "now": T0})

    assert [m["seq"] for m in pub(*range(1, 99))["messages"]] == list(range(1, 99))
    with pytest.raises(InvalidArgument, match=r"key is longer than 256"):
        pub(99, 100)
    assert b.topics["t"].count == 98
    assert pub(99)["messages"] == [{"seq": 99, "duplicate": False}]


class CountingCalls(Broker):
    calls = 0

    def _publish_run(self, cmds: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        self.calls += 1
        return super()._publish_run(cmds)


@pytest.mark.parametrize("why", ["missing topic", "full", "too large at the end"])
def test_a_refused_run_goes_one_by_one_without_being_tried_again(why: str) -> None:
    """A run refused once is applied one by one from there, not tried again from each of its
    commands (n^2: 512 publishes to a missing topic took 126 ms an entry instead of 2.5)."""
    brokers = [CountingCalls(), OneByOne()]
    got = []
    for b in brokers:
        b.apply({"op": "create_topic", "topic": "t", "now": T0,
                 "config": {"max_messages": 50, "max_message_bytes": 10}})  # fmt: skip
        topic = "nope" if why == "missing topic" else "t"
        cmds = [{"op": "publish", "topic": topic, "messages": [{"payload": b"x", "key": f"k{i}"}]}
                for i in range(100)]  # fmt: skip
        if why == "too large at the end":
            cmds = [*cmds[:40], {**cmds[40], "messages": [{"payload": b"x" * 11}]}]
        got.append(apply_entry(b, encode_entry(T0 + 1, cmds)))
    assert got[0] == got[1]
    assert brokers[0].calls == 1  # type: ignore[attr-defined]


def test_a_key_that_cannot_be_encoded_is_an_error_result_as_one_by_one() -> None:
    """Not from a log (msgpack refuses lone surrogates), but apply never raises for a bad
    command: each gets its error, as one by one."""
    results = []
    for b in (Broker(), OneByOne()):
        b.apply({"op": "create_topic", "topic": "t", "now": T0})
        keyed = [{"payload": b"x", "key": f"p-{i}"} for i in range(1, 5)]
        b.apply({"op": "publish", "topic": "t", "now": T0, "messages": keyed})
        bad = {"op": "publish", "topic": "t", "messages": [{"payload": b"x", "key": "a\ud800"}]}
        msgs = [{"payload": "not bytes", "key": "\ud800"}, {"payload": b"x"}]
        batch = {"op": "publish", "topic": "t", "messages": msgs}
        good = {"op": "publish", "topic": "t", "messages": [{"payload": b"x", "key": "q-1"}]}
        results.append(b.apply_batch(T0 + 1, [good, bad, bad, batch]))
    assert results[0] == results[1]
    codes = [r.get("error", {}).get("code") for r in results[0]]
    assert codes == [None, "internal", "internal", "invalid_argument"]
