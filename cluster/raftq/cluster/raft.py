"""The Raft binding: the only module that imports pysyncobj.

``RaftNode`` runs one pysyncobj ``SyncObj`` subclass (``_Binding``) on its own tick thread (a
leader: on its event loop, see Threads below) and exposes one replicated entry point:
``await propose(commands)`` turns a batch of broker commands into ONE log entry
(``entry.encode_entry``), replicates it and resolves with the per-command results once it is
committed and applied. Outcomes are definite: a result, ``NotLeader`` /
``QueueFull`` / ``EntryTooLarge`` (definitely not applied) or ``UnknownOutcome`` (maybe).

What it changes in pysyncobj 0.3.17, through its extension points only:

* journal: ``storage.Journal`` (checksummed, fdatasync'ed) replaces the mmap journal; the tick
  loop syncs once per tick after every append, before a leader counts itself toward a majority
  (that happens at the start of the next tick) and before a follower's acknowledgements
  (``next_node_idx`` messages are held back until the sync) leave the node;
* snapshots: ``_Snapshots`` replaces pysyncobj's serializer: msgpack through
  ``Broker.snapshot/restore``, written by a forked child (the tick thread never blocks on a
  large state), sealed with a CRC, temp file + fsync + rename + dir fsync; a snapshot that
  fails to load stops the node; at startup the journal is cut to the snapshot instead of being
  dropped whole when its head does not match (pysyncobj lost the entries after the snapshot);
* acks: a stale ``next_node_idx`` no longer rewinds the follower's next index, and a follower
  receiving entries it already holds no longer truncates its log after them;
* wire: pickle protocol 4, no compression, AES-GCM sealing (``_Sealer``) instead of Fernet; a
  send that does not fit the socket buffer re-arms write interest so it is flushed as soon as
  the socket is writable; one recv per poll event (pysyncobj's read loop is quadratic in a
  burst); snapshot chunks are answered so long transfers do not time out;
* callbacks: proposals are tracked by (index, term) here, never by pysyncobj callbacks, so
  every one resolves (apply, superseded entry, snapshot install, stop or timeout);
* sends: a new entry goes at once only to the followers a majority needs (``_send_new``; the
  rest get it with the next heartbeat), and to all of them if it is not committed within
  ``RESCUE_AFTER`` (pysyncobj sent every entry to every follower at the next heartbeat);
* commit index: a follower's advances only on an append whose log check passed (pysyncobj also
  took the leader's on snapshot messages, over an unchecked log); a ``CommitMark`` lets a
  restarted node apply its journal before it hears from a leader;
* elections: pre-vote (``_hold_election``): a node stands (term + 1) only once a majority
  said it would vote for it, and a node with a live leader says no, so a node cut off and
  back does not depose the leader (pysyncobj steps down on any higher term it is sent);
* reads: ``read_barrier`` confirms leadership with a majority before a read (ReadIndex;
  pysyncobj has no read path, so a deposed leader answered from stale state).

Threads: pysyncobj code runs only under ``_tick_lock``. A follower's runs on the tick thread,
which holds the lock except while it waits for events; a proposal made while it waits is
appended and sent by the caller's thread right away (the tick thread is woken only to sync it).
A leader's runs on the event loop that started the node (``LOOP_TICKS``): Raft's sockets are
one epoll set (``_Wait``) the loop watches, so an ack is read, committed, applied and answered
in one wake-up, and a proposal is appended, sent and synced where it is made; the tick thread
only watches and ticks if the loop has not for ``LOOP_WATCHDOG``. Anything else reaches
pysyncobj through the thread-safe queues here.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import hmac
import itertools
import logging
import os
import pickle
import random
import select
import signal
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON, SERIALIZER_STATE
from pysyncobj.monotonic import monotonic
from pysyncobj.node import TCPNode
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from raftq.cluster.entry import apply_entry, encode_entry
from raftq.cluster.state import Broker
from raftq.cluster.storage import (
    CommitMark,
    Disk,
    Entry,
    Journal,
    MetaStore,
    OsDisk,
    StorageCorrupt,
    StorageError,
    seal_parts,
    unseal,
    write_atomic,
)

__all__ = [
    "EntryTooLarge",
    "NotLeader",
    "QueueFull",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "RaftStatus",
    "StorageCorrupt",
    "StorageError",
    "UnknownOutcome",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

# ---------------------------------------------------------------------------- tuning
# Measured on the shared 2-core box (bench/raft_bench.py, bench/raft_snapshot.py, tests/raft).
TICK = 0.01  # poll timeout of the tick thread; new proposals wake it through a pipe, so this
# only bounds timer resolution. Idle 3-node cluster: 1.3-1.8% CPU per node.
APPEND_PERIOD = 0.05  # heartbeat, which also carries new entries to the followers outside the
# quorum (QUORUM_SENDS). The quorum gets entries as soon as they are appended (pysyncobj
# made each wait for the next period: ~10 commands/s sequentially with the 0.1 s default).
ELECTION_MIN, ELECTION_MAX = 1.0, 2.0  # longest Raft tick seen on the loaded box (load ~5 on
# 2 cores): 250 ms during compaction, 90 ms on a leader streaming a 100 MB snapshot, 16 ms idle;
# the 0.4 s default left too little margin. Applies while the leader's connection is up (a hung
# or partitioned leader); a killed leader's peers see its connection close: see below.
FAST_ELECTION_WINDOW = 2.0  # fast timeouts only this long after the leader's connection dropped
FAST_ELECTION_MIN, FAST_ELECTION_MAX = 0.15, 0.5  # after the connection to the leader drops
# (a killed leader's peers see it close at once), and for retries until a leader is heard from
# again (within FAST_ELECTION_WINDOW). Spread so that two followers rarely stand at once (a
# split vote). kill -9 of the leader -> publishes resume: median 1.37 s, max 3.07 s with the
# normal timeouts only; 0.3-0.5 s, max < 0.9 s with these (raftq bench --cases f).
FAST_ELECTION_SPLIT = 0.3  # with quorum sends (below) a follower outside the quorum lags up to
# a heartbeat: its vote request would be refused by the up-to-date one, and the election then
# waits for the latter's own timeout. So a follower sent new entries as a quorum member in the
# last QUORUM_RECENT seconds stands within 0.15-0.3 s, one sent them only in heartbeats within
# 0.3-0.5 s, an idle one within 0.15-0.5 s. Leader kill -> publishes resume, medians of 4 in
# two runs each: 0.27/0.30 s sending to all followers, 0.42/0.37 s quorum sends alone,
# 0.27/0.29 s with this split.
QUORUM_RECENT = 1.0
LEADER_FALLBACK = 2.5  # an isolated leader steps down soon after the others can elect a new
# one (> ELECTION_MAX) instead of accepting doomed proposals for 30 s (default).
CONNECTION_TIMEOUT = 10.0  # a follower restoring a 1M-message snapshot is busy for ~3 s; with
# 3.5 s (default) the leader cut the connection mid-install and started over. Killed peers are
# noticed at once (RST) and Raft liveness does not depend on this timeout.
RECONNECT = 0.3  # a restarted peer is reconnected within 0.3 s instead of 5 s (default).
SOCKET_BUFFER = 4 << 20  # 64 KiB (default) needs many writable rounds for one 1 MB batch.
MAX_ENTRY_BYTES = 4 << 20  # a proposal larger than this is refused (EntryTooLarge)
APPEND_BATCH_BYTES = 8 << 20  # > MAX_ENTRY_BYTES: an entry never takes pysyncobj's chunked path
COMPACTION_ENTRIES = 10_000  # entries stay in RAM until compacted: 10k batches of 100 x 100 B
# are ~100 MB. A compaction is cheap for the Raft thread (forked writer: 1M messages, 3-6 s in
# the child, longest tick < 0.3 s), so it can run often.
COMPACTION_SECONDS = 300.0
SNAPSHOT_SYNC_EVERY = 4 << 20  # the snapshot writer's flushes, so journal fsyncs pass between
COMPACTION_BYTES = 64 << 20  # also snapshot after this many entry bytes: big batches reach ~1M
# messages in ~1000 entries, which never hit COMPACTION_ENTRIES, so a restart replayed the whole
# journal in one tick (3.6-5.1 s, past the election timeout; raftq bench --cases m: 10-12 s to
# ready with 1M x 100 B). Restoring a snapshot of the same takes ~0.5 s.
QUORUM_SENDS = True  # a new entry goes at once only to the followers a majority needs (1 of
# 2, 2 of 4); the others get it with the next heartbeat (APPEND_PERIOD), batched. One publish
# at a time, two clusters side by side, 16 alternating 1 s rounds: +11 % (100 B) and +19 %
# (1 KiB) on 2 cores (a follower process is no longer woken and fsynced per entry); (b), (c)
# and (d) unchanged within the noise.
RESCUE_AFTER = 0.005  # entries still uncommitted this long after their quorum send go to every
# follower; the first followers to acknowledge them become the new quorum (a stalled one is
# dropped from it). Or after 3x the recent commit time, up to RESCUE_MAX, where commits are
# slower (a network disk, a loaded leader): rescuing every entry would double the sends.
RESCUE_MAX = 0.025
COMMIT_MARK_EVERY = 1.0  # seconds between CommitMark writes (no fsync; also written at stop)
LOOP_TICKS = True  # a leader runs its Raft ticks on the event loop that started the node:
# a follower's ack is read there, commits, applies and answers the request in one wake-up
# instead of waking the tick thread, which then woke the loop (and the loop, on a proposal,
# woke the tick thread to sync). One publish at a time, paired runs: see node/PERF.md.
LOOP_WATCHDOG = 0.05  # ...and the tick thread ticks for a loop that has not for this long
# (a long handler): heartbeats go out as before, whatever the loop is doing.
CATCH_UP_ENTRIES = 256  # ...but a follower further behind than this (or needing the snapshot)
# is caught up by the tick thread: big sends would stall the loop. Quorum sends leave the
# other follower a heartbeat behind: ~30 entries one publish at a time here.
PRE_VOTE = True  # before standing for election (term + 1), ask the others whether they would
# vote (Raft thesis 9.6): a node cut off from the leader no longer raises its term while it is
# away and deposes the healthy leader when it comes back (pysyncobj steps down on any higher
# term in a vote request; the cluster then waited out an election timeout).
PRE_VOTE_WAIT = 0.2  # a pre-vote round not won within this is lost: ask again after a timeout
LEADER_FRESH = 0.5  # a node that heard a leader this recently (10 heartbeats) refuses pre-votes,
# unless its connection to that leader dropped (a killed leader: fast elections stay fast)
HELLO_GRACE = 1.0  # a newly connected peer says within this that it takes part in pre-votes;
# one that does not runs an older version and votes as before: it counts as granting
PRE_VOTE_WARN_EVERY = 30.0  # seconds between warnings about pre-votes lost
_HELLO, _PRE_VOTE, _PRE_VOTE_REPLY = "raftq_hello", "raftq_pre_vote", "raftq_pre_vote_reply"
_READ_PING, _READ_PONG = "raftq_read_ping", "raftq_read_pong"  # see read_barrier
_OURS = frozenset([_HELLO, _PRE_VOTE, _PRE_VOTE_REPLY, _READ_PING, _READ_PONG])
QUEUE_MAX = 4096  # proposals waiting for the tick thread (each is a batch); beyond: QueueFull
PICKLE_PROTOCOL = 4  # a 10 KB append: protocol 2 (pysyncobj's) 124/105 us to dump/load and
# 15 KB on the wire (bytes become latin-1 text); protocol 4: 3.3/3.8 us and 10 KB.
# Wire compression: none. pysyncobj's receiver always inflates, so every message is still a zlib
# stream, but one of stored blocks built by _stored_zlib: zlib.compress at any level (even 0)
# sets up a deflate state per call, ~48 us whatever the size (level 3, pysyncobj's: 50 us for
# 12 KB); a stored stream costs ~1 us. Payloads are opaque and mostly incompressible.

_LEADER, _FOLLOWER, _CANDIDATE = 2, 0, 1
_ROLES = {_LEADER: "leader", _FOLLOWER: "follower", _CANDIDATE: "candidate"}
_REGULAR = b"\x00"  # pysyncobj's _COMMAND_TYPE.REGULAR prefix


# ---------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class RaftConfig:
    node_id: str
    raft_addr: str
    api_addr: str
    peers: dict[str, tuple[str, str]]
    data_dir: str | None
    secret: str | None
    insecure: bool = False
    fsync: str = "always"  # "always" | "never" (never: a power loss can lose acked entries)


class RaftError(Exception):
    """Base of the binding's errors."""


