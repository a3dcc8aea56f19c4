"""A topic's idempotency keys within its dedup window, compact (issue 22).

A key is kept as its 16-byte blake2b digest (``key_digest``: a collision among 2^64 keys is
as likely as not; a window holds millions at most) with the seq it published. ``DedupKeys``
puts each as a 24-byte entry (digest, seq as 8 little-endian bytes) in one of 2^k buckets,
chosen by ``hash(digest)``: a ``bytes`` of 2-8 entries (one allocation, 33 B of header; an
empty one is the shared ``b""``; an insert or delete makes a new one, a copy of ~100-200 B).
A lookup is one ``bytes.find`` (C) over a few entries, so the per-key work in Python is a
hash, a find and a concatenation, with no Python object per key (an open-addressing table
probed in Python, ``msgindex.DigestTable`` before, cost 8-13 % CPU cluster-wide). 47-60 B a key in
all (``bench/dedup.py``), against ~165 B for a dict of uuid strings.

Expiry is per publish command, as before: a heap of rows ``[expires_at, first seq, digests,
seqs]`` (``seqs`` None when they are consecutive from the first, the common case, else an
``array``: a snapshot then needs no lookup a key),
one per publish (publishes of one entry to a topic share a row: same expiry), and expiring a
row deletes its entries. Each digest held is in exactly one live row. A restored table
holds its rows alone until its first lookup or add (``_Unbuilt``): keys whose rows expire
before that are never put in a bucket.

Deterministic where it matters: lookups compare the full digest, so what a replica answers,
snapshots (``dump``: rows in expiry order) and restores never depends on the bucket layout,
which ``hash()`` (randomized per process by ``PYTHONHASHSEED``) may choose; that layout is
also why an attacker who can pick keys cannot pile them into one bucket. Nothing here reads a
clock, randomness or a file.
"""

from __future__ import annotations

import hashlib
import heapq
import struct
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from raftq.cluster.storage import StorageCorrupt

ENTRY = 24  # digest 16 + seq 8 (little-endian)
GROW_AT = 8  # keys per bucket on average above which the buckets are rebuilt for 2-4
SHRINK_AT = 1  # ... and below which, too

_PROTO = hashlib.blake2b(digest_size=16)  # (copying it beats the constructor's arguments)
_entry = struct.Struct("<16sq").pack  # digest, seq: an entry (one call, one object)


Row = list[Any]  # [expires_at, first seq, digests, seqs: array("q") or None]


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


