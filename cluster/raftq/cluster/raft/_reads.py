"""Read barriers (Raft's ReadIndex): a leader confirms with a majority that it still leads, and
waits until it applied what was committed, before a read is answered."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from raftq.cluster.raft._seam import LEADER, Node, monotonic
from raftq.cluster.raft._tuning import APPEND_PERIOD, HELLO_GRACE
from raftq.cluster.raft._types import NotLeader, RaftError, ReadNotReady
from raftq.cluster.raft._wire import _READ_PING, _READ_PONG

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode


class _Read:
    """A read barrier waiting for a majority's answers to ping ``seq`` and for ``index``
    applied (see RaftNode.read_barrier)."""

    __slots__ = ("fut", "index", "loop", "seq")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fut: asyncio.Future[None] = loop.create_future()
        self.seq = self.index = 0


class Reads:
    """The barriers: queued by any thread, started by the next tick (they share one ping),
    settled under the tick lock. Pings are numbered; ``acked`` holds the highest each peer
    answered in ``term``."""

    def __init__(self, node: RaftNode) -> None:
        self._node = node
        self._raft = node._raft
        self._ticks = node._ticks
        self._peers = node._peers
        self._send = node._replication.send
        self.seq = 0
        self.term = -1
        self.acked: dict[str, int] = {}
        self.pinged_at = 0.0
        self.queue: deque[_Read] = deque()  # from RaftNode.read_barrier
        self.waiting: list[_Read] = []

    def new(self, loop: asyncio.AbstractEventLoop) -> _Read:
        """A barrier, queued for the next tick (any thread)."""
        r = _Read(loop)
        self.queue.append(r)
        return r

    def start(self) -> None:
        """In a tick: start the barriers queued since the last one (they share one ping)."""
        raft = self._raft
        term = raft.term
        commit = raft.commit_index
        journal = self._node._journal
        assert journal is not None
        err: RaftError | None = None
        if raft.state != LEADER:
            err = self._node._not_leader()
        elif journal.term_at(commit) != term:
            err = ReadNotReady("no entry of this leader's term committed yet")
        elif term != self.term:
            self.term = term
            self.acked.clear()
        started = False
        while self.queue:
            r = self.queue.popleft()
            if err is not None:
                self._settle(r, err)
                continue
            if not started:
                self._ping()
                started = True
            r.seq, r.index = self.seq, commit
            self.waiting.append(r)
        if started:
            self.check()

    def _ping(self) -> None:
        raft = self._raft
        self.seq += 1
        self.pinged_at = monotonic()
        ping = {"type": _READ_PING, "term": self.term, "seq": self.seq}
        connected = raft.connected_nodes
        for n in raft.other_nodes:
            if n in connected:
                self._send(n, ping)

    def on_message(self, node: Node, kind: str, m: dict[str, Any]) -> None:
        raft = self._raft
        term = raft.term
        if kind == _READ_PING:  # do we follow the sender in its term?
            ok = m.get("term") == term and raft.leader == node
            self._send(node, {"type": _READ_PONG, "term": m.get("term"), "seq": m.get("seq"),
                              "ok": ok, "now": term})  # fmt: skip
            return
        self._peers.readers.add(node.id)
        now = m.get("now")
        if type(now) is int and now > term and self.waiting:
            # That follower is in a newer term: we are deposed and will hear of it.
            reads, self.waiting = self.waiting, []
            for r in reads:
                self._settle(r, self._node._not_leader("a newer term has begun"))
        elif m.get("ok") is True and m.get("term") == self.term == term:
            seq = m.get("seq")
            if type(seq) is int and seq > self.acked.get(node.id, 0):
                self.acked[node.id] = seq
                self.check()

    def check(self) -> None:
        """Settle the read barriers confirmed by a majority and applied (after each answer,
        and after each tick: applies, or a lost leadership)."""
        if not self.waiting:
            return
        raft = self._raft
        if raft.state != LEADER or raft.term != self.term:
            reads, self.waiting = self.waiting, []
            for r in reads:
                self._settle(r, self._node._not_leader("lost leadership before the read"))
            return
        others = raft.other_nodes
        connected = raft.connected_nodes
        applied = raft.last_applied
        now = monotonic()
        peers = self._peers
        # An older version answers no pings; it counts as confirming (reads as before).
        old = {
            n.id
            for n in others
            if n in connected
            and n.id not in peers.readers
            and peers.connected_at.get(n.id, 0.0) <= now - HELLO_GRACE
        }
        acked = self.acked
        waiting = []
        for r in self.waiting:
            if r.fut.done():  # timed out or cancelled
                continue
            votes = 1 + sum(1 for n in others if acked.get(n.id, 0) >= r.seq or n.id in old)
            if 2 * votes > len(others) + 1 and applied >= r.index:
                self._settle(r, None)
            else:
                waiting.append(r)
        self.waiting = waiting
        if waiting and now - self.pinged_at >= APPEND_PERIOD:
            self._ping()  # a ping or its answer may be lost (a link that dropped and is back)

    def fail_all(self) -> None:
        """The node stops."""
        reads, self.waiting = self.waiting, []
        while self.queue:
            reads.append(self.queue.popleft())
        for r in reads:
            self._settle(r, NotLeader("node stopping"))

    def _settle(self, r: _Read, err: BaseException | None) -> None:
        def settle() -> None:
            if not r.fut.done():
                if err is None:
                    r.fut.set_result(None)
                else:
                    r.fut.set_exception(err)

        ticks = self._ticks
        if threading.get_ident() == ticks.home_ident and r.loop is ticks.home:
            settle()
        else:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                r.loop.call_soon_threadsafe(settle)
