"""A topic's idempotency keys within its dedup window, as fixed-size digests (issue 22).

A key is kept as its 16-byte blake2b digest (``key_digest``: a collision among 2^64 keys is
as likely as not; a window holds millions at most). ``DedupKeys`` is a dict digest -> the row
that holds it, so a lookup, an insert and a delete are each one dict operation in C: a
publish's keys cost ~0.1 us each besides their digest. ~110 B a key in all
(``bench/dedup.py``), against ~165 B for a dict of uuid strings and their seqs.

(A packed table of 24-byte entries in ``bytes`` buckets took 47-60 B a key, but every insert
and delete rebuilt a bucket in Python, ~1.2 us a key on each replica: ~6 % of the cluster's
CPU per message in the publish benchmarks. Memory per key follows rate x window, not the
backlog; CPU is paid on every publish, so the dict won.)

Expiry is per publish command: a heap of rows ``[expires_at, first seq, digests, seqs]``
(``digests`` a list of the very ``bytes`` the dict holds, 8 B a key; ``seqs`` None when they
are consecutive from the first, the common case, else an ``array``), one per publish
(publishes of one entry to a topic share a row: same expiry), and expiring a row deletes its
digests. Each digest held is in exactly one live row, the one the dict maps it to; its seq is
found from its place in the row (a duplicate, the rare case, scans its row).

Deterministic where it matters: snapshots (``dump``: rows in expiry order, whatever the heap's
layout) and what a replica answers depend only on the commands applied; dicts compare full
digests, whatever ``hash()`` (randomized per process) makes of them, which is also why an
attacker who can pick keys cannot pile them up in one slot. Nothing here reads a clock,
randomness or a file.
"""

from __future__ import annotations

import hashlib
import heapq
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any

_PROTO = hashlib.blake2b(digest_size=16)  # (copying it beats the constructor's arguments)
SHRINK_BELOW = 8  # the dict is rebuilt once it holds under 1/8 of its peak (dicts never shrink)


Row = list[Any]  # [expires_at, first seq, digests: list[bytes], seqs: array("q") or None]


def _row_order(row: Row) -> tuple[int, int]:
    return row[0], row[1]


def _consecutive(parts: list[Sequence[int]]) -> int | None:
    """The first seq when the parts' seqs are consecutive, each part starting where the last
    stopped (whatever the parts are: the snapshot's form depends only on the seqs)."""
    first = stop = None
    for p in parts:
        if not p:
            continue
        start = p[0]
        if (stop is not None and start != stop) or not (
            isinstance(p, range) or p == array("q", range(start, start + len(p)))
        ):
            return None
        if first is None:
            first = start
        stop = start + len(p)
    return first


def key_digest(key: str) -> bytes:
    """The 16-byte blake2b digest of an idempotency key (what replicas and snapshots hold)."""
    h = _PROTO.copy()
    h.update(key.encode())
    return h.digest()


def _seq_in(row: Row, d: bytes) -> int:
    i = row[2].index(d)
    return row[1] + i if row[3] is None else int(row[3][i])


