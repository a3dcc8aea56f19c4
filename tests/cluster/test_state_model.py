"""Random command sequences against a deliberately simple reference model of one topic.

The model keeps, per group and seq, one status (fresh, ready, delayed, inflight, acked, dead,
dropped) and the attempt count, and recomputes everything by brute force. After every step the
broker's answers and statistics must agree with it, and these invariants must hold:

- an acked message is never delivered again in its group;
- no message vanishes: acked + dead-lettered + pending + delayed + in flight + dropped + purged
  equals published, per group (dropped by retention or drop_oldest, purged by purge: counted);
- attempts never decrease (each delivery is the previous attempt + 1);
- a message is dead-lettered exactly when a failed attempt used up max_attempts, or on term;
- snapshot -> restore is an exact round trip, and the restored broker carries on;
- in the ordered group ``o`` (while ``ordered``), a message is delivered only with every
  earlier unsettled message of its ordering key in the same receive, before it, and a receive
  that returns fewer than asked leaves nothing deliverable behind (which messages it picks is
  the broker's choice, so the model checks the choice instead of predicting it);
- deliveries carry their ordering key and the time of their first delivery in the group.

``RAFTQ_STATEFUL_EXAMPLES`` raises the number of runs for a longer, randomized local soak;
``RAFTQ_STATEFUL_SHRINK=1`` shrinks a failure to a minimal example (slow).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from state_harness import check_invariants  # type: ignore[import-not-found]

from raftq.cluster import errors as E
from raftq.cluster.state import Broker

T0 = 1_000_000
GROUPS = {
    # group: (visibility_ms, max_attempts, backoff_s, has a dead-letter topic)
    "a": (5000, 2, [0, 2], True),
    "b": (3000, 0, [], False),
    "o": (4000, 3, [0, 1], True),  # ordered (see BrokerMachine.toggle_ordered)
}
ORDERED = "o"
SETTLED = ("acked", "dead", "dropped", "purged")
LIVE = ("fresh", "ready", "delayed", "inflight")
DEDUP_MS = 5000
COUNTERS = (
    "delivered",
    "redelivered",
    "acked",
    "nacked",
    "timed_out",
    "released",
    "dead",
    "dropped",
    "purged",
)


class Entry:
    __slots__ = ("attempts", "consumer", "deadline", "due", "first", "receipt", "status")

    def __init__(self, status: str) -> None:
        self.status = status
        self.attempts = 0
        self.consumer = ""
        self.receipt = ""
        self.deadline = 0
        self.due = 0
        self.first = 0  # now of the first delivery


class Model:
    def __init__(self, max_messages: int, overflow: str, max_age_ms: int | None) -> None:
        self.now = T0
        self.max_messages = max_messages
        self.overflow = overflow
        self.max_age_ms = max_age_ms
        self.published_at: dict[int, int] = {}
        self.next_seq = 1
        self.st: dict[str, dict[int, Entry]] = {g: {} for g in GROUPS}
        self.ready: dict[str, list[int]] = {g: [] for g in GROUPS}
        self.counters = {g: dict.fromkeys(COUNTERS, 0) for g in GROUPS}
        self.dedup: dict[str, tuple[int, int]] = {}
        self.dlq: list[tuple[str, ...]] = []  # (seq, attempts, reason) in DLQ order
        self.receipts: dict[str, tuple[str, int, int]] = {}
        self.okeys: dict[int, str] = {}  # seq -> ordering key
        self.ordered = True  # group ORDERED's config

    # -- helpers
    def retained(self) -> list[int]:
        return sorted(
            s for s in self.published_at if any(self.st[g][s].status in LIVE for g in GROUPS)
        )

    def drop(self, seq: int) -> None:
        for g in GROUPS:
            e = self.st[g][seq]
            if e.status in LIVE:
                if e.status == "ready":
                    self.ready[g].remove(seq)
                e.status = "dropped"
                self.counters[g]["dropped"] += 1

    def dead(self, g: str, seq: int, reason: str) -> None:
        self.st[g][seq].status = "dead"
        self.counters[g]["dead"] += 1
        if GROUPS[g][3]:
            self.dlq.append((str(seq), str(self.st[g][seq].attempts), reason))

    def fail(self, g: str, seq: int, delay_ms: int | None, reason: str) -> int:
        e = self.st[g][seq]
        _, max_attempts, backoff, _ = GROUPS[g]
        if max_attempts and e.attempts >= max_attempts:
            self.dead(g, seq, reason)
            return 1
        if delay_ms is None:
            delay_ms = round(backoff[min(e.attempts, len(backoff)) - 1] * 1000) if backoff else 0
        if delay_ms:
            e.status, e.due = "delayed", self.now + delay_ms
        else:
            e.status = "ready"
            self.ready[g].append(seq)
        return 0

    def in_flight(self, receipt: str) -> tuple[str, int] | None:
        g, seq, attempt = self.receipts[receipt]
        e = self.st[g][seq]
        if e.status == "inflight" and e.attempts == attempt and e.receipt == receipt:
            return g, seq
        return None

    # -- time
    def advance(self, ms: int) -> None:
        self.now += ms
        for g in GROUPS:
            due = sorted(
                (e.deadline, s)
                for s, e in self.st[g].items()
                if e.status == "inflight" and e.deadline <= self.now
            )
            for _, s in due:
                self.counters[g]["timed_out"] += 1
                self.fail(g, s, None, "visibility_timeout")
        for g in GROUPS:
            due = sorted(
                (e.due, s)
                for s, e in self.st[g].items()
                if e.status == "delayed" and e.due <= self.now
            )
            for _, s in due:
                self.st[g][s].status = "ready"
                self.ready[g].append(s)
        if self.max_age_ms is not None:
            for s in self.retained():
                if self.published_at[s] > self.now - self.max_age_ms:
                    break
                self.drop(s)

    # -- commands; return what the broker must answer
    def publish(
        self, messages: list[tuple[str | None, int | None, str | None]]
    ) -> list[tuple[int, bool]]:
        out: list[tuple[int, bool]] = []
        staged: list[tuple[str | None, int | None, str | None]] = []
        batch: dict[str, int] = {}
        for key, delay, okey in messages:
            if key is not None:
                prior = self.dedup.get(key)
                if prior is not None and prior[1] > self.now:
                    out.append((prior[0], True))
                    continue
                if key in batch:
                    out.append((self.next_seq + batch[key], True))
                    continue
                batch[key] = len(staged)
            out.append((self.next_seq + len(staged), False))
            staged.append((key, delay, okey))
        count = len(self.retained())
        if count + len(staged) > self.max_messages and (
            self.overflow == "reject" or len(staged) > self.max_messages
        ):
            raise E.TopicFull("full")
        for key, delay, okey in staged:
            seq = self.next_seq
            self.next_seq += 1
            self.published_at[seq] = self.now
            if okey is not None:
                self.okeys[seq] = okey
            if key is not None:
                self.dedup[key] = (seq, self.now + DEDUP_MS)
            for g in GROUPS:
                e = self.st[g][seq] = Entry("delayed" if delay else "fresh")
                e.due = self.now + (delay or 0)
        retained = self.retained()
        while len(retained) > self.max_messages:
            self.drop(retained.pop(0))
        return out

    def receive(self, g: str, consumer: str, n: int, vis_ms: int | None) -> list[tuple[int, int]]:
        picked: list[int] = []
        while self.ready[g] and len(picked) < n:
            picked.append(self.ready[g].pop(0))
        fresh = sorted(s for s, e in self.st[g].items() if e.status == "fresh")
        picked += fresh[: n - len(picked)]
        return self.deliver(g, consumer, picked, vis_ms)

    def check_ordered_choice(self, g: str, n: int, picked: list[int]) -> None:
        """The broker's choice of ``picked`` in ordered group ``g`` follows the rules."""
        entries = self.st[g]
        assert len(picked) <= n and len(set(picked)) == len(picked)
        earlier: set[int] = set()
        for s in picked:
            assert entries[s].status in ("fresh", "ready"), (s, entries[s].status)
            key = self.okeys.get(s)
            if key is not None:
                behind = [
                    x
                    for x, e in entries.items()
                    if x < s and e.status in LIVE and self.okeys.get(x) == key
                ]
                assert all(x in earlier for x in behind), (s, key, behind, picked)
            earlier.add(s)
        if len(picked) < n:  # nothing deliverable left behind
            for s, e in entries.items():
                if e.status not in ("fresh", "ready") or s in earlier:
                    continue
                key = self.okeys.get(s)
                assert key is not None, ("left behind", s)
                assert any(
                    x < s and ex.status in LIVE and x not in earlier and self.okeys.get(x) == key
                    for x, ex in entries.items()
                ), ("left behind", s, key, picked)

    def deliver(
        self, g: str, consumer: str, picked: list[int], vis_ms: int | None
    ) -> list[tuple[int, int]]:
        deadline = self.now + (vis_ms if vis_ms is not None else GROUPS[g][0])
        self.counters[g]["delivered"] += len(picked)
        out = []
        for s in picked:
            e = self.st[g][s]
            assert e.status in ("fresh", "ready")  # never an acked (or settled) message
            if s in self.ready[g]:
                self.ready[g].remove(s)
            if not e.attempts:
                e.first = self.now
            e.attempts += 1
            e.status, e.consumer, e.deadline = "inflight", consumer, deadline
            out.append((s, e.attempts))
            self.counters[g]["redelivered"] += e.attempts > 1
        return out


class BrokerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.b = Broker()
        self.model: Model
        self.tokens = 0
        self.last_attempt: dict[tuple[str, int], int] = {}

    def apply(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.b.apply({"op": op, "now": self.model.now, **fields})

    @initialize(
        max_messages=st.sampled_from([4, 8]),
        overflow=st.sampled_from(["reject", "drop_oldest"]),
        max_age=st.sampled_from([None, 15]),
    )
    def setup(self, max_messages: int, overflow: str, max_age: int | None) -> None:
        self.model = Model(max_messages, overflow, None if max_age is None else max_age * 1000)
        groups = [
            {
                "group": g,
                "config": {
                    "visibility_timeout": vis / 1000,
                    "max_attempts": attempts,
                    "backoff": backoff,
                    **({} if dlq else {"dead_letter_topic": None}),
                },
            }
            for g, (vis, attempts, backoff, dlq) in GROUPS.items()
        ]
        config = {
            "max_messages": max_messages,
            "overflow": overflow,
            "max_age": max_age,
            "dedup_window": DEDUP_MS / 1000,
        }
        groups[-1]["config"]["ordered"] = True  # type: ignore[index]
        self.apply("create_topic", topic="t", config=config, groups=groups)

    @rule(
        messages=st.lists(
            st.tuples(
                # (keys of a producer, "p-<n>", go to runs; the others are digests)
                st.sampled_from([None, None, "k1", "k2", "k3", "p-1", "p-2", "p-3", "p-4", "q-7"]),
                st.sampled_from([None, None, None, 500, 2500]),
                st.sampled_from([None, "x", "x", "y"]),  # ordering key
            ),
            min_size=1,
            max_size=3,
        )
    )
    def publish(self, messages: list[tuple[str | None, int | None, str | None]]) -> None:
        cmd_msgs: list[dict[str, Any]] = []
        for i, (key, delay, okey) in enumerate(messages):
            m: dict[str, Any] = {"payload": b"m%d" % i}
            if key is not None:
                m["key"] = key
            if okey is not None:
                m["ordering_key"] = okey
            if delay is not None:
                m["delay"] = delay / 1000
            cmd_msgs.append(m)
        try:
            expected: list[tuple[int, bool]] | None = self.model.publish(messages)
        except E.TopicFull:
            expected = None
        if expected is None:
            before = self.b.snapshot()
            with pytest.raises(E.TopicFull):
                self.apply("publish", topic="t", messages=cmd_msgs)
            assert self.b.snapshot() == before
            return
        res = self.apply("publish", topic="t", messages=cmd_msgs)
        assert [(r["seq"], r["duplicate"]) for r in res["messages"]] == expected

    @rule(
        g=st.sampled_from(sorted(GROUPS)),
        consumer=st.sampled_from(["c1", "c2"]),
        n=st.integers(1, 4),
        vis=st.sampled_from([None, None, 1000, 8000]),
    )
    def receive(self, g: str, consumer: str, n: int, vis: int | None) -> None:
        expected = None if g == ORDERED else self.model.receive(g, consumer, n, vis)
        self.tokens += 1
        fields: dict[str, Any] = {
            "topic": "t",
            "group": g,
            "consumer": consumer,
            "max": n,
            "token": hashlib.sha256(b"%d" % self.tokens).digest()[:16],
        }
        if vis is not None:
            fields["visibility"] = vis / 1000
        res = self.apply("receive", **fields)
        got = [(d["seq"], d["attempt"]) for d in res["deliveries"]]
        if expected is None:
            picked = [s for s, _ in got]
            if self.model.ordered:
                self.model.check_ordered_choice(g, n, picked)
            expected = self.model.deliver(g, consumer, picked, vis)
        assert got == expected, (got, expected)
        for seq, attempt in got:  # attempts only ever grow, by one per delivery
            assert attempt == self.last_attempt.get((g, seq), 0) + 1
            self.last_attempt[(g, seq)] = attempt
        for d in res["deliveries"]:
            e = self.model.st[g][d["seq"]]
            e.receipt = d["receipt"]
            self.model.receipts[d["receipt"]] = (g, d["seq"], d["attempt"])
            assert d["deadline"] == e.deadline
            assert d["first_received_at"] == e.first
            assert d.get("ordering_key") == self.model.okeys.get(d["seq"])

    @rule(on=st.booleans(), rare=st.integers(0, 3))
    def toggle_ordered(self, on: bool, rare: int) -> None:
        if rare:
            return
        self.model.ordered = on
        res = self.apply("update_group", topic="t", group=ORDERED, config={"ordered": on})
        assert res["config"]["ordered"] is on

    def _pick(self, data: st.DataObject, most: int) -> list[str]:
        receipts = sorted(self.model.receipts)[-40:]
        return data.draw(st.lists(st.sampled_from(receipts), min_size=1, max_size=most))

    @precondition(lambda self: self.model.receipts)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        receipts = self._pick(data, 3)
        ok = 0
        stale = []
        for r in receipts:
            hit = self.model.in_flight(r)
            if hit is None:
                stale.append(r)
                continue
            g, seq = hit
            self.model.st[g][seq].status = "acked"
            self.model.counters[g]["acked"] += 1
            ok += 1
        res = self.apply("ack", receipts=receipts)
        assert res["acked"] == ok
        assert [(e["receipt"], e["code"]) for e in res["errors"]] == [
            (r, "receipt_stale") for r in stale
        ]

    @precondition(lambda self: self.model.receipts)
    @rule(data=st.data(), delay=st.sampled_from([None, None, 0, 1500]))
    def nack(self, data: st.DataObject, delay: int | None) -> None:
        receipts = self._pick(data, 2)
        ok = dead = 0
        for r in receipts:
            hit = self.model.in_flight(r)
            if hit is not None:
                ok += 1
                self.model.counters[hit[0]]["nacked"] += 1
                dead += self.model.fail(*hit, delay, "nack")
        fields: dict[str, Any] = {"receipts": receipts}
        if delay is not None:
            fields["delay"] = delay / 1000
        res = self.apply("nack", **fields)
        assert (res["nacked"], res["dead_lettered"]) == (ok, dead)

    @precondition(lambda self: self.model.receipts)
    @rule(data=st.data(), seconds=st.integers(1, 10))
    def extend(self, data: st.DataObject, seconds: int) -> None:
        receipts = self._pick(data, 2)
        ok = 0
        for r in receipts:
            hit = self.model.in_flight(r)
            if hit is not None:
                ok += 1
                self.model.st[hit[0]][hit[1]].deadline = self.model.now + seconds * 1000
        res = self.apply("extend", receipts=receipts, seconds=seconds)
        assert res["extended"] == ok

    @precondition(lambda self: self.model.receipts)
    @rule(data=st.data())
    def term(self, data: st.DataObject) -> None:
        receipts = self._pick(data, 2)
        ok = 0
        for r in receipts:
            hit = self.model.in_flight(r)
            if hit is not None:
                ok += 1
                self.model.dead(*hit, "term: stop")
        assert self.apply("term", receipts=receipts, reason="stop")["terminated"] == ok

    @rule(
        consumer=st.sampled_from(["c1", "c2"]),
        # release's topic filter: these patterns match the one topic "t" or not
        topics=st.one_of(
            st.none(), st.lists(st.sampled_from(["t", "*", "t.*", "u", "x.*"]), max_size=2)
        ),
    )
    def release(self, consumer: str, topics: list[str] | None) -> None:
        n = dead = 0
        hit = topics is None or "t" in topics or "*" in topics
        for g in sorted(GROUPS) if hit else []:
            mine = sorted(
                s
                for s, e in self.model.st[g].items()
                if e.status == "inflight" and e.consumer == consumer
            )
            for s in mine:
                n += 1
                self.model.counters[g]["released"] += 1
                dead += self.model.fail(g, s, 0, "released")
        res = self.apply(
            "release", consumer=consumer, **({} if topics is None else {"topics": topics})
        )
        assert (res["released"], res["dead_lettered"]) == (n, dead)

    @rule(ms=st.sampled_from([1, 499, 500, 1000, 2000, 3000, 5000, 10_000, 15_000]))
    def advance(self, ms: int) -> None:
        self.model.advance(ms)
        assert self.apply("tick") == {"now": self.model.now}

    @rule(g=st.sampled_from([None, *sorted(GROUPS)]), rare=st.integers(0, 4))
    def purge(self, g: str | None, rare: int) -> None:
        if rare:  # purging often would keep the backlog too small to reach other paths
            return
        m = self.model
        n = 0
        for group in GROUPS if g is None else [g]:
            for e in m.st[group].values():
                if e.status in LIVE:
                    e.status = "purged"
                    m.counters[group]["purged"] += 1
                    n += 1
            m.ready[group].clear()
        res = self.apply("purge", topic="t", **({} if g is None else {"group": g}))
        if g is not None:
            assert res["purged"] == n

    @rule()
    def snapshot_round_trip(self) -> None:
        snap = self.b.snapshot()
        other = Broker()
        other.restore(snap)
        assert other.snapshot() == snap
        self.b = other  # carry on with the restored copy

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "model"):
            return
        m = self.model
        topic = self.b.topic_stats("t")
        published = m.next_seq - 1
        assert topic["published_total"] == published
        assert topic["messages"] == len(m.retained())
        for g in GROUPS:
            stats = self.b.group_stats("t", g)
            states = [e.status for e in m.st[g].values()]
            expected = {
                "pending": states.count("fresh") + states.count("ready"),
                "delayed": states.count("delayed"),
                "in_flight": states.count("inflight"),
                "dead_lettered_total": m.counters[g]["dead"],
                "dropped_total": m.counters[g]["dropped"],
                **{
                    f"{k}_total": m.counters[g][k] for k in COUNTERS if k not in ("dead", "dropped")
                },
            }
            assert {k: stats[k] for k in expected} == expected, g
            # nothing vanishes
            assert (
                stats["acked_total"]
                + stats["dead_lettered_total"]
                + stats["pending"]
                + stats["delayed"]
                + stats["in_flight"]
                + stats["dropped_total"]
                + stats["purged_total"]
                == published
            )
        check_invariants(self.b)
        snap = self.b.snapshot()
        due = self.b.next_due()  # a hint that never changes the state, always in the future
        assert due is None or due > m.now
        assert self.b.snapshot() == snap
        if m.dlq:
            # dead letters: exactly the failed attempts past max_attempts and the terms
            got = [
                tuple(d["headers"][f"x-raftq-dlq-{k}"] for k in ("seq", "attempts", "reason"))
                for d in self.b.peek("t.dlq", limit=1000)
            ]
            assert got == m.dlq
        else:
            assert "t.dlq" not in self.b.list_topics()


BrokerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RAFTQ_STATEFUL_EXAMPLES", "250")),
    stateful_step_count=40,
    deadline=None,
    derandomize=not os.environ.get("RAFTQ_STATEFUL_EXAMPLES"),  # a soak explores afresh
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # Shrinking a 40-step failure can take minutes: opt in with RAFTQ_STATEFUL_SHRINK=1.
    phases=[Phase.explicit, Phase.reuse, Phase.generate]
    + ([Phase.shrink] if os.environ.get("RAFTQ_STATEFUL_SHRINK") else []),
)
test_broker_agrees_with_the_reference_model = BrokerMachine.TestCase