class ReadNotReady(RaftError):
    """A new leader has not committed an entry of its term yet, so it does not know what is
    committed: retry shortly (its first entry, pysyncobj's no-op, commits within a heartbeat)."""


class NotLeader(RaftError):
    """Definitely not applied: this node is not the leader (or lost leadership first)."""

    def __init__(
        self, message: str, leader_id: str | None = None, leader_api: str | None = None
    ) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_api = leader_api


class QueueFull(RaftError):
    """Definitely not applied: too many proposals waiting, or none got into the log in time."""


class EntryTooLarge(RaftError):
    """Definitely not applied: the encoded batch exceeds MAX_ENTRY_BYTES."""


class UnknownOutcome(RaftError, TimeoutError):
    """The entry was appended but its fate is unknown (timeout, leadership lost, stop)."""


@dataclass
class RaftStatus:
    node_id: str
    role: str
    leader_id: str | None
    leader_api: str | None
    term: int
    commit_index: int
    applied_index: int
    members: dict[str, dict[str, Any]]
    running: bool = True
    error: str | None = None
    # The commit index the leader last told this node (its own on the leader), not capped at
    # this node's log as commit_index is; None until a leader was heard from since start.
    leader_commit: int | None = None


# ---------------------------------------------------------------------------- internals

_QUEUED, _LOGGED, _DONE, _CANCELLED = 0, 1, 2, 3


@dataclass(eq=False)
class _Pending:
    fut: asyncio.Future[list[dict[str, Any]]]
    loop: asyncio.AbstractEventLoop
    state: int = _QUEUED
    index: int = 0
    term: int = 0
    logged_at: float = 0.0


_Done = tuple[_Pending, Any, BaseException | None]  # a proposal's result or error
_Listener = tuple[Callable[[], None], asyncio.AbstractEventLoop, Callable[[], bool] | None]
_LoopWork = tuple[list[_Done], list[Callable[[], None]]]  # what one wake-up of a loop runs


class _Sealer:
    """Fills pysyncobj's encryptor slot (Fernet) with AES-128-GCM: same guarantees (secrecy,
    integrity, a timestamp pysyncobj checks per connection) at ~2 us instead of ~50/70 us to
    seal/open a 10 KB message. Each process seals with its own key, derived from the cluster
    secret and a random salt sent in every header, and a message counter as the nonce, so a
    nonce never repeats under one key."""

    _HEAD = struct.Struct(">BQ16s12s")  # version, timestamp, salt, nonce

    def __init__(self, secret: str) -> None:
        self._master = hashlib.pbkdf2_hmac("sha256", secret.encode(), b"raftq-raft-v1", 200_000)
        self._salt = os.urandom(16)
        self._aead = self._key(self._salt)
        self._keys: dict[bytes, AESGCM] = {self._salt: self._aead}
        self._counter = itertools.count(1)
        self._warned = 0.0

    def _key(self, salt: bytes) -> AESGCM:
        key = hmac.new(self._master, b"raftq-seal" + salt, "sha256").digest()[:16]
        return AESGCM(key)

    def encrypt_at_time(self, data: bytes, ts: int) -> bytes:
        return b"".join(self.seal_parts(data, ts))

    def seal_parts(self, data: bytes, ts: int) -> tuple[bytes, bytes]:
        """``encrypt_at_time`` as (header, ciphertext), to be sent without joining them."""
        nonce = next(self._counter).to_bytes(12, "big")
        head = self._HEAD.pack(1, ts, self._salt, nonce)
        return head, self._aead.encrypt(nonce, data, head)

    def extract_timestamp(self, data: bytes) -> int:
        version, ts, _, _ = self._HEAD.unpack_from(data)
        if version != 1:
            raise ValueError("unknown message seal")
        return int(ts)

    def decrypt(self, data: bytes) -> bytes:
        head = data[: self._HEAD.size]
        _, _, salt, nonce = self._HEAD.unpack(head)
        aead = self._keys.get(salt)
        if aead is None:
            if len(self._keys) > 1024:  # peers restart with new salts; keep the map bounded
                self._keys = {self._salt: self._aead}
            aead = self._keys[salt] = self._key(salt)
        try:
            return aead.decrypt(nonce, data[self._HEAD.size :], head)
        except InvalidTag:
            # pysyncobj drops the connection without a word; say why, at most every 10 s.
            now = time.monotonic()
            if now - self._warned > 10:
                self._warned = now
                log.warning(
                    "raft message failed authentication: is the cluster secret the same"
                    " on every node?"
                )
            raise


def _node(addr: str, node_id: str, api: str) -> Any:
    return TCPNode(addr, raftq_id=node_id, raftq_api=api)


class _Snapshots:
    """pysyncobj's serializer interface: checkSerializing, serialize, deserialize and the
    snapshot transmissions (camelCase names are pysyncobj's).

    File layout: ``seal(msgpack([1, last_entry, prev_entry, [[addr, id, api], ...],
    broker_snapshot]))``.
    """

    def __init__(self, owner: RaftNode, disk: Disk | None, path: str | None, chunk: int) -> None:
        self._owner = owner
        self._disk = disk
        self._path = path
        self._chunk = chunk
        self._pid = 0
        self._id: Any = None
        self._mem: bytes | None = None  # in-memory mode, and a received snapshot to load
        self._mem_done = False
        self._started = 0.0
        self._retry_at = 0.0
        self._aborted = False
        self._loaded: tuple[Entry, Entry, list[Any], bytes] | None = None
        self._tx: dict[Any, tuple[bytes, int]] = {}
        self._rx: bytearray | None = None
        self.installed = False  # the next deserialize() is a snapshot install, not startup

    def _blob(self, data: Any) -> list[bytes]:
        """The snapshot file's bytes in parts: ``seal(msgpack(body))`` without copying the
        broker's snapshot twice more (~0.15-0.3 s of the writer's 1-1.5 s for 65 MB)."""
        last, prev, cluster = data[1], data[2], data[3]
        nodes = [
            [n.id, getattr(n, "raftq_id", n.id), getattr(n, "raftq_api", "")]
            for n in sorted(cluster, key=lambda n: str(n.id))
        ]
        snap = self._owner.broker.snapshot()
        head = msgpack.packb([1, list(last), list(prev), nodes], use_bin_type=True)
        # A five-element array: the four above (after their one-byte array header) + bin(snap).
        return seal_parts([b"\x95", head[1:], _bin_header(len(snap)), snap])

    def serialize(self, data: Any, id_: Any) -> None:
        if self._pid or self._mem_done or time.monotonic() < self._retry_at:
            return  # (pysyncobj asks again every tick after a failure)
        self._id = id_
        self._started = time.monotonic()
        if self._disk is None or self._path is None:
            self._mem = b"".join(self._blob(data))
            self._mem_done = True
            return
        # The entries this snapshot covers then sit in older journal segments only: the
        # compaction after it deletes them instead of rewriting the rest.
        journal = self._owner._journal
        if journal is not None:
            journal.roll(id_)
        # A forked child writes the snapshot from a copy-on-write image of the state, so the
        # tick thread (heartbeats) never waits for it: 1M messages take seconds to serialize.
        try:
            pid = os.fork()
        except OSError as e:
            log.error("snapshot %s: cannot fork the writer: %s; retrying in 30 s", self._path, e)
            self._retry_at = time.monotonic() + 30
            return
        if pid == 0:  # pragma: no cover - child process
            code = 1
            try:
                blob = self._blob(data)
                write_atomic(
                    self._disk, self._path, blob, self._owner.fsync, ".w.tmp", SNAPSHOT_SYNC_EVERY
                )
                code = 0
            finally:
                os._exit(code)
        self._pid = pid

    def _abort_writer(self) -> None:
        if not self._pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        os.waitpid(self._pid, 0)
        self._pid = 0
        self._aborted = True

    def checkSerializing(self) -> tuple[int, Any]:
        if self._aborted:
            self._aborted = False
            return SERIALIZER_STATE.FAILED, self._id
        if self._mem_done:
            self._mem_done = False
            self._owner._rearm_compaction()
            return SERIALIZER_STATE.SUCCESS, self._id
        if not self._pid:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        pid, status = os.waitpid(self._pid, os.WNOHANG)
        if pid == 0:
            return SERIALIZER_STATE.SERIALIZING, self._id
        self._pid = 0
        if status == 0:
            self._owner._rearm_compaction()
            self._tx.clear()
            self._owner.stats["snapshots"] += 1
            self._owner.stats["last_snapshot_ms"] = int((time.monotonic() - self._started) * 1000)
            return SERIALIZER_STATE.SUCCESS, self._id
        log.error(
            "snapshot %s: writer failed (status %d); journal kept, retrying in 30 s",
            self._path,
            status,
        )
        self._retry_at = time.monotonic() + 30
        return SERIALIZER_STATE.FAILED, self._id

    def _read(self) -> bytes | None:
        if self._mem is not None:
            return self._mem
        if self._disk is None or self._path is None:
            return None
        return self._disk.read(self._path)

    def exists(self) -> bool:
        return self._read() is not None

    def load(self) -> tuple[Entry, Entry, list[Any], bytes]:
        """Read, check and decode the snapshot: (last entry, previous entry, nodes, state)."""
        blob = self._read()
        if blob is None:
            raise StorageError(f"{self._path}: snapshot missing")
        body = msgpack.unpackb(unseal(blob, str(self._path)), raw=False)
        if not isinstance(body, list) or len(body) != 5 or body[0] != 1:
            raise StorageCorrupt(f"{self._path}: unknown snapshot version")
        _, last, prev, nodes, snap = body
        last_e = (bytes(last[0]), int(last[1]), int(last[2]))
        prev_e = (bytes(prev[0]), int(prev[1]), int(prev[2]))
        return last_e, prev_e, nodes, snap

    def deserialize(self) -> tuple[Any, ...]:
        try:
            loaded, self._loaded = self._loaded, None
            last_e, prev_e, nodes, snap = loaded if loaded is not None else self.load()
            cluster = [_node(addr, nid, api) for addr, nid, api in nodes]
            self._owner._restore(snap, nodes, last_e[1], install=self.installed)
        except Exception as e:
            err = e if isinstance(e, StorageError) else StorageError(f"{self._path}: {e!r}")
            self._owner._fail(err)
            raise err from e
        finally:
            self.installed = False
            if self._disk is not None:
                self._mem = None
        return (None, last_e, prev_e, cluster)

    def getTransmissionData(self, key: Any) -> tuple[bytes, bool, bool] | None:
        if self._pid:
            return None
        tx = self._tx.get(key)
        if tx is None:
            blob = self._read()
            if blob is None:
                return None
            tx = (blob, 0)
        blob, off = tx
        part = blob[off : off + self._chunk]
        if part:
            self._tx[key] = (blob, off + len(part))
        else:
            self._tx.pop(key, None)
        return part, off == 0, not part

    def setTransmissionData(self, data: Any) -> bool:
        if data is None:
            return False
        part, first, last = data
        if first:
            self._rx = bytearray()
        if self._rx is None:
            return False
        self._rx += part
        if not last:
            return False
        blob, self._rx = bytes(self._rx), None
        try:
            unseal(blob, "received snapshot")
        except StorageCorrupt as e:
            log.error("%s; waiting for the leader to resend", e)
            return False
        if self._disk is not None and self._path is not None:
            # Our own writer may still be busy with an older state: stop it, or its rename
            # could land after ours and put the older snapshot back (found by the power-loss
            # stress, which also caught both writers sharing one temp file).
            self._abort_writer()
            try:  # durable before pysyncobj clears the journal
                write_atomic(self._disk, self._path, blob, self._owner.fsync, ".rx.tmp")
            except OSError as e:
                self._owner._fail(StorageError(f"{self._path}: {e}"))
                return False
        self._mem = blob
        self.installed = True
        return True

    def cancelTransmisstion(self, key: Any) -> None:
        self._tx.pop(key, None)


