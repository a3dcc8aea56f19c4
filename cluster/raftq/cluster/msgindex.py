"""Compact per-message metadata of a topic (issue 22).

``MsgIndex`` replaces ``Topic.msgs`` / ``Topic.refs`` (a tuple and a list slot per message):
packed ``array`` columns indexed by ``seq - first_seq``, about 28 bytes a message (location
of its record in the ``segstore`` and its length there, i.e. its share of that record, payload
size, publish time, and ``refs``: how many
groups have yet to settle it, ``GONE`` once it left the topic). Get by seq is O(1); the gone
prefix is dropped in amortised O(1) as ``Topic.trim`` does. Not numpy: the columns need only
append, index, slice and ``count``, and the stdlib ``array`` does those in C.

A snapshot carries only ``refs`` (compressed: runs of equal counts are the common case); a
restore rebuilds the other columns from the store's ``columns`` (sidecars), which describe
every message of the live segments.

A topic's idempotency keys are in ``dedup`` (``DedupKeys``).

Deterministic: nothing here reads a clock, randomness or a file; dicts keep insertion order.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from raftq.cluster.segstore import Columns
from raftq.cluster.storage import StorageCorrupt

GONE = -1  # refs of a message that left the topic
_COMPACT_AT = 1024  # the gone prefix is cut once it is this long and half the columns


class MsgIndex:
    __slots__ = ("at", "first_seq", "head", "length", "loc", "refs", "size")

    def __init__(self, first_seq: int = 1) -> None:
        self.first_seq = first_seq  # seq of position 0
        self.head = 0  # positions before it are gone
        self.loc = array("q")  # segstore location of its record
        self.length = array("I")  # its share of the record's length (what ``free`` takes)
        self.size = array("I")  # payload bytes
        self.at = array("q")  # published_at ms
        self.refs = array("i")  # groups yet to settle it (from their pin on); GONE: left

    # ------------------------------------------------------------ reading

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.refs)

    def oldest_seq(self) -> int:
        return self.first_seq + self.head

    def __len__(self) -> int:
        """Positions held (gone ones included), from the oldest retained on."""
        return len(self.refs) - self.head

    def retained(self, seq: int) -> bool:
        i = seq - self.first_seq
        return self.head <= i < len(self.refs) and self.refs[i] != GONE

    def get(self, seq: int) -> tuple[int, int, int, int] | None:
        """(location, length, payload size, published_at) of a retained message."""
        i = seq - self.first_seq
        if i < self.head or i >= len(self.refs) or self.refs[i] == GONE:
            return None
        return self.loc[i], self.length[i], self.size[i], self.at[i]

    def is_live(self, seq: int, loc: int) -> bool:
        """Does the index still point at this record for ``seq`` (segstore compaction)?"""
        i = seq - self.first_seq
        return self.head <= i < len(self.refs) and self.refs[i] != GONE and self.loc[i] == loc

    def ref(self, seq: int) -> int:
        return self.refs[seq - self.first_seq]

    # ------------------------------------------------------------ changing

    def append(self, loc: int, length: int, size: int, at: int, refs: int) -> int:
        """Add the next message; returns its seq."""
        seq = self.next_seq
        self.loc.append(loc)
        self.length.append(length)
        self.size.append(size)
        self.at.append(at)
        self.refs.append(refs)
        return seq

    def extend(
        self, locs: list[int], lengths: Sequence[int], sizes: list[int], at: int, refs: int
    ) -> None:
        """Add the next ``len(locs)`` messages, all published at ``at`` with ``refs`` (a
        publish command: one C-level extend per column instead of an append per message)."""
        n = len(locs)
        self.loc.extend(locs)
        self.length.extend(lengths)
        self.size.extend(sizes)
        self.at.extend(array("q", [at]) * n)
        self.refs.extend(array("i", [refs]) * n)

    def set_ref(self, seq: int, refs: int) -> None:
        self.refs[seq - self.first_seq] = refs

    def remove(self, seq: int) -> tuple[int, int, int] | None:
        """Mark a retained message gone; returns (location, length, payload size) for
        the store's ``free`` and the topic's byte count, or None when it was not retained.
        Trims the gone prefix when it was the oldest."""
        i = seq - self.first_seq
        if i < self.head or i >= len(self.refs) or self.refs[i] == GONE:
            return None
        refs = self.refs
        refs[i] = GONE
        out = self.loc[i], self.length[i], self.size[i]
        if i == self.head:  # (``trim`` inline: acks in order remove the head every time)
            h, n = i + 1, len(refs)
            while h < n and refs[h] == GONE:
                h += 1
            self.head = h
            if h > _COMPACT_AT and h * 2 > n:
                self._cut()
        return out

    def trim(self) -> None:
        """Move the head past gone messages; cut the columns once the gone prefix is long."""
        refs, h, n = self.refs, self.head, len(self.refs)
        while h < n and refs[h] == GONE:
            h += 1
        self.head = h
        if h > _COMPACT_AT and h * 2 > n:
            self._cut()

    def _cut(self) -> None:
        h = self.head
        for col in (self.loc, self.length, self.size, self.at, self.refs):
            del col[:h]
        self.first_seq += h
        self.head = 0

    def relocate(self, moved: dict[int, tuple[int, int]]) -> None:
        """Apply a segstore compaction's ``{seq: (new location, length)}``."""
        first, loc, length = self.first_seq, self.loc, self.length
        for seq, (new, n) in moved.items():
            loc[seq - first] = new
            length[seq - first] = n

    def nbytes(self) -> int:
        """Bytes the columns hold (allocated, not only used)."""
        cols = (self.loc, self.length, self.size, self.at, self.refs)
        return sum(c.buffer_info()[1] * c.itemsize for c in cols)

    # ------------------------------------------------------------ snapshot

    def dump(self) -> list[Any]:
        """[oldest seq, next seq, zlib of the refs column from the oldest on] (little-endian):
        a long backlog of untouched messages compresses to almost nothing."""
        refs = self.refs[self.head :]
        if sys.byteorder != "little":
            refs.byteswap()
        return [self.oldest_seq(), self.next_seq, zlib.compress(refs.tobytes(), 1)]

    @classmethod
    def restore(cls, dumped: list[Any], columns: Iterable[tuple[int, Columns]]) -> MsgIndex:
        """Rebuild from ``dump()`` and the store's ``columns(key)``. Records outside the
        retained range (gone messages in a live record) are skipped. StorageCorrupt when a
        retained message has no record."""
        oldest, next_seq, blob = dumped
        n = next_seq - oldest
        ix = cls(oldest)
        ix.refs.frombytes(zlib.decompress(blob))
        if sys.byteorder != "little":
            ix.refs.byteswap()
        if len(ix.refs) != n:
            raise ValueError(f"refs of {len(ix.refs)} messages for seqs {oldest}..{next_seq}")
        ix.loc = array("q", [GONE]) * n
        ix.length = array("I", [0]) * n
        ix.size = array("I", [0]) * n
        ix.at = array("q", [0]) * n
        for segno, c in columns:
            ix._place(segno, c, oldest, next_seq)
        if ix.loc.count(GONE) > ix.refs.count(GONE):
            raise StorageCorrupt(f"messages {oldest}..{next_seq - 1}: some have no record")
        ix.trim()
        return ix

    def _place(self, segno: int, c: Columns, oldest: int, next_seq: int) -> None:
        if len(c.first) == len(c.length):  # a record per message (batches of one)
            self._place_singles(segno, c, oldest, next_seq)
            return
        base, j = segno << 32, 0
        for first, n, off, at in zip(c.first, c.count, c.offset, c.at, strict=True):
            lo, hi = max(first, oldest), min(first + n, next_seq)
            if lo < hi:  # a record's messages have consecutive seqs: slices, C speed
                a, b, k = lo - oldest, hi - oldest, j + lo - first
                self.loc[a:b] = array("q", [base | off]) * (b - a)
                self.length[a:b] = c.length[k : k + b - a]
                self.size[a:b] = c.size[k : k + b - a]
                self.at[a:b] = array("q", [at]) * (b - a)
            j += n

    def _place_singles(self, segno: int, c: Columns, oldest: int, next_seq: int) -> None:
        seqs, k = c.first, len(c.first)
        if not k:
            return
        base = segno << 32
        if seqs[-1] - seqs[0] == k - 1 and seqs == array("q", range(seqs[0], seqs[0] + k)):
            # consecutive seqs (a segment no compaction wrote into): slices, C speed
            lo, hi = max(seqs[0], oldest), min(seqs[-1] + 1, next_seq)
            if lo >= hi:
                return
            a, b, j = lo - oldest, hi - oldest, lo - seqs[0]
            self.loc[a:b] = array("q", [base | o for o in c.offset[j : j + b - a]])
            self.length[a:b] = c.length[j : j + b - a]
            self.size[a:b] = c.size[j : j + b - a]
            self.at[a:b] = c.at[j : j + b - a]
            return
        for i in range(k):
            s = seqs[i]
            if oldest <= s < next_seq:
                p = s - oldest
                self.loc[p] = base | c.offset[i]
                self.length[p], self.size[p], self.at[p] = c.length[i], c.size[i], c.at[i]
