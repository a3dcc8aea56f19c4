"""``RaftNode``, the binding's entry point: it opens the node's files, builds the components and
plugs them into pysyncobj through the seam, and answers its callers (proposals, reads, status,
membership)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from raftq.cluster.entry import encode_entry
from raftq.cluster.journal import Journal
from raftq.cluster.raft._elections import Elections, PreVote
from raftq.cluster.raft._events import Changes
from raftq.cluster.raft._files import (
    CommitMarks,
    align_journal,
    lock_data_dir,
    unlock_data_dir,
)
from raftq.cluster.raft._inbound import Inbound
from raftq.cluster.raft._membership import (
    NOT_A_PEER,
    NOTICE_WAIT,
    PROBE_DIALED_WITHIN,
    PROBE_TIMEOUT,
    Membership,
    probe,
)
from raftq.cluster.raft._peers import Peers
from raftq.cluster.raft._proposals import Proposals
from raftq.cluster.raft._reads import Reads
from raftq.cluster.raft._replication import Replication
from raftq.cluster.raft._seam import (
    FAIL_REASON,
    LEADER,
    ROLES,
    Hooks,
    Node,
    Raft,
    dials,
    make_node,
    monotonic,
)
from raftq.cluster.raft._snapshots import _jitter, _Snapshots
from raftq.cluster.raft._ticks import Ticks
from raftq.cluster.raft._tuning import (
    COMPACTION_ENTRIES,
    COOL_BYTES,
    INLINE_SNAPSHOT_US,
    LEADER_SILENT,
    LOOP_TICKS,
    MAX_ENTRY_BYTES,
    PRE_VOTE,
    QUORUM_SENDS,
    SOCKET_BUFFER,
)
from raftq.cluster.raft._types import (
    EntryTooLarge,
    ForceRefused,
    NotLeader,
    QueueFull,
    RaftConfig,
    RaftError,
    RaftStatus,
    UnknownOutcome,
)
from raftq.cluster.raft._wire import _Sealer
from raftq.cluster.segstore import COMPLETE, SEGMENT_BYTES, SegmentStore
from raftq.cluster.state import Broker
from raftq.cluster.storage import (
    CommitMark,
    Disk,
    MetaStore,
    OsDisk,
    StorageCorrupt,
    StorageError,
)

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package
T = TypeVar("T")


class RaftNode:
    """One Raft member running the broker's state machine (see the package docstring)."""

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
        store_segment_bytes: int = SEGMENT_BYTES,
        inline_snapshot_us: int = INLINE_SNAPSHOT_US,
        cool_bytes: int = COOL_BYTES,
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
        self.stats = {
            "stale_acks_ignored": 0,
            "duplicate_appends": 0,
            "rearmed_sends": 0,
            "syncs": 0,
            "sync_us": 0,
            "max_tick_ms": 0,
            "snapshots": 0,
            "last_snapshot_ms": 0,
            "last_snapshot_timestamp_ms": 0,  # when it was written (wall clock, ms)
            "fast_elections": 0,
            "max_append_gap_ms": 0,  # longest a follower went between its leader's appends
            "rescues": 0,
            "loop_ticks": 0,
            "watchdog_ticks": 0,
            "catch_up_handbacks": 0,
            "pre_votes": 0,
            "pre_votes_won": 0,
            "pre_votes_lost": 0,
            "pre_votes_refused": 0,
            "journal_cooled_bytes": 0,  # commands dropped from memory (Journal.cool)
            "journal_read_backs": 0,  # ...and read back from their segment
        }
        self._disk: Disk = disk if disk is not None else OsDisk()
        if config.data_dir is not None:
            # Payloads live in segment files beside the journal (segstore); without a data
            # directory the broker keeps its default in-memory store.
            self.broker.use_store(
                SegmentStore(
                    self._disk,
                    os.path.join(config.data_dir, "store"),
                    segment_bytes=store_segment_bytes,
                    fsync=self.fsync,
                )
            )
        self._socket_buffer = socket_buffer
        self._fix_sends = fix_partial_sends
        self._lock = threading.Lock()  # apply vs reads
        self._fatal: BaseException | None = None
        self._stop_listeners: list[tuple[Callable[[BaseException], None], Any]] = []
        self._stopping = False
        self._journal: Journal | None = None
        self._marks = CommitMarks(config.node_id)  # (opened by start)
        self._dir_lock: int | None = None  # fd holding data_dir/LOCK
        self._info: dict[str, tuple[str, str]] = {
            config.raft_addr: (config.node_id, config.api_addr)
        }
        for nid, (raddr, api) in config.peers.items():
            self._info[raddr] = (nid, api)
        # The components, each owning its state (later ones use earlier ones).
        self._raft = Raft()
        self._ticks = Ticks(self, loop_ticks, cool_bytes)
        self._replication = Replication(self, fix_stale_acks, quorum_sends)
        self._peers = Peers(self._replication.send, pre_vote)
        self._elections = Elections(self._raft, self.stats)
        self._pre_vote = PreVote(
            self._raft,
            self._elections,
            self._peers,
            self._replication.send,
            self.stats,
            config.node_id,
            pre_vote,
        )
        self._reads = Reads(self)
        data = config.data_dir
        self._snaps = _Snapshots(
            self,
            self._raft,
            self._disk if data is not None else None,
            os.path.join(data, "snapshot.bin") if data is not None else None,
            1 << 20,
            compaction_entries,
            inline_snapshot_us,
        )
        self._proposals = Proposals(self)
        self._members = Membership(self)
        self._changes = Changes(self)  # the INFO lines for elections, leaders, members
        self._changing = False  # a membership change is being made through this node
        self._sealer: _Sealer | None = None
        self._inbound = Inbound(self)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        cfg = self.config
        journal_path = None
        if cfg.data_dir is not None:
            os.makedirs(cfg.data_dir, exist_ok=True)
            # Before anything touches the files: a second process on the same directory
            # truncated and zero-filled the running node's journal while it appended.
            self._dir_lock = lock_data_dir(cfg.data_dir)
            journal_path = os.path.join(cfg.data_dir, "journal.log")
            meta_path = os.path.join(cfg.data_dir, "meta.bin")
            try:
                meta = MetaStore(self._disk, meta_path, self.fsync)
                journal = Journal(self._disk, journal_path, meta, self.fsync)
            except BaseException:
                self._unlock_dir()
                raise
            self._marks.mark = CommitMark(self._disk, os.path.join(cfg.data_dir, "commit.bin"))
        else:
            journal = Journal(None, None, None)
        raft, snaps = self._raft, self._snaps
        hooks = Hooks(
            apply=self._proposals.apply,
            election_timeout=self._elections.election_timeout,
            may_stand=self._pre_vote.may_stand,
            drain=self._ticks.drain,
            deliver=self._proposals.deliver_all,
            send=self._replication.send,
            on_message=self._inbound.on_message,
            on_connected=self._inbound.on_connected,
            on_disconnected=self._inbound.on_disconnected,
        )
        others = [make_node(raddr, nid, api) for nid, (raddr, api) in cfg.peers.items()]
        try:
            raft.start(
                make_node(cfg.raft_addr, cfg.node_id, cfg.api_addr),
                others,
                hooks,
                bind_addr=cfg.raft_addr,
                socket_buffer=self._socket_buffer,
                compaction_entries=int(_jitter(snaps.compaction_entries)),
                fix_sends=self._fix_sends,
                stats=self.stats,
                max_connections=cfg.max_connections,
                handshake_timeout=cfg.handshake_timeout,
            )
        except Exception as e:
            journal._destroy()
            self._unlock_dir()
            raise RaftError(f"cannot start Raft on {cfg.raft_addr}: {e!r}") from e
        # Our journal and serializer replace the ones pysyncobj built (before any tick ran).
        raft.install_storage(journal, snaps)
        self._journal = journal
        if cfg.secret:
            self._sealer = _Sealer(cfg.secret)
            raft.install_sealer(self._sealer)
        self._ticks.install()
        if snaps.exists():
            try:
                loaded = snaps.preload()
            except StorageError as e:
                self._fail(e)
            else:
                align_journal(journal, loaded[1], loaded[0])
                raft.load_snapshot()
        elif journal[0][1] > 1:
            self._fail(
                StorageCorrupt(
                    f"{journal_path}: starts at entry {journal[0][1]} but"
                    f" the snapshot before it is missing"
                )
            )
        else:  # no snapshot: the journal replay writes the store from nothing
            try:
                self.broker.store.truncate_to([])
            except StorageError as e:
                self._fail(e)
        if self._fatal is None:
            try:
                self._marks.apply(raft, journal)
            except StorageError as e:
                self._fail(e)
        refused: ForceRefused | None = None
        if self._fatal is None and cfg.force_new_cluster is not None:
            last = raft.last_log_index
            if last != cfg.force_new_cluster:
                # Left set (compose, k8s env), it would make a restarted node a cluster of one
                # again, beside the members added back since: a split brain.
                refused = ForceRefused(
                    f"--force-new-cluster {cfg.force_new_cluster}: this node's last log index"
                    f" is {last}, not forcing (left set from an earlier recovery? then remove"
                    f" it; to force this log: --force-new-cluster {last})"
                )
            else:
                try:
                    self._force_new_cluster()
                except StorageError as e:
                    self._fail(e)
        if self._fatal is not None or refused is not None:
            raft.destroy()
            self._ticks.close_notifier()
            # (the directory is let go on a failure too: a caller that repairs the files, or
            # frees space, may start a node on it again in this process)
            self._unlock_dir()
            if self._fatal is not None:
                raise self._fatal
            raise refused  # type: ignore[misc]
        if not cfg.secret:
            log.warning(
                "raft %s: INSECURE, no cluster secret: anyone reaching %s can run code"
                " in this process",
                cfg.node_id,
                cfg.raft_addr,
            )
        # Loading a large snapshot takes seconds: start the election clock now, not at __init__,
        # or this node calls an election (and deposes a healthy leader) on its first tick.
        self._elections.restart_timer()
        self._ticks.start(f"raft-{cfg.node_id}")
        if cfg.force_new_cluster is not None:
            self.force_compaction()  # the snapshot keeps the new membership (see above)

    def _force_new_cluster(self) -> None:
        """The operator's way back from a lost majority: this node's whole journal committed and
        applied (what it would do as the leader of any configuration), then this node made the
        only member; ``start`` then writes a snapshot, which keeps that membership."""
        raft = self._raft
        last = raft.last_log_index
        if raft.commit_index < last:
            raft.commit_index = last
        raft.apply_committed()  # (membership entries among them applied too)
        dropped = sorted(self._info.get(n.id, (str(n.id),))[0] for n in raft.other_nodes)
        raft.set_members([])
        log.critical(
            "raft %s: FORCED NEW CLUSTER: entries up to %d committed on this node's word, and"
            " this node made the only member (the others were: %s); add members back one at a"
            " time, each with an empty data directory",
            self.config.node_id,
            last,
            ", ".join(dropped) or "none",
        )

    async def stop(self) -> None:
        ticks = self._ticks
        self._stopping = True
        ticks.unpark.set()
        ticks.wake()
        if ticks.thread is not None:
            await asyncio.to_thread(ticks.thread.join, 10.0)
            if not ticks.thread.is_alive():
                ticks.close_notifier()  # here, not on the tick thread: wake() may be writing
        self._fail_all()

    def _fail(self, err: BaseException, cause: BaseException | None = None) -> None:
        """Stop the node: the tick thread ends (destroying pysyncobj), proposals and reads fail,
        ``status()`` shows ``err``. Only the first failure is logged (with ``cause``'s
        traceback)."""
        if self._fatal is None:
            log.critical("raft node %s stopped: %s", self.config.node_id, err, exc_info=cause)
            self._fatal = err
            for cb, loop in self._stop_listeners:
                with contextlib.suppress(RuntimeError):  # (its loop closed)
                    loop.call_soon_threadsafe(cb, err)

    def _crash(self, where: str, e: Exception) -> None:
        """An unexpected exception in pysyncobj's code (or ours inside it): whatever it left
        half done, the node cannot go on safely, and a tick that raises would raise again
        every TICK. Stop, as on a storage failure."""
        self._fail(RaftError(f"unexpected error in {where}: {e!r}"), e)

    def _fail_all(self) -> None:
        self._proposals.fail_all()
        self._reads.fail_all()
        self._proposals.deliver_all()

    def _unlock_dir(self) -> None:
        # A snapshot writer still running shares the lock (forked with it): end it first, or
        # a restart on this directory is refused until it finishes. Its snapshot is not needed:
        # the journal is compacted only after a writer succeeds.
        with contextlib.suppress(Exception):
            self._snaps.abort_writer()
        fd, self._dir_lock = self._dir_lock, None
        if fd is not None:
            unlock_data_dir(fd)

    # ------------------------------------------------------------------ for the components

    def _sync(self, journal: Journal) -> None:
        t0 = time.perf_counter()
        journal.sync()
        self.stats["syncs"] += 1
        self.stats["sync_us"] += int((time.perf_counter() - t0) * 1e6)

    def _restore(self, snap: bytes, nodes: list[Any], last_index: int, install: bool) -> None:
        """A snapshot was loaded (``_Snapshots.deserialize``): the broker's state replaced."""
        with self._lock:
            store = self.broker.store
            staging = store.dir + ".incoming"
            try:
                received = COMPLETE in store.disk.listdir(staging)
            except FileNotFoundError:
                received = False
            if received:  # a transfer's store files (see _Snapshots.setTransmissionData)
                store.install(staging)
            self.broker.restore(snap)
        for addr, nid, api in nodes:
            self._info[addr] = (nid, api)
        # Restoring a large state blocks this thread for a while (1M messages: ~1.2 s): do not
        # count it against the leader, or this node would call an election right after.
        self._elections.restart_timer()
        if install:
            self._proposals.covered_by_snapshot(last_index)

    def _not_leader(self, why: str = "not the leader") -> NotLeader:
        lid, lapi = self._leader()
        return NotLeader(f"{why}; leader is {lid or 'unknown'}", lid, lapi)

    def _leader(self) -> tuple[str | None, str | None]:
        raft = self._raft
        leader = raft.leader if raft.started else None
        if leader is None:
            return None, None
        if raft.state != LEADER and monotonic() - self._pre_vote.heard_leader_at > LEADER_SILENT:
            return None, None  # (pysyncobj keeps it set while nobody answers our pre-votes)
        info = self._info.get(leader.id)
        if info is not None:
            return info
        return getattr(leader, "raftq_id", None), getattr(leader, "raftq_api", None)

    # ------------------------------------------------------------------ public API

    def _check_running(self) -> None:
        if self._fatal is not None:
            raise RaftError(f"raft node stopped: {self._fatal}")
        if not self._raft.started or self._stopping:
            raise NotLeader("raft node not running")

    def is_leader(self) -> bool:
        raft = self._raft
        return raft.started and self._fatal is None and raft.state == LEADER

    async def propose(
        self, commands: list[dict[str, Any]], timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        self._check_running()
        if not self.is_leader():
            raise self._not_leader()
        data = encode_entry(int(time.time() * 1000), commands)
        if len(data) > MAX_ENTRY_BYTES:
            raise EntryTooLarge(f"entry of {len(data)} bytes exceeds {MAX_ENTRY_BYTES}")
        p = self._proposals.enqueue(data, asyncio.get_running_loop())
        ticks = self._ticks
        wake = True
        if ticks.lock.acquire(blocking=False):
            # The tick thread is waiting for events (or not running), or the loop ticks (and
            # this is the loop): append and send from here.
            try:
                if not ticks.closed and self._fatal is None and ticks.thread is not None:
                    # On the ticking loop, sync here too: nobody else would before its next
                    # tick counts this node's own entries toward commit.
                    wake = not (ticks.on_home and threading.get_ident() == ticks.home_ident)
                    self._proposals.append_queued(sync=not wake)
            except StorageError as e:  # as on the tick thread: the node stops
                self._fail(e)
                wake = True  # the next tick hands back to the tick thread, which ends
            except Exception as e:  # as on the tick thread: the node stops
                self._crash("appending proposals", e)
                wake = True
            finally:
                ticks.lock.release()
        if wake:
            ticks.wake()
        try:
            # (asyncio.timeout, not wait_for + shield: a few loop turns less per proposal. A
            # cancelled caller cancels p.fut, which the tick thread then leaves alone.)
            async with asyncio.timeout(timeout):
                return await p.fut
        except TimeoutError:
            if p.fut.done() and not p.fut.cancelled():
                return p.fut.result()  # settled in the same turn the time ran out
            raise self._proposals.timed_out(p, timeout) from None

    def read(self, fn: Callable[[Broker], T]) -> T:
        """``fn(broker)`` under the apply lock. A store that cannot be read (a payload for a
        peek) stops the node, as on the apply thread: RaftError, never a wrong answer."""
        with self._lock:
            try:
                return fn(self.broker)
            except StorageError as e:
                self._fail(e)
                raise RaftError(f"raft node stopped: {e}") from e

    async def read_barrier(self, timeout: float = 5.0) -> None:
        """Make the next ``read`` linearizable (Raft's ReadIndex): return once this node has
        confirmed, after the call, that it still leads (a majority answered a ping in its
        term) and has applied everything committed when the call was made. A leader cut off
        from the others finds out here instead of answering from stale state. Raises
        NotLeader, ReadNotReady (just elected: call again shortly) or TimeoutError."""
        self._check_running()
        r = self._reads.new(asyncio.get_running_loop())
        self._ticks.wake()
        async with asyncio.timeout(timeout):
            await r.fut

    def add_apply_listener(
        self, cb: Callable[[], None], wanted: Callable[[], bool] | None = None
    ) -> None:
        """Run ``cb()`` on the calling event loop after each tick that applied entries, in the
        same wake-up as that tick's completions. ``wanted()``, if given, is asked where the tick
        ran (the tick thread, or a leader's loop) after the entries were applied; when it says
        no, that loop is not woken for ``cb`` (a follower nobody waits on then never wakes its
        loop per entry). So a waiter must register before it reads the state it waits on, or
        it can miss its wake-up."""
        self._proposals.listeners.append((cb, asyncio.get_running_loop(), wanted))

    def add_stop_listener(self, cb: Callable[[BaseException], None]) -> None:
        """Run ``cb(error)`` on the calling event loop if the node stops on a failure (storage,
        an unexpected error): it will not replicate again in this process."""
        self._stop_listeners.append((cb, asyncio.get_running_loop()))

    def status(self) -> RaftStatus:
        cfg = self.config
        raft = self._raft
        members: dict[str, dict[str, Any]] = {
            cfg.node_id: {
                "raft": cfg.raft_addr,
                "api": cfg.api_addr,
                "connected": True,
                "self": True,
            }
        }
        if not raft.started:
            return RaftStatus(cfg.node_id, "follower", None, None, 0, 0, 0, members, False)
        for n in sorted(raft.members, key=lambda n: str(n.id)):
            nid, api = self._info.get(
                n.id, (getattr(n, "raftq_id", n.id), getattr(n, "raftq_api", ""))
            )
            members[nid] = {
                "raft": n.id,
                "api": api,
                "connected": raft.is_connected(n),
                "self": False,
            }
        lid, lapi = self._leader()
        applied = raft.last_applied
        running = self._fatal is None and not self._stopping and self._ticks.thread is not None
        return RaftStatus(
            node_id=cfg.node_id,
            # (a stopped node neither follows nor leads, whatever pysyncobj last said)
            role="stopped" if self._fatal is not None else ROLES.get(raft.state, "follower"),
            leader_id=lid,
            leader_api=lapi,
            term=raft.term,
            commit_index=max(raft.commit_index, applied),
            applied_index=applied,
            members=members,
            running=running,
            removed=self._members.removed,
            last_log_index=raft.last_log_index,
            last_log_term=raft.last_log_term,
            error=None if self._fatal is None else str(self._fatal),
            leader_commit=raft.leader_commit,
        )

    async def _on_tick_thread(
        self, fn: Callable[[Callable[[Any, Any], None]], None], timeout: float
    ) -> tuple[Any, Any]:
        """Run ``fn(callback)`` in the next tick; wait for ``callback(result, error)``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Any, Any]] = loop.create_future()

        def callback(res: Any, err: Any) -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_result((res, err))

            loop.call_soon_threadsafe(settle)

        self._ticks.calls.append(lambda: fn(callback))
        self._ticks.wake()
        return await asyncio.wait_for(fut, timeout)

    async def transfer_leadership(self, timeout: float = 5.0) -> bool:
        """Hand leadership to the most caught-up follower; True once another node leads."""
        deadline = time.monotonic() + timeout
        if not self._raft.started or not self._raft.members:
            return False  # nobody to hand over to
        while time.monotonic() < deadline:
            if not self.is_leader():
                return self._leader()[0] not in (None, self.config.node_id)
            try:
                _, err = await self._on_tick_thread(
                    self._raft.transfer_leadership, max(0.05, deadline - time.monotonic())
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

    async def _membership(self, op: str, node: Node, timeout: float) -> None:
        """Add or remove ``node`` (on the leader), if ``Membership.refusal`` finds it safe;
        a node being removed is told first (``Membership.notify``)."""
        self._check_running()
        if not self.is_leader():
            raise self._not_leader()
        if self._changing:
            raise RaftError(
                "membership change refused: another one is being made; one change at a time"
            )
        self._changing = True
        members = self._members
        notified = False
        try:
            if op == "rem":
                notified = True  # (until we know: a notice may be out)
                try:
                    notified, why = await self._on_tick_thread(
                        lambda cb: members.notify(node, cb), NOTICE_WAIT
                    )
                except TimeoutError:
                    notified, why = True, None  # (it may have heard: cancelled if refused)
                if why is not None:
                    raise RaftError(f"membership change refused: {why}")
            method = self._raft.add_node if op == "add" else self._raft.remove_node

            def change(cb: Callable[[Any, Any], None]) -> None:
                why = members.refusal(op, node)
                if why is not None:
                    cb(None, why)
                    return
                if op == "add":
                    members.adding(node)
                method(node, cb)

            try:
                _, err = await self._on_tick_thread(change, timeout)
            except asyncio.CancelledError:
                notified = False  # (it may happen all the same)
                raise
            except TimeoutError:
                notified = False
                raise UnknownOutcome(
                    f"membership change {op} {node.id} not committed in time"
                ) from None
            if err != FAIL_REASON.SUCCESS:
                if err in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
                    raise self._not_leader()
                if err == FAIL_REASON.QUEUE_FULL:
                    raise QueueFull("membership queue full")
                if isinstance(err, str):
                    raise RaftError(f"membership change refused: {err}")
                if err == FAIL_REASON.REQUEST_DENIED:
                    raise RaftError(
                        "membership change refused: an earlier change (or this leader's first"
                        " entry) is not committed yet; one change at a time, retry shortly"
                    )
                raise RaftError(f"membership change {op} {node.id} refused (reason {err})")
            notified = False
        finally:
            self._changing = False
            if notified:
                self._ticks.calls.append(lambda: members.cancel(node))
                self._ticks.wake()

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
        if not self.is_leader():
            raise self._not_leader()
        # Never a member that is not there: it would count toward the majority all the same.
        why = await self._probe(raft_addr)
        if why == NOT_A_PEER:  # (it would never vote for us: one member alone would wedge)
            raise RaftError(
                f"membership change refused: {node_id} does not list this node as a peer:"
                f" start it with every member in --peers (this node: {self.config.node_id}"
                f" at {self.config.raft_addr})"
            )
        if why is not None:
            raise RaftError(
                f"membership change refused: {node_id} does not answer on its Raft port"
                f" {raft_addr} with this cluster's secret: {why}; start it first (with every"
                " member as a peer and the cluster secret), then add it"
            )
        self._info[raft_addr] = (node_id, api_addr)
        await self._membership("add", make_node(raft_addr, node_id, api_addr), timeout)

    async def _probe(self, raft_addr: str) -> str | None:
        """``_membership.probe``; for a node that dials us, the proof that it takes us as a peer
        is its own attempts to connect (refused until it is a member), within PROBE_TIMEOUT."""
        me = self.config.raft_addr
        if not dials(raft_addr, me):
            return await probe(raft_addr, self._sealer, me, PROBE_TIMEOUT)
        start = time.monotonic()
        why = await probe(raft_addr, self._sealer, None, PROBE_TIMEOUT)
        if why is not None:
            return why
        since = monotonic() - PROBE_DIALED_WITHIN
        while (self._raft.dialed_by(raft_addr) or -1e9) < since:
            if time.monotonic() - start > PROBE_TIMEOUT:
                return NOT_A_PEER
            await asyncio.sleep(0.05)
        return None

    async def remove_member(self, node_id: str, timeout: float = 10.0) -> None:
        self._check_running()
        members = self._raft.members
        target = next(
            (n for n in members if self._info.get(n.id, ("",))[0] == node_id), None
        ) or next((n for n in members if getattr(n, "raftq_id", None) == node_id), None)
        if target is None:
            raise RaftError(f"cannot remove {node_id!r}: not a member (or this node)")
        await self._membership("rem", target, timeout)

    def force_compaction(self) -> None:
        """Start a snapshot now (tests, benchmarks)."""
        self._ticks.calls.append(self._raft.force_compaction)
        self._ticks.wake()
