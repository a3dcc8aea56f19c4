"""Tuning constants of the Raft binding, each with the measurement behind its value."""

from __future__ import annotations

# ---------------------------------------------------------------------------- tuning
# Measured on the shared 2-core box (bench/raft_bench.py, bench/raft_snapshot.py, tests/raft).
TICK = 0.01  # poll timeout of the tick thread; new proposals wake it through a pipe, so this
# only bounds timer resolution. Idle 3-node cluster: 1.3-1.8% CPU per node.
APPEND_PERIOD = 0.05  # heartbeat, which also carries new entries to the followers outside the
# quorum (QUORUM_SENDS). The quorum gets entries as soon as they are appended (pysyncobj
# made each wait for the next period: ~10 commands/s sequentially with the 0.1 s default).
ELECTION_MIN, ELECTION_MAX = 0.6, 1.0  # how long a follower waits without an append (a
# heartbeat every APPEND_PERIOD) before it asks for a pre-vote: a leader that dies silently (a
# frozen or unplugged host closes no socket) is replaced within ~1 s. Longest gap between a
# leader's appends that a follower saw (raft stat max_append_gap_ms) under the whole bench
# (raftq bench --cases a,b,c,d,e --runs 3: 4-5 compactions a node), other agents loading the
# 2 cores: 96-108 ms in quiet runs; 408 ms when the leader itself stalled (longest tick 478 ms,
# the box busy), and 635 ms on a follower whose own tick stalled 814 ms (that one self-heals:
# it reads the leader's appends before its timer is checked; no pre-vote was asked). 0.6 s is
# ~1.5x the worst leader stall seen; a follower whose timer fires anyway cannot depose a live
# leader: the others refuse its pre-vote (LEADER_FRESH). No election during those runs (term
# unchanged) with 0.6-1.0, 0.5-0.8 or 1.0-2.0. SIGSTOP of the leader -> a survivor leads
# (raftq bench --cases s): median 1.69 s, max 3.35 s with 1.0-2.0 (20 stops); 0.69 s, max
# 0.82 s with 0.5-0.8 (10, interleaved with those); 0.85 s, max 1.02 s with these (10).
LEADER_SILENT = 2.0  # a follower that has had no append from its leader this long
# names no leader (not ready, 503 no_leader): pre-vote keeps pysyncobj's leader set for good on
# a node nobody answers (removed while stopped or cut off; cut off from every other node). 40
# heartbeats, twice the longest tick stall seen on the loaded box (~1 s): a healthy follower
# never goes quiet that long (longest gap between appends measured: 635 ms, see above), and
# by then it would have stood for election anyway (> ELECTION_MAX).
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
LEADER_FALLBACK = 1.5  # an isolated leader steps down soon after the others can elect a new
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
INLINE_SNAPSHOT_US = 20_000  # a state whose snapshot takes about this long or less (Broker.
# snapshot_cost) is serialized on the tick thread, no fork: a heartbeat waits at most ~20 ms.
SEND_AHEAD = 8 << 20  # pysyncobj's send passes over a follower whose connection holds this
# much unsent (Raft._send_appends): a new member's store files (1.1 GB for 10M x 100 B) and then
# its entries queued on the leader faster than the follower took them
SNAPSHOT_SYNC_EVERY = 4 << 20  # the snapshot writer's flushes, so journal fsyncs pass between
COMPACTION_BYTES = 64 << 20  # also snapshot after this many entry bytes (or the last snapshot's
# size, when larger: _snapshots.py). Entries stay in RAM until then, so this bounds the journal's
# share of a node's memory. 32 MB (tried with snapshots without payloads) cost more than it
# saved: 10M x 100 B over 100 topics filled at 152k/s with RSS peaks of 366 MB, at 64 MB 169k/s
# and 385 MB (bench/backlog.py); each snapshot holds every node's tick thread a few ms (journal
# roll) and cost (c) 1 KiB 8 % of a 20k-message run (A/B against 512 MB). Big batches reach ~1M
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
COOL_BYTES = 8 << 20  # the journal keeps whole about this much of the commands that every
# member has and this node applied (Journal.cool); the rest are read back when needed. Filling
# 10M x 100 B over 100 topics: RSS peak 386 -> 335 MB a node, settled 341 -> 276.
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
LEADER_FRESH = 0.5  # a node that heard a leader this recently (10 heartbeats; < ELECTION_MIN, or
# it would refuse a follower whose timer fired first after a silent death) refuses pre-votes,
# unless its connection to that leader dropped (a killed leader: fast elections stay fast)
HELLO_GRACE = 1.0  # a newly connected peer says within this that it takes part in pre-votes;
# one that does not runs an older version and votes as before: it counts as granting
PRE_VOTE_WARN_EVERY = 30.0  # seconds between warnings about pre-votes lost
QUEUE_MAX = 4096  # proposals waiting for the tick thread (each is a batch); beyond: QueueFull
PICKLE_PROTOCOL = 4  # a 10 KB append: protocol 2 (pysyncobj's) 124/105 us to dump/load and
# 15 KB on the wire (bytes become latin-1 text); protocol 4: 3.3/3.8 us and 10 KB.
# Wire compression: none. pysyncobj's receiver always inflates, so every message is still a zlib
# stream, but one of stored blocks built by _stored_zlib: zlib.compress at any level (even 0)
# sets up a deflate state per call, ~48 us whatever the size (level 3, pysyncobj's: 50 us for
# 12 KB); a stored stream costs ~1 us. Payloads are opaque and mostly incompressible.
# ---------------------------------------------------------------------------- the Raft port
# Frames are a 4-byte length and then the bytes (pysyncobj buffered whatever length it was
# told: one connection declaring 2 GiB and streaming 256 MiB took a leader from 58 to 483 MB).
PRE_AUTH_FRAME = 4096  # until a connection has proven the secret: the handshake's two messages
# (a sealed random key, then the sealed node address) are ~110 and ~150 bytes.
MAX_FRAME = APPEND_BATCH_BYTES + MAX_ENTRY_BYTES + (4 << 20)  # after: pysyncobj batches entries
# until they reach APPEND_BATCH_BYTES, so one append carries up to that plus one entry, plus
# pickling (~30 B an entry); snapshot chunks are 1 MiB. A frame refused here would be re-sent
# forever, so the margin is generous: it only has to bound memory.
MAX_CONNECTIONS = 64  # unauthenticated inbound Raft connections at once
HANDSHAKE_TIMEOUT = 5.0  # an inbound connection not authenticated by then is closed (the
# handshake takes one round trip: milliseconds)
WARN_EVERY = 10.0  # seconds between log lines about refused connections and frames, per kind