class DedupKeys:
    """Digest -> seq for the keys of one topic's window, with their expiry rows."""

    __slots__ = ("buckets", "heap", "last", "mask", "n")

    def __init__(self) -> None:
        self.buckets: list[bytes] = [b""]
        self.mask = 0  # len(buckets) - 1, a power of two minus one
        self.n = 0  # live keys
        # [expires_at, first seq, digests joined, seqs or None: consecutive from the first],
        # a min-heap; ``last`` is the row pushed last, which a publish with the same expiry
        # extends.
        self.heap: list[Row] = []
        self.last: Row | None = None

    def __len__(self) -> int:
        return self.n

    def lookup(self, key: str) -> tuple[bytes, int | None]:
        """The digest of ``key`` and the seq it published, or None: ``key_digest`` and
        ``get`` in one call (a publish makes one per key)."""
        h = _PROTO.copy()
        h.update(key.encode())
        d = h.digest()
        b = self.buckets[hash(d) & self.mask]
        i = b.find(d)
        if i < 0:
            return d, None
        while i % ENTRY:
            i = b.find(d, i + 1)
            if i < 0:
                return d, None
        return d, int.from_bytes(b[i + 16 : i + ENTRY], "little")

    def get(self, d: bytes) -> int | None:
        """The seq a digest published, or None."""
        b = self.buckets[hash(d) & self.mask]
        i = b.find(d)
        while i > 0 and i % ENTRY:  # a match across two entries (or into a seq) is not one
            i = b.find(d, i + 1)
        if i < 0:
            return None
        return int.from_bytes(b[i + 16 : i + ENTRY], "little")

    def add(self, expires_at: int, keyed: Mapping[bytes, int]) -> None:
        """The new keys of one publish command: digests (none held yet, none twice) ->
        their seqs, in seq order."""
        if not keyed:
            return
        buckets, mask = self.buckets, self.mask
        for d, seq in keyed.items():
            buckets[hash(d) & mask] += _entry(d, seq)
        blob = b"".join(keyed)
        vals = list(keyed.values())
        together = vals[-1] - vals[0] == len(vals) - 1  # (increasing: consecutive)
        last = self.last
        if last is not None and last[0] == expires_at:  # (still in the heap: expires later)
            held = len(last[2]) // 16
            seqs = last[3]
            if seqs is None and not (together and vals[0] == last[1] + held):
                seqs = last[3] = array("q", range(last[1], last[1] + held))
            if seqs is not None:
                seqs.extend(vals)
            last[2].extend(blob)
        else:
            row: Row = [
                expires_at,
                vals[0],
                bytearray(blob),
                None if together else array("q", vals),
            ]
            heapq.heappush(self.heap, row)
            self.last = row
        self.n += len(keyed)
        if self.n > GROW_AT * (mask + 1):
            self._rebuild()

    def next_expiry(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def expire(self, now: int) -> int:
        """Drop the rows due at ``now`` and their keys; returns how many keys left."""
        q, n = self.heap, 0
        buckets, mask = self.buckets, self.mask
        while q and q[0][0] <= now:
            row = heapq.heappop(q)
            if row is self.last:
                self.last = None
            blob = bytes(row[2])
            for j in range(0, len(blob), 16):
                d = blob[j : j + 16]
                h = hash(d) & mask
                b = buckets[h]
                i = b.find(d)
                while i > 0 and i % ENTRY:
                    i = b.find(d, i + 1)
                if i >= 0:
                    buckets[h] = b[ENTRY:] if i == 0 else b[:i] + b[i + ENTRY :]
                    n += 1
        self.n -= n
        if n and self.mask and self.n < SHRINK_AT * (self.mask + 1):
            self._rebuild()
        return n

    def _rebuild(self) -> None:
        """Buckets for 2-4 keys each (the least power of two at least n/4: growing past 8
        a bucket quadruples them), entries moved; depends only on the count."""
        size = 1
        while GROW_AT * size < 2 * self.n:
            size *= 2
        mask = size - 1
        new = [b""] * size
        for raw in self.buckets:
            for i in range(0, len(raw), ENTRY):
                new[hash(raw[i : i + 16]) & mask] += raw[i : i + ENTRY]
        self.buckets, self.mask = new, mask

    def nbytes(self) -> int:
        """Bytes held (objects and allocations, as ``sys.getsizeof`` counts them)."""
        rows = sum(
            sys.getsizeof(r) + sys.getsizeof(r[2]) + (sys.getsizeof(r[3]) if r[3] else 0)
            for r in self.heap
        )
        return (
            sys.getsizeof(self.buckets)
            + sum(sys.getsizeof(b) for b in self.buckets)
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
        merged: list[tuple[int, bytearray, list[Sequence[int]]]] = []
        for exp, first, blob, seqs in sorted(self.heap, key=_row_order):
            part = range(first, first + len(blob) // 16) if seqs is None else seqs
            if merged and merged[-1][0] == exp:
                merged[-1][1].extend(blob)
                merged[-1][2].append(part)
            else:
                merged.append((exp, bytearray(blob), [part]))
        rows: list[list[Any]] = []
        for exp, blob, parts in merged:
            first = _consecutive(parts)
            if first is not None:
                rows.append([exp, bytes(blob), first])
                continue
            got = array("q")
            for p in parts:
                got.extend(p if type(p) is array else array("q", p))
            if sys.byteorder != "little":
                got.byteswap()
            rows.append([exp, bytes(blob), got.tobytes()])
        return rows

    @classmethod
    def restore(cls, rows: Iterable[Any]) -> DedupKeys:
        """From ``dump()`` rows (snapshot v8). ValueError on a malformed row."""
        loaded: list[tuple[int, bytes, Sequence[int]]] = []
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
            loaded.append((exp, bytes(blob), seqs))
        return cls._loaded(loaded)

    @classmethod
    def from_keys(cls, rows: Iterable[tuple[int, Iterable[str], Iterable[int]]]) -> DedupKeys:
        """From the rows ``(expires_at, keys, seqs)`` of a v3-v7 snapshot: the upgrade."""
        loaded: list[tuple[int, bytes, Sequence[int]]] = []
        for exp, keys, seqs in rows:
            keys, seqs = list(keys), array("q", seqs)
            if len(keys) != len(seqs):
                raise ValueError("dedup row: keys and seqs differ in number")
            if keys:
                loaded.append((exp, b"".join(map(key_digest, keys)), seqs))
        return cls._loaded(loaded)

    @classmethod
    def _loaded(cls, rows: list[tuple[int, bytes, Sequence[int]]]) -> DedupKeys:
        """The table of these rows, its buckets left to build (``_Unbuilt``): a restart
        restores the rows alone, and keys that expire before the topic's next publish are
        never put in a bucket (a restart with 7M keys in the window spent 5.4 s a node
        building buckets and 1.7 s more emptying them as the journal replayed). A key held
        twice is found by the build."""
        k = cls()
        k.n = sum(len(seqs) for _, _, seqs in rows)
        for exp, blob, seqs in rows:
            together = _consecutive([seqs]) is not None
            k.heap.append([exp, seqs[0], bytearray(blob), None if together else array("q", seqs)])
        heapq.heapify(k.heap)
        k.__class__ = _Unbuilt
        return k


class _Unbuilt(DedupKeys):
    """A restored ``DedupKeys`` before its first ``lookup``, ``get`` or ``add``: rows without
    buckets. An expiry drops rows alone; the first use builds the buckets of the keys left,
    sized for all of them at once, and turns the object into a plain ``DedupKeys`` (no check
    a call on the hot path). What it answers is the same either way, so replicas that build
    at different times (one restarted, one not) agree.

    ``dump`` writes each digest once; a snapshot that holds one twice is corrupt (it got
    past the seal), and the build stops the node there (``StorageCorrupt``, out of the
    apply that needed the table), as the eager restore refused it: the table would
    otherwise answer by which row expired first, and a replica that built earlier
    differently from one that built later."""

    __slots__ = ()

    def lookup(self, key: str) -> tuple[bytes, int | None]:
        self._build()
        return DedupKeys.lookup(self, key)

    def get(self, d: bytes) -> int | None:
        self._build()
        return DedupKeys.get(self, d)

    def add(self, expires_at: int, keyed: Mapping[bytes, int]) -> None:
        self._build()
        DedupKeys.add(self, expires_at, keyed)

    def expire(self, now: int) -> int:
        q, n = self.heap, 0
        while q and q[0][0] <= now:
            n += len(heapq.heappop(q)[2]) // 16
        self.n -= n
        return n

    def _build(self) -> None:
        size = 1
        while GROW_AT * size < 2 * self.n:
            size *= 2
        self.mask = mask = size - 1
        self.buckets = buckets = [b""] * size
        for _, first, blob, seqs in self.heap:
            raw = bytes(blob)
            got = range(first, first + len(raw) // 16) if seqs is None else seqs
            for j, seq in zip(range(0, len(raw), 16), got, strict=True):
                d = raw[j : j + 16]
                h = hash(d) & mask
                b = buckets[h]
                if b:
                    i = b.find(d)
                    while i > 0 and i % ENTRY:
                        i = b.find(d, i + 1)
                    if i >= 0:
                        raise StorageCorrupt("a snapshot's dedup rows hold a key twice")
                buckets[h] = b + _entry(d, seq)
        self.__class__ = DedupKeys  # type: ignore[assignment]  # (a plain table from now on)
