"""The Broker's snapshot (``state.Broker.snapshot`` / ``restore``): v9 written, v2-v9 read and
converted. Metadata only: per topic its stream key, index dump, ordering keys, counts,
idempotency keys and groups; the payloads stay in the store, whose marks the snapshot names
(the binding's transfer sends the files they name: ``raft/_snapshots.py``). Only a Broker on
an in-memory store (no data directory: no files to transfer) inlines those segments' bytes.

Deterministic like apply: the same state gives the same bytes on every replica (dicts in
insertion order, sets sorted), so ``Broker.digest`` can compare replicas. Reads no clock.
"""

from __future__ import annotations

import heapq
import os
from collections import deque
from typing import TYPE_CHECKING, Any

import msgpack

from raftq.cluster import validate as v
from raftq.cluster.dedup import DedupKeys
from raftq.cluster.keys import TopicKeys
from raftq.cluster.memdisk import MemDisk
from raftq.cluster.msgindex import GONE, MsgIndex
from raftq.cluster.segstore import Marks, files_of
from raftq.cluster.topics import GROUP_COUNTERS, TOPIC_COUNTERS, Group, Topic, age_due, reorder

if TYPE_CHECKING:
    from raftq.cluster.state import Broker

# 2: topics carry their running publish delays; 3: dedup keys per publish; 4: API tokens,
# written only when there is one (else 3, which nodes without tokens can still install);
# 5: ordering keys, ordered groups, topic labels and first-receive times, written only when one
# of them is in the state (else 3 or 4); 6: cluster settings (max_retained_bytes), written only
# while one is set (else 3, 4 or 5); 7: payloads in the segment store (issue 22): per topic its
# stream key, index dump, ordering keys, count and bytes instead of the messages, plus the
# store's marks and ``next_stream``; 8: idempotency keys as digests (per topic, dedup rows
# ``[expires_at, 16-byte digests joined, seqs]``, ``DedupKeys.dump``: the first seq when they
# are consecutive, else little-endian int64 bytes)
# instead of ``[expires_at, keys, seqs]``; always written (v2-v7 are read and converted: their
# keys are hashed, v2-v6 also their messages moved into the store); 9: a topic's dedup is
# ``[v8 rows, high, legacy_until, records]`` (``TopicKeys.dump``: producers' numbered keys
# as runs of seqs and expiries; a v8 topic's keys stay digests, asked by a miss in a record
# until they expired).
SNAPSHOT_VERSION = 9
READABLE_SNAPSHOTS = (2, 3, 4, 5, 6, 7, 8, 9)


def cost(b: Broker) -> int:
    """About how long ``dump`` takes, in microseconds (measured on the 2-core box,
    ``bench/snapshot_cost.py``: ~1.2 us an in-flight, held, delayed or skipped delivery or
    delayed or ordered message, ~0.02-0.08 an idempotency key and ~3 an expiry row of them (one
    a publish at worst), ~0.006 a retained message; high
    rather than low: garbage collections make the first kind cost 0.3-1.2 us), so
    the binding can serialize a light state in place instead of forking a writer. Walks
    topics and groups, not messages."""
    items = 0  # (each ~1.2 us)
    total = 100 + 2 * len(b._tokens)
    for t in b.topics.values():
        items += len(t.okeys) + len(t.publish_delays)
        total += 20 + len(t.dedup) // 12 + 3 * t.dedup.pieces() + t.count // 150
        for g in t.groups.values():
            items += len(g.skip) + len(g.held) + len(g.inflight) + len(g.delayed)
            items += len(g.first) + len(g.ready)
            total += 20
    return total + (6 * items) // 5


