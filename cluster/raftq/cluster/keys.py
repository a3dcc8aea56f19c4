"""A topic's idempotency keys: producers' numbered keys in runs, the others as digests.

The clients make keys ``<producer id>-<epoch>-<n>`` (``Producer.key``), n counting up from 1
for each client instance, so a topic's keys mostly come as runs of consecutive n from a few
prefixes. ``TopicKeys`` keeps such a key (any key ``<prefix>-<n>``, n in canonical decimal:
ASCII digits, no leading zero, at most 18 of them, so the string and the pair map one to one)
as a slot in a ``Run`` of its prefix's ``Record``: its seq and its expiry, two array items,
16 bytes, with no digest to compute and no bucket to fetch. Keys of other shapes go to the
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

A run holds consecutive n (``n0`` on) whose expiries never decrease, so expiring one cuts
its front (``start``); runs of a prefix are in n order and never overlap, expired fronts
included; a key out of order (a retry of an older publish that never applied) or a shorter
window starts another run. Runs are found through a heap of (front expiry, serial, run), one
entry per run. Deterministic: what is kept where depends only on the commands applied; a
snapshot (``dump``) lists records by prefix, runs by n.
"""

from __future__ import annotations

import heapq
import sys
import zlib
from array import array
from bisect import bisect_right, insort
from collections.abc import Mapping
from typing import Any

from raftq.cluster.dedup import DedupKeys, key_digest

# A token of a numbered key: (prefix, n), or (prefix, n, digest) when ``lookup`` asked the
# digests (so ``add`` need not hash it again).
Token = tuple[Any, ...]

MAX_DIGITS = 18  # (n < 10**18 < 2**63)
SLOTS = 1024  # of ``high``: 8 KB a topic while one of its numbered keys is a digest
MIN_RUN = 8  # consecutive n that start a run of their own (a record's first run: any)
MAX_RUNS = 64  # runs a record holds at most; keys past that are digests


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
    """Keys ``n0 + start`` .. ``n0 + len(seqs) - 1`` of one prefix: their seqs and expiries
    (non-decreasing)."""

    __slots__ = ("exps", "n0", "seqs", "start")

    def __init__(self, n0: int) -> None:
        self.n0 = n0
        self.start = 0
        self.seqs = array("q")
        self.exps = array("q")

    def end(self) -> int:
        """The n after its last."""
        return self.n0 + len(self.seqs)

    def live(self) -> int:
        return len(self.seqs) - self.start


def _n0(run: Run) -> int:
    return run.n0


def _drop_front(run: Run) -> None:
    """Forget a run's expired front (its n, too: a key there may come again, in a run of
    its own before this one)."""
    run.n0 += run.start
    run.seqs, run.exps, run.start = run.seqs[run.start :], run.exps[run.start :], 0


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
    raw = a[lo:]
    if sys.byteorder != "little":
        raw.byteswap()
    return raw.tobytes()


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
        if r.start <= j < len(r.seqs):
            return r.seqs[j]
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
            seq = rec.find(n)
            if seq is not None:
                return (prefix, n), seq
            high = self.high
            if not self.legacy_until and (high is None or n > high[rec.slot]):
                return (prefix, n), None
        d, seq = self.digests.lookup(key)
        return (prefix, n, d), seq

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
        the last run, or any once the record holds ``MAX_RUNS`` runs (sparse numbers, as
        ``order-<id>``, would otherwise cost a run, ~500 B, a key)."""
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
            if last is not None and last.end() == n0 and last.exps[-1] <= exp:
                run = last
            elif runs and (j - i < MIN_RUN or len(runs) >= MAX_RUNS):
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
                            _drop_front(r)
                    insort(runs, run, key=_n0)
                self.serial += 1
                heapq.heappush(self.runq, (exp, self.serial, run, prefix))
            if j - i == 1:
                run.seqs.append(items[i][1])
                run.exps.append(exp)
            else:
                run.seqs.extend([s for _, s in items[i:j]])
                run.exps.extend(array("q", [exp]) * (j - i))
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
            cut = bisect_right(run.exps, now, lo=run.start)
            gone += cut - run.start
            self.nruns -= cut - run.start
            run.start = cut
            if cut < len(run.seqs):
                if cut > 64 and 2 * cut > len(run.seqs):  # (the dead front is most of it)
                    _drop_front(run)
                self.serial += 1
                heapq.heappush(q, (run.exps[run.start], self.serial, run, prefix))
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
                runs.append(
                    [r.n0 + r.start, _stretches(r.seqs, r.start, 1), _stretches(r.exps, r.start, 0)]
                )
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
                run = Run(int(n0))
                run.seqs = _expand(seqs, 1)
                run.exps = _expand(exps, 0)
                if not run.seqs or len(run.seqs) != len(run.exps):
                    raise ValueError("dedup records: a run's seqs and expiries differ")
                if rec.runs and run.n0 < rec.runs[-1].end():
                    raise ValueError("dedup records: runs overlap")
                rec.runs.append(run)
                k.nruns += len(run.seqs)
                k.serial += 1
                k.runq.append((run.exps[0], k.serial, run, prefix))
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
            sys.getsizeof(r.seqs) + sys.getsizeof(r.exps) + 80
            for rec in self.records.values()
            for r in rec.runs
        )
        recs = sum(sys.getsizeof(p) + 120 for p in self.records)
        high = 0 if self.high is None else sys.getsizeof(self.high)
        return self.digests.nbytes() + runs + recs + high + sys.getsizeof(self.runq) * 2
