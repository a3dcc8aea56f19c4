"""INFO log lines for what an operator follows: elections, who leads, losing leadership and
the members. Read after every tick (a few attribute reads; the members' names only when their
count changed, which every change does: one at a time); pysyncobj logs none of it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from raftq.cluster.raft._seam import CANDIDATE, LEADER, Node

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package


class Changes:
    """Compares the role, leader and member count with the last tick's (under the tick lock)."""

    def __init__(self, node: RaftNode) -> None:
        self._raft = node._raft
        self._node_id = node.config.node_id
        self._info = node._info
        self._role: int | None = None  # None: not looked yet
        self._leader: Node | None = None
        self._count = -1
        self._members: list[str] = []

    def _name(self, node: Any) -> str:
        return self._info.get(node.id, (getattr(node, "raftq_id", node.id),))[0]

    def check(self) -> None:
        raft = self._raft
        role, leader = raft.state, raft.leader
        if role != self._role or leader is not self._leader:
            self._roles(role, leader)
        others = raft.other_nodes
        if len(others) != self._count:
            self._membership(others)

    def _roles(self, role: int, leader: Node | None) -> None:
        first, was_leader, was_candidate = (
            self._role is None,
            self._role == LEADER,
            self._role == CANDIDATE,
        )
        before = self._leader
        self._role, self._leader = role, leader
        me, term = self._node_id, self._raft.term
        if role == CANDIDATE:
            log.info("raft %s: election: standing in term %d", me, term)
        elif role == LEADER:
            if not was_candidate:  # (stood and won within one tick: no tick saw it stand)
                log.info("raft %s: election: standing in term %d", me, term)
            log.info("raft %s: elected leader in term %d", me, term)
        else:
            if was_leader:
                log.info("raft %s: no longer the leader (term %d)", me, term)
            if leader is not None:
                log.info("raft %s: leader is %s (term %d)", me, self._name(leader), term)
            elif before is not None and not first:
                log.info("raft %s: lost the leader %s (term %d)", me, self._name(before), term)

    def _membership(self, others: Any) -> None:
        names = sorted([self._node_id, *(self._name(n) for n in others)])
        first = self._count < 0
        old = self._members
        self._count, self._members = len(others), names
        if first:
            log.info("raft %s: members %s", self._node_id, ", ".join(names))
            return
        added = [n for n in names if n not in old]
        gone = [n for n in old if n not in names]
        log.info(
            "raft %s: members now %s (%s)",
            self._node_id,
            ", ".join(names),
            "; ".join([*(f"added {n}" for n in added), *(f"removed {n}" for n in gone)]),
        )
