"""A topic's idempotency keys: producers' numbered keys in runs, the others as digests.

The clients make keys ``<producer id>-<epoch>-<n>`` (``Producer.key``), n counting up from 1
for each client instance, so a topic's keys mostly come as runs of consecutive n from a few
prefixes. ``TopicKeys`` keeps such a key (any key ``<prefix>-<n>``, n in canonical decimal:
ASCII digits, no leading zero, at most 18 of them, so the string and the pair map one to one)
as a slot in a ``Run`` of its prefix's ``Record``, with no digest to compute and no bucket
to fetch; a run holds seqs and expiries as stretches (consecutive seqs, one expiry), so a
producer's keys cost a few bytes a publish, 16 a key at most when its publishes interleave
with others' one key at a time. Keys of other shapes go to the
digest table (``dedup.DedupKeys``), as before. (With the digest table alone a keyed publish
spent ~1 us a key a node, a third of the cluster's busy CPU in a pipelined publish, and ~50 B
a key; PERF.md.)

Where a numbered key goes, and why a miss in a record is an answer:

- A prefix gets a record when one publish brings two or more of its keys; from then on every
  key of that prefix goes to it, until all of them have expired and the record is dropped.
- A key of a prefix without a record, alone in its publish, goes to the digests (a client
  that publishes one message and goes away costs no record), and ``high[slot]``, the highest
  n of such keys over the prefixes of one of ``SLOTS`` slots (by CRC-32 of the prefix), is
  raised to its n; unless that is n - 1 already: a producer publishing one message at a
  time, whose keys from the second on get a record. So do a record's keys that would make
  a short run out of line (``_put``: sparse numbers, as ``order-<id>``) or a run too many.
- So a key of a prefix with a record is either in its runs or, if its n is at most
  ``high[record.slot]``, maybe among the digests; a key above that, not in the runs, is new
  without a look at the digests: a producer's next keys. (A slot shared with other prefixes
  only makes its bound higher: more looks, never a wrong answer. A one-message client's key
  is n = 1.)
- A topic restored from a v8 snapshot has every key as a digest, of prefixes unknown: until
  the last of them expires (``legacy_until``) a miss in a record asks the digests too. (A
  v3-v7 snapshot has the keys themselves: their numbered ones raise ``high``.)

A run holds consecutive n (``n0`` on) whose expiries never decrease, so expiring cuts its
front (``start``) at an expiry stretch; runs of a prefix are in n order and never overlap,
expired fronts included; a key out of order (a retry of an older publish that never
applied) or a shorter window starts another run. Runs are found through a heap of (front
expiry, serial, run), one entry per run. Deterministic: what is kept where depends only on
the commands applied; a snapshot (``dump``) lists records by prefix, runs by n.
"""

from __future__ import annotations

import heapq
import sys
import zlib
from array import array
from bisect import bisect_right, insort
from collections.abc import Mapping
from itertools import chain, compress, islice, repeat
from operator import add, gt, ne, sub
from typing import Any

from raftq.cluster.dedup import DedupKeys, key_digest

# A token of a numbered key: (prefix, n), or (prefix, n, digest) when ``lookup`` asked the
# digests (so ``add`` need not hash it again).
Token = tuple[Any, ...]

MAX_DIGITS = 18  # (n < 10**18 < 2**63)
SLOTS = 1024  # of ``high``: 8 KB a topic while one of its numbered keys is a digest
MIN_RUN = 8  # consecutive n that start a run of their own (a record's first run: any)
MAX_RUNS = 64  # runs a record holds at most of shorter stretches than LONG_RUN
LONG_RUN = 64  # consecutive n that always get a run (a client publishing batches round robin
# over topics: each topic's keys are its batches, with the other topics' between them)
DENSE_FROM = 64  # a run with more stretches than this + half its keys turns dense


def numbered(key: str) -> tuple[str, int] | None:
    """(prefix, n) of a key ``<prefix>-<n>`` with n in canonical decimal, else None."""
    prefix, dash, tail = key.rpartition("-")
    if (
        not dash
        or not tail
        or len(tail) > MAX_DIGITS
        or tail[0] == "0"
        or not tail.isascii()
        or not tail.isdigit()
    ):
        return None
    return prefix, int(tail)


def slot(prefix: str) -> int:
    """The prefix's slot of ``high`` (CRC-32: the same on every replica)."""
    return zlib.crc32(prefix.encode()) & (SLOTS - 1)


