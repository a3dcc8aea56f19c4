"""Compact per-message metadata of a topic (issue 22).

``MsgIndex`` replaces ``Topic.msgs`` / ``Topic.refs`` (a tuple and a list slot per message):
packed ``array`` columns indexed by ``seq - first_seq``, 16 bytes a message (its record in
the ``segstore``, as an id into a per-record table of location and publish time; its length
there, i.e. its share of that record; its payload size; and ``refs``: how many groups have yet
to settle it, ``GONE`` once it left the topic), plus 16 bytes a record. Get by seq is O(1); the gone
prefix is dropped in amortised O(1) as ``Topic.trim`` does. Not numpy: the columns need only
append, index, slice and ``count``, and the stdlib ``array`` does those in C.

A snapshot carries only ``refs`` (compressed: runs of equal counts are the common case); a
restore rebuilds the other columns from the store's ``columns`` (sidecars), which describe
every message of the live segments.

A topic's idempotency keys are in ``Topic.dedup`` (``dedup.DedupKeys``).

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
_REC_LIMIT = 1 << 32  # record ids are 'I': renumbered before they would pass this


class MsgIndex:
    """Per message 16 B: its record (an id into the record table), its share of that record,
    its payload size and its refs. Per record 16 B: its location and publish time (every
    message of a record was published, or copied by a compaction, together)."""

    __slots__ = ("first_seq", "head", "length", "rat", "rbase", "rec", "refs", "rloc", "size")

    def __init__(self, first_seq: int = 1) -> None:
        self.first_seq = first_seq  # seq of position 0
        self.head = 0  # positions before it are gone
        self.rec = array("I")  # id of its record (rloc/rat position + rbase)
        self.length = array("I")  # its share of the record's length (what ``free`` takes)
        self.size = array("I")  # payload bytes
        self.refs = array("i")  # groups yet to settle it (from their pin on); GONE: left
        self.rbase = 0  # id of record table position 0
        self.rloc = array("q")  # per record: its segstore location
        self.rat = array("q")  # ... published_at ms

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
        r = self.rec[i] - self.rbase
        return self.rloc[r], self.length[i], self.size[i], self.rat[r]

    def is_live(self, seq: int, loc: int) -> bool:
        """Does the index still point at this record for ``seq`` (segstore compaction)?"""
        i = seq - self.first_seq
        return (
            self.head <= i < len(self.refs)
            and self.refs[i] != GONE
            and self.rloc[self.rec[i] - self.rbase] == loc
        )

    def ref(self, seq: int) -> int:
        return self.refs[seq - self.first_seq]

    # ------------------------------------------------------------ changing

    def _record(self, loc: int, at: int) -> int:
        """The id of the record at ``loc``: the newest one when it is (messages appended to
        the same open record), else a new one."""
        rloc = self.rloc
        if rloc and rloc[-1] == loc and self.rat[-1] == at:
            return self.rbase + len(rloc) - 1
        if self.rbase + len(rloc) >= _REC_LIMIT:
            self._renumber()
        rloc.append(loc)
        self.rat.append(at)
        return self.rbase + len(rloc) - 1

    def append(self, loc: int, length: int, size: int, at: int, refs: int) -> int:
        """Add the next message; returns its seq."""
        seq = self.next_seq
        rid = self._record(loc, at)  # (first: it may renumber, replacing ``rec``)
        self.rec.append(rid)
        self.length.append(length)
        self.size.append(size)
        self.refs.append(refs)
        return seq

    def extend(
        self, locs: list[int], lengths: Sequence[int], sizes: list[int], at: int, refs: int
    ) -> None:
        """Add the next ``len(locs)`` messages, all published at ``at`` with ``refs`` (a
        publish command: one C-level extend per column instead of an append per message)."""
        n = len(locs)
        if locs[0] == locs[-1]:  # one record (a publish's messages share the open record)
            rids = array("I", [self._record(locs[0], at)]) * n
        else:
            rids = array("I", [self._record(loc, at) for loc in locs])
        self.rec.extend(rids)  # (after: ``_record`` may renumber, replacing ``rec``)
        self.length.extend(lengths)
        self.size.extend(sizes)
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
        out = self.rloc[self.rec[i] - self.rbase], self.length[i], self.size[i]
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
        for col in (self.rec, self.length, self.size, self.refs):
            del col[:h]
        self.first_seq += h
        self.head = 0
        # Records no message refers to any more: the ones below the least id still held.
        k = (min(self.rec) if self.rec else self.rbase + len(self.rloc)) - self.rbase
        if k > _COMPACT_AT and k * 2 > len(self.rloc):
            del self.rloc[:k], self.rat[:k]
            self.rbase += k

    def _renumber(self) -> None:
        """Ids restart from 0 (once in 2^32 records: a pass over every message)."""
        k = min(self.rec) - self.rbase if self.rec else len(self.rloc)
        del self.rloc[:k], self.rat[:k]
        base = self.rbase + k
        self.rec = array("I", [r - base for r in self.rec])
        self.rbase = 0

    def relocate(self, moved: dict[int, tuple[int, int]]) -> None:
        """Apply a segstore compaction's ``{seq: (new location, length)}``: the messages of
        one new record came from one old record, so they keep its publish time."""
        first, length = self.first_seq, self.length
        last, rid = -1, 0
        for seq, (new, n) in moved.items():
            i = seq - first
            if new != last:  # (``_record`` may renumber, replacing ``rec``)
                rid = self._record(new, self.rat[self.rec[i] - self.rbase])
                last = new
            self.rec[i] = rid
            length[i] = n

    def nbytes(self) -> int:
        """Bytes the columns hold (allocated, not only used)."""
        cols = (self.rec, self.length, self.size, self.refs, self.rloc, self.rat)
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
        none = _REC_LIMIT - 1  # (no record: never an id, restore makes far fewer)
        ix.rec = array("I", [none]) * n
        ix.length = array("I", [0]) * n
        ix.size = array("I", [0]) * n
        for segno, c in columns:
            ix._place(segno, c, oldest, next_seq)
        if none in ix.rec:  # only gone messages may lack a record: they get a dummy one
            dummy = len(ix.rloc)
            ix.rloc.append(GONE)
            ix.rat.append(0)
            i = ix.rec.index(none)
            while True:
                if ix.refs[i] != GONE:
                    raise StorageCorrupt(
                        f"messages {oldest}..{next_seq - 1}: {oldest + i} has no record"
                    )
                ix.rec[i] = dummy
                try:
                    i = ix.rec.index(none, i + 1)
                except ValueError:
                    break
        ix.trim()
        return ix

    def _place(self, segno: int, c: Columns, oldest: int, next_seq: int) -> None:
        if len(c.first) == len(c.length):  # a record per message (batches of one)
            self._place_singles(segno, c, oldest, next_seq)
            return
        base, j = segno << 32, 0
        rloc, rat = self.rloc, self.rat
        for first, n, off, at in zip(c.first, c.count, c.offset, c.at, strict=True):
            lo, hi = max(first, oldest), min(first + n, next_seq)
            if lo < hi:  # a record's messages have consecutive seqs: slices, C speed
                a, b, k = lo - oldest, hi - oldest, j + lo - first
                self.rec[a:b] = array("I", [len(rloc)]) * (b - a)
                rloc.append(base | off)
                rat.append(at)
                self.length[a:b] = c.length[k : k + b - a]
                self.size[a:b] = c.size[k : k + b - a]
            j += n

    def _place_singles(self, segno: int, c: Columns, oldest: int, next_seq: int) -> None:
        seqs, k = c.first, len(c.first)
        if not k:
            return
        base = segno << 32
        rloc, rat = self.rloc, self.rat
        if seqs[-1] - seqs[0] == k - 1 and seqs == array("q", range(seqs[0], seqs[0] + k)):
            # consecutive seqs (a segment no compaction wrote into): slices, C speed
            lo, hi = max(seqs[0], oldest), min(seqs[-1] + 1, next_seq)
            if lo >= hi:
                return
            a, b, j = lo - oldest, hi - oldest, lo - seqs[0]
            r = len(rloc)
            self.rec[a:b] = array("I", range(r, r + b - a))
            rloc.extend([base | o for o in c.offset[j : j + b - a]])
            rat.extend(c.at[j : j + b - a])
            self.length[a:b] = c.length[j : j + b - a]
            self.size[a:b] = c.size[j : j + b - a]
            return
        for i in range(k):
            s = seqs[i]
            if oldest <= s < next_seq:
                p = s - oldest
                self.rec[p] = len(rloc)
                rloc.append(base | c.offset[i])
                rat.append(c.at[i])
                self.length[p], self.size[p] = c.length[i], c.size[i]
