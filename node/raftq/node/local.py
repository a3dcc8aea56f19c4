"""``LocalRaft``: an in-process stand-in for ``raftq.cluster.raft.RaftNode``.

It applies each proposed entry to a ``Broker`` under a lock, through the same entry encoding the
real binding uses, so handler tests exercise the exact command bytes. It is always "leader"
unless a test says otherwise (``set_follower``), and it can inject faults (``fail_next``) and
latency (``delay``). Never used by a real node process.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from raftq.cluster.entry import apply_entry, encode_entry
from raftq.cluster.state import Broker
from raftq.node.raftapi import NotLeader, RaftError, RaftStatus

T = TypeVar("T")


class LocalRaft:
    def __init__(
        self,
        node_id: str = "n1",
        api_addr: str = "127.0.0.1:0",
        broker: Broker | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.node_id = node_id
        self.api_addr = api_addr
        self.broker = broker if broker is not None else Broker()
        self.clock = clock or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._order = asyncio.Lock()
        self._listeners: list[tuple[Callable[[], None], Callable[[], bool] | None]] = []
        self.leader_id: str | None = node_id
        self.leader_api: str | None = api_addr
        self.index = 0
        self.term = 1
        self.delay = 0.0
        self.entries: list[int] = []  # number of commands in each applied entry
        self._faults: list[BaseException] = []
        self.transferred = False
        self.stopped = False
        self.error: BaseException | None = None  # set by fail(): Raft stopped on a failure
        self._stop_listeners: list[Callable[[BaseException], None]] = []

    # test controls
    def set_follower(self, leader_id: str | None, leader_api: str | None) -> None:
        self.leader_id, self.leader_api = leader_id, leader_api

    def set_leader(self) -> None:
        self.leader_id, self.leader_api = self.node_id, self.api_addr

    def fail_next(self, exc: BaseException) -> None:
        self._faults.append(exc)

    def fail(self, err: BaseException) -> None:
        """Stop as the real binding does on a storage failure (on the loop's thread)."""
        self.error = err
        for cb in self._stop_listeners:
            cb(err)

    # the RaftNode interface
    def start(self) -> None:
        pass

    async def propose(
        self, commands: list[dict[str, Any]], timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        if self.error is not None:
            raise RaftError(f"raft node stopped: {self.error}")
        if not self.is_leader():
            raise NotLeader("not the leader", self.leader_id, self.leader_api)
        if self._faults:
            raise self._faults.pop(0)
        data = encode_entry(self.clock(), commands)
        # Entries apply in proposal order, as in Raft, however long each one takes.
        async with self._order:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self._apply(data, len(commands))

    def _apply(self, data: bytes, n: int) -> list[dict[str, Any]]:
        with self._lock:
            results = apply_entry(self.broker, data)
            self.index += 1
            self.entries.append(n)
        for cb, wanted in self._listeners:
            if wanted is None or wanted():
                cb()
        return results

    async def read_barrier(self, timeout: float = 5.0) -> None:
        if not self.is_leader():
            raise NotLeader("not the leader", self.leader_id, self.leader_api)

    def read(self, fn: Callable[[Broker], T]) -> T:
        with self._lock:
            return fn(self.broker)

    def status(self) -> RaftStatus:
        role = "leader" if self.is_leader() else "follower"
        if self.error is not None:
            role = "stopped"
        return RaftStatus(
            node_id=self.node_id,
            role=role,
            leader_id=self.leader_id,
            leader_api=self.leader_api,
            term=self.term,
            commit_index=self.index,
            applied_index=self.index,
            last_log_index=self.index,
            last_log_term=self.term,
            members={
                self.node_id: {
                    "raft": "local",
                    "api": self.api_addr,
                    "connected": True,
                    "self": True,
                }
            },
            running=self.error is None and not self.stopped,
            error=None if self.error is None else str(self.error),
        )

    def is_leader(self) -> bool:
        return self.leader_id == self.node_id and self.error is None

    def add_apply_listener(
        self, cb: Callable[[], None], wanted: Callable[[], bool] | None = None
    ) -> None:
        self._listeners.append((cb, wanted))  # on the loop right after each entry applies

    def add_stop_listener(self, cb: Callable[[BaseException], None]) -> None:
        self._stop_listeners.append(cb)

    async def add_member(
        self, node_id: str, raft_addr: str, api_addr: str, timeout: float = 10.0
    ) -> None:
        raise RaftError("LocalRaft is a single node; it has no membership")

    async def remove_member(self, node_id: str, timeout: float = 10.0) -> None:
        raise RaftError("LocalRaft is a single node; it has no membership")

    async def transfer_leadership(self, timeout: float = 5.0) -> bool:
        self.transferred = True
        return False

    async def stop(self) -> None:
        self.stopped = True