class _Transport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport, whose server closes the socket of a failed bind attempt
    (pysyncobj retries the bind, from its constructor on, and left each failed socket open)."""

    def _createServer(self) -> None:
        super()._createServer()
        _close_socket_on_failed_bind(self._server)


class _Binding(SyncObj):  # type: ignore[misc]
    """The SyncObj subclass: one replicated method taking bytes."""

    def __init__(self, owner: RaftNode, self_node: Any, others: list[Any], conf: Any) -> None:
        self._rq = owner
        super().__init__(self_node, others, conf, transportClass=_Transport)

    @replicated  # type: ignore[untyped-decorator]
    def raftq_apply(self, data: bytes) -> None:
        self._rq._apply(data)

    def _SyncObj__generateRaftTimeout(self) -> float:  # pysyncobj calls it by this name
        return self._rq._election_timeout()

    def _SyncObj__connectedToAnyone(self) -> bool:
        # pysyncobj asks this only right before it stands for election: the pre-vote gate
        return bool(super()._SyncObj__connectedToAnyone()) and self._rq._may_stand()

    def _checkCommandsToApply(self) -> None:
        super()._checkCommandsToApply()  # membership changes (pysyncobj's own queue)
        self._rq._drain()
        self._rq._deliver_all()  # before this tick's poll, which may wait a whole TICK


class _Read:
    """A read barrier waiting for a majority's answers to ping ``seq`` and for ``index``
    applied (see RaftNode.read_barrier)."""

    __slots__ = ("fut", "index", "loop", "seq")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fut: asyncio.Future[None] = loop.create_future()
        self.seq = self.index = 0


# ---------------------------------------------------------------------------- the node


class RaftNode:
    def __init__(
        self,
        config: RaftConfig,
        broker: Broker | None = None,
        *,
        disk: Disk | None = None,
        compaction_entries: int = COMPACTION_ENTRIES,
        fix_stale_acks: bool = True,
        fix_partial_sends: bool = True,
        socket_buffer: int = SOCKET_BUFFER,
        quorum_sends: bool = QUORUM_SENDS,
        loop_ticks: bool = LOOP_TICKS,
        pre_vote: bool = PRE_VOTE,
    ) -> None:
        if config.fsync not in ("always", "never"):
            raise ValueError(f"fsync must be 'always' or 'never', not {config.fsync!r}")
        if not config.secret and not config.insecure:
            raise RaftError(
                "refusing to start without a cluster secret: Raft messages are pickled, so"
                " anyone reaching the Raft port could run code; set a secret (insecure=True"
                " only for local development)"
            )
        self.config = config
        self.broker = broker if broker is not None else Broker()
        self.fsync = config.fsync == "always"
        self._disk: Disk = disk if disk is not None else OsDisk()
        self._compaction_entries = compaction_entries
        self._since_compaction = 0  # entry bytes applied since the last forced compaction
        self._compaction_bytes = _jitter(COMPACTION_BYTES)
        self._fix_acks = fix_stale_acks
        self._fix_sends = fix_partial_sends
        self._quorum_sends = quorum_sends
        self._quorum: list[Any] = []  # followers sent new entries at once (see _send_new)
        self._race: tuple[int, int, list[Any]] | None = None  # (index, term, first acks)
        self._commit_s = 0.0  # moving average: our entries' append -> apply (quorum sends)
        self._socket_buffer = socket_buffer
        self._rview = memoryview(bytearray(socket_buffer))  # reads land here (under _tick_lock)
        self._lock = threading.Lock()  # apply vs reads
        self._tick_lock = threading.Lock()  # pysyncobj's state; the tick thread's but in its waits
        self._ticking = False  # the tick thread holds _tick_lock (its waits may release it)
        self._tick_ident = 0  # the tick thread's id
        # A leader's ticks run on the event loop that started the node (LOOP_TICKS; see
        # _loop_tick): while _on_home is set (under _tick_lock) the tick thread only watches.
        self._loop_ticks = loop_ticks
        self._home: asyncio.AbstractEventLoop | None = None
        self._home_ident = 0
        self._on_home = False
        # (loop, epoll fd) while that loop watches _wait (set and cleared on that loop only)
        self._attached: tuple[asyncio.AbstractEventLoop, int] | None = None
        self._home_timer: asyncio.TimerHandle | None = None
        self._home_ticked_at = 0.0
        self._unpark = threading.Event()
        self._wait: _Wait | None = None
        self._closed = False  # pysyncobj destroyed (set under _tick_lock)
        self._qlock = threading.Lock()  # proposal queue and pending table
        self._queue: deque[tuple[bytes, _Pending]] = deque()
        self._pending: dict[int, _Pending] = {}
        self._done: list[_Done] = []
        self._calls: deque[Callable[[], None]] = deque()
        self._acks: list[tuple[Any, Any]] = []
        self._ack_next: dict[Any, int] = {}  # the verified next index for a duplicate append
        # (callback, its loop, wanted): see add_apply_listener
        self._listeners: list[_Listener] = []
        self._applied = False  # entries applied since the last _deliver_all
        self._fatal: BaseException | None = None
        self._stopping = False
        self._leader_lost = False  # the connection to the leader dropped; none heard from since
        self._leader_lost_until = 0.0
        self._quorum_sending = False  # _send_new is sending to the quorum (tags the appends)
        self._quorum_at = self._lagging_at = -QUORUM_RECENT  # new entries: as a quorum member
        # / only in heartbeats (see FAST_ELECTION_SPLIT)
        self._send_pending = False  # appended off the tick thread, to be sent by it
        self._orig_disconnected: Any = None
        self._orig_connected: Any = None
        # Pre-vote (see _hold_election); times on pysyncobj's clock.
        self._pre_vote = pre_vote
        self._pre_voters: set[str] = set()  # peers that said they take part (raftq_hello)
        self._connected_at: dict[str, float] = {}
        self._heard_leader_at = -LEADER_FRESH
        self._hello_due: set[Any] = set()  # connected peers not yet greeted
        self._round: tuple[int, float, set[str]] | None = None  # (term, until, peers granting)
        self._won: tuple[int, float] | None = None  # pysyncobj may stand for (term, until)
        self._ahead_term = -1  # our term while a leader of an older one is heard (see _may_stand)
        self._pre_vote_warned = -PRE_VOTE_WARN_EVERY
        # Read barriers (see read_barrier): pings sent, the highest each peer answered in
        # _read_term, and the barriers waiting.
        self._read_seq = 0
        self._read_term = -1
        self._read_acked: dict[str, int] = {}
        self._read_pinged_at = 0.0
        self._read_queue: deque[_Read] = deque()  # from read_barrier, started by the next tick
        self._reads: list[_Read] = []
        self._readers: set[str] = set()  # peers that answer read pings (said so in hello)
        self._thread: threading.Thread | None = None
        self._b: Any = None
        self._journal: Journal | None = None
        self._snaps: _Snapshots | None = None
        self._commit_mark: CommitMark | None = None
        self._commit_marked_at = 0.0
        self._dir_lock: int | None = None  # fd holding data_dir/LOCK
        self._notifier: Any = None
        self._func: Any = None
        self._orig_send: Any = None
        self._orig_on_message: Any = None
        self._info: dict[str, tuple[str, str]] = {
            config.raft_addr: (config.node_id, config.api_addr)
        }
        for nid, (raddr, api) in config.peers.items():
            self._info[raddr] = (nid, api)
        self.stats = {
            "stale_acks_ignored": 0,
            "duplicate_appends": 0,
            "rearmed_sends": 0,
            "syncs": 0,
            "sync_us": 0,
            "max_tick_ms": 0,
            "snapshots": 0,
            "last_snapshot_ms": 0,
            "fast_elections": 0,
            "rescues": 0,
            "loop_ticks": 0,
            "watchdog_ticks": 0,
            "catch_up_handbacks": 0,
            "pre_votes": 0,
            "pre_votes_won": 0,
            "pre_votes_lost": 0,
            "pre_votes_refused": 0,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        cfg = self.config
        journal_path = meta_path = snap_path = None
        if cfg.data_dir is not None:
            os.makedirs(cfg.data_dir, exist_ok=True)
            # Before anything touches the files: a second process on the same directory
            # truncated and zero-filled the running node's journal while it appended.
            self._dir_lock = _lock_data_dir(cfg.data_dir)
            journal_path = os.path.join(cfg.data_dir, "journal.log")
            meta_path = os.path.join(cfg.data_dir, "meta.bin")
            snap_path = os.path.join(cfg.data_dir, "snapshot.bin")
            try:
                meta = MetaStore(self._disk, meta_path, self.fsync)
                journal = Journal(self._disk, journal_path, meta, self.fsync)
            except BaseException:
                self._unlock_dir()
                raise
            self._commit_mark = CommitMark(self._disk, os.path.join(cfg.data_dir, "commit.bin"))
            disk: Disk | None = self._disk
        else:
            journal = Journal(None, None, None)
            disk = None
        conf = SyncObjConf(
            autoTick=False,  # our own tick loop: sync, flush held acks, deliver completions
            autoTickPeriod=TICK,
            password=None,  # pysyncobj's Fernet is replaced by _Sealer below
            bindAddress=cfg.raft_addr,  # never 0.0.0.0 (pysyncobj's default for a host)
            bindRetryTime=0.1,
            maxBindRetries=10,
            appendEntriesPeriod=APPEND_PERIOD,
            raftMinTimeout=ELECTION_MIN,
            raftMaxTimeout=ELECTION_MAX,
            leaderFallbackTimeout=LEADER_FALLBACK,
            connectionTimeout=CONNECTION_TIMEOUT,
            connectionRetryTime=RECONNECT,
            sendBufferSize=self._socket_buffer,
            recvBufferSize=self._socket_buffer,
            appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
            logCompactionBatchSize=1 << 20,
            logCompactionMinEntries=int(_jitter(self._compaction_entries)),
            logCompactionMinTime=COMPACTION_SECONDS,
            commandsQueueSize=1000,  # pysyncobj's queue: membership changes only
            commandsWaitLeader=False,  # a proposal without a leader fails at once (NotLeader)
            dynamicMembershipChange=True,
        )
        others = [_node(raddr, nid, api) for nid, (raddr, api) in cfg.peers.items()]
        try:
            b = _Binding(self, _node(cfg.raft_addr, cfg.node_id, cfg.api_addr), others, conf)
        except Exception as e:
            journal._destroy()
            self._unlock_dir()
            raise RaftError(f"cannot start Raft on {cfg.raft_addr}: {e!r}") from e
        self._b = b
        # Our journal and serializer replace the ones pysyncobj built (before any tick ran).
        if len(journal) == 0:
            journal.add(b"\x01", 1, 0)  # pysyncobj's initial no-op entry
            journal.sync()
        b._SyncObj__raftLog = journal
        b._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
        b._SyncObj__votedForNodeId = journal.getVotedForNodeId()
        b._SyncObj__raftCommitIndex = 1
        b._SyncObj__needLoadDumpFile = False
        self._journal = journal
        self._snaps = _Snapshots(self, disk, snap_path, 1 << 20)
        b._SyncObj__serializer = self._snaps
        self._func = b._methodToID[b._getFuncName("raftq_apply")]
        transport = b._SyncObj__transport
        if cfg.secret:
            sealer = _Sealer(cfg.secret)
            b._SyncObj__encryptor = sealer  # read by the transport for every new connection
            for conn in transport._connections.values():  # made in __init__, not yet connected
                conn.encryptor = sealer
        self._orig_send = transport.send
        self._orig_on_message = b._SyncObj__onMessageReceived
        transport.send = self._send
        transport.setOnMessageReceivedCallback(self._on_message)
        self._orig_disconnected = transport._onNodeDisconnectedCallback
        transport.setOnNodeDisconnectedCallback(self._on_disconnected)
        self._orig_connected = transport._onNodeConnectedCallback
        transport.setOnNodeConnectedCallback(self._on_connected)
        self._install_wait(b._poller)
        self._notifier = PipeNotifier(b._poller)
        if self._snaps.exists():
            try:
                self._snaps._loaded = loaded = self._snaps.load()
            except StorageError as e:
                self._fail(e)
            else:
                self._align_journal(journal, loaded[1], loaded[0])
                b._SyncObj__loadDumpFile(clearJournal=False)
        elif journal[0][1] > 1:
            self._fail(
                StorageCorrupt(
                    f"{journal_path}: starts at entry {journal[0][1]} but"
                    f" the snapshot before it is missing"
                )
            )
        if self._fatal is None:
            try:
                self._apply_marked()
            except StorageError as e:
                self._fail(e)
        if self._fatal is not None:
            b._doDestroy()
            self._close_notifier()
            raise self._fatal
        if not cfg.secret:
            log.warning(
                "raft %s: INSECURE, no cluster secret: anyone reaching %s can run code"
                " in this process",
                cfg.node_id,
                cfg.raft_addr,
            )
        # Loading a large snapshot takes seconds: start the election clock now, not at __init__,
        # or this node calls an election (and deposes a healthy leader) on its first tick.
        b._SyncObj__raftElectionDeadline = monotonic() + b._SyncObj__generateRaftTimeout()
        if self._loop_ticks:
            with contextlib.suppress(RuntimeError):  # no running loop: the tick thread only
                self._home = asyncio.get_running_loop()
                self._home_ident = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name=f"raft-{cfg.node_id}", daemon=True)
        self._thread.start()

    def _apply_marked(self) -> None:
        """At start, before the election clock runs: apply the journal up to the commit mark
        (see ``CommitMark``), if the journal still holds that entry with the same term."""
        mark, journal, b = self._commit_mark, self._journal, self._b
        done = max(b._SyncObj__raftCommitIndex, b._SyncObj__raftLastApplied)
        if mark is None or journal is None or mark.index <= done:
            return  # (a mark older than the snapshot: nothing to replay)
        if journal.term_at(mark.index) != mark.term:
            log.warning(
                "raft %s: commit mark %d (term %d) not in the journal: ignored",
                self.config.node_id,
                mark.index,
                mark.term,
            )
            return
        t0 = time.monotonic()
        first = b._SyncObj__raftLastApplied
        b._SyncObj__raftCommitIndex = mark.index
        b._SyncObj__applyLogEntries()
        log.info(
            "raft %s: applied entries %d-%d (committed before the restart) in %.2f s",
            self.config.node_id,
            first + 1,
            mark.index,
            time.monotonic() - t0,
        )

    def _mark_commit(self, now: bool) -> None:
        """Tick thread, after the journal sync: keep the commit mark within a second."""
        mark, journal = self._commit_mark, self._journal
        if mark is None or journal is None:
            return
        idx = self._b._SyncObj__raftCommitIndex
        t = time.monotonic()
        if idx <= mark.index or (not now and t - self._commit_marked_at < COMMIT_MARK_EVERY):
            return
        term = journal.term_at(idx)
        if term is None:
            return
        self._commit_marked_at = t
        try:
            mark.store(idx, term)
        except OSError as e:  # a hint only: the next write may succeed
            log.warning("raft %s: commit mark not written: %s", self.config.node_id, e)

    @staticmethod
    def _align_journal(journal: Journal, prev: Entry, last: Entry) -> None:
        """pysyncobj keeps the journal at startup only if it begins exactly with the snapshot's
        last two entries, and otherwise throws ALL of it away, entries after the snapshot
        included. A crash between writing a snapshot and compacting the journal leaves a
        longer head, and the node lost acknowledged entries (found by the power-loss test).
        Cut the head to the snapshot instead; keep everything after it."""
        pos = prev[1] - journal[0][1]
        if pos > 0 and pos + 1 < len(journal) and journal[pos] == prev and journal[pos + 1] == last:
            journal.deleteEntriesTo(pos)

    def _run(self) -> None:
        stats = self.stats
        last = time.monotonic()
        self._tick_ident = threading.get_ident()
        # Held from one tick to the next: only the poll wait releases it, so an entry appended
        # by another thread is always synced (_after_tick) before a tick counts it (found by
        # review: a single node committed such an entry unsynced when the lock was free between
        # ticks).
        with self._tick_lock:
            self._ticking = True
            try:
                while not self._stopping and self._fatal is None:
                    if self._on_home:
                        self._watch_home()
                        last = time.monotonic()
                        continue
                    self._tick()
                    now = time.monotonic()
                    # Longest tick (poll wait included): heartbeats stop while it runs.
                    stats["max_tick_ms"] = max(stats["max_tick_ms"], int((now - last) * 1000))
                    last = now
                    if (
                        self._home is not None
                        and self._b._SyncObj__raftState == _LEADER
                        and not self._catching_up()
                    ):
                        self._go_home()
            finally:
                self._ticking = False
            if self._on_home:
                self._leave_home()  # (the loop lets go of the sockets before they close)
            self._closed = True
            try:
                if self._fatal is None:
                    self._after_tick()
            except Exception:
                log.exception("final flush failed")
            try:
                self._b._doDestroy()
            except Exception:
                log.exception("closing raft failed")
            self._unlock_dir()
        self._fail_all()

    def _unlock_dir(self) -> None:
        # A snapshot writer still running shares the lock (forked with it): end it first, or
        # a restart on this directory is refused until it finishes. Its snapshot is not needed:
        # the journal is compacted only after a writer succeeds.
        if self._snaps is not None:
            with contextlib.suppress(Exception):
                self._snaps._abort_writer()
        fd, self._dir_lock = self._dir_lock, None
        if fd is not None:
            os.close(fd)

    def _tick(self, block: bool = True) -> float:
        """One pysyncobj tick and our flush after it; returns how long the next may wait."""
        wait = TICK
        journal = self._journal
        try:
            if journal is not None and journal.dirty:
                # Appended since the last sync (a proposal from another thread while the loop
                # ticks): this tick may count the leader's own entries toward commit.
                self._sync(journal)
            if self._quorum and self._pending:
                wait = self._rescue()
            if self._hello_due:
                self._greet()
            if self._pre_vote:
                self._hold_election()
            self._b.doTick(wait if block else 0.0)
        except StorageError as e:
            self._fail(e)
            return wait
        except Exception:
            log.exception("raft tick failed")
        try:
            # Always, even after a failed tick: the next tick counts the leader's own
            # entries toward commit, so they must be synced first.
            self._after_tick()
        except StorageError as e:
            self._fail(e)
        except Exception:
            log.exception("raft flush failed")
            if threading.get_ident() == self._tick_ident:  # never on the event loop
                time.sleep(TICK)
        return wait

    # ------------------------------------------------------------------ a leader's loop ticks

    def _go_home(self) -> None:
        """Tick thread, now leader: hand the ticks to the event loop (see LOOP_TICKS)."""
        home = self._home
        assert home is not None
        self._on_home = True
        self._home_ticked_at = time.monotonic()
        try:
            home.call_soon_threadsafe(self._loop_tick)
        except RuntimeError:  # the loop is closed: keep ticking here
            self._on_home = False
            self._home = None

    def _watch_home(self) -> None:
        """Tick thread while the loop ticks: wait, and tick for the loop if it has not for
        LOOP_WATCHDOG (it is busy elsewhere) so that heartbeats still go out."""
        self._tick_lock.release()
        try:
            # (Looks without the lock: taking it would make the loop's next tick wait.)
            while not self._unpark.wait(LOOP_WATCHDOG):
                home = self._home
                if (
                    not self._on_home
                    or self._stopping
                    or self._fatal is not None
                    or home is None
                    or not home.is_running()
                    or time.monotonic() - self._home_ticked_at >= LOOP_WATCHDOG
                ):
                    break
        finally:
            self._tick_lock.acquire()
        self._unpark.clear()
        if not self._on_home or self._stopping or self._fatal is not None:
            return
        home = self._home
        if home is None or not home.is_running():
            self._leave_home()
            self._home = None  # that loop ended (the node outlived it): tick here from now on
            return
        if time.monotonic() - self._home_ticked_at >= LOOP_WATCHDOG:
            self.stats["watchdog_ticks"] += 1
            self._tick(block=False)
            if (
                self._b._SyncObj__raftState != _LEADER
                or self._fatal is not None
                or self._catching_up()
            ):
                self._leave_home()

    def _catching_up(self) -> bool:
        """A connected follower lags by more than CATCH_UP_ENTRIES or needs the snapshot: its
        sends (8 MB batches, snapshot chunks) belong on the tick thread, not the API's loop."""
        b, journal = self._b, self._journal
        if journal is None:
            return False
        behind = max(journal[0][1], journal[-1][1] - CATCH_UP_ENTRIES)
        nxt, connected = b._SyncObj__raftNextIndex, b._SyncObj__connectedNodes
        if any(n in connected and nxt.get(n, 0) <= behind for n in b._SyncObj__otherNodes):
            if self._on_home:
                self.stats["catch_up_handbacks"] += 1
            return True
        return False

    def _leave_home(self) -> None:
        """Under _tick_lock: the tick thread ticks again; the loop stops watching."""
        self._on_home = False
        self._unpark.set()
        attached = self._attached
        if attached is None:
            return
        if threading.get_ident() == self._home_ident:
            self._detach_home()
        else:
            with contextlib.suppress(RuntimeError):  # closed: it watches nothing any more
                attached[0].call_soon_threadsafe(self._detach_home)

    def _detach_home(self, close: bool = False) -> None:
        """Loop thread: stop watching Raft's sockets (whoever decided to); ``close``: and
        close their epoll set (the node stopped)."""
        if self._home_timer is not None:
            self._home_timer.cancel()
            self._home_timer = None
        attached, self._attached = self._attached, None
        if attached is not None:
            with contextlib.suppress(Exception):
                attached[0].remove_reader(attached[1])
        wait = self._wait
        if close and wait is not None:
            self._wait = None
            wait.close()

    def _loop_tick(self) -> None:
        """Event loop thread, leader: handle Raft's socket events and run a tick, as the tick
        thread would. Called when any Raft socket has an event, by a timer (heartbeats,
        elections, rescues) and once on taking over."""
        home = self._home
        if not self._on_home or home is None:
            self._detach_home()
            return
        if not self._tick_lock.acquire(blocking=False):
            # The tick thread is ticking for a busy loop (LOOP_WATCHDOG): never block the loop
            # on it; stop watching the sockets (they would report the same events again and
            # again) and look again shortly.
            self._detach_home()
            self._home_timer = home.call_later(0.001, self._on_home_timer)
            return
        try:
            nxt = self._loop_tick_locked(home)
        finally:
            self._tick_lock.release()
        if nxt is None:
            return
        timer = self._home_timer
        due = home.time() + nxt
        if timer is None or timer.when() > due + 0.001:
            if timer is not None:
                timer.cancel()
            self._home_timer = home.call_at(due, self._on_home_timer)

    def _loop_tick_locked(self, home: asyncio.AbstractEventLoop) -> float | None:
        """``_loop_tick`` under ``_tick_lock``: how long until the next tick is due, or None
        once the tick thread takes over again."""
        wait = self._wait
        if not self._on_home or wait is None:
            self._detach_home()
            return None
        if self._stopping or self._fatal is not None:
            self._leave_home()  # the tick thread ends the node (as it would have ticked)
            return None
        if self._attached is None:
            fd = wait.fileno()
            home.add_reader(fd, self._loop_tick)
            self._attached = (home, fd)
        stats = self.stats
        stats["max_tick_ms"] = max(
            stats["max_tick_ms"], int((time.monotonic() - self._home_ticked_at) * 1000)
        )
        stats["loop_ticks"] += 1
        try:
            self._b._poller.poll(0)  # acks first: this tick commits what they confirm
        except StorageError as e:  # (a vote for a newer term not stored: stop, as in a tick)
            self._fail(e)
        except Exception:
            log.exception("raft poll failed")
        nxt = TICK if self._fatal is not None else self._tick(block=False)
        wait.rearm()  # what is still unread wakes the loop again at once
        self._home_ticked_at = time.monotonic()
        if (
            self._stopping
            or self._fatal is not None
            or self._b._SyncObj__raftState != _LEADER
            or self._catching_up()
        ):
            self._leave_home()
            return None
        return nxt

    def _on_home_timer(self) -> None:
        self._home_timer = None
        self._loop_tick()

    def _close_notifier(self) -> None:
        n, self._notifier = self._notifier, None
        if n is not None:
            for fd in (n._PipeNotifier__pipeR, n._PipeNotifier__pipeW):
                with contextlib.suppress(OSError):
                    os.close(fd)
        wait, attached = self._wait, self._attached
        if wait is None:
            return
        if attached is None:
            self._wait = None
            wait.close()
        elif threading.get_ident() == self._home_ident:
            self._detach_home(close=True)
        else:  # the loop still watches it: it lets go first
            try:
                attached[0].call_soon_threadsafe(self._detach_home, True)
            except RuntimeError:  # closed: nobody watches any more
                self._wait = None
                wait.close()

    def _install_wait(self, poller: Any) -> None:
        """Swap the ``select.poll`` object inside pysyncobj's poller for a ``_Wait``. Only the
        server socket may be subscribed yet (pysyncobj binds in its constructor), for reads."""
        callbacks = getattr(poller, "_PollPoller__descrToCallbacks", None)
        inner = getattr(poller, "_PollPoller__poll", None)
        if callbacks is None or inner is None:
            raise RaftError(f"unexpected pysyncobj poller {type(poller).__name__}")
        wait = _Wait(self)
        for fd in callbacks:
            with contextlib.suppress(KeyError, OSError):
                inner.unregister(fd)
                os.fstat(fd)
                wait.register(fd, select.POLLIN | select.POLLERR)
        poller._PollPoller__poll = self._wait = wait

    async def stop(self) -> None:
        self._stopping = True
        self._unpark.set()
        self._wake()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
            if not self._thread.is_alive():
                self._close_notifier()  # here, not on the tick thread: _wake() may be writing
        self._fail_all()

    def _fail(self, err: BaseException) -> None:
        if self._fatal is None:
            log.critical("raft node %s stopped: %s", self.config.node_id, err)
            self._fatal = err

    def _fail_all(self) -> None:
        with self._qlock:
            queued = list(self._queue)
            self._queue.clear()
            pending = list(self._pending.values())
            self._pending.clear()
            for _, p in queued:
                if p.state == _QUEUED:
                    p.state = _DONE
                    self._done.append((p, None, NotLeader("node stopping; not applied")))
            for p in pending:
                if p.state == _LOGGED:
                    p.state = _DONE
                    self._done.append((p, None, UnknownOutcome("node stopped before commit")))
        reads, self._reads = self._reads, []
        while self._read_queue:
            reads.append(self._read_queue.popleft())
        for r in reads:
            self._settle_read(r, NotLeader("node stopping"))
        self._deliver_all()

    # ------------------------------------------------------------------ tick thread

    def _wake(self) -> None:
        home = self._home
        if self._on_home and home is not None and threading.get_ident() == self._home_ident:
            home.call_soon(self._loop_tick)  # the ticking loop itself: no pipe needed
            return
        n = self._notifier
        if n is not None:
            with contextlib.suppress(OSError):  # pipe full: a wake-up is already pending
                n.notify()

    def _after_tick(self) -> None:
        journal = self._journal
        assert journal is not None
        try:
            if self._send_pending:
                self._send_pending = False
                if self._b._SyncObj__raftState == _LEADER:
                    self._b._SyncObj__sendAppendEntries()
        finally:
            if journal.dirty:
                self._sync(journal)
        self._mark_commit(self._closed)
        self._bound_reads()
        if journal._broken is not None:  # (pysyncobj swallows a failed snapshot install)
            self._fail(journal._broken)
        if self._acks:
            acks, self._acks = self._acks, []
            # A node that failed (a snapshot it could not install, a journal it could not
            # write) acks nothing: the ack would claim entries it does not hold.
            if self._fatal is None:
                for node, msg in acks:
                    self._send_now(node, msg)
        if self._reads:
            self._check_reads()
        self._deliver_all()

    def _bound_reads(self) -> None:
        """pysyncobj reads a socket until it would block and only then parses, growing its
        buffer with ``+=`` and cutting every message off the front with a copy: both are
        quadratic in a burst. A 100 MB snapshot sent to a restarted follower froze it for
        10 s per attempt (the leader timed out and started over, forever). One recv per poll
        event bounds the buffer; the poller is level-triggered, so the rest comes next.
        That recv fills one preallocated buffer of the socket buffer's size: pysyncobj's
        ``recv(4 MiB)`` allocates 4 MiB per call (~24 us for a 12 KB message; 3 us now), and
        a smaller recv size makes a large append take many poll rounds."""
        transport = self._b._SyncObj__transport
        for conn in [*transport._connections.values(), *transport._unknownConnections]:
            if not getattr(conn, "_raftq_bounded", False):
                conn._raftq_bounded = True
                conn._TcpConnection__tryReadBuffer = functools.partial(
                    _read_once, conn, self._rview
                )

    def _sync(self, journal: Journal) -> None:
        t0 = time.perf_counter()
        journal.sync()
        self.stats["syncs"] += 1
        self.stats["sync_us"] += int((time.perf_counter() - t0) * 1e6)

    def _deliver_all(self) -> None:
        applied, self._applied = self._applied, False
        if not self._done and not (applied and self._listeners):
            return
        done, self._done = self._done, []
        by_loop: dict[asyncio.AbstractEventLoop, _LoopWork] = {}
        for item in done:
            by_loop.setdefault(item[0].loop, ([], []))[0].append(item)
        if applied:
            for cb, loop, wanted in self._listeners:
                if wanted is None or wanted():
                    by_loop.setdefault(loop, ([], []))[1].append(cb)
        here = threading.get_ident() == self._home_ident
        for loop, work in by_loop.items():
            # One wake-up per loop for a tick's completions and apply listeners, not one per
            # proposal or entry (none for the loop running this tick); a closed loop means
            # nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                if here and loop is self._home:
                    loop.call_soon(_on_loop, work)
                else:
                    loop.call_soon_threadsafe(_on_loop, work)

    def _drain(self) -> None:
        while self._calls:
            self._calls.popleft()()
        if self._read_queue:
            self._start_reads()
        self._append_queued(sync=True)

    def _append_queued(self, sync: bool) -> None:
        """Append the queued proposals (one entry each) and send them at once. With ``sync``
        False (caller's thread) the journal stays dirty: the woken tick thread syncs it in
        ``_after_tick``, before its next tick counts the leader's own entries toward commit."""
        if not self._queue:
            return
        b = self._b
        journal = self._journal
        assert journal is not None
        added = 0
        with self._qlock:
            leader = b._SyncObj__raftState == _LEADER
            err = None if leader else self._not_leader("lost leadership before appending")
            while self._queue:
                data, p = self._queue.popleft()
                if p.state != _QUEUED:
                    continue
                if err is not None:
                    p.state = _DONE
                    self._done.append((p, None, err))
                    continue
                idx = journal[-1][1] + 1
                term = b._SyncObj__raftCurrentTerm
                cmd = _REGULAR + pickle.dumps((self._func, (data,)), PICKLE_PROTOCOL)
                journal.add(cmd, idx, term)
                p.state, p.index, p.term, p.logged_at = _LOGGED, idx, term, time.monotonic()
                prev = self._pending.get(idx)
                if prev is not None and prev.state == _LOGGED:
                    # An older entry of ours at this index is gone from this leader's log: it
                    # is not committed yet, but a later leader that still holds it may commit
                    # it (with 5 nodes, after more elections), so its outcome is unknown.
                    prev.state = _DONE
                    gone = UnknownOutcome(f"entry {idx} was superseded here; it may yet commit")
                    self._done.append((prev, None, gone))
                self._pending[idx] = p
                added += 1
        if added:
            # Send now (pysyncobj would wait for the next heartbeat), then sync while the
            # followers do the same: the leader counts itself at the start of the next tick.
            # From the caller's thread only to followers that have everything before these
            # entries: catching one up (batches up to 8 MB, or the snapshot) would stall the
            # event loop; the tick thread sends then, once woken (a leader whose loop ticks
            # sends them there in any case).
            first_new = journal[-1][1] - added + 1
            if not self._send_new(first_new):
                if sync:
                    b._SyncObj__sendAppendEntries()
                else:
                    self._send_pending = True
            if sync:
                self._sync(journal)
                if not b._SyncObj__otherNodes:
                    self._wake()  # a single node commits alone: no ack will end the next poll

    def _send_new(self, first_new: int) -> bool:
        """Send entries from ``first_new`` on to followers that have everything before them
        (no catch-up: that may be large and is the tick thread's job). With quorum sends, only
        to as many as a majority needs, kept from one entry to the next; the heartbeat carries
        them to the rest. False when too few such followers are connected: the caller sends to
        everyone instead."""
        b = self._b
        others = b._SyncObj__otherNodes
        nxt = b._SyncObj__raftNextIndex
        connected = b._SyncObj__connectedNodes
        ready = [n for n in others if n in connected and nxt.get(n, 0) >= first_new]
        if not self._quorum_sends or len(others) < 2:
            if len(ready) < len(others):
                return False
            b._SyncObj__sendAppendEntries()
            return True
        need = (len(others) + 1) // 2
        chosen = [n for n in self._quorum if n in ready]
        if len(chosen) < need:
            chosen += sorted((n for n in ready if n not in chosen), key=lambda n: n.id)
            chosen = chosen[:need]
            if len(chosen) < need:
                self._quorum = []
                return False
        self._quorum = chosen
        if not isinstance(others, _Members):  # pysyncobj replaces it on a snapshot install
            others = b._SyncObj__otherNodes = _Members(others)
        heartbeat = b._SyncObj__newAppendEntriesTime  # the others' next send: not moved
        others.only = set(chosen)
        self._quorum_sending = True
        try:
            b._SyncObj__sendAppendEntries()
        finally:
            self._quorum_sending = False
            others.only = None
            b._SyncObj__newAppendEntriesTime = heartbeat
        return True

    def _rescue(self) -> float:
        """Tick thread, quorum sends on: if our oldest uncommitted entry has waited
        RESCUE_AFTER, send everything to every follower now and let the first to acknowledge
        it form the quorum (a quorum follower may be stalled: a snapshot, a slow disk).
        Returns how long the coming poll may wait."""
        b = self._b
        with self._qlock:  # a timed-out proposal leaves _pending from another thread
            first = next(iter(self._pending.values()), None)
        if first is None or first.state != _LOGGED or b._SyncObj__raftState != _LEADER:
            return TICK
        after = max(RESCUE_AFTER, min(3 * self._commit_s, RESCUE_MAX))
        left = first.logged_at + after - time.monotonic()
        if left > 0:
            return min(TICK, left)
        others = b._SyncObj__otherNodes
        match = b._SyncObj__raftMatchIndex
        if sum(match.get(n, 0) >= first.index for n in others) >= (len(others) + 1) // 2:
            return TICK  # acknowledged: this tick commits it
        term = b._SyncObj__raftCurrentTerm
        race = self._race
        if race is None or race[0] < first.index or race[1] != term:
            journal = self._journal
            assert journal is not None
            self._race = (journal[-1][1], term, [])
            self.stats["rescues"] += 1
            b._SyncObj__sendAppendEntries()
        return TICK

    def _apply(self, data: bytes) -> None:
        b = self._b
        idx = b._SyncObj__raftLastApplied + 1
        with self._lock:
            results = apply_entry(self.broker, data)
        self._since_compaction += len(data)
        if self._since_compaction >= self._compaction_bytes:
            self._since_compaction = 0
            self._compaction_bytes = _jitter(COMPACTION_BYTES)
            b.forceLogCompaction()  # taken up by pysyncobj's next compaction check
        if self._pending:
            with self._qlock:
                # Lower indexes were applied as other entries (no-op, membership): superseded.
                while self._pending:
                    first = next(iter(self._pending))
                    if first >= idx:
                        break
                    old = self._pending.pop(first)
                    if old.state == _LOGGED:
                        old.state = _DONE
                        err = self._not_leader(f"entry {first} was superseded; not applied")
                        self._done.append((old, None, err))
                p = self._pending.pop(idx, None)
                if p is not None and p.state == _LOGGED:
                    p.state = _DONE
                    if self._quorum:
                        self._commit_s += (time.monotonic() - p.logged_at - self._commit_s) / 16
                    journal = self._journal
                    assert journal is not None
                    if journal.term_at(idx) == p.term:
                        self._done.append((p, results, None))
                    else:
                        err = self._not_leader(f"entry {idx} was superseded; not applied")
                        self._done.append((p, None, err))
        self._applied = True

    def _rearm_compaction(self) -> None:
        """A new entry-count threshold for the next snapshot (see ``_jitter``)."""
        b = self._b
        if b is not None:
            b._SyncObj__conf.logCompactionMinEntries = int(_jitter(self._compaction_entries))

    def _restore(self, snap: bytes, nodes: list[Any], last_index: int, install: bool) -> None:
        with self._lock:
            self.broker.restore(snap)
        for addr, nid, api in nodes:
            self._info[addr] = (nid, api)
        # Restoring a large state blocks this thread for a while (1M messages: ~1.2 s): do not
        # count it against the leader, or this node would call an election right after.
        b = self._b
        b._SyncObj__raftElectionDeadline = monotonic() + b._SyncObj__generateRaftTimeout()
        if install:
            with self._qlock:
                for idx in [i for i in self._pending if i <= last_index]:
                    p = self._pending.pop(idx)
                    if p.state == _LOGGED:
                        p.state = _DONE
                        err = UnknownOutcome(f"entry {idx} was covered by an installed snapshot")
                        self._done.append((p, None, err))

    # ------------------------------------------------------------------ transport hooks

    def _election_timeout(self) -> float:
        b = self._b
        if self._leader_lost and (
            b._SyncObj__raftState == _LEADER or monotonic() > self._leader_lost_until
        ):
            self._leader_lost = False  # won, or the loss is old: a one-way link to a live
            # leader must not depose it every 0.15-0.5 s
        if self._leader_lost:
            lo, hi = FAST_ELECTION_MIN, FAST_ELECTION_MAX
            recent = time.monotonic() - QUORUM_RECENT
            if self._quorum_at > recent:
                hi = FAST_ELECTION_SPLIT
            elif self._lagging_at > recent:
                lo = FAST_ELECTION_SPLIT
            return random.uniform(lo, hi)
        return random.uniform(ELECTION_MIN, ELECTION_MAX)

    def _on_disconnected(self, node: Any) -> None:
        """A follower whose connection to the leader drops stands for election soon instead of
        waiting out the election timeout (kill -9 of the leader closes its sockets at once).
        If the leader is alive and only this link broke, the election may move leadership
        here: a short disruption, which the timeout would cause a little later anyway."""
        self._orig_disconnected(node)
        self._hello_due.discard(node)
        self._pre_voters.discard(node.id)  # the next connection may be another version
        self._readers.discard(node.id)
        b = self._b
        if node == b._SyncObj__raftLeader and b._SyncObj__raftState != _LEADER:
            self._leader_lost = True
            self._leader_lost_until = monotonic() + FAST_ELECTION_WINDOW
            self.stats["fast_elections"] += 1
            deadline = monotonic() + self._election_timeout()
            b._SyncObj__raftElectionDeadline = min(b._SyncObj__raftElectionDeadline, deadline)

    def _on_connected(self, node: Any) -> None:
        self._orig_connected(node)
        self._connected_at[node.id] = monotonic()
        self._hello_due.add(node)
        self._greet()

    def _greet(self) -> None:
        """Tell newly connected peers what this version takes part in: pre-votes, read pings
        (pysyncobj ignores a type it does not know). Retried each tick: without a secret,
        pysyncobj reports an outgoing connection before it can carry messages."""
        hello = {"type": _HELLO, "pre_vote": self._pre_vote, "reads": True}
        for node in list(self._hello_due):
            if self._send(node, hello):
                self._hello_due.discard(node)

    # ------------------------------------------------------------------ pre-vote

    def _may_stand(self) -> bool:
        """May pysyncobj stand for election now (term + 1)? With pre-vote only once it was won
        (PRE_VOTE_WAIT ago at most), when the leader asked us to (a transfer), or when a leader
        of an older term is alive: our term is ahead of it, which pysyncobj never tells it, so
        only a higher term in a vote request brings the terms together (one election)."""
        b = self._b
        if not self._pre_vote or b._SyncObj__transferInProgress:
            return True
        term = b._SyncObj__raftCurrentTerm
        if self._ahead_term == term:
            return True
        won = self._won
        return won is not None and won[0] == term + 1 and monotonic() < won[1]

    def _hold_election(self) -> None:
        """Before each tick. pysyncobj stands for election (term + 1) in the tick where its
        deadline has passed, if ``_may_stand``. Until then, ask the others whether they would
        vote for us: a majority of yes within PRE_VOTE_WAIT lets it stand at once; otherwise a
        new election timeout starts. Our term does not change meanwhile."""
        b = self._b
        if b._SyncObj__raftState == _LEADER or b._SyncObj__selfNode is None:
            return
        now = monotonic()
        if b._SyncObj__raftElectionDeadline > now or self._may_stand():
            return
        if not SyncObj._SyncObj__connectedToAnyone(b):
            return  # pysyncobj does not stand either
        term = b._SyncObj__raftCurrentTerm + 1
        r = self._round
        if r is not None and r[0] == term:
            if now < r[1]:
                return
            self._round = None
            self._lost_round(term, r)
            b._SyncObj__raftElectionDeadline = now + b._SyncObj__generateRaftTimeout()
            return
        others = b._SyncObj__otherNodes
        connected = b._SyncObj__connectedNodes
        unsure = [
            self._connected_at.get(n.id, 0.0) + HELLO_GRACE
            for n in others
            if n in connected and n.id not in self._pre_voters
        ]
        if unsure and max(unsure) > now:
            b._SyncObj__raftElectionDeadline = max(unsure)  # let them say hello first
            return
        self._round = (term, now + PRE_VOTE_WAIT, set())
        self.stats["pre_votes"] += 1
        ask = {
            "type": _PRE_VOTE,
            "term": term,
            "last_log_index": b._SyncObj__getCurrentLogIndex(),
            "last_log_term": b._SyncObj__getCurrentLogTerm(),
        }
        for n in others:
            if n in connected:
                self._send(n, ask)
        self._count_round()

    def _lost_round(self, term: int, r: tuple[int, float, set[str]]) -> None:
        self.stats["pre_votes_lost"] += 1
        now = time.monotonic()
        if now - self._pre_vote_warned >= PRE_VOTE_WARN_EVERY:
            self._pre_vote_warned = now
            log.warning(
                "raft %s: no leader heard, and a pre-vote for term %d got %d of %d yes (more"
                " are needed); cut off from the others? (%d lost so far)",
                self.config.node_id,
                term,
                1 + len(r[2]),
                1 + len(self._b._SyncObj__otherNodes),
                self.stats["pre_votes_lost"],
            )

    def _count_round(self) -> None:
        r = self._round
        if r is None:
            return
        b = self._b
        others = b._SyncObj__otherNodes
        connected = b._SyncObj__connectedNodes
        votes = 1
        for n in others:
            if n.id in r[2]:
                votes += 1
            elif n in connected and n.id not in self._pre_voters:
                votes += 1  # an older version: knows no pre-vote and votes as it always did
        if 2 * votes > len(others) + 1:
            now = monotonic()
            self._won = (r[0], now + PRE_VOTE_WAIT)
            self._round = None
            self.stats["pre_votes_won"] += 1
            b._SyncObj__raftElectionDeadline = now  # stand in the next tick

    def _on_pre_vote_message(self, node: Any, kind: str, m: dict[str, Any]) -> None:
        self._pre_voters.add(node.id)
        if kind == _PRE_VOTE:
            granted = self._would_vote(m)
            if not granted:
                self.stats["pre_votes_refused"] += 1
            self._send(node, {"type": _PRE_VOTE_REPLY, "term": m.get("term"), "granted": granted})
        elif kind == _PRE_VOTE_REPLY:
            r = self._round
            if (
                r is not None
                and m.get("granted") is True
                and m.get("term") == r[0]
                and monotonic() < r[1]
            ):
                r[2].add(node.id)
                self._count_round()

    def _would_vote(self, m: dict[str, Any]) -> bool:
        """Would we vote for this candidate in the term it names? As pysyncobj decides a vote
        (a newer term, a log at least as up to date), and only if we know of no live leader:
        not leading ourselves, nor a follower that heard one within LEADER_FRESH and still has
        its connection."""
        b = self._b
        term, idx, last_term = m.get("term"), m.get("last_log_index"), m.get("last_log_term")
        if not (type(term) is int and type(idx) is int and type(last_term) is int):
            return False
        if b._SyncObj__raftState == _LEADER or term <= b._SyncObj__raftCurrentTerm:
            return False
        if (
            b._SyncObj__raftLeader is not None
            and not self._leader_lost
            and monotonic() - self._heard_leader_at < LEADER_FRESH
        ):
            return False
        ours = (b._SyncObj__getCurrentLogTerm(), b._SyncObj__getCurrentLogIndex())
        return (last_term, idx) >= ours

    def _on_message(self, node: Any, message: Any) -> None:
        b = self._b
        if isinstance(message, dict) and message.get("type") in _OURS:
            kind = message["type"]
            if kind == _HELLO:  # what the peer's version takes part in
                if message.get("reads") is True:
                    self._readers.add(node.id)
                if message.get("pre_vote", True) is True:  # (the first hello had no keys)
                    self._pre_voters.add(node.id)
                return
            if kind in (_READ_PING, _READ_PONG):
                self._on_read_message(node, kind, message)
                return
            if self._pre_vote:
                self._on_pre_vote_message(node, kind, message)
                return
        if isinstance(message, dict) and message.get("type") == "append_entries":
            term = b._SyncObj__raftCurrentTerm
            if message.get("term", -1) >= term:
                self._heard_leader_at = monotonic()
                self._round = self._won = None  # a leader: no election
                self._ahead_term = -1
            elif self._pre_vote and self._ahead_term != term:
                self._ahead_term = term
                log.warning(
                    "raft %s: term %d is ahead of the leader's (%s); standing for election to"
                    " bring them together",
                    self.config.node_id,
                    term,
                    message.get("term"),
                )
            if "prevLogIdx" not in message and "commit_index" in message:
                # A snapshot chunk (or "none yet") checks nothing of our log, yet pysyncobj
                # raised our commit index to the leader's over whatever our log holds: an
                # old leader's unreplicated tail got applied (and, kept by the commit mark,
                # re-applied after a restart). Raft advances it only on a verified append.
                message["commit_index"] = min(message["commit_index"], b._SyncObj__raftCommitIndex)
            quorum = message.get("quorum")
            if quorum:
                self._quorum_at = time.monotonic()
            elif quorum is not None and message.get("entries"):
                self._lagging_at = time.monotonic()
        if (
            self._leader_lost
            and isinstance(message, dict)
            and message.get("type") == "append_entries"
            and message.get("term", -1) >= b._SyncObj__raftCurrentTerm
        ):
            self._leader_lost = False  # a leader again: normal timeouts from here
        if (
            self._fix_acks
            and isinstance(message, dict)
            and message.get("type") == "next_node_idx"
            and b._SyncObj__raftState == _LEADER
        ):
            self._on_ack(node, message)
            return
        if (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and "transmission" not in message
            and message.get("term", -1) >= b._SyncObj__raftCurrentTerm
        ):
            self._skip_known_entries(node, message)
        self._orig_on_message(node, message)
        if isinstance(message, dict) and message.get("type") == "append_entries":
            part = message.get("serialized")
            if part and not part[2]:
                # pysyncobj does not answer snapshot chunks: the leader hears nothing for the
                # whole transfer, drops the connection after CONNECTION_TIMEOUT and starts over
                # (a 100 MB snapshot never got through). A progress reply keeps it alive.
                self._send(
                    node,
                    {"type": "next_node_idx", "next_node_idx": 0, "reset": False, "success": False},
                )

    def _skip_known_entries(self, node: Any, m: dict[str, Any]) -> None:
        """pysyncobj truncates a follower's log after ``prevLogIdx`` on every append, even when
        the entries sent are the ones it already has (a re-send): acknowledged, possibly
        committed entries vanish until the leader notices. Raft truncates only at a conflict:
        drop the entries we already hold, and if nothing new remains, answer for exactly the
        entries this message verified without letting pysyncobj touch the log."""
        j = self._journal
        assert j is not None
        last_idx, last_term = j[-1][1], j[-1][2]
        prev = m["prevLogIdx"]
        if prev >= last_idx or prev < j[0][1] or j.term_at(prev) != m["prevLogTerm"]:
            return  # nothing of ours after prev, or pysyncobj rejects: no truncation either way
        entries = m.get("entries") or []
        known = 0
        for e in entries:
            if e[1] > last_idx or j.term_at(e[1]) != e[2]:
                break
            known += 1
        verified = prev + known
        self.stats["duplicate_appends"] += 1  # a re-send: pysyncobj would truncate here
        if known == len(entries):
            m["prevLogIdx"], m["prevLogTerm"], m["entries"] = last_idx, last_term, []
            m["commit_index"] = min(m["commit_index"], verified)  # our tail is unverified
            self._ack_next[node] = verified + 1
        elif known:
            m["prevLogIdx"], m["prevLogTerm"] = verified, j.term_at(verified)
            m["entries"] = entries[known:]

    def _on_ack(self, node: Any, message: dict[str, Any]) -> None:
        """pysyncobj sets next_index to whatever an ack says, so an ack for an older append
        rewinds it below entries already in flight: they are sent again and the follower
        truncates and rewrites entries it had (and may have applied). Only move forward on
        success; on a rejection trust the follower (acks arrive in order) but never below its
        match index unless it says it lost entries."""
        b = self._b
        match = b._SyncObj__raftMatchIndex
        nxt_tbl = b._SyncObj__raftNextIndex
        nxt = int(message["next_node_idx"])
        if node in match:
            if message.get("success"):
                if nxt - 1 > match[node]:
                    match[node] = nxt - 1
                    race = self._race
                    if race is not None and nxt - 1 >= race[0] and node not in race[2]:
                        race[2].append(node)
                        if len(race[2]) >= (len(b._SyncObj__otherNodes) + 1) // 2:
                            self._quorum, self._race = race[2], None
                if nxt > nxt_tbl.get(node, 0):
                    nxt_tbl[node] = nxt
                elif nxt < nxt_tbl.get(node, 0):
                    self.stats["stale_acks_ignored"] += 1  # pysyncobj would rewind here
            elif message.get("reset"):
                if nxt - 1 < match[node]:
                    log.warning(
                        "follower %s reports log end %d below its match index %d",
                        node,
                        nxt - 1,
                        match[node],
                    )
                    match[node] = nxt - 1
                nxt_tbl[node] = nxt
        b._SyncObj__lastResponseTime[node] = monotonic()

    def _send(self, node: Any, message: Any) -> bool:
        if (
            self._quorum_sends
            and isinstance(message, dict)
            and message.get("type") == "append_entries"
        ):
            # Tells a follower whether it is in the quorum: its fast election timeout depends
            # on it (pysyncobj ignores the key; without it a follower takes the full range).
            message["quorum"] = self._quorum_sending
        if isinstance(message, dict) and message.get("type") == "next_node_idx":
            nxt = self._ack_next.pop(node, None)
            if nxt is not None and message.get("success"):
                message = {**message, "next_node_idx": nxt}
            # A follower's ack waits for the end of the tick: the journal is synced first.
            self._acks.append((node, message))
            return True
        return self._send_now(node, message)

    def _send_now(self, node: Any, message: Any) -> bool:
        transport = self._b._SyncObj__transport
        conn = transport._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        if conn.sendRandKey:
            message = (conn.sendRandKey, message)
        data = _stored_zlib(pickle.dumps(message, PICKLE_PROTOCOL))
        parts: tuple[bytes, ...] = (data,)
        if isinstance(conn.encryptor, _Sealer):
            parts = conn.encryptor.seal_parts(data, int(monotonic()))
        elif conn.encryptor:
            parts = (conn.encryptor.encrypt_at_time(data, int(monotonic())),)
        size = sum(len(p) for p in parts)
        parts = (struct.pack("i", size), *parts)
        if conn._TcpConnection__writeBuffer:  # queued behind earlier bytes
            conn._TcpConnection__writeBuffer += b"".join(parts)
            conn._TcpConnection__trySendBuffer()
        else:  # straight to the socket, the parts gathered by the kernel (no joined copy)
            try:
                sent = conn._TcpConnection__socket.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                conn.disconnect()
                return False
            if sent < size + 4:
                conn._TcpConnection__writeBuffer = b"".join(parts)[sent:]
        if conn.state != CONNECTION_STATE.CONNECTED:
            return False
        if self._fix_sends and conn.getSendBufferSize() > 0:
            # pysyncobj re-arms write interest only inside a write event, so a send that did not
            # fit the socket buffer would sit until the next send (up to a heartbeat later).
            self.stats["rearmed_sends"] += 1
            ev = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR
            self._b._poller.subscribe(conn.fileno(), conn._TcpConnection__processConnection, ev)
        return True

    # ------------------------------------------------------------------ public API

    def _check_running(self) -> None:
        if self._fatal is not None:
            raise RaftError(f"raft node stopped: {self._fatal}")
        if self._b is None or self._stopping:
            raise NotLeader("raft node not running")

    def _not_leader(self, why: str = "not the leader") -> NotLeader:
        lid, lapi = self._leader()
        return NotLeader(f"{why}; leader is {lid or 'unknown'}", lid, lapi)

    def _leader(self) -> tuple[str | None, str | None]:
        b = self._b
        leader = b._getLeader() if b is not None else None
        if leader is None:
            return None, None
        info = self._info.get(leader.id)
        if info is not None:
            return info
        return getattr(leader, "raftq_id", None), getattr(leader, "raftq_api", None)

    def is_leader(self) -> bool:
        b = self._b
        return b is not None and self._fatal is None and b._SyncObj__raftState == _LEADER

    async def propose(
        self, commands: list[dict[str, Any]], timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        self._check_running()
        if not self.is_leader():
            raise self._not_leader()
        data = encode_entry(int(time.time() * 1000), commands)
        if len(data) > MAX_ENTRY_BYTES:
            raise EntryTooLarge(f"entry of {len(data)} bytes exceeds {MAX_ENTRY_BYTES}")
        loop = asyncio.get_running_loop()
        p = _Pending(loop.create_future(), loop)
        with self._qlock:
            if len(self._queue) >= QUEUE_MAX:
                raise QueueFull(f"{QUEUE_MAX} proposals already waiting; not applied")
            self._queue.append((data, p))
        wake = True
        if self._tick_lock.acquire(blocking=False):
            # The tick thread is waiting for events (or not running), or the loop ticks (and
            # this is the loop): append and send from here.
            try:
                if not self._closed and self._fatal is None and self._thread is not None:
                    # On the ticking loop, sync here too: nobody else would before its next
                    # tick counts this node's own entries toward commit.
                    wake = not (self._on_home and threading.get_ident() == self._home_ident)
                    self._append_queued(sync=not wake)
            except StorageError as e:  # as on the tick thread: the node stops
                self._fail(e)
                wake = True  # the next tick hands back to the tick thread, which ends
            except Exception:  # as on the tick thread: logged; the outcome comes as usual
                log.exception("raft append failed")
            finally:
                self._tick_lock.release()
        if wake:
            self._wake()
        try:
            # (asyncio.timeout, not wait_for + shield: a few loop turns less per proposal. A
            # cancelled caller cancels p.fut, which the tick thread then leaves alone.)
            async with asyncio.timeout(timeout):
                return await p.fut
        except TimeoutError:
            if p.fut.done() and not p.fut.cancelled():
                return p.fut.result()  # settled in the same turn the time ran out
            with self._qlock:
                if p.state == _QUEUED:
                    p.state = _CANCELLED
                    raise QueueFull(f"not appended within {timeout}s; not applied") from None
                if p.state == _LOGGED:
                    p.state = _CANCELLED
                    if self._pending.get(p.index) is p:
                        del self._pending[p.index]
            raise UnknownOutcome(
                f"entry {p.index} (term {p.term}) not committed within {timeout}s"
            ) from None

    def read(self, fn: Callable[[Broker], T]) -> T:
        with self._lock:
            return fn(self.broker)

    async def read_barrier(self, timeout: float = 5.0) -> None:
        """Make the next ``read`` linearizable (Raft's ReadIndex): return once this node has
        confirmed, after the call, that it still leads (a majority answered a ping in its
        term) and has applied everything committed when the call was made. A leader cut off
        from the others finds out here instead of answering from stale state. Raises
        NotLeader, ReadNotReady (just elected: call again shortly) or TimeoutError."""
        self._check_running()
        r = _Read(asyncio.get_running_loop())
        self._read_queue.append(r)
        self._wake()
        async with asyncio.timeout(timeout):
            await r.fut

    def _start_reads(self) -> None:
        """In a tick: start the barriers queued since the last one (they share one ping)."""
        b = self._b
        term = b._SyncObj__raftCurrentTerm
        commit = b._SyncObj__raftCommitIndex
        journal = self._journal
        assert journal is not None
        err: RaftError | None = None
        if b._SyncObj__raftState != _LEADER:
            err = self._not_leader()
        elif journal.term_at(commit) != term:
            err = ReadNotReady("no entry of this leader's term committed yet")
        elif term != self._read_term:
            self._read_term = term
            self._read_acked.clear()
        started = False
        while self._read_queue:
            r = self._read_queue.popleft()
            if err is not None:
                self._settle_read(r, err)
                continue
            if not started:
                self._ping()
                started = True
            r.seq, r.index = self._read_seq, commit
            self._reads.append(r)
        if started:
            self._check_reads()

    def _ping(self) -> None:
        b = self._b
        self._read_seq += 1
        self._read_pinged_at = monotonic()
        ping = {"type": _READ_PING, "term": self._read_term, "seq": self._read_seq}
        connected = b._SyncObj__connectedNodes
        for n in b._SyncObj__otherNodes:
            if n in connected:
                self._send(n, ping)

    def _on_read_message(self, node: Any, kind: str, m: dict[str, Any]) -> None:
        b = self._b
        term = b._SyncObj__raftCurrentTerm
        if kind == _READ_PING:  # do we follow the sender in its term?
            ok = m.get("term") == term and b._SyncObj__raftLeader == node
            self._send(node, {"type": _READ_PONG, "term": m.get("term"), "seq": m.get("seq"),
                              "ok": ok, "now": term})  # fmt: skip
            return
        self._readers.add(node.id)
        now = m.get("now")
        if type(now) is int and now > term and self._reads:
            # That follower is in a newer term: we are deposed and will hear of it.
            reads, self._reads = self._reads, []
            for r in reads:
                self._settle_read(r, self._not_leader("a newer term has begun"))
        elif m.get("ok") is True and m.get("term") == self._read_term == term:
            seq = m.get("seq")
            if type(seq) is int and seq > self._read_acked.get(node.id, 0):
                self._read_acked[node.id] = seq
                self._check_reads()

    def _check_reads(self) -> None:
        """Settle the read barriers confirmed by a majority and applied (after each answer,
        and after each tick: applies, or a lost leadership)."""
        if not self._reads:
            return
        b = self._b
        if b._SyncObj__raftState != _LEADER or b._SyncObj__raftCurrentTerm != self._read_term:
            reads, self._reads = self._reads, []
            for r in reads:
                self._settle_read(r, self._not_leader("lost leadership before the read"))
            return
        others = b._SyncObj__otherNodes
        connected = b._SyncObj__connectedNodes
        applied = b._SyncObj__raftLastApplied
        now = monotonic()
        # An older version answers no pings; it counts as confirming (reads as before).
        old = {
            n.id
            for n in others
            if n in connected
            and n.id not in self._readers
            and self._connected_at.get(n.id, 0.0) <= now - HELLO_GRACE
        }
        acked = self._read_acked
        waiting = []
        for r in self._reads:
            if r.fut.done():  # timed out or cancelled
                continue
            votes = 1 + sum(1 for n in others if acked.get(n.id, 0) >= r.seq or n.id in old)
            if 2 * votes > len(others) + 1 and applied >= r.index:
                self._settle_read(r, None)
            else:
                waiting.append(r)
        self._reads = waiting
        if waiting and now - self._read_pinged_at >= APPEND_PERIOD:
            self._ping()  # a ping or its answer may be lost (a link that dropped and is back)

    def _settle_read(self, r: _Read, err: BaseException | None) -> None:
        def settle() -> None:
            if not r.fut.done():
                if err is None:
                    r.fut.set_result(None)
                else:
                    r.fut.set_exception(err)

        if threading.get_ident() == self._home_ident and r.loop is self._home:
            settle()
        else:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                r.loop.call_soon_threadsafe(settle)

    def add_apply_listener(
        self, cb: Callable[[], None], wanted: Callable[[], bool] | None = None
    ) -> None:
        """Run ``cb()`` on the calling event loop after each tick that applied entries, in the
        same wake-up as that tick's completions. ``wanted()``, if given, is asked where the tick
        ran (the tick thread, or a leader's loop) after the entries were applied; when it says
        no, that loop is not woken for ``cb`` (a follower nobody waits on then never wakes its
        loop per entry). So a waiter must register before it reads the state it waits on, or
        it can miss its wake-up."""
        self._listeners.append((cb, asyncio.get_running_loop(), wanted))

    def status(self) -> RaftStatus:
        cfg = self.config
        b = self._b
        members: dict[str, dict[str, Any]] = {
            cfg.node_id: {
                "raft": cfg.raft_addr,
                "api": cfg.api_addr,
                "connected": True,
                "self": True,
            }
        }
        if b is None:
            return RaftStatus(cfg.node_id, "follower", None, None, 0, 0, 0, members, False)
        for n in sorted(b.otherNodes, key=lambda n: str(n.id)):
            nid, api = self._info.get(
                n.id, (getattr(n, "raftq_id", n.id), getattr(n, "raftq_api", ""))
            )
            members[nid] = {
                "raft": n.id,
                "api": api,
                "connected": b.isNodeConnected(n),
                "self": False,
            }
        lid, lapi = self._leader()
        applied = b._SyncObj__raftLastApplied
        running = self._fatal is None and not self._stopping and self._thread is not None
        return RaftStatus(
            node_id=cfg.node_id,
            role=_ROLES.get(b._SyncObj__raftState, "follower"),
            leader_id=lid,
            leader_api=lapi,
            term=b._SyncObj__raftCurrentTerm,
            commit_index=max(b._SyncObj__raftCommitIndex, applied),
            applied_index=applied,
            members=members,
            running=running,
            error=None if self._fatal is None else str(self._fatal),
            leader_commit=b._SyncObj__leaderCommitIndex,
        )

    async def _on_tick_thread(
        self, fn: Callable[[Callable[[Any, Any], None]], None], timeout: float
    ) -> tuple[Any, Any]:
        """Run ``fn(callback)`` on the tick thread; wait for ``callback(result, error)``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Any, Any]] = loop.create_future()

        def callback(res: Any, err: Any) -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_result((res, err))

            loop.call_soon_threadsafe(settle)

        self._calls.append(lambda: fn(callback))
        self._wake()
        return await asyncio.wait_for(fut, timeout)

    async def transfer_leadership(self, timeout: float = 5.0) -> bool:
        """Hand leadership to the most caught-up follower; True once another node leads."""
        deadline = time.monotonic() + timeout
        if self._b is None or not self._b.otherNodes:
            return False  # nobody to hand over to
        while time.monotonic() < deadline:
            if not self.is_leader():
                return self._leader()[0] not in (None, self.config.node_id)
            try:
                _, err = await self._on_tick_thread(
                    lambda cb: self._b.transferLeadership(callback=cb),
                    max(0.05, deadline - time.monotonic()),
                )
            except TimeoutError:
                return False
            if err == FAIL_REASON.SUCCESS:
                # Role changes on the tick thread; polling it is simplest and bounded.
                while time.monotonic() < deadline and self.is_leader():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            else:
                await asyncio.sleep(0.05)  # no follower fully caught up yet
        return not self.is_leader() and self._leader()[0] not in (None, self.config.node_id)

    async def _membership(self, op: str, node: Any, timeout: float) -> None:
        self._check_running()
        if not self.is_leader():
            raise self._not_leader()
        method = self._b.addNodeToCluster if op == "add" else self._b.removeNodeFromCluster
        try:
            _, err = await self._on_tick_thread(lambda cb: method(node, callback=cb), timeout)
        except TimeoutError:
            raise UnknownOutcome(
                f"membership change {op} {node.id} not committed in time"
            ) from None
        if err != FAIL_REASON.SUCCESS:
            if err in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
                raise self._not_leader()
            if err == FAIL_REASON.QUEUE_FULL:
                raise QueueFull("membership queue full")
            raise RaftError(f"membership change {op} {node.id} refused (reason {err})")

    async def add_member(
        self, node_id: str, raft_addr: str, api_addr: str, timeout: float = 10.0
    ) -> None:
        self._check_running()
        for nid, m in self.status().members.items():
            if nid == node_id or m["raft"] == raft_addr:
                raise RaftError(
                    f"cannot add {node_id} at {raft_addr}: {nid} at {m['raft']} is a member"
                    " already (remove it first to replace it)"
                )
        self._info[raft_addr] = (node_id, api_addr)
        await self._membership("add", _node(raft_addr, node_id, api_addr), timeout)

    async def remove_member(self, node_id: str, timeout: float = 10.0) -> None:
        self._check_running()
        target = next(
            (n for n in self._b.otherNodes if self._info.get(n.id, ("",))[0] == node_id), None
        ) or next((n for n in self._b.otherNodes if getattr(n, "raftq_id", None) == node_id), None)
        if target is None:
            raise RaftError(f"cannot remove {node_id!r}: not a member (or this node)")
        await self._membership("rem", target, timeout)

    def force_compaction(self) -> None:
        """Start a snapshot now (tests, benchmarks)."""
        self._calls.append(lambda: self._b.forceLogCompaction())
        self._wake()


class _Members(set):  # type: ignore[type-arg]
    """pysyncobj's set of the other members. While ``only`` is set (by ``_send_new``, under
    ``_tick_lock``), ``members | readonly`` - how pysyncobj's send loop picks its targets -
    yields just those nodes; everything else, other threads included, still sees every
    member (swapping the set made /cluster and remove_member see a smaller cluster)."""

    __slots__ = ("only",)

    def __init__(self, nodes: Any = ()) -> None:
        super().__init__(nodes)
        self.only: set[Any] | None = None

    def __or__(self, other: Any) -> Any:
        if self.only is not None:
            return self.only | other
        return set.__or__(self, other)


class _Wait:
    """Stands in for the ``select.poll`` object inside pysyncobj's ``PollPoller``.

    An epoll set, so the event loop can watch all of Raft's sockets through one descriptor
    (``fileno``) while it runs the leader's ticks (see ``RaftNode._loop_tick``). Registrations
    are one-shot, re-armed after their events were handled (``rearm``, or the next ``poll``):
    pysyncobj closes a socket before it unsubscribes it, and while a forked snapshot writer
    holds a copy the epoll set keeps that registration. Disarmed, it can never report again
    (armed, it would wake the loop forever, or under a reused fd number disconnect the new
    socket). Still level-triggered: unread data is reported again once re-armed.

    On the tick thread it releases ``_tick_lock`` while blocked waiting, never while events are
    handled, so another thread holding the lock never runs alongside pysyncobj code."""

    def __init__(self, node: RaftNode) -> None:
        self._node = node
        self._ep = select.epoll()
        self._masks: dict[int, int] = {}
        self._fired: set[int] = set()  # reported, not re-armed yet

    def fileno(self) -> int:
        return self._ep.fileno()

    def close(self) -> None:
        self._ep.close()

    def register(self, fd: int, mask: int) -> None:
        # poll and epoll share the event bits on Linux (IN 1, OUT 4, ERR 8, HUP 16).
        mask |= select.EPOLLONESHOT
        try:
            if fd in self._masks:
                self._ep.modify(fd, mask)
            else:
                self._ep.register(fd, mask)
        except FileNotFoundError:  # the fd number now names another file
            self._ep.register(fd, mask)
        except FileExistsError:
            self._ep.modify(fd, mask)
        self._masks[fd] = mask
        self._fired.discard(fd)

    def unregister(self, fd: int) -> None:
        self._fired.discard(fd)
        if self._masks.pop(fd, None) is None:
            raise KeyError(fd)  # as select.poll (pysyncobj expects it)
        with contextlib.suppress(OSError):  # already closed: gone, or disarmed for good
            self._ep.unregister(fd)

    def rearm(self) -> None:
        """Re-arm what was reported and is still registered (closed sockets are not)."""
        fired, self._fired = self._fired, set()
        for fd in fired:
            mask = self._masks.get(fd)
            if mask is not None:
                with contextlib.suppress(OSError):
                    self._ep.modify(fd, mask)

    def poll(self, timeout_ms: float | None = None) -> list[tuple[int, int]]:
        node = self._node
        self.rearm()
        timeout = -1.0 if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000
        if timeout == 0 or not node._ticking or threading.get_ident() != node._tick_ident:
            events = self._ep.poll(timeout)  # no wait, the loop's ticks, pysyncobj's teardown
        else:
            node._tick_lock.release()
            try:
                events = self._ep.poll(timeout)
            finally:
                node._tick_lock.acquire()
        ready = []
        for fd, ev in events:
            if fd in self._masks:  # (else: a closed socket's last event, see above)
                self._fired.add(fd)
                ready.append((fd, ev))
        return ready


def _lock_data_dir(path: str) -> int:
    """Hold ``path/LOCK`` (flock) for as long as the node runs, or refuse to start."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RaftError(
            f"data directory {path} is in use by another raftq node (its LOCK file is held);"
            " not starting"
        ) from None
    return fd


