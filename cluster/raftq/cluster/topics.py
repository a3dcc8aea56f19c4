"""A topic and its consumer groups: the records the Broker (``state.py``) keeps per topic,
and the bookkeeping of ordered groups. Deterministic like the Broker: no clock, randomness or
file; nothing here touches the store.

Per group, a message is in exactly one state:

- *fresh*: ``seq >= cursor``, not in ``skip``, and (below the group's ``pin``) still retained
  (pending, never delivered; ``fresh`` counts them);
- *held*: in ``held`` (``seq -> attempts so far``), and then exactly one of in flight
  (``inflight``), delayed (``delayed``) or ready for redelivery (queued in ``ready``; in an
  ordered group a keyed one is queued only once it is first of its key: see ``kq`` and the
  "ordered groups" section). The time of its first delivery (``first_received_at``) is in
  its inflight entry while in flight, else in ``first`` (a failed one waiting to go again);
- *settled*: everything else (acked, dead-lettered, dropped, or not addressed to this group).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from typing import Any

from raftq.cluster.keys import TopicKeys
from raftq.cluster.msgindex import MsgIndex

# At most this many fresh messages an ordered group's receive sets aside because their key is
# held (see ``take_ordered``): bounds the work of one receive behind a hot key.
MAX_BLOCKED_PER_RECEIVE = 10_000


class Group:
    __slots__ = (
        "by_consumer",
        "config",
        "counters",
        "cursor",
        "delayed",
        "first",
        "fresh",
        "held",
        "inflight",
        "kq",
        "name",
        "pin",
        "ready",
        "skip",
    )

    def __init__(self, name: str, config: dict[str, Any], cursor: int) -> None:
        self.name = name
        self.config = config
        self.cursor = cursor
        # The group is counted in a message's refs only from ``pin`` on; a group created with
        # start=earliest pins the older messages instead (see ``Broker._settle``).
        self.pin = cursor
        self.fresh = 0  # how many messages are fresh
        self.skip: set[int] = set()
        self.held: dict[int, int] = {}
        # seq -> [consumer, mac, deadline_ms, first_received_at_ms]
        self.inflight: dict[int, list[Any]] = {}
        self.delayed: dict[int, int] = {}
        self.ready: deque[int] = deque()
        self.by_consumer: dict[str, dict[int, None]] = {}
        self.counters: dict[str, int] = dict.fromkeys(GROUP_COUNTERS, 0)
        # seq -> now of its first delivery (first_received_at), for the held messages that
        # were delivered and are not in flight (in flight, it is in their inflight entry).
        self.first: dict[int, int] = {}
        # Ordered groups only (else None): ordering key -> its held seqs, sorted; a key is in
        # it only while it has held messages. Only a key's first held seq ever sits in
        # ``ready`` (see ``take_ordered``).
        self.kq: dict[str, list[int]] | None = {} if config.get("ordered") else None

    def is_ready(self, seq: int) -> bool:
        return seq in self.held and seq not in self.inflight and seq not in self.delayed


GROUP_COUNTERS = (
    "delivered",
    "redelivered",
    "acked",
    "nacked",
    "timed_out",
    "released",
    "dead_lettered",
    "dropped",
    "purged",
)
TOPIC_COUNTERS = ("published", "duplicates", "dropped_overflow", "expired", "purged")


class Topic:
    __slots__ = (
        "_bytes",
        "_total",
        "config",
        "count",
        "counters",
        "created_at",
        "dedup",
        "groups",
        "index",
        "key",
        "name",
        "next_seq",
        "okeys",
        "pinned",
        "publish_delays",
    )

    def __init__(
        self, name: str, config: dict[str, Any], created_at: int, total: list[int], key: str
    ) -> None:
        self.name = name
        self.key = key  # its stream in the store: f"{name}.{n}", never reused
        self.config = config
        self.created_at = created_at
        # ``bytes`` (payload bytes retained) is a property that keeps ``total[0]``, the sum over
        # every topic of the Broker (its retained-bytes limit), in step wherever it changes.
        self._total = total
        self._bytes = 0
        self.next_seq = 1  # (== index.next_seq, kept as a plain attribute: read everywhere)
        # Per retained message: its record in the store, sizes, publish time and refs (how
        # many groups have yet to settle it; msgindex.GONE once it left).
        self.index = MsgIndex(1)
        self.okeys: dict[int, str] = {}  # seq -> ordering key, for retained ones with a key
        self.count = 0
        self.groups: dict[str, Group] = {}
        # Idempotency keys seen within the dedup window -> seq (``keys.TopicKeys``:
        # producers' numbered keys in runs, 16 B a key; the others as digests, ~50 B a key,
        # ``dedup.DedupKeys``). No Python object per key; they expire per publish command.
        self.dedup = TopicKeys()
        self.counters: dict[str, int] = dict.fromkeys(TOPIC_COUNTERS, 0)
        self.pinned: list[Group] = []  # groups whose pin is above the oldest retained seq
        # seq -> due of messages published with a delay that may not be due yet, so that a
        # group created later with start=earliest delays them too (pruned when due).
        self.publish_delays: dict[int, int] = {}

    @property
    def bytes(self) -> int:
        return self._bytes

    @bytes.setter
    def bytes(self, value: int) -> None:
        self._total[0] += value - self._bytes
        self._bytes = value

    def has(self, seq: int) -> bool:
        """Is message ``seq`` retained?"""
        return self.index.retained(seq)

    def published_at(self, seq: int) -> int | None:
        got = self.index.get(seq)
        return None if got is None else got[3]

    def oldest_seq(self) -> int:
        return self.index.oldest_seq()

    def trimmed(self) -> None:
        """The gone prefix may have moved (the index trims itself): unpin groups below it."""
        if self.pinned:
            oldest = self.index.oldest_seq()
            self.pinned = [g for g in self.pinned if g.pin > oldest]


def advance_cursor(g: Group, to: int) -> None:
    """Move the cursor up to ``to`` (everything below it has left the topic), keeping
    ``skip`` within ``[cursor, next_seq)``; costs at most the distance moved."""
    skip = g.skip
    if skip:
        if to - g.cursor <= len(skip):
            for s in range(g.cursor, to):
                skip.discard(s)
        else:
            g.skip = {s for s in skip if s >= to}
    g.cursor = to


def skip_to_end(t: Topic, g: Group) -> None:
    """``g`` has nothing fresh: move its cursor to the end instead of keeping ``skip`` entries
    for messages it will never take fresh (held ones may sit below the cursor). Without this a
    group whose messages all come delayed, or a caught-up group beside redrives to another,
    grew ``skip`` (and every snapshot) by one entry per message, for ever."""
    advance_cursor(g, t.next_seq)


def age_due(t: Topic) -> int | None:
    """When the oldest retained message of ``t`` outlives ``max_age``, if it has both."""
    max_age = t.config["max_age"]
    if max_age is None or not t.count:
        return None
    at = t.published_at(t.oldest_seq())
    return None if at is None else at + round(max_age * 1000)


# ---------------------------------------------------------------------- ordered groups
#
# A group with ``ordered: true`` delivers the messages of one ordering key one held run at a
# time, in seq order: a message is delivered only when every held message of its key with a
# lower seq is delivered in the same receive. ``Group.kq`` maps each key with held messages
# to its held seqs, sorted; only a key's first held seq is ever queued in ``ready`` (when it is
# ready), and taking it takes the ready run behind it too. A fresh message whose key has an
# earlier held one is not delivered when the cursor passes it: it becomes held with 0
# attempts, ready but queued behind its key (blocked), and is queued in ``ready`` once it is
# first of its key. So the cursor passes each message once, a receive costs O(what it takes +
# what it blocks), at most MAX_BLOCKED_PER_RECEIVE blocked per receive, and the memory is one
# held entry per blocked message (the backlog of the held keys), nothing per idle key.
# Messages without a key behave as in any group. ``kq`` is derived state: rebuilt from
# ``held`` on restore (``reorder``), so snapshots do not carry it.


def is_head(t: Topic, g: Group, seq: int) -> bool:
    """Is ``seq`` first among the held messages of its key (or without a key)?"""
    key = t.okeys.get(seq)
    return key is None or g.kq[key][0] == seq  # type: ignore[index]


def unqueue(t: Topic, g: Group, seq: int) -> None:
    """``seq`` is no longer held by ordered group ``g``: queue the next of its key if ready."""
    key = t.okeys.get(seq)
    if key is None:
        return
    kq = g.kq
    assert kq is not None
    q = kq[key]
    if q[0] != seq:
        q.remove(seq)  # (a later one settled first: a receive took several of the key)
        return
    del q[0]
    if not q:
        del kq[key]
    elif g.is_ready(q[0]):
        g.ready.append(q[0])


def due_ordered(t: Topic, g: Group, seq: int) -> None:
    """The delay of held ``seq`` in ordered group ``g`` ran out."""
    key = t.okeys.get(seq)
    if key is None:
        g.ready.append(seq)
    elif not g.held[seq] and seq >= g.cursor:
        # Published with a delay and never delivered, and the cursor is not past it yet: it
        # turns fresh again, so that the cursor takes it after the earlier fresh ones of its
        # key (as held it would overtake them).
        del g.held[seq]
        g.skip.discard(seq)
        g.fresh += 1
        unqueue(t, g, seq)
    elif g.kq[key][0] == seq:  # type: ignore[index]
        g.ready.append(seq)


def take_ordered(t: Topic, g: Group, n: int, seqs: list[int]) -> None:
    """What a receive of up to ``n`` from ordered group ``g`` takes, appended to ``seqs``
    (see the section comment above)."""
    held, inflight, delayed, ready = g.held, g.inflight, g.delayed, g.ready
    kq = g.kq
    assert kq is not None
    took: dict[str, int] = {}  # key -> how many of its first held seqs this receive takes
    while ready and len(seqs) < n:
        seq = ready.popleft()
        if seq not in held or seq in inflight or seq in delayed:
            continue
        key = t.okeys.get(seq)
        if key is None:
            seqs.append(seq)
            continue
        q = kq[key]
        if q[0] != seq or key in took:
            continue  # (not first of its key any more: queued again when it is)
        i = 0
        while i < len(q) and len(seqs) < n and q[i] not in inflight and q[i] not in delayed:
            seqs.append(q[i])
            i += 1
        took[key] = i
    left = g.fresh
    if len(seqs) >= n or not left:
        return
    cursor, end, skip = g.cursor, t.next_seq, g.skip
    blocked = 0
    while cursor < end and len(seqs) < n and left and blocked < MAX_BLOCKED_PER_RECEIVE:
        seq = cursor
        cursor += 1
        if skip and seq in skip:
            skip.discard(seq)
            continue
        if not t.has(seq):
            continue  # (below a start=earliest group's pin: gone before it was created)
        left -= 1
        key = t.okeys.get(seq)
        if key is not None:
            kept = kq.get(key)
            if kept is None:
                kq[key] = [seq]
                took[key] = 1
            else:
                q = kept
                pos = len(q) if q[-1] < seq else bisect_left(q, seq)
                q.insert(pos, seq)
                if pos != took.get(key, 0):
                    held[seq] = 0  # blocked: an earlier one of its key is held
                    blocked += 1
                    continue
                took[key] = pos + 1
        held[seq] = 0
        seqs.append(seq)
    g.cursor = cursor
    g.fresh = left
    if not left:
        skip_to_end(t, g)  # (else may_deliver would say yes until the next publish)


def reorder(t: Topic, g: Group) -> None:
    """Turn ``ordered`` on or off as ``g.config`` says, or rebuild ``kq`` after a restore:
    O(held). Turning it off queues every ready message in ``ready``."""
    ready = g.ready
    queued = dict.fromkeys(s for s in ready if g.is_ready(s))  # (in order, once each)
    if not g.config.get("ordered"):
        g.kq = None
        for s in sorted(g.held):
            if s not in queued and g.is_ready(s):
                queued[s] = None
        g.ready = deque(queued)
        return
    kq: dict[str, list[int]] = {}
    for s in sorted(g.held):
        key = t.okeys.get(s)
        if key is not None:
            kq.setdefault(key, []).append(s)
    g.kq = kq
    heads = {q[0] for q in kq.values()}
    keep = [s for s in queued if t.okeys.get(s) is None or s in heads]
    kept = set(keep)
    keep += sorted(s for s in heads if s not in kept and g.is_ready(s))
    g.ready = deque(keep)