def dump(b: Broker, marks: Marks, inline: bool) -> bytes:
    """The v9 snapshot of ``b`` naming the store's ``marks``; ``inline``: with the bytes of the
    segments they name (a Broker on an in-memory store: see ``Broker.snapshot``)."""
    topics: list[list[Any]] = []
    for t in b.topics.values():
        groups = [
            [
                g.name,
                g.config,
                g.cursor,
                g.pin,
                g.fresh,
                sorted(g.skip),
                list(g.held.items()),
                [[s, *e] for s, e in g.inflight.items()],
                list(g.delayed.items()),
                [s for s in g.ready if g.is_ready(s)],
                [g.counters[k] for k in GROUP_COUNTERS],
                list(g.first.items()),
            ]
            for g in t.groups.values()
        ]
        topics.append(
            [
                t.name,
                t.config,
                t.created_at,
                t.next_seq,
                t.key,
                t.index.dump(),
                sorted(t.okeys.items()),
                t.count,
                t.bytes,
                t.dedup.dump(),
                [t.counters[k] for k in TOPIC_COUNTERS],
                groups,
                list(t.publish_delays.items()),
            ]
        )
    tokens = [
        [
            tid,
            r["name"],
            r["hash"],
            [[g["topics"], g["actions"]] for g in r["grants"]],
            r["cluster"],
            r["expires_at"],
            r["disabled"],
            r["created_at"],
        ]
        for tid, r in sorted(b._tokens.items())
    ]
    head = [SNAPSHOT_VERSION, b.now, b.applied_commands, topics, tokens, b._keyed]
    out = [*head, b.settings, marks, b.next_stream]
    if inline:
        out.append(_segment_bytes(b, marks))
    return msgpack.packb(out, use_bin_type=True)


def _segment_bytes(b: Broker, marks: Marks) -> list[list[Any]]:
    disk, directory = b.store.disk, b.store.dir
    out = []
    sizes = [s[1] for _, _, segs in marks for s in segs]
    for name, size in zip(files_of(marks), sizes, strict=True):
        data = disk.read(os.path.join(directory, name)) or b""
        out.append([name, data[:size]])
    return out


def marks_of(data: bytes) -> Marks:
    """The store marks a snapshot names (``[]`` for one older than v7): the segments a
    transfer of it exports."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
        version = obj[0]
    except Exception as e:
        raise ValueError(f"not a raftq snapshot: {e!r}") from e
    if version not in READABLE_SNAPSHOTS:
        raise ValueError(f"unsupported snapshot version {version!r}")
    marks: Marks = obj[7] if version >= 7 else []
    return marks


def load(b: Broker, obj: Any) -> None:
    """A decoded snapshot (v2-v9) into ``b``, a new Broker on the store to restore: the store
    cut back to the snapshot's marks, topics, groups, tokens and the heaps rebuilt."""
    marks: Any = None
    if obj[0] >= 7:
        (
            version, b.now, b.applied_commands, topics, tokens, b._keyed, settings,
            marks, b.next_stream, *inline,
        ) = obj  # fmt: skip
        b.settings = v.cluster_settings(settings, {})
        if inline and isinstance(b.store.disk, MemDisk):
            for name, data in inline[0]:
                f = b.store.disk.create(os.path.join(b.store.dir, name))
                f.write(data)
    elif obj[0] == 6:
        version, b.now, b.applied_commands, topics, tokens, b._keyed, settings = obj
        b.settings = v.cluster_settings(settings, {})
    elif obj[0] == 5:
        version, b.now, b.applied_commands, topics, tokens, b._keyed = obj
    elif obj[0] == 4:
        version, b.now, b.applied_commands, topics, tokens = obj
    else:
        version, b.now, b.applied_commands, topics = obj
        tokens = ()
    for tid, name, digest, grants, cluster, expires_at, disabled, created_at in tokens:
        if tid in b._tokens or name in b._token_names:
            raise ValueError(f"token {tid!r} or name {name!r} given twice")
        b._tokens[tid] = {
            "id": tid,
            "name": name,
            "hash": digest,
            "grants": [{"topics": p, "actions": list(a)} for p, a in grants],
            "cluster": cluster,
            "expires_at": expires_at,
            "disabled": disabled,
            "created_at": created_at,
        }
        b._token_names[name] = tid
    b.store.truncate_to(marks if marks is not None else [])
    for row in topics:
        if version >= 7:
            (
                name, config, created_at, next_seq, key, index, okeys, count, nbytes, dedup,
                tc, groups, delays,
            ) = row  # fmt: skip
            t = Topic(name, dict(config), created_at, b._retained, key)
            t.index = MsgIndex.restore(list(index), b.store.columns(key))
            t.okeys = dict(okeys)
            t.count, t.bytes = count, nbytes
        else:
            name, config, created_at, next_seq, first_seq, msgs, refs, dedup, tc, groups, delays = row  # fmt: skip  # noqa: E501
            t = Topic(name, dict(config), created_at, b._retained, f"{name}.{b.next_stream}")
            b.next_stream += 1
            _convert(b, t, first_seq, msgs, refs)
        t.next_seq = next_seq
        if t.index.next_seq != next_seq:
            raise ValueError(f"topic {name!r}: index ends at {t.index.next_seq}, not {next_seq}")
        _load_topic(b, t, version, dedup, tc, groups, delays)
    heapq.heapify(b._deadlines)
    heapq.heapify(b._delays)


