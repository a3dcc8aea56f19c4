"""Helpers for the state machine tests: a fake leader, and a check of the internal bookkeeping.

A module with a unique name (not conftest) so that test modules can import it whatever other
conftest.py files pytest has loaded."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from raftq.cluster import topics
from raftq.cluster.dedup import ENTRY, key_digest
from raftq.cluster.keys import DenseRun, _expand, _stretches
from raftq.cluster.msgindex import GONE
from raftq.cluster.state import Broker

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
    """The broker's internal bookkeeping agrees with itself (see topics.py's docstring)."""
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
        check_keys(t.dedup, b.now)
        # what expires next is in the expiry indexes, no later than it is due
        nxt = t.dedup.next_expiry()
        if nxt is not None:
            assert b._dedup_expiry.at[t.name] <= nxt, t.name
        age_due = topics.age_due(t)
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


def check_keys(k: Any, now: int) -> None:
    """A topic's ``TopicKeys``: its digest table (``check_dedup``), and its records' runs in
    n order, disjoint (expired fronts included), expiries non-decreasing and live ones later
    than ``now``; ``nruns`` counts the live keys."""
    check_dedup(k.digests, now)
    live = 0
    for rec in k.records.values():
        assert rec.runs, "a record without runs is dropped"
        for a, b in zip(rec.runs, rec.runs[1:], strict=False):
            assert a.end() <= b.n0
        for r in rec.runs:
            assert 0 <= r.start < r.cnt
            if isinstance(r, DenseRun):  # (an item a key)
                assert len(r.svals) == len(r.evals) == r.cnt and not r.sidx and not r.eidx
                assert list(r.evals) == sorted(r.evals) and r.evals[r.start] > now
                assert r.lexp == r.evals[-1] and r.nseq == r.svals[-1] + 1
                live += r.live()
                continue
            assert len(r.sidx) == len(r.svals) and len(r.eidx) == len(r.evals)
            assert r.sidx[0] == r.eidx[0] == 0
            assert list(r.sidx) == sorted(set(r.sidx)) and list(r.eidx) == sorted(set(r.eidx))
            assert r.sidx[-1] < r.cnt and r.eidx[-1] < r.cnt
            assert list(r.evals) == sorted(set(r.evals)) and r.front_expiry() > now
            assert r.lexp == r.evals[-1] and r.nseq == r.seq(r.cnt - 1) + 1
            # maximal stretches: each one breaks its predecessor's run of seqs
            for m in range(1, len(r.sidx)):
                assert r.svals[m] != r.svals[m - 1] + r.sidx[m] - r.sidx[m - 1]
            live += r.live()
    assert live == k.nruns
    for rec in k.records.values():  # a snapshot holds what arrays of a value a key made
        for r in rec.runs:
            for step in (1, 0):
                assert r.dumped(step) == _stretches(r.values(step, r.start), 0, step)


def dedup_held(k: Any) -> list[tuple[bytes, int]]:
    """(digest, seq) of every key a ``TopicKeys`` holds, sorted: the same for two nodes that
    hold the same keys, whether as digests or in runs (one converted an older snapshot)."""
    held = []
    for _, first, blob, seqs in k.digests.heap:
        got = range(first, first + len(blob) // 16) if seqs is None else seqs
        held += [(bytes(blob[i * 16 : i * 16 + 16]), s) for i, s in enumerate(got)]
    for prefix, rec in k.records.items():
        for r in rec.runs:
            for j in range(r.start, r.cnt):
                held.append((key_digest(f"{prefix}-{r.n0 + j}"), r.seq(j)))
    return sorted(held)


def legacy_dedup(dumped: Any) -> list[Any]:
    """A v9 topic's dedup ``[v8 rows, high, legacy_until, records]`` as v3-v7 rows ``[exp,
    keys, seqs]`` (keys a Harness published, or numbered ones)."""
    rows, _, _, recs = dumped
    out = []
    for exp, blob, raw in rows:
        keys = [KEYS[blob[i : i + 16]] for i in range(0, len(blob), 16)]
        if isinstance(raw, int):  # the first of consecutive seqs
            seqs = list(range(raw, raw + len(keys)))
        else:
            seqs = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8)]
        out.append([exp, keys, seqs])
    by_exp: dict[int, tuple[list[str], list[int]]] = {}
    for prefix, runs in recs:
        for n0, seqs, exps in runs:
            for j, (seq, exp) in enumerate(zip(_expand(seqs, 1), _expand(exps, 0), strict=True)):
                row = by_exp.setdefault(exp, ([], []))
                row[0].append(f"{prefix}-{n0 + j}")
                row[1].append(seq)
    out += [[exp, keys, seqs] for exp, (keys, seqs) in by_exp.items()]
    return out


def v8_dedup(dumped: Any) -> list[Any]:
    """A v9 topic's dedup as v8 rows: every key a digest."""
    rows = []
    for exp, keys, seqs in legacy_dedup(dumped):
        order = sorted(range(len(seqs)), key=seqs.__getitem__)
        blob = b"".join(key_digest(keys[i]) for i in order)
        rows.append([exp, blob, b"".join(seqs[i].to_bytes(8, "little") for i in order)])
    return sorted(rows, key=lambda r: r[0])


def v7_snapshot(b: Broker, version: int = 7) -> bytes:
    """``b``'s snapshot as v7 wrote it (idempotency keys, not digests), or as v8 did
    (digests only: no records of numbered keys)."""
    obj = msgpack.unpackb(b.snapshot(), raw=False, strict_map_key=False)
    obj[0] = version
    for row in obj[3]:
        row[9] = legacy_dedup(row[9]) if version == 7 else v8_dedup(row[9])
    return msgpack.packb(obj, use_bin_type=True)


def legacy_snapshot(b: Broker, version: int) -> bytes:
    """``b``'s state in the layout of snapshot ``version`` (3-6): messages with their
    payloads, as nodes before the segment store wrote them."""
    obj = msgpack.unpackb(b.snapshot(), raw=False, strict_map_key=False)
    _, now, applied, topic_rows, tokens, keyed, settings = obj[:7]
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
    ) in topic_rows:
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
    for row in obj[3]:  # (the keys held, whether as digests or in runs)
        row[9] = dedup_held(b.topics[row[0]].dedup)
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
