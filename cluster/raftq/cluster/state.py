"""The broker state machine: topics, consumer groups, deliveries, dead letters.

``Broker.apply(command)`` is the only way state changes. It is deterministic: it reads no clock,
randomness, environment or file. The leader stamps every command with ``now`` (ms since the
epoch) and supplies the random ``token`` that receipts are derived from, so every replica fed the
same commands reaches byte-identical ``snapshot()`` output. Never iterate a ``set`` where the order
could change state or output: string hashes differ between processes; dicts keep insertion order,
which replicas share, and everything else is sorted.

A topic and its groups are ``topics.Topic`` and ``topics.Group``; ``topics.py`` also says which
state a message is in per group, and keeps the bookkeeping of ordered groups.

Payloads and headers live in the ``store`` (``segstore.SegmentStore``; without one given, an
in-memory one over ``memdisk.MemDisk``), one stream per topic incarnation (``Topic.key``,
``f"{name}.{n}"`` with ``n`` from ``next_stream``, never reused). Appends, frees, clears and
compactions happen inside apply, so every replica writes the same bytes at the same offsets. In
memory a topic keeps only ``Topic.index`` (``msgindex.MsgIndex``: packed columns by seq of the
record (an id into a table of record location and publish time), the message's length there,
payload size and ``refs``, how many groups have yet to settle it, counting a group only from
its ``pin`` on, its creation point; 16 B a message) and
``Topic.okeys`` (the ordering keys of retained messages that have one). A publish goes to
its stream's open record (``append_open``): one record per topic per apply, sealed at its end
on every replica alike; every removal frees its share; dead-lettering and redrive read the source
record and append to the target stream. Receive results name what to read: ``apply_batch(...,
read=True)`` fills in payloads and headers once the whole batch is applied (the leader);
``read=False`` leaves them out (followers). A ``StorageError`` propagates out of apply: the
node stops (a rejection would make replicas diverge). ``compact`` commands (proposed from
``compaction_candidates()``) move the live records of mostly-dead segments.

A group created with ``start=earliest`` instead *pins* the older
messages (``Topic.pinned``): creating it costs O(1), and a message leaves when its refs reach zero
and no pinning group still needs it, or through retention, overflow, purge or redrive. Deadlines
and delays sit in two global heaps with lazy deletion, so expiry costs O(expired * log n) and no
command scans all messages. Retention (``max_age``) and dedup-key expiry are per topic; two
``_Expiry`` heaps hold a lower bound of each topic's next such time, so no command scans all
topics either.

API tokens are records the node authenticates requests with (``hash`` is the SHA-256 of the
secret; the secret never gets here). Only their commands change them; nothing expires them here:
the node compares ``expires_at`` with its own clock, so that apply stays deterministic.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack

from raftq.cluster import snapshot
from raftq.cluster import validate as v
from raftq.cluster.errors import (
    BrokerError,
    GroupExists,
    GroupNotFound,
    InvalidArgument,
    MessageTooLarge,
    ReceiptInvalid,
    ReceiptStale,
    StorageFull,
    TokenExists,
    TokenNotFound,
    TopicExists,
    TopicFull,
    TopicNotFound,
)
from raftq.cluster.grants import check_grants, check_patterns, matches
from raftq.cluster.memdisk import MemDisk
from raftq.cluster.msgindex import GONE, MsgIndex
from raftq.cluster.segstore import Marks, SegmentStore
from raftq.cluster.storage import StorageError
from raftq.cluster.topics import (
    GROUP_COUNTERS,
    TOPIC_COUNTERS,
    Group,
    Topic,
    advance_cursor,
    age_due,
    due_ordered,
    is_head,
    reorder,
    skip_to_end,
    take_ordered,
    unqueue,
)

DEFAULT_GROUP = v.DEFAULT_GROUP
DLQ_PREFIX = "x-raftq-dlq-"
REDRIVE_HEADER = "x-raftq-redrives"
MAX_RECEIPT_LEN = 600
TOKEN_HASH_BYTES = 32  # SHA-256
TOKEN_CREATE_FIELDS = frozenset(
    ["op", "now", "id", "name", "hash", "grants", "cluster", "expires_at"]
)
TOKEN_UPDATE_FIELDS = frozenset(
    ["op", "now", "id", "name", "grants", "cluster", "expires_at", "disabled"]
)
TOKEN_REVOKE_FIELDS = frozenset(["op", "now", "id"])
COMPACT_SLACK = 4096  # stale deadline entries tolerated beyond twice the live ones
EXPIRY_SLACK = 1024  # the same for the per-topic expiry heaps (_Expiry)

MAX_COMPACTIONS = 4  # compact commands compaction_candidates() proposes at once
MEM_STORE_DIR = "/raftq-mem/store"  # the directory name of a Broker's in-memory store
# An in-memory store has nothing durable to wait for: its retired segments go once the batch
# that retired them is read (``commit`` of every epoch there will ever be).
MEM_COMMIT = 1 << 62


def mem_store() -> SegmentStore:
    """A ready store over a new ``MemDisk`` (a Broker without a data directory)."""
    store = SegmentStore(MemDisk(), MEM_STORE_DIR)
    store.truncate_to([])
    return store


def _group(topic: Topic, name: Any) -> Group:
    g = topic.groups.get(name) if isinstance(name, str) else None
    if g is None:
        v.name(name, "group")
        raise GroupNotFound(
            f"group {name!r} not found on topic {topic.name!r}", topic=topic.name, group=name
        )
    return g


def _pinned_elsewhere(t: Topic, g: Group, seq: int) -> bool:
    """Does a group other than ``g``, not counted in the refs of ``seq``, still need it?"""
    for h in t.pinned:
        if (
            h is not g
            and seq < h.pin
            and (seq in h.held or (seq >= h.cursor and seq not in h.skip))
        ):
            return True
    return False


def _plain_publishes(cmds: list[Any], i: int) -> int:
    """The end of the run of publishes from ``cmds[i]`` that each carry one message of a
    payload (bytes) and maybe a key (a string) to one topic, and nothing else."""
    topic = None
    j, end = i, len(cmds)
    while j < end:
        c = cmds[j]
        if type(c) is not dict or len(c) != 3 or c.get("op") != "publish":
            break
        msgs = c.get("messages")
        if type(msgs) is not list or len(msgs) != 1:
            break
        m = msgs[0]
        if type(m) is not dict or type(m.get("payload")) is not bytes:
            break
        key = m.get("key")
        if len(m) != (1 if key is None else 2) or (key is not None and type(key) is not str):
            break
        name = c.get("topic")
        if topic is None:
            if type(name) is not str:
                break
            topic = name
        elif name != topic:
            break
        j += 1
    return j


def _config(cmd: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = cmd.get("config")
    return {} if cfg is None else v.mapping(cfg, "config")


def _pop_due(
    heap: list[tuple[int, str, str, tuple[int, ...]]], now: int
) -> list[tuple[int, str, str, int]]:
    """Pop every entry due at ``now`` and return its items one per seq, sorted."""
    out: list[tuple[int, str, str, int]] = []
    pop = heapq.heappop
    while heap and heap[0][0] <= now:
        when, tname, gname, seqs = pop(heap)
        out.extend((when, tname, gname, seq) for seq in seqs)
    out.sort()
    return out


class _Expiry:
    """When something in a topic may next expire, for every topic where it can: a heap of
    ``(due, topic)`` with lazy deletion and ``at[topic]``, the live entry's due. The due is a
    lower bound (taking messages out only makes the real one later), so checking a topic when
    its entry fires finds everything there is to find; the caller then notes the real next due.
    Not part of the state: rebuilt on restore, and its layout never changes an outcome."""

    __slots__ = ("at", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[int, str]] = []
        self.at: dict[str, int] = {}

    def note(self, name: str, due: int | None) -> None:
        """Something in topic ``name`` may expire at ``due``: lower the bound to it."""
        if due is not None:
            cur = self.at.get(name)
            if cur is None or due < cur:
                self.at[name] = due
                heapq.heappush(self.heap, (due, name))
                if cur is not None:
                    self._compact()

    def forget(self, name: str) -> None:
        if self.at.pop(name, None) is not None:
            self._compact()

    def _compact(self) -> None:
        """Stale entries (a lowered bound, a deleted topic) wait until they come due, which
        may be years: rebuild once they outnumber the live ones."""
        if len(self.heap) > 2 * len(self.at) + EXPIRY_SLACK:
            self.heap = [(due, name) for name, due in self.at.items()]
            heapq.heapify(self.heap)

    def pop_due(self, now: int) -> list[str]:
        """Take out and return, sorted, the topics whose bound is due at ``now``."""
        heap, at = self.heap, self.at
        out: list[str] = []
        while heap and heap[0][0] <= now:
            due, name = heapq.heappop(heap)
            if at.get(name) == due:
                del at[name]
                out.append(name)
        out.sort()
        return out

    def first(self, real: Callable[[str], int | None]) -> int | None:
        """The earliest real due: bounds at the top are replaced by ``real(topic)`` until the
        top is exact (each replacement moves a bound later, so this is amortised O(log n))."""
        heap, at = self.heap, self.at
        while heap:
            due, name = heap[0]
            if at.get(name) != due:
                heapq.heappop(heap)
                continue
            actual = real(name)
            if actual == due:
                return due
            heapq.heappop(heap)
            del at[name]
            self.note(name, actual)
        return None


def _now(now: Any) -> int:
    if isinstance(now, bool) or not isinstance(now, int) or not 0 <= now <= v.MAX_INT:
        raise InvalidArgument("command needs an integer 'now' in ms", field="now")
    return now


def _is_num(s: str) -> bool:
    return 0 < len(s) <= 20 and s.isascii() and s.isdigit()


def _mac(token: bytes, seq: int, attempt: int) -> str:
    return hashlib.blake2b(b"%d:%d" % (seq, attempt), key=token, digest_size=8).hexdigest()


class Broker:
    """The replicated state. See the module docstring for the model.

    ``store`` holds the payloads; without one, a new in-memory store (``memdisk``). A store
    given is the binding's: it calls ``truncate_to`` before the first apply."""

    def __init__(self, store: SegmentStore | None = None) -> None:
        self.store = store if store is not None else mem_store()
        self._in_memory = isinstance(self.store.disk, MemDisk)
        self.next_stream = 0  # topic incarnations created so far: the n of their stream keys
        # Receive results waiting for their payloads, read once the whole batch is applied
        # (``_read``): per stream, the deliveries and their (seq, location, length), in step.
        self._reads: dict[str, tuple[list[dict[str, Any]], list[tuple[int, int, int]]]] = {}
        self.now = 0
        self.topics: dict[str, Topic] = {}
        # (deadline, topic, group, seqs) and (due, topic, group, seqs); one entry per receive
        # batch, stale entries skipped when they fire (lazy deletion).
        self._deadlines: list[tuple[int, str, str, tuple[int, ...]]] = []
        self._deadlines_limit = COMPACT_SLACK
        self._delays: list[tuple[int, str, str, tuple[int, ...]]] = []
        self._aging = _Expiry()  # topics with max_age and messages
        self._dedup_expiry = _Expiry()  # topics holding idempotency keys
        # consumer -> {(topic, group): None}, to release a consumer's deliveries at once.
        self._consumers: dict[str, dict[tuple[str, str], None]] = {}
        self._tokens: dict[str, dict[str, Any]] = {}  # id -> record (see _op_token_create)
        self._token_names: dict[str, str] = {}  # name -> id
        self.applied_commands = 0
        # Set for good once a message with an ordering key is published: from then on the
        # snapshot is v5 (older nodes could not honour the keys).
        self._keyed = False
        # Payload bytes retained over every topic (kept by ``Topic.bytes``) and the cluster
        # settings (``validate.CLUSTER_SETTINGS``; only the ones set).
        self._retained = [0]
        self.settings: dict[str, Any] = {}

    # ------------------------------------------------------------------ entry points

    def use_store(self, store: SegmentStore) -> None:
        """Swap the store of an empty Broker (the binding's, before it restores)."""
        if self.topics or self.next_stream:
            raise RuntimeError("use_store() on a Broker that holds topics")
        self.store = store
        self._in_memory = isinstance(store.disk, MemDisk)

    def apply(self, command: Mapping[str, Any]) -> dict[str, Any]:
        """Apply one command (a map with ``op`` and ``now``); raise BrokerError on rejection.
        A receive's payloads are read before it returns."""
        if not isinstance(command, Mapping):
            raise InvalidArgument("command must be a map", field="command")
        self._reads.clear()
        self._advance(_now(command.get("now")))
        try:
            result = self._dispatch(command)
        except BaseException:
            self._reads.clear()
            raise
        finally:
            self.store.seal()  # the open records end with the apply, as on every replica
        self._read(True)
        return result

    def apply_batch(
        self, now: int, commands: Iterable[Any], read: bool = True
    ) -> list[dict[str, Any]]:
        """Apply a group-committed batch sharing one ``now``; errors become ``{"error": ...}``.
        Raises InvalidArgument (and applies nothing) when ``now`` is not a time. With
        ``read``, receive results get their payloads and headers from the store once the
        whole batch is applied (the leader); without, they carry none (a follower).
        A StorageError propagates: the node must stop (a rejection would diverge)."""
        self._reads.clear()
        self._advance(_now(now))
        out: list[dict[str, Any]] = []
        cmds = commands if type(commands) is list else list(commands)
        i, end = 0, len(cmds)
        alone = 0  # commands before this go one by one: the rest of a run that was refused
        try:
            while i < end:
                cmd = cmds[i]
                i += 1
                if i > alone and i < end and (j := _plain_publishes(cmds, i - 1)) > i:
                    # Publishes of one message to one topic, as producers that do not batch
                    # send them: applied together when that gives what one by one gives.
                    run = self._publish_run(cmds[i - 1 : j])
                    if run is not None:
                        out += run
                        i = j
                        continue
                    alone = j  # (not tried again from each of its commands: that was n^2)
                try:
                    if type(cmd) is not dict and not isinstance(cmd, Mapping):
                        raise InvalidArgument("command must be a map", field="command")
                    out.append(self._dispatch(cmd))
                except BrokerError as e:
                    out.append({"error": e.to_wire()})
                except StorageError:
                    self._reads.clear()
                    raise
                except Exception as e:  # a bug must not take every replica down with it
                    out.append({"error": {"code": "internal", "message": repr(e), "details": {}}})
        finally:
            # One record per stream per entry: the open records end with the batch, at the
            # same point on every replica (a replay too), before anything reads them.
            self.store.seal()
        self._read(read)
        return out

    def _read(self, read: bool) -> None:
        """Fill in the payloads of this batch's deliveries (records freed or moved by a
        later command of the batch stay readable until the next snapshot commits)."""
        reads, self._reads = self._reads, {}
        if read and reads:
            for key, (deliveries, items) in reads.items():  # one read_batch a stream
                got = self.store.read_batch(key, items)
                for d, (payload, hdrs) in zip(deliveries, got, strict=True):
                    d["payload"] = payload
                    d["headers"] = hdrs or {}
        if self._in_memory and self.store.retiring():
            self.store.commit(MEM_COMMIT)

    def _dispatch(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        op = cmd.get("op")
        handler = _HANDLERS.get(op) if isinstance(op, str) else None
        if handler is None:
            raise InvalidArgument(f"unknown op {op!r}", field="op")
        result: dict[str, Any] = handler(self, cmd)
        self.applied_commands += 1
        return result

    # ------------------------------------------------------------------ time

    def _advance(self, now: int) -> None:
        """Move time forward (never back) and fire what became due.

        Fired entries are sorted before they are handled: the heaps may hold a different
        layout on a replica restored from a snapshot, the sorted list of live entries is the
        same everywhere."""
        if now > self.now:
            self.now = now
        now = self.now
        dl = self._deadlines
        if dl and dl[0][0] <= now:
            for deadline, tname, gname, seq in _pop_due(dl, now):
                t = self.topics.get(tname)
                g = t.groups.get(gname) if t else None
                entry = g.inflight.get(seq) if g else None
                if t and g and entry and entry[2] == deadline:
                    g.counters["timed_out"] += 1
                    self._fail(t, g, seq, "visibility_timeout", None)
        dq = self._delays
        if dq and dq[0][0] <= now:
            for due, tname, gname, seq in _pop_due(dq, now):
                t = self.topics.get(tname)
                if not gname:  # the topic's own entry for a publish delay
                    if t is not None and t.publish_delays.get(seq) == due:
                        del t.publish_delays[seq]
                    continue
                g = t.groups.get(gname) if t else None
                if g is not None and g.delayed.get(seq) == due:
                    del g.delayed[seq]
                    if g.kq is None:
                        g.ready.append(seq)
                    else:
                        assert t is not None
                        due_ordered(t, g, seq)
        topics = self.topics
        if self._dedup_expiry.heap and self._dedup_expiry.heap[0][0] <= now:
            for name in self._dedup_expiry.pop_due(now):
                t = topics.get(name)
                if t is not None:
                    self._expire_keys(t, now)
        if self._aging.heap and self._aging.heap[0][0] <= now:
            for name in self._aging.pop_due(now):
                t = topics.get(name)
                if t is not None:
                    self._expire_messages(t, now)

    def _live(self, item: tuple[int, str, str, tuple[int, ...]], deadline: bool) -> bool:
        when, tname, gname, seqs = item
        t = self.topics.get(tname)
        if not gname:
            return t is not None and any(t.publish_delays.get(s) == when for s in seqs)
        g = t.groups.get(gname) if t else None
        if g is None:
            return False
        if deadline:
            inflight = g.inflight
            return any((e := inflight.get(s)) is not None and e[2] == when for s in seqs)
        return any(g.delayed.get(s) == when for s in seqs)

    def _expire_keys(self, t: Topic, now: int) -> None:
        t.dedup.expire(now)
        nxt = t.dedup.next_expiry()
        if nxt is not None:
            self._dedup_expiry.note(t.name, nxt)

    def _expire_messages(self, t: Topic, now: int) -> None:
        max_age = t.config["max_age"]
        if max_age is not None and t.count:
            limit = now - round(max_age * 1000)
            while t.count:
                seq = t.oldest_seq()
                at = t.published_at(seq)
                if at is None or at > limit:
                    break
                t.counters["expired"] += 1
                self._remove(t, seq)
        self._aging.note(t.name, age_due(t))

    def next_due(self) -> int | None:
        """Earliest time (ms) at which a tick would change something; a hint for the leader.

        Drops the stale entries it finds at the top of the heaps (acked deliveries), so that
        the leader does not propose ticks that change nothing; the heaps' layout never reaches
        the state. Dedup expiry needs no tick: publish fires it first."""
        cands = []
        dl, dq = self._deadlines, self._delays
        while dl and not self._live(dl[0], True):
            heapq.heappop(dl)
        if dl:
            cands.append(dl[0][0])
        while dq and not self._live(dq[0], False):
            heapq.heappop(dq)
        if dq:
            cands.append(dq[0][0])
        topics = self.topics
        aged = self._aging.first(lambda name: age_due(topics[name]))
        if aged is not None:
            cands.append(aged)
        return min(cands) if cands else None

    # ------------------------------------------------------------------ topics and groups

    def _topic(self, cmd: Mapping[str, Any], field: str = "topic") -> Topic:
        name = cmd.get(field)
        t = self.topics.get(name) if isinstance(name, str) else None
        if t is None:
            v.name(name, field)
            raise TopicNotFound(f"topic {name!r} not found", topic=name)
        return t

    def _op_create_topic(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        # Whether the topic exists is checked first: with if_not_exists an existing topic is
        # created=false whatever the rest of the spec says. (A replica of an older version
        # computes the same result and applied_commands; the node checks the spec before it
        # proposes, commands.create_topic.)
        name = v.name(cmd.get("topic"), "topic")
        if name in self.topics:
            if cmd.get("if_not_exists"):
                return {"topic": name, "created": False}
            raise TopicExists(f"topic {name!r} already exists", topic=name)
        config, groups = v.topic_spec(name, cmd)
        t = self._new_topic(name, config)
        for gname, gcfg in groups:
            t.groups[gname] = Group(gname, gcfg, t.next_seq)
        return {"topic": name, "created": True}

    def _new_topic(self, name: str, config: dict[str, Any]) -> Topic:
        t = Topic(name, config, self.now, self._retained, f"{name}.{self.next_stream}")
        self.next_stream += 1
        self.topics[name] = t
        return t

    def _ensure_dlq(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            t = self._new_topic(name, v.topic_config({}))
            cfg = v.group_config(name, {"max_attempts": 0, "dead_letter_topic": None})
            t.groups[DEFAULT_GROUP] = Group(DEFAULT_GROUP, cfg, t.next_seq)
        return t

    def _op_update_topic(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        t.config = v.topic_config(_config(cmd), t.config)
        self._aging.note(t.name, age_due(t))  # a shorter max_age: due earlier
        return {"topic": t.name, "config": v.config_out(t.config, v.TOPIC_OPTIONAL)}

    def _op_delete_topic(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        for g in t.groups.values():
            self._forget_consumers(t, g)
        del self.topics[t.name]
        self.store.drop(t.key)
        t.bytes = 0  # (out of the node-wide total)
        self._aging.forget(t.name)
        self._dedup_expiry.forget(t.name)
        return {"topic": t.name, "deleted": True}

    def _op_create_group(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        gname = v.name(cmd.get("group"), "group")
        start = cmd.get("start", "latest")
        if start not in ("latest", "earliest"):
            raise InvalidArgument("start must be 'latest' or 'earliest'", field="start")
        if gname in t.groups:  # (before the config: as create_topic)
            if cmd.get("if_not_exists"):
                return {"topic": t.name, "group": gname, "created": False}
            raise GroupExists(
                f"group {gname!r} already exists on {t.name!r}", topic=t.name, group=gname
            )
        cfg = v.group_config(t.name, _config(cmd))
        if start == "earliest":
            # O(1): the group pins the retained messages instead of counting in their refs;
            # the gaps between them are not fresh for it (see _op_receive).
            g = Group(gname, cfg, t.oldest_seq())
            g.pin = t.next_seq
            g.fresh = t.count
            if t.count:
                t.pinned.append(g)
            # Messages still waiting out their publish delay wait for this group too.
            for seq, due in list(t.publish_delays.items()):
                if due <= self.now or not t.has(seq):
                    del t.publish_delays[seq]
                    continue
                g.held[seq] = 0
                g.delayed[seq] = due
                g.skip.add(seq)
                g.fresh -= 1
                heapq.heappush(self._delays, (due, t.name, gname, (seq,)))
                key = t.okeys.get(seq)
                if g.kq is not None and key is not None:
                    g.kq.setdefault(key, []).append(seq)  # (in seq order, as published)
        else:
            g = Group(gname, cfg, t.next_seq)
        t.groups[gname] = g
        return {"topic": t.name, "group": gname, "created": True}

    def _op_update_group(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        g = _group(t, cmd.get("group"))
        g.config = v.group_config(t.name, _config(cmd), g.config)
        if (g.kq is None) == bool(g.config.get("ordered")):
            reorder(t, g)
        return {"topic": t.name, "group": g.name, "config": _group_config_out(g)}

    def _op_delete_group(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        g = _group(t, cmd.get("group"))
        for seq in sorted(g.held):
            self._settle(t, g, seq)
        self._settle_fresh(t, g)
        self._forget_consumers(t, g)
        if g in t.pinned:
            t.pinned.remove(g)
        del t.groups[g.name]
        return {"topic": t.name, "group": g.name, "deleted": True}

    def _forget_consumers(self, t: Topic, g: Group) -> None:
        for consumer in g.by_consumer:
            pairs = self._consumers.get(consumer)
            if pairs is not None:
                pairs.pop((t.name, g.name), None)
                if not pairs:
                    del self._consumers[consumer]

    # ------------------------------------------------------------------ publish

    def _op_publish(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        msgs_in = cmd.get("messages")
        if not isinstance(msgs_in, list) or not msgs_in:
            raise InvalidArgument("messages must be a non-empty list", field="messages")
        cfg = t.config
        max_size = cfg["max_message_bytes"]
        now = self.now
        dedup = t.dedup
        window = round(cfg["dedup_window"] * 1000)
        # Validate everything first: a rejected batch stores nothing.
        # (payload, headers) and payload sizes in step; (seq, delay, ordering key) of the
        # messages that have more than a payload and a key (the clients' common shapes).
        staged: list[tuple[bytes, dict[str, str] | None]] = []
        sizes: list[int] = []
        extra: list[tuple[int, int, str | None]] = []
        keyed = False
        # this publish's new keys (their digests with a window, else the keys) -> seq
        batch_keys: dict[Any, int] = {}
        results: list[dict[str, Any]] = []
        add_bytes = 0
        first = t.next_seq  # staged messages get first, first + 1, ... in order
        # A client's batch: its first ``known`` keys are a producer's next ones, new (seqs
        # first, first + 1, ...: none is a duplicate, none refused alone), for ``add_next``.
        many = window and len(msgs_in) > 1
        prefix, n0, known = dedup.next_keys(msgs_in) if many else ("", 0, 0)
        if known and len(msgs_in[known - 1]["key"]) > v.MAX_KEY_LEN:  # (the longest of them)
            known = 0  # (one by one, to refuse the first too long)
        for i, m in enumerate(msgs_in):
            if type(m) is not dict and not isinstance(m, Mapping):
                raise InvalidArgument(f"messages[{i}] must be a map", field="messages")
            payload = m.get("payload")
            if not isinstance(payload, bytes):
                raise InvalidArgument(f"messages[{i}].payload must be bytes", field="payload")
            size = len(payload)
            if size > max_size:
                raise MessageTooLarge(
                    f"messages[{i}] is {size} bytes; topic {t.name!r} allows {max_size}",
                    size=size,
                    limit=max_size,
                    index=i,
                )
            key = m.get("key")
            # The common shapes, {payload} and {payload, key} (the clients'), have nothing
            # else to look up (this pays for the ordering key's lookup in the others).
            plain = len(m) == (1 if key is None else 2)
            hdrs = None if plain else m.get("headers")
            if hdrs is not None:
                hdrs = v.headers(hdrs)
            if key is not None and i >= known:
                v.string(key, "key", v.MAX_KEY_LEN)
                if window:  # (one digest per key, for the lookup and the insert)
                    key, prior = dedup.lookup(key)
                    if prior is None and known and key[0] == prefix and 0 <= key[1] - n0 < known:
                        prior = first + key[1] - n0  # (one of the known keys again)
                    if prior is not None:
                        results.append({"seq": prior, "duplicate": True})
                        continue
                if key in batch_keys:
                    results.append({"seq": batch_keys[key], "duplicate": True})
                    continue
                batch_keys[key] = first + len(staged)
            if not plain:
                delay = m.get("delay")
                delay_ms = 0 if delay is None else v.seconds_ms(delay, "delay", 0, v.MAX_DELAY_S)
                okey = m.get("ordering_key")
                if okey is not None:
                    okey = v.ordering_key(okey, f"messages[{i}].ordering_key")
                    keyed = True
                if delay_ms or okey is not None:
                    extra.append((first + len(staged), delay_ms, okey))
            results.append({"seq": first + len(staged), "duplicate": False})
            staged.append((payload, hdrs))
            sizes.append(size)
            add_bytes += size
        max_n, max_b = cfg["max_messages"], cfg["max_bytes"]
        n = len(staged)
        # Only what is stored counts: a retry whose messages are all duplicates stores nothing
        # and must get its original results, even from a topic that is full now.
        over = n > 0 and (
            (max_n is not None and t.count + n > max_n)
            or (max_b is not None and t.bytes + add_bytes > max_b)
        )
        if over and cfg["overflow"] == "reject":
            raise TopicFull(
                f"topic {t.name!r} is full",
                topic=t.name,
                count=t.count,
                bytes=t.bytes,
                max_messages=max_n,
                max_bytes=max_b,
            )
        if over and (
            (max_n is not None and n > max_n) or (max_b is not None and add_bytes > max_b)
        ):
            raise TopicFull(
                f"batch alone exceeds the limits of topic {t.name!r}",
                topic=t.name,
                count=t.count,
                bytes=t.bytes,
                max_messages=max_n,
                max_bytes=max_b,
            )
        limit = self.settings.get("max_retained_bytes")
        if n and limit is not None:
            self._check_retained(t, add_bytes, limit)
        groups = list(t.groups.values())
        ngroups = len(groups)
        n_fresh = n
        if keyed:
            self._keyed = True
        if n:  # into the stream's open record: one record per topic per apply (entry)
            locs, lengths = self.store.append_open(t.key, first, now, staged)
            if n == 1:
                t.index.append(locs[0], lengths[0], sizes[0], now, ngroups)
            else:
                t.index.extend(locs, lengths, sizes, now, ngroups)
        for seq, delay_ms, okey in extra:
            if okey is not None:
                t.okeys[seq] = okey
            if delay_ms:
                n_fresh -= 1
                due = now + delay_ms
                t.publish_delays[seq] = due
                heapq.heappush(self._delays, (due, t.name, "", (seq,)))  # prunes it when due
                for g in groups:
                    g.held[seq] = 0
                    g.delayed[seq] = due
                    g.skip.add(seq)
                    heapq.heappush(self._delays, (due, t.name, g.name, (seq,)))
                    if g.kq is not None and okey is not None:
                        g.kq.setdefault(okey, []).append(seq)  # (the highest seq yet)
        t.next_seq = first + n
        if known:  # (all stored: seqs first, first + 1, ...)
            dedup.add_next(now + window, prefix, n0, first, known)
        if window and batch_keys:  # exactly this publish's new keys, in order, with their seqs
            dedup.add(now + window, batch_keys)
        if known or (window and batch_keys):
            self._dedup_expiry.note(t.name, now + window)
        for g in groups:
            g.fresh += n_fresh
            if not g.fresh and g.skip:
                skip_to_end(t, g)
        t.count += n
        t.bytes += add_bytes
        t.counters["published"] += n
        t.counters["duplicates"] += len(results) - n
        if over:
            self._enforce_limits(t)
        if cfg["max_age"] is not None:
            self._aging.note(t.name, age_due(t))
        return {"topic": t.name, "messages": results}

    def _publish_run(self, cmds: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Publishes of one message each to one topic (``_plain_publishes``), applied together:
        the results and state that ``_op_publish`` one by one gives, with one store append,
        index extend and keys add for them all (group commit of small publishes: many HTTP or
        SQS producers sending a message each; the clients coalesce their own publishes into
        batches, so ``raftq bench`` does not come here). None, having changed nothing, where
        one by one could differ: the topic is missing, a message too large or its key too long,
        a limit would be reached, a group has nothing fresh but skipped messages."""
        t = self.topics.get(cmds[0]["topic"])
        if t is None:
            return None
        cfg = t.config
        max_n = cfg["max_messages"]
        groups = list(t.groups.values())
        if (max_n is not None and t.count + len(cmds) > max_n) or any(
            not g.fresh and g.skip for g in groups
        ):
            # (one by one, a publish may reach the limit, or move such a group's cursor: a
            # publish of a duplicate does when the group has nothing fresh but skipped ones)
            return None
        try:
            return self._publish_together(t, cmds, groups)
        except StorageError:
            raise
        except Exception as e:  # a bug, once it changed things: each command says so
            err = {"code": "internal", "message": repr(e), "details": {}}
            return [{"error": err} for _ in cmds]

    def _publish_together(
        self, t: Topic, cmds: list[dict[str, Any]], groups: list[Group]
    ) -> list[dict[str, Any]] | None:
        """``_publish_run`` once the topic and its groups allow it: the messages checked and
        looked up (None, having changed nothing, if one by one could differ), then added."""
        cfg = t.config
        max_size = cfg["max_message_bytes"]
        window = round(cfg["dedup_window"] * 1000)
        lookup = t.dedup.lookup
        name = t.name
        first = t.next_seq
        staged: list[tuple[bytes, None]] = []
        sizes: list[int] = []
        out: list[dict[str, Any]] = []
        batch_keys: dict[Any, int] = {}  # the run's new keys, as ``_op_publish`` keeps them
        add_bytes = 0
        for cmd in cmds:
            m = cmd["messages"][0]
            payload = m["payload"]
            size = len(payload)
            if size > max_size:
                return None
            key = m.get("key")
            if key is not None and len(key) > v.MAX_KEY_LEN:
                return None
            if key is not None and window:  # (no window: no key is looked up, none kept)
                # One by one, a key of an earlier publish of the run would be in the keys by
                # now; here it is in batch_keys (the same token: looked up before any add).
                try:
                    tok, prior = lookup(key)
                except Exception:  # (nothing changed yet: one by one, the command's own error)
                    return None
                if prior is None:
                    prior = batch_keys.get(tok)
                if prior is not None:
                    out.append({"topic": name, "messages": [{"seq": prior, "duplicate": True}]})
                    continue
                batch_keys[tok] = first + len(staged)
            out.append(
                {"topic": name, "messages": [{"seq": first + len(staged), "duplicate": False}]}
            )
            staged.append((payload, None))
            sizes.append(size)
            add_bytes += size
        n = len(staged)
        max_b = cfg["max_bytes"]
        if max_b is not None and t.bytes + add_bytes > max_b:
            return None  # (one by one, the publish that reaches it is refused or drops)
        limit = self.settings.get("max_retained_bytes")
        if n and limit is not None:
            try:  # (passed by them all, passed by each: the bound only grows along the run)
                self._check_retained(t, add_bytes, limit)
            except StorageFull:
                return None
        now = self.now
        if n:
            locs, lengths = self.store.append_open(t.key, first, now, staged)
            t.index.extend(locs, lengths, sizes, now, len(groups))
        t.next_seq = first + n
        if batch_keys:
            t.dedup.add(now + window, batch_keys)
            self._dedup_expiry.note(name, now + window)
        for g in groups:
            g.fresh += n
        t.count += n
        t.bytes += add_bytes
        t.counters["published"] += n
        t.counters["duplicates"] += len(cmds) - n
        if cfg["max_age"] is not None:
            self._aging.note(name, age_due(t))
        self.applied_commands += len(cmds)
        return out

    def _check_retained(self, t: Topic, add: int, limit: int) -> None:
        """Refuse a publish that would take the payload bytes retained over every topic past
        ``limit`` (``storage_full``). A ``drop_oldest`` topic with ``max_bytes`` counts at most
        that much after the publish (its own overflow drops first), so a topic used as a ring
        buffer keeps rolling at the limit; the bound is conservative, never under. Dead letters
        and redrives do not come here (as they bypass ``reject``): none is lost."""
        after = t.bytes + add
        cap = t.config["max_bytes"]
        if t.config["overflow"] == "drop_oldest" and cap is not None and after > cap:
            after = cap
        retained = self._retained[0]
        if retained - t.bytes + after > limit:
            raise StorageFull(
                f"storage full: {retained} bytes retained over all topics, {add} more would"
                f" pass the cluster's max_retained_bytes of {limit}; consume or purge first",
                retained_bytes=retained,
                max_retained_bytes=limit,
                bytes=add,
            )

    def _enforce_limits(self, t: Topic) -> None:
        max_n, max_b = t.config["max_messages"], t.config["max_bytes"]
        while t.count and (
            (max_n is not None and t.count > max_n) or (max_b is not None and t.bytes > max_b)
        ):
            t.counters["dropped_overflow"] += 1
            self._remove(t, t.oldest_seq())

    def _remove(self, t: Topic, seq: int) -> None:
        """Take a retained message out of the topic and out of every group (retention, overflow,
        redrive), counting it as dropped in each group that had not settled it."""
        if not t.index.retained(seq):
            return
        for g in t.groups.values():
            if seq in g.held:
                self._unhold(t, g, seq)
                g.counters["dropped"] += 1
            elif seq >= g.cursor and seq not in g.skip:
                g.counters["dropped"] += 1
                g.fresh -= 1
                if seq == g.cursor:
                    g.cursor += 1
                else:
                    g.skip.add(seq)
        was_oldest = seq == t.index.oldest_seq()
        self._free(t, seq)
        if was_oldest:
            t.trimmed()
            oldest = t.oldest_seq()
            for g in t.groups.values():
                if g.cursor < oldest:
                    advance_cursor(g, oldest)

    def _free(self, t: Topic, seq: int) -> None:
        """Message ``seq`` leaves the topic: out of the index, its record freed in the store."""
        r = t.index.remove(seq)
        assert r is not None
        loc, length, size = r
        self.store.free(t.key, loc, length)
        t.count -= 1
        t._bytes -= size  # (the ``bytes`` setter inline: this runs once per ack)
        t._total[0] -= size
        if t.okeys:
            t.okeys.pop(seq, None)

    def _settle(self, t: Topic, g: Group, seq: int) -> None:
        """Group ``g`` is done with ``seq``; free the message when every group is: its refs
        (groups counted from their pin on) reach zero and no group pinning it still needs it."""
        ix = t.index
        i = seq - ix.first_seq
        refs = ix.refs
        if i < ix.head or i >= len(refs):
            return
        r = refs[i]
        if r == GONE:
            return
        if seq >= g.pin:
            r -= 1
            refs[i] = r
            if r:
                return
        elif r:
            return
        if t.pinned and _pinned_elsewhere(t, g, seq):
            return
        # ``_free`` inline (checked above already): this runs once per ack.
        refs[i] = GONE
        size = ix.size[i]
        self.store.free(t.key, ix.rloc[ix.rec[i] - ix.rbase], ix.length[i])
        t.count -= 1
        t._bytes -= size
        t._total[0] -= size
        if t.okeys:
            t.okeys.pop(seq, None)
        if i == ix.head:
            ix.trim()
            if t.pinned:
                t.trimmed()

    def _settle_fresh(self, t: Topic, g: Group) -> int:
        """Settle every fresh message of ``g`` at once (delete or purge of a group): one tight
        pass over the group's backlog. Returns how many it settled."""
        ix, skip, pin = t.index, g.skip, g.pin
        refs = ix.refs
        n = 0
        free: list[int] = []
        for seq in range(max(g.cursor, t.oldest_seq()), t.next_seq):
            i = seq - ix.first_seq  # (stable: nothing is removed from the index in here)
            r = refs[i]
            if r == GONE or (skip and seq in skip):
                continue
            n += 1
            if seq >= pin:
                r -= 1
                refs[i] = r
                if r:
                    continue
            elif r:
                continue
            if t.pinned and _pinned_elsewhere(t, g, seq):
                continue
            free.append(seq)
        for seq in free:  # (removing trims the index, which moves its positions)
            self._free(t, seq)
        t.trimmed()
        return n

    def _unhold(self, t: Topic, g: Group, seq: int) -> None:
        del g.held[seq]
        entry = g.inflight.pop(seq, None)
        if entry is not None:
            self._unbind(t, g, entry[0], seq)
        g.delayed.pop(seq, None)
        if g.first:
            g.first.pop(seq, None)
        if g.kq is not None:
            unqueue(t, g, seq)

    def _unbind(self, t: Topic, g: Group, consumer: str, seq: int) -> None:
        seqs = g.by_consumer[consumer]
        del seqs[seq]
        if not seqs:
            del g.by_consumer[consumer]
            pairs = self._consumers[consumer]
            del pairs[(t.name, g.name)]
            if not pairs:
                del self._consumers[consumer]

    # ------------------------------------------------------------------ receive

    def _op_receive(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        g = _group(t, cmd.get("group"))
        consumer = v.string(cmd.get("consumer"), "consumer", 256)
        if not consumer:
            raise InvalidArgument("consumer must not be empty", field="consumer")
        n = v.integer(cmd.get("max", 1), "max", 1, v.MAX_RECEIVE)
        token = cmd.get("token")
        if not isinstance(token, bytes) or not 16 <= len(token) <= 64:
            raise InvalidArgument("token must be 16 to 64 random bytes", field="token")
        vis = cmd.get("visibility")
        vis_ms = (
            v.seconds_ms(g.config["visibility_timeout"], "visibility_timeout", 0, v.MAX_TIMEOUT_S)
            if vis is None
            else v.seconds_ms(vis, "visibility", 0.001, v.MAX_TIMEOUT_S)
        )
        now = self.now
        deadline = now + vis_ms
        out: list[dict[str, Any]] = []
        held, inflight, ready = g.held, g.inflight, g.ready
        seqs: list[int] = []
        if g.kq is not None:
            take_ordered(t, g, n, seqs)
        else:
            while ready and len(seqs) < n:
                seq = ready.popleft()
                if seq in held and seq not in inflight and seq not in g.delayed:
                    seqs.append(seq)
        if g.kq is None and len(seqs) < n and g.fresh:  # an idle group costs O(1)
            cursor, end, skip, pin = g.cursor, t.next_seq, g.skip, g.pin
            taken = len(seqs)
            n = min(n, taken + g.fresh)
            while cursor < end and len(seqs) < n:
                seq = cursor
                cursor += 1
                if skip and seq in skip:
                    skip.discard(seq)
                    continue
                if seq < pin and not t.index.retained(seq):
                    continue  # gone before this (start=earliest) group was created
                held[seq] = 0
                seqs.append(seq)
            g.cursor = cursor
            g.fresh -= len(seqs) - taken
        if not seqs:
            return {"deliveries": out}
        mine = g.by_consumer.get(consumer)
        if mine is None:
            mine = g.by_consumer[consumer] = {}
            self._consumers.setdefault(consumer, {})[(t.name, g.name)] = None
        prefix = f"{t.name}:{g.name}:"
        heapq.heappush(self._deadlines, (deadline, t.name, g.name, tuple(seqs)))
        if len(self._deadlines) > self._deadlines_limit:
            self._compact_deadlines()
        first = g.first
        okeys = t.okeys  # (empty unless a message with an ordering key was published)
        ix = t.index
        base, recs, rbase, lengths = ix.first_seq, ix.rec, ix.rbase, ix.length
        rlocs, rats = ix.rloc, ix.rat
        reads = self._reads.get(t.key)
        if reads is None:
            reads = self._reads[t.key] = ([], [])
        filled, items = reads  # (payload, headers: _read)
        for seq in seqs:
            attempt = held[seq] + 1
            held[seq] = attempt
            mac = _mac(token, seq, attempt)
            f = now if attempt == 1 else first.pop(seq, now)
            inflight[seq] = [consumer, mac, deadline, f]
            mine[seq] = None
            i = seq - base
            r = recs[i] - rbase
            d = {
                "seq": seq,
                "attempt": attempt,
                "receipt": f"{prefix}{seq}:{attempt}:{mac}",
                "published_at": rats[r],
                "deadline": deadline,
                "first_received_at": f,
            }
            if okeys and seq in okeys:
                d["ordering_key"] = okeys[seq]
            filled.append(d)
            items.append((seq, rlocs[r], lengths[i]))
            out.append(d)
        g.counters["delivered"] += len(seqs)
        g.counters["redelivered"] += sum(1 for d in out if d["attempt"] > 1)
        return {"topic": t.name, "group": g.name, "deliveries": out}

    # ------------------------------------------------------------------ settle a delivery

    def _receipt(self, receipt: Any) -> tuple[Topic, Group, int]:
        """Resolve a receipt to the in-flight delivery it names, or raise."""
        if not isinstance(receipt, str):
            raise ReceiptInvalid("receipt must be a string", receipt=repr(receipt))
        parts = receipt.split(":") if len(receipt) <= MAX_RECEIPT_LEN else ()
        if len(parts) != 5 or not _is_num(parts[2]) or not _is_num(parts[3]):
            raise ReceiptInvalid(f"malformed receipt {receipt[:300]!r}", receipt=receipt[:300])
        tname, gname, s_seq, s_att, mac = parts
        seq, attempt = int(s_seq), int(s_att)
        t = self.topics.get(tname)
        g = t.groups.get(gname) if t else None
        if t is None or g is None:
            # (a deleted topic's or group's receipts too: nothing tells them apart)
            what = f"topic {tname!r}" if t is None else f"group {gname!r} of topic {tname!r}"
            raise ReceiptInvalid(
                f"receipt {receipt!r} names {what}: none exists (never did, or was deleted)",
                receipt=receipt,
            )
        entry = g.inflight.get(seq)
        if entry is None:
            raise ReceiptStale(
                f"delivery {receipt!r} is no longer in flight "
                "(acked, timed out, released, dead-lettered or removed)",
                receipt=receipt,
            )
        if g.held[seq] != attempt:
            raise ReceiptStale(
                f"receipt {receipt!r} is for attempt {attempt} of message {seq}, but attempt "
                f"{g.held[seq]} is in flight now: the earlier delivery timed out or was released",
                receipt=receipt,
            )
        if entry[1] != mac:
            raise ReceiptInvalid(
                f"receipt {receipt!r} does not match its delivery", receipt=receipt
            )
        return t, g, seq

    def _many(self, cmd: Mapping[str, Any]) -> list[Any]:
        receipts = cmd.get("receipts")
        if not isinstance(receipts, list) or not receipts:
            raise InvalidArgument("receipts must be a non-empty list", field="receipts")
        return receipts

    def _op_ack(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        errors: list[dict[str, Any]] = []
        acked = 0
        for r in self._many(cmd):
            try:
                t, g, seq = self._receipt(r)
            except BrokerError as e:
                errors.append({"receipt": r if isinstance(r, str) else repr(r), **e.to_wire()})
                continue
            self._unhold(t, g, seq)
            g.counters["acked"] += 1
            self._settle(t, g, seq)
            acked += 1
        return {"acked": acked, "errors": errors}

    def _op_nack(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        delay = cmd.get("delay")
        delay_ms = None if delay is None else v.seconds_ms(delay, "delay", 0, v.MAX_TIMEOUT_S)
        errors: list[dict[str, Any]] = []
        done = 0
        dead = 0
        for r in self._many(cmd):
            try:
                t, g, seq = self._receipt(r)
            except BrokerError as e:
                errors.append({"receipt": r if isinstance(r, str) else repr(r), **e.to_wire()})
                continue
            g.counters["nacked"] += 1
            dead += self._fail(t, g, seq, "nack", delay_ms)
            done += 1
        return {"nacked": done, "dead_lettered": dead, "errors": errors}

    def _compact_deadlines(self) -> None:
        """Acks leave their deadline entries behind (lazy deletion); once those outnumber the
        live ones, rebuild the heap from what is in flight. Amortized O(1) per delivery; the
        layout never reaches state (what fires is sorted), so replicas may compact at
        different times."""
        live: list[tuple[int, str, str, tuple[int, ...]]] = [
            (entry[2], t.name, g.name, (seq,))
            for t in self.topics.values()
            for g in t.groups.values()
            for seq, entry in g.inflight.items()
        ]
        heapq.heapify(live)
        self._deadlines = live
        self._deadlines_limit = 2 * len(live) + COMPACT_SLACK

    def _op_extend(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        secs = cmd.get("seconds")
        ext = v.seconds_ms(secs, "seconds", 0.001, v.MAX_TIMEOUT_S)
        deadline = self.now + ext
        errors: list[dict[str, Any]] = []
        done = 0
        for r in self._many(cmd):
            try:
                t, g, seq = self._receipt(r)
            except BrokerError as e:
                errors.append({"receipt": r if isinstance(r, str) else repr(r), **e.to_wire()})
                continue
            g.inflight[seq][2] = deadline
            heapq.heappush(self._deadlines, (deadline, t.name, g.name, (seq,)))
            done += 1
        if len(self._deadlines) > self._deadlines_limit:
            self._compact_deadlines()
        return {"extended": done, "deadline": deadline, "errors": errors}

    def _op_term(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        reason = cmd.get("reason")
        reason = "terminated" if reason is None else v.string(reason, "reason", 1024)
        errors: list[dict[str, Any]] = []
        done = 0
        for r in self._many(cmd):
            try:
                t, g, seq = self._receipt(r)
            except BrokerError as e:
                errors.append({"receipt": r if isinstance(r, str) else repr(r), **e.to_wire()})
                continue
            self._dead_letter(t, g, seq, f"term: {reason}")
            done += 1
        return {"terminated": done, "errors": errors}

    def _op_release(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        """Give back a consumer's deliveries; with ``topics`` (patterns), only those on topics
        one of them matches (the node passes a token's consume patterns)."""
        consumer = v.string(cmd.get("consumer"), "consumer", 256)
        only = check_patterns(cmd["topics"], "topics") if "topics" in cmd else None
        pairs = self._consumers.get(consumer)
        released = 0
        dead = 0
        for tname, gname in sorted(pairs or ()):
            if only is not None and not any(matches(p, tname) for p in only):
                continue
            t = self.topics[tname]
            g = t.groups[gname]
            for seq in sorted(g.by_consumer.get(consumer, ())):
                g.counters["released"] += 1
                dead += self._fail(t, g, seq, "released", 0)
                released += 1
        return {"consumer": consumer, "released": released, "dead_lettered": dead}

    def _fail(self, t: Topic, g: Group, seq: int, reason: str, delay_ms: int | None) -> int:
        """A delivery attempt failed: retry later, or dead-letter when attempts are used up.
        Returns 1 when the message was dead-lettered."""
        attempts = g.held[seq]
        max_attempts = g.config["max_attempts"]
        if max_attempts and attempts >= max_attempts:
            self._dead_letter(t, g, seq, reason)
            return 1
        entry = g.inflight.pop(seq)
        self._unbind(t, g, entry[0], seq)
        g.first[seq] = entry[3]
        if delay_ms is None:
            backoff = g.config["backoff"]
            delay_ms = round(backoff[min(attempts, len(backoff)) - 1] * 1000) if backoff else 0
        if delay_ms:
            due = self.now + delay_ms
            g.delayed[seq] = due
            heapq.heappush(self._delays, (due, t.name, g.name, (seq,)))
        elif g.kq is None or is_head(t, g, seq):
            g.ready.append(seq)
        return 0

    def _dead_letter(self, t: Topic, g: Group, seq: int, reason: str) -> None:
        attempts = g.held[seq]
        okey = t.okeys.get(seq) if t.okeys else None
        self._unhold(t, g, seq)
        g.counters["dead_lettered"] += 1
        dlq_name = g.config["dead_letter_topic"]
        got = t.index.get(seq)
        if got is not None and dlq_name is not None:
            payload, old = self.store.read(t.key, seq, got[0], got[1])
            hdrs = dict(old or {})
            hdrs.update(
                {
                    DLQ_PREFIX + "topic": t.name,
                    DLQ_PREFIX + "group": g.name,
                    DLQ_PREFIX + "seq": str(seq),
                    DLQ_PREFIX + "attempts": str(attempts),
                    DLQ_PREFIX + "reason": reason,
                    DLQ_PREFIX + "published-at": str(got[3]),
                }
            )
            self._append_dlq(self._ensure_dlq(dlq_name), payload, hdrs, okey)
        self._settle(t, g, seq)

    def _append(
        self, t: Topic, payload: bytes, hdrs: dict[str, str], okey: str | None, refs: int
    ) -> int:
        """Append one message (a dead letter, a redrive) to the store and the index."""
        seq = t.next_seq
        t.next_seq += 1
        locs, lengths = self.store.append_open(t.key, seq, self.now, [(payload, hdrs)])
        t.index.append(locs[0], lengths[0], len(payload), self.now, refs)
        if okey is not None:
            t.okeys[seq] = okey
        t.count += 1
        t.bytes += len(payload)
        t.counters["published"] += 1
        return seq

    def _append_dlq(self, d: Topic, payload: bytes, hdrs: dict[str, str], okey: str | None) -> None:
        """Dead letters bypass ``reject`` limits (they must never be lost on the way in);
        ``drop_oldest`` still applies. They keep their ordering key."""
        self._append(d, payload, hdrs, okey, len(d.groups))
        for g in d.groups.values():
            g.fresh += 1
        if d.config["overflow"] == "drop_oldest":
            self._enforce_limits(d)
        if d.config["max_age"] is not None:
            self._aging.note(d.name, age_due(d))

    # ------------------------------------------------------------------ admin

    def _op_tick(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        return {"now": self.now}

    def _op_purge(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        t = self._topic(cmd)
        gname = cmd.get("group")
        if gname is None:
            n = t.count
            for g in t.groups.values():
                g.counters["purged"] += len(g.held) + g.fresh
                for seq in list(g.held):
                    self._unhold(t, g, seq)
                g.ready.clear()
                g.skip.clear()
                g.cursor = g.pin = t.next_seq
                g.fresh = 0
            t.pinned = []
            self.store.clear(t.key)  # (every record at once; the stream goes on)
            t.index = MsgIndex(t.next_seq)
            t.okeys = {}
            t.count = 0
            t.bytes = 0
            t.counters["purged"] += n
            return {"topic": t.name, "purged": n}
        g = _group(t, gname)
        n = 0
        for seq in sorted(g.held):
            self._unhold(t, g, seq)
            self._settle(t, g, seq)
            n += 1
        n += self._settle_fresh(t, g)
        g.counters["purged"] += n
        g.cursor = g.pin = t.next_seq
        g.fresh = 0
        g.skip.clear()
        g.ready.clear()
        if g in t.pinned:
            t.pinned.remove(g)
        return {"topic": t.name, "group": g.name, "purged": n}

    def _op_redrive(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        """Move up to ``max`` of the oldest dead letters back to the group they came from."""
        d = self._topic(cmd)
        n = v.integer(cmd.get("max", 100), "max", 1, 100_000)
        moved = 0
        skipped = 0
        seq, end = d.oldest_seq(), d.next_seq  # (not what this redrive appends itself)
        while seq < end and moved < n:
            got = d.index.get(seq)
            seq += 1
            if got is None:
                continue
            payload, old = self.store.read(d.key, seq - 1, got[0], got[1])
            hdrs = old or {}
            src_t = self.topics.get(hdrs.get(DLQ_PREFIX + "topic", ""))
            src_g = hdrs.get(DLQ_PREFIX + "group", "")
            # (headers naming this topic itself come from a publisher, not from dead-lettering)
            if src_t is None or src_t is d or src_g not in src_t.groups:
                skipped += 1
                continue
            new_hdrs = dict(hdrs)
            prior = hdrs.get(REDRIVE_HEADER, "")
            new_hdrs[REDRIVE_HEADER] = str(int(prior) + 1 if _is_num(prior) else 1)
            okey = d.okeys.get(seq - 1) if d.okeys else None
            self._publish_internal(src_t, src_g, payload, new_hdrs, okey)
            self._remove(d, seq - 1)
            moved += 1
        return {"topic": d.name, "redriven": moved, "skipped": skipped}

    def _publish_internal(
        self, t: Topic, group: str, payload: bytes, hdrs: dict[str, str], okey: str | None
    ) -> None:
        """Append one message addressed to one group, bypassing size and backlog limits (it was
        accepted once already), with its ordering key."""
        seq = self._append(t, payload, hdrs, okey, 1)
        for g in t.groups.values():
            if g.name != group:
                g.skip.add(seq)
                if not g.fresh:
                    skip_to_end(t, g)
            else:
                g.fresh += 1
        if t.config["max_age"] is not None:
            self._aging.note(t.name, age_due(t))

    # ------------------------------------------------------------------ store compaction

    def _op_compact(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        """Copy the live records of a mostly-dead segment to its stream's tail. Proposed by the
        leader (``compaction_candidates``); a segment that stopped being a candidate since
        (emptied, retired) is left alone: ``compacted: false``."""
        t = self._topic(cmd)
        segno = v.integer(cmd.get("segment"), "segment", 0, v.MAX_INT)
        if (t.key, segno) not in self.store.candidates():
            return {"topic": t.name, "segment": segno, "compacted": False}
        moved = self.store.compact(t.key, segno, t.index.is_live)
        t.index.relocate(moved)
        return {"topic": t.name, "segment": segno, "compacted": True, "moved": len(moved)}

    def compaction_candidates(self) -> list[dict[str, Any]]:
        """The ``compact`` commands a leader should propose now (at most MAX_COMPACTIONS)."""
        cands = self.store.candidates()
        if not cands:
            return []
        by_key = {t.key: name for name, t in self.topics.items()}
        return [
            {"op": "compact", "topic": by_key[key], "segment": segno}
            for key, segno in cands[:MAX_COMPACTIONS]
            if key in by_key
        ]

    # ------------------------------------------------------------------ cluster settings

    def _op_cluster_settings(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        """Change cluster settings (``validate.CLUSTER_SETTINGS``; a null one goes back to no
        limit). Lowering a limit below what is retained deletes nothing: publishes are refused
        until consumers have drained below it."""
        self.settings = v.cluster_settings(_config(cmd), self.settings)
        return self.storage()

    def storage(self) -> dict[str, Any]:
        """The settings (every one, null when unset) and the payload bytes retained."""
        settings = {**v.CLUSTER_SETTINGS, **self.settings}
        return {"settings": settings, "retained_bytes": self._retained[0]}

    # ------------------------------------------------------------------ API tokens

    def _token(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        tid = cmd.get("id")
        rec = self._tokens.get(tid) if isinstance(tid, str) else None
        if rec is None:
            v.token_id(tid)
            raise TokenNotFound(f"token {tid!r} not found", id=tid)
        return rec

    def _token_fields(
        self, cmd: Mapping[str, Any], tid: str, fields: tuple[str, ...]
    ) -> dict[str, Any]:
        """The given ones of ``fields``, validated: a field given is set (``expires_at: None``
        clears the expiry), one left out keeps its value."""
        out: dict[str, Any] = {}
        for f in fields:
            if f not in cmd:
                continue
            x = cmd[f]
            if f == "name":
                name = v.name(x, "name")
                owner = self._token_names.get(name)
                if owner is not None and owner != tid:
                    raise TokenExists(
                        f"a token named {name!r} already exists", field="name", name=name
                    )
                out[f] = name
            elif f == "grants":
                out[f] = check_grants(x)
            elif f == "expires_at":
                out[f] = None if x is None else v.integer(x, f, 0)
            else:  # cluster, disabled
                out[f] = v.boolean(x, f)
        return out

    def _op_token_create(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        v.unknown(cmd, TOKEN_CREATE_FIELDS, "token_create")
        tid = v.token_id(cmd.get("id"))
        if tid in self._tokens:
            raise TokenExists(f"token {tid!r} already exists", field="id", id=tid)
        for f in ("name", "hash", "grants"):
            if f not in cmd:
                raise InvalidArgument(f"token_create needs {f}", field=f)
        given = self._token_fields(cmd, tid, ("name", "grants", "cluster", "expires_at"))
        rec: dict[str, Any] = {
            "id": tid,
            "name": given["name"],
            "hash": v.fixed_bytes(cmd["hash"], "hash", TOKEN_HASH_BYTES),
            "grants": given["grants"],
            "cluster": given.get("cluster", False),  # may manage membership and tokens
            "expires_at": given.get("expires_at"),  # ms; the node checks it against its clock
            "disabled": False,
            "created_at": self.now,
        }
        self._tokens[tid] = rec
        self._token_names[rec["name"]] = tid
        return {"id": tid, "name": rec["name"], "created_at": self.now}

    def _op_token_update(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        v.unknown(cmd, TOKEN_UPDATE_FIELDS, "token_update")
        rec = self._token(cmd)
        tid = rec["id"]
        changes = self._token_fields(
            cmd, tid, ("name", "grants", "cluster", "expires_at", "disabled")
        )
        if "name" in changes:
            del self._token_names[rec["name"]]
            self._token_names[changes["name"]] = tid
        rec.update(changes)
        return _token_view(rec)

    def _op_token_revoke(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        v.unknown(cmd, TOKEN_REVOKE_FIELDS, "token_revoke")
        rec = self._token(cmd)
        del self._tokens[rec["id"]]
        del self._token_names[rec["name"]]
        return {"id": rec["id"], "revoked": True}

    # ------------------------------------------------------------------ queries (read-only)

    def token(self, token_id: str) -> dict[str, Any] | None:
        """A token's whole record, ``hash`` included, for the node to check a secret against:
        never answer it to a client (``tokens()`` is the public view)."""
        rec = self._tokens.get(token_id) if isinstance(token_id, str) else None
        return None if rec is None else {**_token_view(rec), "hash": rec["hash"]}

    def tokens(self) -> list[dict[str, Any]]:
        """Every token's public view (no hash), by name."""
        return [_token_view(self._tokens[tid]) for _, tid in sorted(self._token_names.items())]

    def list_topics(self) -> list[str]:
        return list(self.topics)

    def overview(self) -> dict[str, Any]:
        """Cluster-wide figures in O(topics + groups), without building each topic's stats:
        ``totals`` (topics, groups, retained messages and bytes, pending, delayed and in-flight
        deliveries), ``topic_counters`` and ``group_counters`` (each counter summed over all
        topics or groups), ``unsettled`` (topic -> messages its groups have yet to settle:
        pending, delayed and in flight) and ``retained`` (topic -> retained messages). (Few
        objects: a scrape with many topics should not set off the garbage collector.)"""
        topic_counters = dict.fromkeys(TOPIC_COUNTERS, 0)
        group_counters = dict.fromkeys(GROUP_COUNTERS, 0)
        unsettled_by_topic: dict[str, int] = {}
        retained: dict[str, int] = {}
        nbytes = groups = pending_total = delayed = in_flight = 0
        for name, t in self.topics.items():
            nbytes += t.bytes
            retained[name] = t.count
            for k, c in t.counters.items():
                topic_counters[k] += c
            unsettled = 0
            for g in t.groups.values():
                n_in_flight, n_delayed = len(g.inflight), len(g.delayed)
                unsettled += g.fresh + len(g.held)
                pending_total += g.fresh + len(g.held) - n_in_flight - n_delayed
                delayed += n_delayed
                in_flight += n_in_flight
                for k, c in g.counters.items():
                    group_counters[k] += c
            groups += len(t.groups)
            unsettled_by_topic[name] = unsettled
        totals = {
            "topics": len(self.topics),
            "groups": groups,
            "messages": sum(retained.values()),
            "bytes": nbytes,
            "pending": pending_total,
            "delayed": delayed,
            "in_flight": in_flight,
        }
        return {
            "totals": totals,
            "topic_counters": topic_counters,
            "group_counters": group_counters,
            "unsettled": unsettled_by_topic,
            "retained": retained,
        }

    def may_deliver(self, topic: str, group: str) -> bool:
        """Cheap over-approximation of "a receive would deliver something now" (a false
        positive costs the caller one empty receive; a false negative never happens). A
        missing topic or group says yes, so the receive itself reports it."""
        t = self.topics.get(topic)
        g = t.groups.get(group) if t is not None else None
        if t is None or g is None:
            return True
        return bool(g.ready) or g.cursor < t.next_seq

    def topic_stats(self, name: str) -> dict[str, Any]:
        t = self._topic({"topic": name})
        oldest = t.published_at(t.oldest_seq()) if t.count else None
        return {
            "topic": t.name,
            "config": v.config_out(t.config, v.TOPIC_OPTIONAL),
            "created_at": t.created_at,
            "messages": t.count,
            "bytes": t.bytes,
            "first_seq": t.oldest_seq() if t.count else None,
            "last_seq": t.next_seq - 1,
            "oldest_age_ms": (self.now - oldest) if oldest is not None else None,
            **{f"{k}_total": c for k, c in t.counters.items()},
            "groups": [self._group_stats(t, g) for g in t.groups.values()],
        }

    def group_stats(self, topic: str, group: str) -> dict[str, Any]:
        t = self._topic({"topic": topic})
        return self._group_stats(t, _group(t, group))

    def _group_stats(self, t: Topic, g: Group) -> dict[str, Any]:
        fresh = g.fresh
        in_flight = len(g.inflight)
        delayed = len(g.delayed)
        ready = len(g.held) - in_flight - delayed
        oldest_seq = min(g.held) if g.held else None
        if fresh:
            s = g.cursor
            while s in g.skip or (s < g.pin and not t.has(s)):
                s += 1
            oldest_seq = s if oldest_seq is None else min(oldest_seq, s)
        at = t.published_at(oldest_seq) if oldest_seq is not None else None
        return {
            "group": g.name,
            "config": _group_config_out(g),
            "pending": fresh + ready,
            "delayed": delayed,
            "in_flight": in_flight,
            "consumers": len(g.by_consumer),
            "oldest_age_ms": (self.now - at) if at is not None else None,
            **{f"{k}_total": c for k, c in g.counters.items()},
        }

    def peek(
        self, topic: str, from_seq: int | None = None, limit: int = 10
    ) -> list[dict[str, Any]]:
        t = self._topic({"topic": topic})
        v.integer(limit, "limit", 1, v.MAX_RECEIVE)
        if from_seq is not None:
            v.integer(from_seq, "from_seq", 0)
        seq = t.oldest_seq() if from_seq is None else max(from_seq, t.oldest_seq())
        out: list[dict[str, Any]] = []
        while seq < t.next_seq and len(out) < limit:
            got = t.index.get(seq)
            if got is not None:
                payload, hdrs = self.store.read(t.key, seq, got[0], got[1])
                d = {
                    "seq": seq,
                    "payload": payload,
                    "headers": hdrs or {},
                    "published_at": got[3],
                }
                if seq in t.okeys:
                    d["ordering_key"] = t.okeys[seq]
                out.append(d)
            seq += 1
        return out

    def digest(self) -> str:
        """A short fingerprint of the whole state, the store's marks included; equal on
        replicas that applied the same log."""
        snap = snapshot.dump(self, self.store.marks()[1], inline=False)
        return hashlib.blake2b(snap, digest_size=16).hexdigest()

    # ------------------------------------------------------------------ snapshot

    def snapshot_cost(self) -> int:
        """About how long ``snapshot`` takes, in microseconds (``snapshot.cost``), so the
        binding can serialize a light state in place instead of forking a writer."""
        return snapshot.cost(self)

    def snapshot(self, marks: Marks | None = None) -> bytes:
        """v9: metadata only, no payloads. ``marks``: the store's, taken by the binding
        (``store.marks()``) under its apply lock; None takes them now.

        A Broker on an in-memory store (``memdisk``: no data directory) has no files another
        node could receive, so its snapshot carries the bytes of the segments its marks name
        as a tenth field, ``[[file name, bytes], ...]``, which ``restore`` writes back into
        an in-memory store first (only there: a store on disk gets them by transfer)."""
        if marks is None:
            marks = self.store.marks()[1]
        return snapshot.dump(self, marks, isinstance(self.store.disk, MemDisk))

    @staticmethod
    def snapshot_marks(data: bytes) -> Marks:
        """The store marks a snapshot names (``[]`` for one older than v7): the segments a
        transfer of it exports."""
        return snapshot.marks_of(data)

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's. v7-v9: the store is cut back to the
        snapshot's marks (``truncate_to``) and each topic's index rebuilt from it; v2-v6: the
        store is emptied and the snapshot's messages appended to it in seq order (so a
        converted node's files may differ from those of a node that applied the log: compare
        such nodes by state, not digest). A bad snapshot raises ValueError and keeps the
        current state (the store, though, may be cut already: restore again or stop); a
        StorageError from the store propagates (the node stops)."""
        try:
            obj = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)
            version = obj[0]
        except Exception as e:
            raise ValueError(f"not a raftq snapshot: {e!r}") from e
        if version not in snapshot.READABLE_SNAPSHOTS:
            raise ValueError(f"unsupported snapshot version {version!r}")
        try:
            fresh = Broker(self.store)
            snapshot.load(fresh, obj)
        except StorageError:
            raise
        except Exception as e:
            raise ValueError(f"corrupt snapshot: {e!r}") from e
        fresh._deadlines_limit = 2 * len(fresh._deadlines) + COMPACT_SLACK
        self.__dict__.update(fresh.__dict__)


def _token_view(rec: dict[str, Any]) -> dict[str, Any]:
    """A token's public view (everything but ``hash``), a copy."""
    return {
        "id": rec["id"],
        "name": rec["name"],
        "grants": [{"topics": g["topics"], "actions": list(g["actions"])} for g in rec["grants"]],
        "cluster": rec["cluster"],
        "expires_at": rec["expires_at"],
        "disabled": rec["disabled"],
        "created_at": rec["created_at"],
    }


def _group_config_out(g: Group) -> dict[str, Any]:
    """A copy: results leave the state machine and must not alias its state."""
    return v.config_out(g.config, v.GROUP_OPTIONAL)


_HANDLERS: dict[str, Any] = {
    "create_topic": Broker._op_create_topic,
    "update_topic": Broker._op_update_topic,
    "delete_topic": Broker._op_delete_topic,
    "create_group": Broker._op_create_group,
    "update_group": Broker._op_update_group,
    "delete_group": Broker._op_delete_group,
    "publish": Broker._op_publish,
    "receive": Broker._op_receive,
    "ack": Broker._op_ack,
    "nack": Broker._op_nack,
    "extend": Broker._op_extend,
    "term": Broker._op_term,
    "release": Broker._op_release,
    "tick": Broker._op_tick,
    "purge": Broker._op_purge,
    "redrive": Broker._op_redrive,
    "token_create": Broker._op_token_create,
    "token_update": Broker._op_token_update,
    "token_revoke": Broker._op_token_revoke,
    "cluster_settings": Broker._op_cluster_settings,
    "compact": Broker._op_compact,
}