def _convert(b: Broker, t: Topic, first_seq: int, msgs: Any, refs: Any) -> None:
    """A v2-v6 topic's messages into the store, in seq order, and its index."""
    ix = t.index = MsgIndex(first_seq)
    for i, m in enumerate(msgs):
        if m is None:
            ix.append(GONE, 0, 0, 0, GONE)
            continue
        seq = first_seq + i
        loc, length = b.store.append(t.key, seq, m[1], m[0], m[2])
        ix.append(loc, length, len(m[0]), m[1], refs[i])
        if len(m) > 3:
            t.okeys[seq] = m[3]
        t.count += 1
        t.bytes += len(m[0])
    ix.trim()


def _load_topic(
    b: Broker, t: Topic, version: int, dedup: Any, tc: Any, groups: Any, delays: Any
) -> None:
    name = t.name
    if version == 2:  # one [key, seq, expires_at] row per key
        by_exp: dict[int, tuple[list[str], list[int]]] = {}
        for k, s, e in dedup:
            row = by_exp.setdefault(e, ([], []))
            row[0].append(k)
            row[1].append(s)
        dedup = [(e, keys, seqs) for e, (keys, seqs) in by_exp.items()]
    if version >= 9:  # [rows, records]
        t.dedup = TopicKeys.restore(dedup)
    elif version == 8:  # [expires_at, digests, seqs] rows
        t.dedup = TopicKeys(DedupKeys.restore(dedup))
    else:  # [expires_at, keys, seqs]: the keys are hashed (the upgrade)
        t.dedup = TopicKeys.from_keys(dedup)
    t.counters = dict(zip(TOPIC_COUNTERS, tc, strict=True))
    for s, due in delays:
        t.publish_delays[s] = due
        b._delays.append((due, name, "", (s,)))
    for grow in groups:
        if version >= 5:
            (
                gname,
                gcfg,
                cursor,
                pin,
                fresh,
                skip,
                held,
                inflight,
                delayed,
                ready,
                gc,
                fr,
            ) = grow
        else:
            gname, gcfg, cursor, pin, fresh, skip, held, inflight, delayed, ready, gc = grow
            fr = ()
        gcfg = dict(gcfg)
        gcfg["backoff"] = list(gcfg["backoff"])
        g = Group(gname, gcfg, cursor)
        g.pin, g.fresh = pin, fresh
        g.skip = set(skip)
        g.held = dict(held)
        for s, consumer, mac, deadline, *f in inflight:
            # (an older snapshot has no first-receive times: the snapshot's now)
            g.inflight[s] = [consumer, mac, deadline, f[0] if f else b.now]
            g.by_consumer.setdefault(consumer, {})[s] = None
            b._consumers.setdefault(consumer, {})[(name, gname)] = None
            b._deadlines.append((deadline, name, gname, (s,)))
        for s, due in delayed:
            g.delayed[s] = due
            b._delays.append((due, name, gname, (s,)))
        g.ready = deque(ready)
        g.counters = dict(zip(GROUP_COUNTERS, gc, strict=True))
        g.first = dict(fr)
        if version < 5:  # (no first-receive times: the snapshot's now, as above)
            for s, attempts in g.held.items():
                if attempts and s not in g.inflight:
                    g.first[s] = b.now
        t.groups[gname] = g
    oldest = t.oldest_seq()
    t.pinned = [g for g in t.groups.values() if g.pin > oldest]
    for g in t.groups.values():
        if g.kq is not None:
            reorder(t, g)
    b.topics[name] = t
    b._aging.note(name, age_due(t))
    nxt = t.dedup.next_expiry()
    if nxt is not None:
        b._dedup_expiry.note(name, nxt)
