"""Helpers for the state machine tests: a fake leader, and a check of the internal bookkeeping.

A module with a unique name (not conftest) so that test modules can import it whatever other
conftest.py files pytest has loaded."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from raftq.cluster.dedup import ENTRY, key_digest
from raftq.cluster.msgindex import GONE
from raftq.cluster.state import Broker, _age_due

T0 = 1_700_000_000_000  # ms


# Every idempotency key a Harness published, by digest: ``legacy_snapshot`` writes the keys
# back (a v8 snapshot holds only their digests).
KEYS: dict[bytes, str] = {}


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
        if op == "publish" and isinstance(fields.get("messages"), list):
            for m in fields["messages"]:
                if isinstance(m, dict) and isinstance(m.get("key"), str):
                    KEYS[key_digest(m["key"])] = m["key"]
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
    keys = {t.key for t in b.topics.values()}
    assert len(keys) == len(b.topics), "a stream key per topic"
    # the store holds exactly the retained messages' records, no other stream has live ones
    live_bytes = 0
    for t in b.topics.values():
        ix = t.index
        assert ix.next_seq == t.next_seq, t.name
        refs, base, h = ix.refs, ix.first_seq, ix.head
        assert all(r == GONE for r in refs[:h])
        assert h == len(refs) or refs[h] != GONE
        live = [i for i in range(len(refs)) if refs[i] != GONE]
        assert t.count == len(live) and t.bytes == sum(ix.size[i] for i in live)
        assert set(t.okeys) <= {base + i for i in live}, t.name
        assert sum(s[2] for s in b.store.stats(t.key)) == len(live), t.name
        live_bytes += sum(ix.length[i] for i in live)
        check_dedup(t.dedup, b.now)
        # what expires next is in the expiry indexes, no later than it is due
        if t.dedup.heap:
            assert b._dedup_expiry.at[t.name] <= t.dedup.heap[0][0], t.name
        age_due = _age_due(t)
        if age_due is not None:
            assert b._aging.at[t.name] <= age_due, t.name

        def unsettled(g: Any, seq: int, t: Any = t) -> bool:
            fresh = seq >= g.cursor and seq not in g.skip
            # below its pin (start=earliest), a gap is not fresh for the group
            return seq in g.held or (fresh and (seq >= g.pin or t.has(seq)))

        for i, r in enumerate(refs):
            seq = base + i
            holders = [g for g in t.groups.values() if unsettled(g, seq)]
            if r == GONE:
                assert not holders, (t.name, seq)
            else:
                counted = sum(seq >= g.pin for g in holders)
                assert r == counted, (t.name, seq, r, counted)
                # a holder not counted in refs must be known as pinning
                assert all(g in t.pinned for g in holders if seq < g.pin), (t.name, seq)
        for g in t.groups.values():
            fresh = [s for s in range(g.cursor, t.next_seq) if s not in g.held and unsettled(g, s)]
            assert g.fresh == len(fresh), (t.name, g.name, g.fresh, len(fresh))
            assert all(g.cursor <= s < t.next_seq for s in g.skip), (t.name, g.name)
            for s in range(g.cursor, base + h):
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
                    if s in t.okeys:
                        kq.setdefault(t.okeys[s], []).append(s)
                assert g.kq == kq, (t.name, g.name, g.kq, kq)
                heads = {q[0] for q in kq.values()}
                for s in ready:
                    keyed = s in t.okeys
                    assert (s in queued) == (not keyed or s in heads), (t.name, g.name, s)
            for s in g.held:
                assert t.has(s) and (s < g.cursor or s in g.skip)
            for s, (consumer, _, deadline, _) in g.inflight.items():
                assert s in g.by_consumer[consumer]
                assert (deadline, t.name, g.name, s) in deadlines
            for s, due in g.delayed.items():
                assert (due, t.name, g.name, s) in delays
            for consumer, seqs in g.by_consumer.items():
                assert seqs and all(g.inflight[s][0] == consumer for s in seqs)
                consumers.setdefault(consumer, set()).add((t.name, g.name))
    assert b.store.retained_bytes()[0] == live_bytes
    assert {c: set(p) for c, p in b._consumers.items()} == consumers
    assert set(b._aging.at) <= set(b.topics) and set(b._dedup_expiry.at) <= set(b.topics)
    for index in (b._aging, b._dedup_expiry):
        assert all((due, name) in index.heap for name, due in index.at.items())
    assert b._token_names == {r["name"]: tid for tid, r in b._tokens.items()}
    assert all(r["id"] == tid for tid, r in b._tokens.items())


def twin(b: Broker) -> Broker:
    """A fresh broker (its own in-memory store) restored from ``b``'s snapshot."""
    other = Broker()
    other.restore(b.snapshot())
    return other


