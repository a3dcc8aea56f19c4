"""Proposals and their outcomes: queued, appended as one entry each, tracked by (index, term) until
applied or known lost, and resolved on their callers' loops in one wake-up per tick."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftq.cluster.entry import apply_entry
from raftq.cluster.raft._seam import LEADER, REGULAR
from raftq.cluster.raft._tuning import PICKLE_PROTOCOL, QUEUE_MAX
from raftq.cluster.raft._types import NotLeader, QueueFull, UnknownOutcome

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package

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


class Proposals:
    """The proposal queue (any thread), the pending table (index -> proposal) and the
    completions of this tick, under ``lock``; appends and applies run under the tick lock."""

    def __init__(self, node: RaftNode) -> None:
        self._node = node
        self._raft = node._raft
        self._ticks = node._ticks
        self._replication = node._replication
        self._snaps = node._snaps
        self.lock = threading.Lock()  # queue and pending table
        self.queue: deque[tuple[bytes, _Pending]] = deque()
        self.pending: dict[int, _Pending] = {}
        self.done: list[_Done] = []
        # (callback, its loop, wanted): see RaftNode.add_apply_listener
        self.listeners: list[_Listener] = []
        self.applied = False  # entries applied since the last deliver_all

    # ------------------------------------------------------------------ callers' side

    def enqueue(self, data: bytes, loop: asyncio.AbstractEventLoop) -> _Pending:
        p = _Pending(loop.create_future(), loop)
        with self.lock:
            if len(self.queue) >= QUEUE_MAX:
                raise QueueFull(f"{QUEUE_MAX} proposals already waiting; not applied")
            self.queue.append((data, p))
        return p

    def timed_out(self, p: _Pending, timeout: float) -> BaseException:
        """``p`` was not settled within ``timeout``: what its caller is told."""
        with self.lock:
            if p.state == _QUEUED:
                p.state = _CANCELLED
                return QueueFull(f"not appended within {timeout}s; not applied")
            if p.state == _LOGGED:
                p.state = _CANCELLED
                if self.pending.get(p.index) is p:
                    del self.pending[p.index]
        return UnknownOutcome(f"entry {p.index} (term {p.term}) not committed within {timeout}s")

    # ------------------------------------------------------------------ under the tick lock

    def append_queued(self, sync: bool) -> None:
        """Append the queued proposals (one entry each) and send them at once. With ``sync``
        False (caller's thread) the journal stays dirty: the woken tick thread syncs it in
        ``Ticks.after_tick``, before its next tick counts the leader's own entries toward
        commit."""
        if not self.queue:
            return
        node, raft = self._node, self._raft
        journal = node._journal
        assert journal is not None
        added = 0
        with self.lock:
            leader = raft.state == LEADER
            err = None if leader else node._not_leader("lost leadership before appending")
            term = raft.term
            func = raft.func_id
            while self.queue:
                data, p = self.queue.popleft()
                if p.state != _QUEUED:
                    continue
                if err is not None:
                    p.state = _DONE
                    self.done.append((p, None, err))
                    continue
                idx = journal[-1][1] + 1
                cmd = REGULAR + pickle.dumps((func, (data,)), PICKLE_PROTOCOL)
                journal.add(cmd, idx, term)
                p.state, p.index, p.term, p.logged_at = _LOGGED, idx, term, time.monotonic()
                prev = self.pending.get(idx)
                if prev is not None and prev.state == _LOGGED:
                    # An older entry of ours at this index is gone from this leader's log: it
                    # is not committed yet, but a later leader that still holds it may commit
                    # it (with 5 nodes, after more elections), so its outcome is unknown.
                    prev.state = _DONE
                    gone = UnknownOutcome(f"entry {idx} was superseded here; it may yet commit")
                    self.done.append((prev, None, gone))
                self.pending[idx] = p
                added += 1
        if added:
            # Send now (pysyncobj would wait for the next heartbeat), then sync while the
            # followers do the same: the leader counts itself at the start of the next tick.
            # From the caller's thread only to followers that have everything before these
            # entries: catching one up (batches up to 8 MB, or the snapshot) would stall the
            # event loop; the tick thread sends then, once woken (a leader whose loop ticks
            # sends them there in any case).
            first_new = journal[-1][1] - added + 1
            if not self._replication.send_new(first_new):
                if sync:
                    raft.send_append_entries()
                else:
                    self._replication.send_pending = True
            if sync:
                node._sync(journal)
                if not raft.other_nodes:
                    self._ticks.wake()  # a single node commits alone: no ack will end the poll

    def apply(self, idx: int, data: bytes) -> None:
        """pysyncobj applies our entry ``idx`` (the replicated method)."""
        node = self._node
        with node._lock:  # (payloads are read only for an entry somebody here waits for)
            results = apply_entry(node.broker, data, idx in self.pending)
        snaps = self._snaps
        snaps.since_compaction += len(data)
        if snaps.since_compaction >= snaps.compaction_bytes:
            snaps.force_by_bytes()
        if self.pending:
            with self.lock:
                # Lower indexes were applied as other entries (no-op, membership): superseded.
                while self.pending:
                    first = next(iter(self.pending))
                    if first >= idx:
                        break
                    old = self.pending.pop(first)
                    if old.state == _LOGGED:
                        old.state = _DONE
                        err = node._not_leader(f"entry {first} was superseded; not applied")
                        self.done.append((old, None, err))
                p = self.pending.pop(idx, None)
                if p is not None and p.state == _LOGGED:
                    p.state = _DONE
                    repl = self._replication
                    if repl.quorum:
                        repl.commit_s += (time.monotonic() - p.logged_at - repl.commit_s) / 16
                    journal = node._journal
                    assert journal is not None
                    if journal.term_at(idx) == p.term:
                        self.done.append((p, results, None))
                    else:
                        err = node._not_leader(f"entry {idx} was superseded; not applied")
                        self.done.append((p, None, err))
        self.applied = True

    def covered_by_snapshot(self, last_index: int) -> None:
        """An installed snapshot covers entries up to ``last_index``: what became of ours there
        is not known here."""
        with self.lock:
            for idx in [i for i in self.pending if i <= last_index]:
                p = self.pending.pop(idx)
                if p.state == _LOGGED:
                    p.state = _DONE
                    err = UnknownOutcome(f"entry {idx} was covered by an installed snapshot")
                    self.done.append((p, None, err))

    def fail_all(self) -> None:
        """The node stops: every proposal not settled yet is (call deliver_all after)."""
        with self.lock:
            queued = list(self.queue)
            self.queue.clear()
            pending = list(self.pending.values())
            self.pending.clear()
            for _, p in queued:
                if p.state == _QUEUED:
                    p.state = _DONE
                    self.done.append((p, None, NotLeader("node stopping; not applied")))
            for p in pending:
                if p.state == _LOGGED:
                    p.state = _DONE
                    self.done.append((p, None, UnknownOutcome("node stopped before commit")))

    # ------------------------------------------------------------------ completions

    def deliver_all(self) -> None:
        applied, self.applied = self.applied, False
        if not self.done and not (applied and self.listeners):
            return
        done, self.done = self.done, []
        by_loop: dict[asyncio.AbstractEventLoop, _LoopWork] = {}
        for item in done:
            by_loop.setdefault(item[0].loop, ([], []))[0].append(item)
        if applied:
            for cb, loop, wanted in self.listeners:
                if wanted is None or wanted():
                    by_loop.setdefault(loop, ([], []))[1].append(cb)
        ticks = self._ticks
        here = threading.get_ident() == ticks.home_ident
        for loop, work in by_loop.items():
            # One wake-up per loop for a tick's completions and apply listeners, not one per
            # proposal or entry (none for the loop running this tick); a closed loop means
            # nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                if here and loop is ticks.home:
                    loop.call_soon(_on_loop, work)
                else:
                    loop.call_soon_threadsafe(_on_loop, work)


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
