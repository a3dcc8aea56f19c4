"""The binding's public types: its configuration, its status and its errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftq.cluster.raft._tuning import HANDSHAKE_TIMEOUT, MAX_CONNECTIONS


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
    # Recovery from a lost majority: commit this node's journal and make it the only member,
    # if its last log index is this (the operator's confirmation; one-shot: the log moves on).
    force_new_cluster: int | None = None
    max_connections: int = MAX_CONNECTIONS  # unauthenticated inbound Raft connections at once
    handshake_timeout: float = HANDSHAKE_TIMEOUT  # seconds for an inbound one to authenticate


class RaftError(Exception):
    """Base of the binding's errors."""


class ForceRefused(RaftError):
    """``force_new_cluster`` named another index than this node's last: nothing was done."""


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
    # A leader told this node it is being removed from the cluster (it serves no more).
    removed: bool = False
    # This node's log (the longest one's holder is the survivor to force: README).
    last_log_index: int = 0
    last_log_term: int = 0
