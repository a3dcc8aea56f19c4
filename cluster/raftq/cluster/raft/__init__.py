"""The Raft binding: the broker's state machine replicated with pysyncobj 0.3.17.

``RaftNode`` runs one pysyncobj ``SyncObj`` subclass on its own tick thread (a leader: on its
event loop, see Threads below) and exposes one replicated entry point: ``await
propose(commands)`` turns a batch of broker commands into ONE log entry
(``entry.encode_entry``), replicates it and resolves with the per-command results once it is
committed and applied. Outcomes are definite: a result, ``NotLeader`` / ``QueueFull`` /
``EntryTooLarge`` (definitely not applied) or ``UnknownOutcome`` (maybe).

How pysyncobj is changed: by subclassing ``SyncObj`` and ``TCPTransport``, overriding private
methods, replacing methods per instance, and reading, writing and calling private attributes
(name-mangled ones included). All of it is in ONE module, ``_seam.py``, the only one that
imports pysyncobj. It declares every name it relies on (``OVERRIDDEN``, ``READ``, ``WRITTEN``,
``CALLED``, ``IMPLEMENTED``) and checks at import that the installed pysyncobj is the pinned
version and has them all, and again on the objects once built; any mismatch is one
``PysyncobjMismatch`` naming everything missing. The rest of the package uses the seam's
``Raft`` (a small typed API) only. An unexpected exception inside pysyncobj's code (a tick, a
loop tick's poll, the flush after a tick, an append) stops the node as a storage failure does.

What it changes in pysyncobj's behaviour:

* journal: ``journal.Journal`` (checksummed, fdatasync'ed segment files) replaces pysyncobj's
  journal; the tick loop syncs once per tick after every append, before a leader counts itself
  toward a majority (that happens at the start of the next tick) and before a follower's
  acknowledgements (``next_node_idx`` messages are held back until the sync) leave the node;
* snapshots: ``_Snapshots`` replaces pysyncobj's serializer: msgpack through
  ``Broker.snapshot/restore``, written by a forked child (the tick thread never blocks on a
  large state), sealed with a CRC, temp file + fsync + rename + dir fsync; a snapshot that
  fails to load stops the node; at startup the journal is cut to the snapshot instead of being
  dropped whole when its head does not match (pysyncobj lost the entries after the snapshot);
* acks: a stale ``next_node_idx`` no longer rewinds the follower's next index, and a follower
  receiving entries it already holds no longer truncates its log after them;
* wire: pickle protocol 4, no compression (still a zlib stream: stored blocks), AES-GCM
  sealing (``_Sealer``) instead of Fernet, written with one ``sendmsg``; a send that does not
  fit the socket buffer re-arms write interest so it is flushed as soon as the socket is
  writable; one recv per poll event (pysyncobj's read loop is quadratic in a burst); snapshot
  chunks are answered so long transfers do not time out; a failed bind closes its socket;
* port (``_Transport``): inbound connections capped, an unauthenticated one closed after the
  handshake timeout, frame lengths capped (4 KiB before authentication, ``MAX_FRAME`` after)
  as soon as they are read (pysyncobj buffered any length it was told), and refused
  connections and frames, messages that fail to open and handshakes the peer cut short logged
  (rate-limited) and counted in ``stats`` (pysyncobj dropped them without a word);
* callbacks: proposals are tracked by (index, term) here, never by pysyncobj callbacks, so
  every one resolves (apply, superseded entry, snapshot install, stop or timeout);
* sends: a new entry goes at once only to the followers a majority needs
  (``Replication.send_new``; the rest get it with the next heartbeat), and to all of them if
  it is not committed within ``RESCUE_AFTER`` (pysyncobj sent every entry to every follower at
  the next heartbeat);
* commit index: a follower's advances only on an append whose log check passed (pysyncobj also
  took the leader's on snapshot messages, over an unchecked log); a ``CommitMark`` lets a
  restarted node apply its journal before it hears from a leader;
* elections: a follower whose connection to the leader drops stands within 0.15-0.5 s instead
  of 1-2 s (``Elections``); pre-vote (``PreVote``): a node stands (term + 1) only once a
  majority said it would vote for it, and a node with a live leader says no, so a node cut off
  and back does not depose the leader (pysyncobj steps down on any higher term it is sent);
* membership: changes are checked first (``_membership``: one at a time, never one the live
  members could not survive), a removed member is told, pysyncobj's admin messages that add or
  remove members on the Raft port are switched off, and ``force_new_cluster`` recovers a lost
  majority;
* reads: ``read_barrier`` confirms leadership with a majority before a read (ReadIndex;
  pysyncobj has no read path, so a deposed leader answered from stale state).

Threads: pysyncobj code runs only under the tick lock (``Ticks.lock``). A follower's runs on
the tick thread, which holds the lock except while it waits for events; a proposal made while
it waits is appended and sent by the caller's thread right away (the tick thread is woken only
to sync it). A leader's runs on the event loop that started the node (``LOOP_TICKS``): Raft's
sockets are one epoll set (``_Wait``) the loop watches, so an ack is read, committed, applied
and answered in one wake-up, and a proposal is appended, sent and synced where it is made; the
tick thread only watches and ticks if the loop has not for ``LOOP_WATCHDOG``. Anything else
reaches pysyncobj through the components' thread-safe queues.

Modules, one job each: ``_node`` (RaftNode: start, wiring, public API), ``_seam`` (pysyncobj),
``_ticks`` (who ticks when), ``_proposals`` (proposals and outcomes), ``_replication`` (sends
and acks), ``_inbound`` (received messages and connections), ``_elections`` (timeouts and
pre-vote), ``_membership`` (safe membership changes), ``_peers`` (what peers take part in),
``_reads`` (read barriers), ``_events`` (INFO lines: elections, leaders, members),
``_snapshots``, ``_files`` (data dir lock, commit mark), ``_wire`` (bytes on the wire),
``_tuning`` (constants and their measurements), ``_types`` (public types).
"""

from __future__ import annotations

from raftq.cluster.raft._node import RaftNode
from raftq.cluster.raft._types import (
    EntryTooLarge,
    ForceRefused,
    NotLeader,
    QueueFull,
    RaftConfig,
    RaftError,
    RaftStatus,
    ReadNotReady,
    UnknownOutcome,
)
from raftq.cluster.storage import StorageCorrupt, StorageError

__all__ = [
    "EntryTooLarge",
    "ForceRefused",
    "NotLeader",
    "QueueFull",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "RaftStatus",
    "ReadNotReady",
    "StorageCorrupt",
    "StorageError",
    "UnknownOutcome",
]
