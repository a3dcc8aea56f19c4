"""The narrow Raft interface the node depends on (a ``Protocol``), so handlers can be tested
with ``LocalRaft``; the real implementation is ``raftq.cluster.raft.RaftNode``.

The exception classes are re-exported from ``raftq.cluster.raft`` so that ``except NotLeader``
in the node catches what the real binding raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from raftq.cluster.state import Broker

T = TypeVar("T")


class RaftError(Exception):
    pass


class NotLeader(RaftError):
    """Definitely not applied."""

    def __init__(
        self,
        message: str = "not the leader",
        leader_id: str | None = None,
        leader_api: str | None = None,
    ) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_api = leader_api


class QueueFull(RaftError):
    """Definitely not applied."""


class UnknownOutcome(RaftError, TimeoutError):
    """May or may not have been applied."""


@dataclass
class RaftStatus:
    node_id: str
    role: str
    leader_id: str | None
    leader_api: str | None
    term: int
    commit_index: int
    applied_index: int
    members: dict[str, dict[str, Any]] = field(default_factory=dict)


class Raft(Protocol):
    def start(self) -> None: ...

    async def propose(
        self, commands: list[dict[str, Any]], timeout: float = 5.0
    ) -> list[dict[str, Any]]: ...

    def read(self, fn: Callable[[Broker], T]) -> T: ...

    def status(self) -> Any: ...

    def is_leader(self) -> bool: ...

    def add_apply_listener(self, cb: Callable[[], None]) -> None: ...

    async def transfer_leadership(self, timeout: float = 5.0) -> bool: ...

    async def stop(self) -> None: ...
