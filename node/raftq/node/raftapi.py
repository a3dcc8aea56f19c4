"""The narrow Raft interface the node depends on (a ``Protocol``), so handlers can be tested
with ``LocalRaft``; the real implementation is ``raftq.cluster.raft.RaftNode``.

The exception classes are re-exported from ``raftq.cluster.raft`` so that ``except NotLeader``
in the node catches what the real binding raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from raftq.cluster.raft import (
    EntryTooLarge,
    ForceRefused,
    NotLeader,
    QueueFull,
    RaftError,
    RaftStatus,
    ReadNotReady,
    UnknownOutcome,
)
from raftq.cluster.state import Broker

__all__ = [
    "EntryTooLarge",
    "ForceRefused",
    "NotLeader",
    "QueueFull",
    "Raft",
    "RaftError",
    "RaftStatus",
    "ReadNotReady",
    "UnknownOutcome",
]

T = TypeVar("T")


class Raft(Protocol):
    def start(self) -> None: ...

    async def propose(
        self, commands: list[dict[str, Any]], timeout: float = 5.0
    ) -> list[dict[str, Any]]: ...

    def read(self, fn: Callable[[Broker], T]) -> T: ...

    async def read_barrier(self, timeout: float = 5.0) -> None: ...

    def status(self) -> Any: ...

    def is_leader(self) -> bool: ...

    def add_apply_listener(
        self, cb: Callable[[], None], wanted: Callable[[], bool] | None = None
    ) -> None: ...

    def add_stop_listener(self, cb: Callable[[BaseException], None]) -> None: ...

    async def transfer_leadership(self, timeout: float = 5.0) -> bool: ...

    async def add_member(
        self, node_id: str, raft_addr: str, api_addr: str, timeout: float = 10.0
    ) -> None: ...

    async def remove_member(self, node_id: str, timeout: float = 10.0) -> None: ...

    async def stop(self) -> None: ...