def check_dedup(k: Any, now: int) -> None:
    """Each digest held is in exactly one live row and one bucket entry, the one its hash
    picks, with the seq its row says; ``n`` counts them."""
    held = [bytes(r[2][i : i + 16]) for r in k.heap for i in range(0, len(r[2]), 16)]
    assert all(r[0] > now for r in k.heap), "a due row is gone"
    for _, first, blob, seqs in k.heap:
        n = len(blob) // 16
        want = list(range(first, first + n)) if seqs is None else list(seqs)
        assert len(want) == n and want[0] == first
        assert [k.get(bytes(blob[i * 16 : i * 16 + 16])) for i in range(n)] == want
    assert len(held) == len(set(held)) == k.n == sum(len(b) for b in k.buckets) // ENTRY
    assert all(len(b) % ENTRY == 0 for b in k.buckets)
    for j, b in enumerate(k.buckets):
        for i in range(0, len(b), ENTRY):
            assert hash(bytes(b[i : i + 16])) & k.mask == j
    assert set(held) == {bytes(b[i : i + 16]) for b in k.buckets for i in range(0, len(b), ENTRY)}


def legacy_dedup(rows: Any) -> list[Any]:
    """v8 dedup rows ``[exp, digests, seqs bytes or first seq]`` as v3-v7 ones ``[exp, keys, seqs]``
    (keys a Harness published)."""
    out = []
    for exp, blob, raw in rows:
        keys = [KEYS[blob[i : i + 16]] for i in range(0, len(blob), 16)]
        if isinstance(raw, int):  # the first of consecutive seqs
            seqs = list(range(raw, raw + len(keys)))
        else:
            seqs = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8)]
        out.append([exp, keys, seqs])
    return out


def v7_snapshot(b: Broker) -> bytes:
    """``b``'s snapshot as v7 wrote it: idempotency keys, not digests."""
    obj = msgpack.unpackb(b.snapshot(), raw=False, strict_map_key=False)
    obj[0] = 7
    for row in obj[3]:
        row[9] = legacy_dedup(row[9])
    return msgpack.packb(obj, use_bin_type=True)


def legacy_snapshot(b: Broker, version: int) -> bytes:
    """``b``'s state in the layout of snapshot ``version`` (3-6): messages with their
    payloads, as nodes before the segment store wrote them."""
    obj = msgpack.unpackb(b.snapshot(), raw=False, strict_map_key=False)
    _, now, applied, topics, tokens, keyed, settings = obj[:7]
    rows = []
    for (
        name,
        config,
        created_at,
        next_seq,
        key,
        dump,
        okeys,
        _,
        _,
        dedup,
        tc,
        groups,
        delays,
    ) in topics:
        t = b.topics[name]
        ok = dict(okeys)
        msgs: list[Any] = []
        refs: list[int] = []
        for seq in range(dump[0], next_seq):
            got = t.index.get(seq)
            if got is None:
                msgs.append(None)
                refs.append(0)
                continue
            payload, hdrs = b.store.read(key, seq, got[0], got[1])
            m = [payload, got[3], hdrs or None]
            if seq in ok:
                m.append(ok[seq])
            msgs.append(m)
            refs.append(t.index.ref(seq))
        if version < 5:
            groups = [g[:11] for g in groups]
        rows.append(
            [
                name,
                config,
                created_at,
                next_seq,
                dump[0],
                msgs,
                refs,
                legacy_dedup(dedup),
                tc,
                groups,
                delays,
            ]
        )
    head: list[Any] = [version, now, applied, rows]
    if version >= 4:
        head.append(tokens)
    if version >= 5:
        head.append(keyed)
    if version >= 6:
        head.append(settings)
    return msgpack.packb(head, use_bin_type=True)


def state_of(b: Broker) -> list[Any]:
    """``b``'s snapshot without the store's marks and segments, plus every retained message
    read from the store: what nodes share whatever their store layout (a node that converted
    an old snapshot appended its messages differently)."""
    obj = msgpack.unpackb(b.snapshot(), raw=False, strict_map_key=False)
    return [*obj[:7], obj[8], messages(b)]


def messages(b: Broker) -> dict[str, list[Any]]:
    """Every retained message of every topic, read from the store (the peek view)."""
    out = {}
    for name, t in b.topics.items():
        out[name] = _all(b, name, t)
    return out


def _all(b: Broker, name: str, t: Any) -> list[Any]:
    got = []
    seq = t.oldest_seq()
    while seq < t.next_seq:
        page = b.peek(name, seq, 1000)
        got += page
        seq += 1000
    return got