class Run:
    """Keys ``n0 + start`` .. ``n0 + cnt - 1`` of one prefix: their seqs and expiries as
    *stretches*, so a producer's keys cost a few bytes a publish, not 16 a key. Key ``n0 + i``
    has seq ``svals[k] + i - sidx[k]``, k the last stretch with ``sidx[k] <= i`` (a stretch:
    consecutive seqs), and expiry ``evals[k]``, k the last with ``eidx[k] <= i`` (expiries
    never decrease, so ``evals`` goes up). A stretch starts only where the previous one does
    not continue (maximal: the same keys make the same arrays on every replica). A run whose
    keys hardly make stretches (producers publishing one key at a time, interleaved, each in
    an entry of its own) turns into a ``DenseRun``, and back once its keys stretch again."""

    __slots__ = ("cnt", "eidx", "evals", "lexp", "n0", "nseq", "sidx", "start", "svals")

    def __init__(self, n0: int) -> None:
        self.n0 = n0
        self.cnt = 0  # keys, the expired front (before ``start``) included
        self.start = 0
        self.sidx = array("q")
        self.svals = array("q")
        self.eidx = array("q")
        self.evals = array("q")
        self.nseq = -1  # the seq that continues the last stretch (seqs are >= 1)
        self.lexp = -1  # the last key's expiry

    def end(self) -> int:
        """The n after its last."""
        return self.n0 + self.cnt

    def live(self) -> int:
        return self.cnt - self.start

    def append(self, seq: int, exp: int) -> None:
        """The next key's seq and expiry (``exp`` at least ``lexp``)."""
        i = self.cnt
        self.cnt = i + 1
        grew = False
        if seq != self.nseq:
            self.sidx.append(i)
            self.svals.append(seq)
            grew = True
        self.nseq = seq + 1
        if exp != self.lexp:
            self.eidx.append(i)
            self.evals.append(exp)
            self.lexp = exp
            grew = True
        if grew and len(self.sidx) + len(self.eidx) > DENSE_FROM + (i >> 1):
            self._densify()

    def extend(self, seqs: list[int], exp: int) -> None:
        """The next keys' seqs, one expiry (at least ``lexp``)."""
        s0, m = seqs[0], len(seqs)
        if seqs == list(range(s0, s0 + m)):  # (a publish's keys: consecutive seqs, the usual)
            self.extend_range(s0, m, exp)
            return
        i = self.cnt
        self.cnt = i + m
        nseq = self.nseq
        for j, seq in enumerate(seqs, i):
            if seq != nseq:
                self.sidx.append(j)
                self.svals.append(seq)
            nseq = seq + 1
        self.nseq = nseq
        self._expiry(i, exp)

    def extend_range(self, s0: int, m: int, exp: int) -> None:
        """The next ``m`` keys: seqs ``s0``, ``s0 + 1``, ..., one expiry (at least ``lexp``)."""
        i = self.cnt
        self.cnt = i + m
        if s0 != self.nseq:
            self.sidx.append(i)
            self.svals.append(s0)
        self.nseq = s0 + m
        self._expiry(i, exp)

    def _expiry(self, i: int, exp: int) -> None:
        """Keys from ``i`` on expire at ``exp``; dense when stretches outnumber the keys."""
        if exp != self.lexp:
            self.eidx.append(i)
            self.evals.append(exp)
            self.lexp = exp
        if len(self.sidx) + len(self.eidx) > DENSE_FROM + (i >> 1):
            self._densify()

    def seq(self, i: int) -> int:
        """Key ``n0 + i``'s seq."""
        sidx = self.sidx
        k = len(sidx) - 1 if i >= sidx[-1] else bisect_right(sidx, i) - 1
        return self.svals[k] + i - sidx[k]

    def front_expiry(self) -> int:
        return self.evals[bisect_right(self.eidx, self.start) - 1]

    def expire_front(self, now: int) -> int:
        """Cut the keys due at ``now`` off its front; returns how many."""
        evals = self.evals
        k = bisect_right(evals, now)  # (the first stretch due later)
        cut = self.eidx[k] if k < len(evals) else self.cnt
        gone = cut - self.start
        self.start = cut
        if cut < self.cnt:
            sidx = self.sidx
            if (k > 16 and 2 * k > len(evals)) or (
                len(sidx) > 32 and 2 * bisect_right(sidx, cut) > len(sidx)
            ):  # (most of its stretches are dead)
                self.drop_front()
        return gone

    def values(self, step: int, s: int = 0) -> array[int]:
        """Keys ``n0 + s`` on: their seqs (``step`` 1) or expiries (0), an item each."""
        idx, vals = (self.sidx, self.svals) if step else (self.eidx, self.evals)
        k = bisect_right(idx, s) - 1
        bounds = [s, *idx[k + 1 :], self.cnt]
        counts = map(sub, bounds[1:], bounds)
        bases = list(map(sub, vals[k:], idx[k:])) if step else vals[k:]
        col = list(chain.from_iterable(map(repeat, bases, counts)))  # (C-level loops)
        return array("q", map(add, col, range(s, self.cnt)) if step else col)

    def dumped(self, step: int) -> list[int] | bytes:
        """The live keys' seqs (``step`` 1) or expiries (0) as a snapshot holds them:
        ``[first, count, ...]`` when there are at most 1/64 as many stretches as keys, else
        the values' little-endian int64 bytes (what ``_stretches`` makes of the same values:
        the format did not change when runs stopped holding arrays)."""
        idx, vals = (self.sidx, self.svals) if step else (self.eidx, self.evals)
        s, cnt = self.start, self.cnt
        k = bisect_right(idx, s) - 1
        if len(idx) - k > max(1, (cnt - s) // 64):
            return _le_bytes(self.values(step, s))
        if step:  # (seqs that go back along n: what _stretches makes of them, bytes or not)
            levels = list(map(sub, vals[k:], idx[k:]))
            if any(map(gt, levels, islice(levels, 1, None))):
                return _stretches(self.values(1, s), 0, 1)
        bounds = [s, *idx[k + 1 :], cnt]
        counts = map(sub, bounds[1:], bounds)
        firsts = [vals[k] + step * (s - idx[k]), *vals[k + 1 :]]
        return [x for pair in zip(firsts, counts, strict=True) for x in pair]

    def drop_front(self) -> None:
        """Forget the expired front (its n, too: a key there may come again, in a run of its
        own before this one)."""
        s = self.start
        if not s:
            return
        sidx, eidx = self.sidx, self.eidx
        if s >= self.cnt:  # (nothing live: no stretches; lexp stays, expiries never go back)
            for name in ("sidx", "svals", "eidx", "evals"):
                setattr(self, name, array("q"))
            self.nseq = -1
        else:
            k = bisect_right(sidx, s) - 1
            first = self.svals[k] + s - sidx[k]
            self.sidx = array("q", [0, *(i - s for i in sidx[k + 1 :])])
            self.svals = array("q", [first]) + self.svals[k + 1 :]
            k = bisect_right(eidx, s) - 1
            self.eidx = array("q", [0, *(i - s for i in eidx[k + 1 :])])
            self.evals = self.evals[k:]
        self.n0 += s
        self.cnt -= s
        self.start = 0

    def _densify(self) -> None:
        seqs, exps = self.values(1), self.values(0)
        self.__class__ = DenseRun
        self.svals, self.evals = seqs, exps
        self.sidx, self.eidx = array("q"), array("q")


class DenseRun(Run):
    """A ``Run`` whose keys hardly stretch: ``svals`` and ``evals`` hold every key's seq and
    expiry (16 B a key), ``sidx`` and ``eidx`` stay empty. It turns back into a ``Run`` when,
    its expired front dropped, its keys make at most an eighth as many stretches."""

    __slots__ = ()

    def append(self, seq: int, exp: int) -> None:
        self.svals.append(seq)
        self.evals.append(exp)
        self.cnt += 1
        self.nseq, self.lexp = seq + 1, exp

    def extend(self, seqs: list[int], exp: int) -> None:
        self.svals.extend(seqs)
        self.evals.extend(array("q", [exp]) * len(seqs))
        self.cnt += len(seqs)
        self.nseq, self.lexp = seqs[-1] + 1, exp

    def extend_range(self, s0: int, m: int, exp: int) -> None:
        self.extend(list(range(s0, s0 + m)), exp)

    def seq(self, i: int) -> int:
        return self.svals[i]

    def front_expiry(self) -> int:
        return self.evals[self.start]

    def expire_front(self, now: int) -> int:
        cut = bisect_right(self.evals, now, lo=self.start)
        gone = cut - self.start
        self.start = cut
        if 64 < cut < self.cnt and 2 * cut > self.cnt:  # (the dead front is most of it)
            self.drop_front()
        return gone

    def values(self, step: int, s: int = 0) -> array[int]:
        return (self.svals if step else self.evals)[s:]

    def dumped(self, step: int) -> list[int] | bytes:
        return _stretches(self.svals if step else self.evals, self.start, step)

    def drop_front(self) -> None:
        s = self.start
        if not s:
            return
        self.svals, self.evals = self.svals[s:], self.evals[s:]
        self.n0 += s
        self.cnt -= s
        self.start = 0
        if not self.cnt:
            return
        sb, eb = _breaks(self.svals, 1), _breaks(self.evals, 0)
        if 8 * (len(sb) + len(eb) + 2) <= self.cnt:  # (its keys stretch again)
            seqs, exps = self.svals, self.evals
            self.__class__ = Run  # type: ignore[assignment]  # (same slots)
            self.sidx = array("q", [0, *sb])
            self.svals = array("q", map(seqs.__getitem__, self.sidx))
            self.eidx = array("q", [0, *eb])
            self.evals = array("q", map(exps.__getitem__, self.eidx))


def _n0(run: Run) -> int:
    return run.n0


def _le_bytes(a: array[int]) -> bytes:
    if sys.byteorder != "little":
        a = array("q", a)
        a.byteswap()
    return a.tobytes()


def _breaks(a: array[int], step: int) -> list[int]:
    """The indexes i >= 1 where ``a[i]`` does not continue ``a[i - 1]`` (by ``step``): where
    stretches start (C-level loops)."""
    d = list(map(sub, a, range(len(a)))) if step else a
    return list(compress(range(1, len(a)), map(ne, islice(d, 1, None), d)))


def _stretches(a: array[int], lo: int, step: int) -> list[int] | bytes:
    """``a[lo:]`` as ``[first, count, ...]``: stretches whose values go up by ``step`` (1:
    seqs) or stay (0: expiries, never decreasing), when there are at most 1/64 as many as
    values; else its little-endian bytes. Found by bisection (``a[i] - step * i`` never
    decreases where the stretches hold) and checked against ``a``, so any array is right."""
    hi = len(a)
    out: list[int] = []
    limit = max(1, (hi - lo) // 64)  # (a bisection ~2-4 us: a stretch must pay for itself)
    index = range(hi)

    def level(i: int) -> int:
        return a[i] - step * i

    k = lo
    while k < hi and len(out) < 2 * limit:
        e = bisect_right(index, level(k), lo=k, hi=hi, key=level)
        out += (a[k], e - k)
        k = e
    if k == hi and _expand(out, step) == a[lo:]:
        return out
    return _le_bytes(a[lo:])


def _expand(x: Any, step: int) -> array[int]:
    """``_stretches`` back into an array (ValueError on a malformed one)."""
    out = array("q")
    if isinstance(x, bytes):
        out.frombytes(x)
        if sys.byteorder != "little":
            out.byteswap()
        return out
    if len(x) % 2:
        raise ValueError("dedup records: stretches come in pairs")
    for j in range(0, len(x), 2):
        first, count = x[j], x[j + 1]
        if type(count) is not int or count < 1:
            raise ValueError("dedup records: a stretch without values")
        if step:
            out.extend(range(first, first + count))
        else:
            out.extend(array("q", [first]) * count)
    return out


class Record:
    """One prefix's runs, in n order."""

    __slots__ = ("runs", "slot")

    def __init__(self, prefix: str) -> None:
        self.runs: list[Run] = []
        self.slot = slot(prefix)

    def find(self, n: int) -> int | None:
        runs = self.runs
        r = runs[-1]
        if n < r.n0:
            i = bisect_right(runs, n, key=_n0) - 1
            if i < 0:
                return None
            r = runs[i]
        j = n - r.n0
        if r.start <= j < r.cnt:
            return r.seq(j)
        return None


class TopicKeys:
    """Idempotency key -> the seq it published, within the topic's window."""

    __slots__ = ("digests", "high", "legacy_until", "nruns", "records", "runq", "serial")

    def __init__(self, digests: DedupKeys | None = None) -> None:
        self.digests = DedupKeys() if digests is None else digests
        self.high: array[int] | None = None  # see the module docstring
        # (v3-v8: the digests may hold numbered keys of any prefix until then)
        self.legacy_until = max((r[0] for r in self.digests.heap), default=0)
        self.records: dict[str, Record] = {}
        self.nruns = 0  # live keys in runs
        self.runq: list[tuple[int, int, Run, str]] = []  # (front expiry, serial, run, prefix)
        self.serial = 0

    def __len__(self) -> int:
        return len(self.digests) + self.nruns

    def pieces(self) -> int:
        """Expiry rows and runs: what a snapshot costs besides the keys (~3 us each)."""
        return len(self.digests.heap) + len(self.runq)

    def lookup(self, key: str) -> tuple[Any, int | None]:
        """A token for ``add`` and the seq ``key`` published, or None."""
        prefix, dash, tail = key.rpartition("-")  # ``numbered``, inline: the call cost
        # ~45 ns a key of ~670 (measured 252 against 298 ns for the parse alone)
        if (
            not dash
            or not tail
            or len(tail) > MAX_DIGITS
            or tail[0] == "0"
            or not tail.isascii()
            or not tail.isdigit()
        ):
            return self.digests.lookup(key)
        n = int(tail)
        rec = self.records.get(prefix)
        if rec is not None:
            r = rec.runs[-1]
            if n < r.n0 + r.cnt:  # (else past its last run: a producer's next key, the usual)
                seq = rec.find(n)
                if seq is not None:
                    return (prefix, n), seq
            high = self.high
            if not self.legacy_until and (high is None or n > high[rec.slot]):
                return (prefix, n), None
        d, seq = self.digests.lookup(key)
        return (prefix, n, d), seq

    def next_keys(self, msgs: list[Any]) -> tuple[str, int, int]:
        """How many of a publish's first messages carry a producer's next keys: ``(prefix, n,
        count)`` when their keys are ``prefix-n``, ``prefix-(n+1)``, ... past the last run of
        ``prefix`` and what ``lookup`` would look for (count 0 when not even the first's is).
        ``lookup`` gives each of them the token ``(prefix, n + i)`` and no seq; this finds
        that out with C-level list work: the keys a client's batch should have, compared with
        the ones it has (~0.1 of ``lookup``'s cost a key)."""
        try:
            keys = list(map(dict.get, msgs, repeat("key")))
        except TypeError:  # (a message that is not a dict: each its own lookup)
            return "", 0, 0
        key = keys[0]
        if type(key) is not str:
            return "", 0, 0
        try:
            tok, seq = self.lookup(key)
        except UnicodeEncodeError:  # (a key msgpack would not have decoded: the publish's
            return "", 0, 0  # own checks come first, then its lookup fails as it did)
        if seq is not None or len(tok) != 2:
            return "", 0, 0
        prefix, n = tok
        r = self.records[prefix].runs[-1]  # (a token of two: the prefix has a record)
        if n < r.n0 + r.cnt or len(str(n + len(keys))) > MAX_DIGITS:
            return "", 0, 0  # (in the runs' span a later n may be held: each its lookup)
        # Every later n is past the last run and above the high mark too: none is held.
        want = list(map((prefix + "-").__add__, map(str, range(n, n + len(keys)))))
        if keys == want:
            return prefix, n, len(keys)
        return prefix, n, next(compress(range(len(keys)), map(ne, keys, want)))

    def add(self, expires_at: int, keyed: Mapping[Any, int]) -> None:
        """The new keys of one publish command: tokens from ``lookup`` (none held yet, none
        twice) -> their seqs, in seq order."""
        if len(keyed) == 1:  # (one key a publish: plain publishes; no grouping)
            for tok, seq in keyed.items():
                if type(tok) is bytes:
                    self.digests.add(expires_at, keyed)
                    return
                prefix, n = tok[0], tok[1]
                rec = self.records.get(prefix)
                if rec is not None:  # (what _put does with the usual one: the next key)
                    last = rec.runs[-1]
                    if last.n0 + last.cnt == n and last.lexp <= expires_at:
                        last.append(seq, expires_at)
                        self.nruns += 1
                        return
                if rec is None and not self._alone(prefix, n, tok, seq, expires_at):
                    rec = self.records[prefix] = Record(prefix)
                if rec is not None and self._put(prefix, rec, [(n, seq)], expires_at):
                    digs1: list[tuple[int, bytes]] = []
                    self._to_digests(prefix, [(n, seq)], digs1)
                    self.digests.add(expires_at, {digs1[0][1]: seq})
            return
        by_prefix: dict[str, list[tuple[int, int]]] = {}
        digs: dict[bytes, int] = {}
        alone: dict[str, tuple[bytes, int]] = {}  # a prefix's one key so far -> its digest
        records = self.records
        for tok, seq in keyed.items():
            if type(tok) is bytes:
                digs[tok] = seq
                continue
            prefix, n = tok[0], tok[1]
            items = by_prefix.get(prefix)
            if items is None:
                by_prefix[prefix] = [(n, seq)]
                if prefix not in records:  # a digest, unless another key of it follows
                    d = tok[2] if len(tok) == 3 else key_digest(f"{prefix}-{n}")
                    digs[d] = seq
                    alone[prefix] = (d, n)
            else:
                if prefix in alone:  # two: a record's, not digests
                    del digs[alone.pop(prefix)[0]]
                items.append((n, seq))
        for prefix, (_, n) in alone.items():
            high = self.high
            if high is None:
                high = self.high = array("q", bytes(8 * SLOTS))
            s = slot(prefix)
            if n > high[s]:
                high[s] = n
        later: list[tuple[int, bytes]] = []  # (seq, digest) of keys _put left
        for prefix, items in by_prefix.items():
            if prefix in alone:
                continue
            rec = records.get(prefix)
            if rec is None:
                rec = records[prefix] = Record(prefix)
            left = self._put(prefix, rec, items, expires_at)
            if left:
                self._to_digests(prefix, left, later)
        if later:  # (the digest table takes a publish's keys in seq order)
            later += [(seq, d) for d, seq in digs.items()]
            later.sort()
            digs = {d: seq for seq, d in later}
        if digs:
            self.digests.add(expires_at, digs)  # (in seq order)

    def add_next(self, expires_at: int, prefix: str, n: int, seq: int, count: int) -> None:
        """The keys ``next_keys`` found: ``prefix-n`` ... ``prefix-(n+count-1)``, new, with
        seqs ``seq`` ... ``seq+count-1`` (what ``add`` does with their tokens, without a
        tuple a key: the usual one continues the prefix's last run)."""
        rec = self.records[prefix]
        last = rec.runs[-1]
        if last.n0 + last.cnt == n and last.lexp <= expires_at:
            last.extend_range(seq, count, expires_at)
            self.nruns += count
            return
        left = self._put(prefix, rec, [(n + i, seq + i) for i in range(count)], expires_at)
        if left:
            later: list[tuple[int, bytes]] = []
            self._to_digests(prefix, left, later)
            self.digests.add(expires_at, {d: s for s, d in sorted(later)})

    def _alone(self, prefix: str, n: int, tok: Token, seq: int, exp: int) -> bool:
        """A publish's only key, of a prefix without a record: a digest (True), unless the
        prefix's slot says its key n - 1 came the same way (False: a producer publishing one
        message at a time, which deserves a record from its second key on)."""
        high = self.high
        if high is None:
            high = self.high = array("q", bytes(8 * SLOTS))
        s = slot(prefix)
        if n > 1 and high[s] == n - 1:
            return False
        if n > high[s]:
            high[s] = n
        self.digests.add(exp, {tok[2] if len(tok) == 3 else key_digest(f"{prefix}-{n}"): seq})
        return True

    def _put(
        self, prefix: str, rec: Record, items: list[tuple[int, int]], exp: int
    ) -> list[tuple[int, int]]:
        """Keys of ``prefix`` (n, seq) into its record's runs; returns those left for the
        digests: a stretch of fewer than ``MIN_RUN`` consecutive n that does not continue
        the last run, or of fewer than ``LONG_RUN`` once the record holds ``MAX_RUNS`` runs
        (sparse numbers, as ``order-<id>``, would otherwise cost a run, ~500 B, a key; a
        long stretch costs a few bytes a key in a run of its own)."""
        if len(items) > 1:
            items.sort()
        runs = rec.runs
        left: list[tuple[int, int]] = []
        i, m = 0, len(items)
        while i < m:
            if items[-1][0] - items[i][0] == m - 1 - i:  # (the rest consecutive: the usual)
                j = m
            else:
                j = i + 1
                while j < m and items[j][0] == items[j - 1][0] + 1:
                    j += 1
            n0 = items[i][0]
            last = runs[-1] if runs else None
            if last is not None and last.end() == n0 and last.lexp <= exp:
                run = last
            elif runs and (j - i < MIN_RUN or (j - i < LONG_RUN and len(runs) >= MAX_RUNS)):
                left += items[i:j]
                i = j
                continue
            else:
                run = Run(n0)
                if last is None or n0 >= last.end():
                    runs.append(run)
                else:  # (out of order: a retry of an older publish that did not apply)
                    # Keys here are new, so a run they overlap overlaps with its expired
                    # front only (the one before them, or the one after).
                    k = bisect_right(runs, n0, key=_n0)
                    for r in runs[max(k - 1, 0) : k + 1]:
                        if r.n0 < n0 + j - i and n0 < r.end():
                            r.drop_front()
                    insort(runs, run, key=_n0)
                self.serial += 1
                heapq.heappush(self.runq, (exp, self.serial, run, prefix))
            if j - i == 1:
                run.append(items[i][1], exp)
            else:
                run.extend([s for _, s in items[i:j]], exp)
            self.nruns += j - i
            i = j
        return left

    def _to_digests(
        self, prefix: str, left: list[tuple[int, int]], digs: list[tuple[int, bytes]]
    ) -> None:
        """Numbered keys of ``prefix`` for the digest table: their digests onto ``digs``
        (seq, digest), its slot of ``high`` raised past them."""
        high = self.high
        if high is None:
            high = self.high = array("q", bytes(8 * SLOTS))
        s = slot(prefix)
        for n, seq in left:
            digs.append((seq, key_digest(f"{prefix}-{n}")))
            if n > high[s]:
                high[s] = n

    def next_expiry(self) -> int | None:
        due = [self.runq[0][0]] if self.runq else []
        d = self.digests.next_expiry()
        if d is not None:
            due.append(d)
        if self.legacy_until:
            due.append(self.legacy_until)
        return min(due) if due else None

    def expire(self, now: int) -> int:
        """Drop the keys due at ``now``; returns how many."""
        gone = self.digests.expire(now)
        if self.high is not None and not len(self.digests):
            self.high = None  # (no numbered key among the digests: no bound needed)
        q = self.runq
        while q and q[0][0] <= now:
            _, _, run, prefix = heapq.heappop(q)
            cut = run.expire_front(now)
            gone += cut
            self.nruns -= cut
            if run.start < run.cnt:
                self.serial += 1
                heapq.heappush(q, (run.front_expiry(), self.serial, run, prefix))
                continue
            rec = self.records[prefix]
            rec.runs.remove(run)
            if not rec.runs:
                del self.records[prefix]
        if self.legacy_until and now >= self.legacy_until:
            self.legacy_until = 0
        return gone

    # ------------------------------------------------------------ snapshot

    def dump(self) -> list[Any]:
        """``[digest rows, high, legacy_until, records]`` (snapshot v9): ``DedupKeys.dump``
        rows; ``[[slot, n], ...]`` of the slots above 0; then per prefix in order
        ``[prefix, runs]``, a run ``[first n, seqs, expiries]`` of its live keys, each a
        flat list of stretches (``[first seq, count, ...]``: consecutive seqs;
        ``[expiry, count, ...]``: one expiry) when they are few, else little-endian int64
        bytes: a producer's keys cost a few bytes a publish, not 16 a key."""
        high = [] if self.high is None else [[s, n] for s, n in enumerate(self.high) if n]
        recs = []
        for prefix in sorted(self.records):
            runs = []
            for r in self.records[prefix].runs:
                runs.append([r.n0 + r.start, r.dumped(1), r.dumped(0)])
            recs.append([prefix, runs])
        return [self.digests.dump(), high, self.legacy_until, recs]

    @classmethod
    def restore(cls, dumped: Any) -> TopicKeys:
        """From ``dump()`` (v9). ValueError on a malformed one."""
        rows, high, legacy_until, recs = dumped
        k = cls(DedupKeys.restore(rows))
        k.legacy_until = int(legacy_until)
        if high:
            k.high = array("q", bytes(8 * SLOTS))
            for s, n in high:
                k.high[s] = n  # (IndexError, OverflowError: a bad slot or n)
        last = None
        for prefix, runs in recs:
            if not isinstance(prefix, str) or (last is not None and prefix <= last):
                raise ValueError("dedup records: prefixes out of order")
            last = prefix
            if not runs:
                raise ValueError("dedup records: a record without keys")
            rec = k.records[prefix] = Record(prefix)
            for n0, seqs, exps in runs:
                run = _run_of(int(n0), seqs, exps)
                if rec.runs and run.n0 < rec.runs[-1].end():
                    raise ValueError("dedup records: runs overlap")
                rec.runs.append(run)
                k.nruns += run.cnt
                k.serial += 1
                k.runq.append((run.evals[0], k.serial, run, prefix))
        heapq.heapify(k.runq)
        return k

    @classmethod
    def from_keys(cls, rows: Any) -> TopicKeys:
        """From the rows ``(expires_at, keys, seqs)`` of a v3-v7 snapshot (the upgrade):
        every key a digest, its numbered ones counted in ``high`` as if each came alone."""
        rows = [(exp, list(keys), seqs) for exp, keys, seqs in rows]
        k = cls(DedupKeys.from_keys(rows))
        k.legacy_until = 0
        for _, keys, _ in rows:
            for key in keys:
                p = numbered(key)
                if p is not None:
                    if k.high is None:
                        k.high = array("q", bytes(8 * SLOTS))
                    s = slot(p[0])
                    if p[1] > k.high[s]:
                        k.high[s] = p[1]
        return k

    def nbytes(self) -> int:
        """Bytes held, about (``sys.getsizeof`` of the structures)."""
        runs = sum(
            sum(map(sys.getsizeof, (r.sidx, r.svals, r.eidx, r.evals))) + 120
            for rec in self.records.values()
            for r in rec.runs
        )
        recs = sum(sys.getsizeof(p) + 120 for p in self.records)
        high = 0 if self.high is None else sys.getsizeof(self.high)
        return self.digests.nbytes() + runs + recs + high + sys.getsizeof(self.runq) * 2


def _run_of(n0: int, seqs: Any, exps: Any) -> Run:
    """A run from a snapshot's ``[first n, seqs, expiries]`` (stretches or bytes); ValueError
    on a malformed one (counts that differ, expiries that go back)."""
    run = Run(n0)
    if isinstance(seqs, bytes) or isinstance(exps, bytes):  # (keys that hardly stretch)
        vals, ends = _expand(seqs, 1), _expand(exps, 0)
        if not vals or len(vals) != len(ends):
            raise ValueError("dedup records: a run's seqs and expiries differ")
        if any(map(gt, ends, islice(ends, 1, None))):
            raise ValueError("dedup records: a run's expiries go back")
        if min(vals) < 0 or ends[0] < 0:
            raise ValueError("dedup records: a negative seq or expiry")
        run.__class__ = DenseRun
        run.svals, run.evals = vals, ends
        run.cnt, run.nseq, run.lexp = len(vals), vals[-1] + 1, ends[-1]
        return run
    sc, ec = _counted(seqs), _counted(exps)
    if not sc or sc != ec:
        raise ValueError("dedup records: a run's seqs and expiries differ")
    for j in range(0, len(seqs), 2):
        first, count = seqs[j], seqs[j + 1]
        if first < 0:  # (-1 stands for "none yet")
            raise ValueError("dedup records: a negative seq")
        if first != run.nseq:
            run.sidx.append(run.cnt)
            run.svals.append(first)
        run.nseq = first + count
        run.cnt += count
    i = 0
    for j in range(0, len(exps), 2):
        exp, count = exps[j], exps[j + 1]
        if exp < max(run.lexp, 0):
            raise ValueError("dedup records: a run's expiries go back, or below 0")
        if exp != run.lexp:
            run.eidx.append(i)
            run.evals.append(exp)
            run.lexp = exp
        i += count
    return run


def _counted(x: Any) -> int:
    """The values of a list of stretches (ValueError on a malformed one)."""
    if not isinstance(x, list | tuple) or len(x) % 2:
        raise ValueError("dedup records: stretches come in pairs")
    total = 0
    for j in range(1, len(x), 2):
        count = x[j]
        if type(count) is not int or count < 1 or type(x[j - 1]) is not int:
            raise ValueError("dedup records: a stretch without values")
        total += count
    return total
