"""Helpers for the state machine tests: a fake leader, and a check of the internal bookkeeping.

A module with a unique name (not conftest) so that test modules can import it whatever other
conftest.py files pytest has loaded."""

from __future__ import annotations

import hashlib
from typing import Any

from raftq.cluster.state import Broker, _age_due

T0 = 1_700_000_000_000  # ms


class Harness:
    """Plays the leader: stamps ``now`` and receive tokens, applies one command at a time."""

    def __init__(self) -> None:
        self.b = Broker()
        self.now = T0
        self._tokens = 0
        self.check = True  # check the internal bookkeeping after every command

    def token(self) -> bytes:
        self._tokens += 1
        return hashlib.sha256(b"token-%d" % self._tokens).digest()[:16]

    def __call__(self, op: str, **fields: Any) -> dict[str, Any]:
        cmd: dict[str, Any] = {"op": op, "now": self.now, **fields}
        if op == "receive" and "token" not in fields:
            cmd["token"] = self.token()
        try:
            return self.b.apply(cmd)
        finally:
            if self.check:
                check_invariants(self.b)

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 1000)

    def topic(self, name: str = "t", **config: Any) -> str:
        self("create_topic", topic=name, config=config)
        return name

    def publish(self, topic: str, *payloads: bytes, **extra: Any) -> list[int]:
        res = self("publish", topic=topic, messages=[{"payload": p, **extra} for p in payloads])
        return [m["seq"] for m in res["messages"]]

    def receive(
        self,
        topic: str = "t",
        group: str = "default",
        consumer: str = "c1",
        max: int = 10,
        **kw: Any,
    ) -> list[dict[str, Any]]:
        res = self("receive", topic=topic, group=group, consumer=consumer, max=max, **kw)
        deliveries: list[dict[str, Any]] = res["deliveries"]
        return deliveries

    def gstats(self, topic: str = "t", group: str = "default") -> dict[str, Any]:
        return self.b.group_stats(topic, group)


def check_invariants(b: Broker) -> None:
    """The broker's internal bookkeeping agrees with itself (see state.py's docstring)."""
    deadlines = {(d, t, g, s) for d, t, g, seqs in b._deadlines for s in seqs}
    delays = {(d, t, g, s) for d, t, g, seqs in b._delays for s in seqs}
    consumers: dict[str, set[tuple[str, str]]] = {}
    # the node-wide retained-bytes total (the max_retained_bytes limit) is the topics' sum
    assert b._retained[0] == sum(t.bytes for t in b.topics.values())
    for t in b.topics.values():
        msgs, refs, base = t.msgs, t.refs, t.first_seq
        assert len(msgs) == len(refs) and base + len(msgs) == t.next_seq, t.name
        assert all(m is None for m in msgs[: t.head])
        assert t.head == len(msgs) or msgs[t.head] is not None
        live = [m for m in msgs if m is not None]
        assert t.count == len(live) and t.bytes == sum(len(m[0]) for m in live)
        held = [k for exp, _, keys in t.dedup_heap for k in keys if exp > b.now]
        assert sorted(held) == sorted(t.dedup), "each key held is in exactly one live entry"
        # what expires next is in the expiry indexes, no later than it is due
        if t.dedup_heap:
            assert b._dedup_expiry.at[t.name] <= t.dedup_heap[0][0], t.name
        age_due = _age_due(t)
        if age_due is not None:
            assert b._aging.at[t.name] <= age_due, t.name

        def unsettled(g: Any, seq: int, t: Any = t) -> bool:
            fresh = seq >= g.cursor and seq not in g.skip
            # below its pin (start=earliest), a gap is not fresh for the group
            return seq in g.held or (fresh and (seq >= g.pin or t.get(seq) is not None))

        for i, m in enumerate(msgs):
            seq = base + i
            holders = [g for g in t.groups.values() if unsettled(g, seq)]
            if m is None:
                assert not holders, (t.name, seq)
            else:
                counted = sum(seq >= g.pin for g in holders)
                assert refs[i] == counted, (t.name, seq, refs[i], counted)
                # a holder not counted in refs must be known as pinning
                assert all(g in t.pinned for g in holders if seq < g.pin), (t.name, seq)
        for g in t.groups.values():
            fresh = [s for s in range(g.cursor, t.next_seq) if s not in g.held and unsettled(g, s)]
            assert g.fresh == len(fresh), (t.name, g.name, g.fresh, len(fresh))
            assert all(g.cursor <= s < t.next_seq for s in g.skip), (t.name, g.name)
            for s in range(g.cursor, base + t.head):
                # (below a start=earliest group's pin, a message may leave before it moves)
                assert s in g.skip or s in g.held or s < g.pin, (t.name, g.name, s)
            assert set(g.inflight) <= set(g.held) and set(g.delayed) <= set(g.held)
            assert not set(g.inflight) & set(g.delayed)
            ready = set(g.held) - set(g.inflight) - set(g.delayed)
            queued = [s for s in g.ready if g.is_ready(s)]
            assert len(queued) == len(set(queued)), (t.name, g.name, "queued twice")
            delivered = {s for s, a in g.held.items() if a}
            assert set(g.first) == delivered - set(g.inflight), (t.name, g.name)
            if g.kq is None:
                assert ready <= set(g.ready), (t.name, g.name)
            else:
                # an ordered group: kq is every held seq by key, sorted; of the keyed ready
                # ones, exactly the first of each key is queued
                kq: dict[str, list[int]] = {}
                for s in sorted(g.held):
                    m = t.get(s)
                    if m is not None and len(m) > 3:
                        kq.setdefault(m[3], []).append(s)
                assert g.kq == kq, (t.name, g.name, g.kq, kq)
                heads = {q[0] for q in kq.values()}
                for s in ready:
                    m = t.get(s)
                    keyed = m is not None and len(m) > 3
                    assert (s in queued) == (not keyed or s in heads), (t.name, g.name, s)
            for s in g.held:
                assert t.get(s) is not None and (s < g.cursor or s in g.skip)
            for s, (consumer, _, deadline, _) in g.inflight.items():
                assert s in g.by_consumer[consumer]
                assert (deadline, t.name, g.name, s) in deadlines
            for s, due in g.delayed.items():
                assert (due, t.name, g.name, s) in delays
            for consumer, seqs in g.by_consumer.items():
                assert seqs and all(g.inflight[s][0] == consumer for s in seqs)
                consumers.setdefault(consumer, set()).add((t.name, g.name))
    assert {c: set(p) for c, p in b._consumers.items()} == consumers
    assert set(b._aging.at) <= set(b.topics) and set(b._dedup_expiry.at) <= set(b.topics)
    for index in (b._aging, b._dedup_expiry):
        assert all((due, name) in index.heap for name, due in index.at.items())
    assert b._token_names == {r["name"]: tid for tid, r in b._tokens.items()}
    assert all(r["id"] == tid for tid, r in b._tokens.items())