def _bin_header(size: int) -> bytes:
    """msgpack's header of a bin object of ``size`` bytes."""
    if size < 1 << 8:
        return bytes((0xC4, size))
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def _jitter(threshold: float) -> float:
    """Snapshot thresholds vary by +-25 % per node and per snapshot: nodes that apply the same
    entries would otherwise all snapshot at once, which on shared hardware (a local cluster,
    or nodes sharing a disk) cut throughput 3-8x for the ~1.5 s the writers ran."""
    return threshold * random.uniform(0.75, 1.25)


def _close_socket_on_failed_bind(server: Any) -> None:
    """pysyncobj's ``TcpServer.bind`` leaves the socket of a failed attempt open (e.g. the port
    still held by a process that just stopped; it retries later): close it."""
    bind = server.bind

    def bind_or_close() -> None:
        try:
            bind()
        except Exception:
            sock = server._TcpServer__socket
            if sock is not None:
                sock.close()
                server._TcpServer__socket = None
            raise

    server.bind = bind_or_close


_STORED = struct.Struct("<BHH")  # deflate stored block header: BFINAL/BTYPE=00, LEN, NLEN


def _stored_zlib(data: bytes) -> bytes:
    """``data`` as a zlib stream (RFC 1950) of stored deflate blocks (RFC 1951 3.2.4): what
    ``zlib.compress(data, 0)`` yields, without its ~48 us deflate set-up per call."""
    parts: list[bytes | memoryview] = [b"\x78\x01"]  # 32 KiB window, no dictionary, FCHECK
    view = memoryview(data)
    pos = 0
    while True:
        part = view[pos : pos + 0xFFFF]
        pos += len(part)
        final = pos >= len(view)
        parts.append(_STORED.pack(final, len(part), len(part) ^ 0xFFFF))
        parts.append(part)
        if final:
            break
    parts.append(struct.pack(">I", zlib.adler32(data)))
    return b"".join(parts)


def _read_once(conn: Any, view: memoryview) -> None:
    """One recv into ``view``, appended to the connection's read buffer (pysyncobj's
    ``__tryReadBuffer`` loops until the socket is drained, allocating its buffer size each
    time)."""
    sock = conn._TcpConnection__socket
    try:
        n = sock.recv_into(view)
    except (BlockingIOError, InterruptedError):
        n = -1
    except OSError:
        conn.disconnect()
        return
    if n == 0:  # closed by the peer
        conn.disconnect()
        return
    if n > 0:
        conn._TcpConnection__readBuffer += view[:n]
    conn._TcpConnection__lastReadTime = monotonic()


def _on_loop(work: _LoopWork) -> None:
    items, listeners = work
    for p, result, err in items:
        if p.fut.done():
            continue
        if err is not None:
            p.fut.set_exception(err)
        else:
            p.fut.set_result(result)
    for cb in listeners:
        try:
            cb()
        except Exception:
            log.exception("apply listener failed")