class DedupKeys:
    """Digest -> seq for the keys of one topic's window, with their expiry rows."""

    __slots__ = ("heap", "held", "last", "peak")

    def __init__(self) -> None:
        self.held: dict[bytes, Row] = {}
        # [expires_at, first seq, digests, seqs or None: consecutive from the first], a
        # min-heap; ``last`` is the row pushed last, which a publish with the same expiry
        # extends.
        self.heap: list[Row] = []
        self.last: Row | None = None
        self.peak = 0  # most keys held since the dict was last built

    def __len__(self) -> int:
        return len(self.held)

    def lookup(self, key: str) -> tuple[bytes, int | None]:
        """The digest of ``key`` and the seq it published, or None: ``key_digest`` and
        ``get`` in one call (a publish makes one per key)."""
        h = _PROTO.copy()
        h.update(key.encode())
        d = h.digest()
        row = self.held.get(d)
        return d, None if row is None else _seq_in(row, d)

    def get(self, d: bytes) -> int | None:
        """The seq a digest published, or None."""
        row = self.held.get(d)
        return None if row is None else _seq_in(row, d)

    def add(self, expires_at: int, keyed: Mapping[bytes, int]) -> None:
        """The new keys of one publish command: digests (none held yet, none twice) ->
        their seqs, in seq order."""
        if not keyed:
            return
        vals = list(keyed.values())
        together = vals[-1] - vals[0] == len(vals) - 1  # (increasing: consecutive)
        row = self.last
        if row is not None and row[0] == expires_at:  # (still in the heap: expires later)
            held = len(row[2])
            seqs = row[3]
            if seqs is None and not (together and vals[0] == row[1] + held):
                seqs = row[3] = array("q", range(row[1], row[1] + held))
            if seqs is not None:
                seqs.extend(vals)
            row[2].extend(keyed)
        else:
            row = [expires_at, vals[0], list(keyed), None if together else array("q", vals)]
            heapq.heappush(self.heap, row)
            self.last = row
        self.held.update(zip(keyed, repeat(row)))
        if len(self.held) > self.peak:
            self.peak = len(self.held)

    def next_expiry(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def expire(self, now: int) -> int:
        """Drop the rows due at ``now`` and their keys; returns how many keys left."""
        q, held = self.heap, self.held
        before = len(held)
        while q and q[0][0] <= now:
            row = heapq.heappop(q)
            if row is self.last:
                self.last = None
            for d in row[2]:
                del held[d]
        if len(held) * SHRINK_BELOW < self.peak:
            self.held = dict(held)  # (a dict keeps its table at its peak size until rebuilt)
            self.peak = len(held)
        return before - len(held)

    def nbytes(self) -> int:
        """Bytes held (objects and allocations, as ``sys.getsizeof`` counts them)."""
        rows = sum(
            sys.getsizeof(r) + sys.getsizeof(r[2]) + (sys.getsizeof(r[3]) if r[3] else 0)
            for r in self.heap
        )
        return (
            sys.getsizeof(self.held)
            + sum(map(sys.getsizeof, self.held))
            + sys.getsizeof(self.heap)
            + rows
        )

    # ------------------------------------------------------------ snapshot

    def dump(self) -> list[list[Any]]:
        """Rows ``[expires_at, digests, seqs]``, one per expiry time, in expiry order:
        canonical, whatever the heap's layout or how publishes split keys between rows (a
        restored replica holds one row per expiry time). ``seqs`` is the first seq when they
        are consecutive (a row is the keys of one entry's publishes: the common case, 16 B a
        key in all), else little-endian int64 bytes (24 B a key)."""
        merged: list[tuple[int, list[bytes], list[Sequence[int]]]] = []
        for exp, first, digests, seqs in sorted(self.heap, key=_row_order):
            part = range(first, first + len(digests)) if seqs is None else seqs
            if merged and merged[-1][0] == exp:
                merged[-1][1].append(b"".join(digests))
                merged[-1][2].append(part)
            else:
                merged.append((exp, [b"".join(digests)], [part]))
        rows: list[list[Any]] = []
        for exp, blobs, parts in merged:
            blob = b"".join(blobs)
            first = _consecutive(parts)
            if first is not None:
                rows.append([exp, blob, first])
                continue
            got = array("q")
            for p in parts:
                got.extend(p if type(p) is array else array("q", p))
            if sys.byteorder != "little":
                got.byteswap()
            rows.append([exp, blob, got.tobytes()])
        return rows

    @classmethod
    def restore(cls, rows: Iterable[Any]) -> DedupKeys:
        """From ``dump()`` rows (snapshot v8). ValueError on a malformed row."""
        loaded: list[tuple[int, list[bytes], Sequence[int]]] = []
        for exp, blob, raw in rows:
            if len(blob) % 16 or not blob:
                raise ValueError("dedup row: digests are 16 bytes each")
            seqs: Sequence[int]
            if type(raw) is int:  # the first of consecutive seqs
                seqs = range(raw, raw + len(blob) // 16)
            elif len(raw) != len(blob) // 2:
                raise ValueError("dedup row: digests and seqs differ in number")
            else:
                seqs = array("q")
                seqs.frombytes(raw)
                if sys.byteorder != "little":
                    seqs.byteswap()
            digests = [blob[j : j + 16] for j in range(0, len(blob), 16)]
            loaded.append((exp, digests, seqs))
        return cls._loaded(loaded)

    @classmethod
    def from_keys(cls, rows: Iterable[tuple[int, Iterable[str], Iterable[int]]]) -> DedupKeys:
        """From the rows ``(expires_at, keys, seqs)`` of a v3-v7 snapshot: the upgrade."""
        loaded: list[tuple[int, list[bytes], Sequence[int]]] = []
        for exp, keys, seqs in rows:
            digests, seqs = list(map(key_digest, keys)), array("q", seqs)
            if len(digests) != len(seqs):
                raise ValueError("dedup row: keys and seqs differ in number")
            if digests:
                loaded.append((exp, digests, seqs))
        return cls._loaded(loaded)

    @classmethod
    def _loaded(cls, rows: list[tuple[int, list[bytes], Sequence[int]]]) -> DedupKeys:
        """The table of these rows; ValueError if a digest is held twice."""
        k = cls()
        held = k.held
        n = 0
        for exp, digests, seqs in rows:
            together = _consecutive([seqs]) is not None
            row = [exp, seqs[0], digests, None if together else array("q", seqs)]
            k.heap.append(row)
            held.update(zip(digests, repeat(row)))
            n += len(digests)
            if len(held) != n:
                raise ValueError("dedup rows: a key held twice")
        heapq.heapify(k.heap)
        k.peak = n
        return k
