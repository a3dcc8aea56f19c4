"""Where the transport's events enter raftq: each received message goes to its component (raftq's
own types) or is checked and fixed before pysyncobj handles it; connects and disconnects too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftq.cluster.raft._membership import KINDS as MEMBERSHIP
from raftq.cluster.raft._seam import LEADER, Node
from raftq.cluster.raft._wire import _HELLO, _OURS, _READ_PING, _READ_PONG

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode


class Inbound:
    """The transport's callbacks (``Hooks.on_message``, ``on_connected``, ``on_disconnected``),
    on whichever thread ticks, under the tick lock."""

    def __init__(self, node: RaftNode) -> None:
        self._raft = node._raft
        self._peers = node._peers
        self._reads = node._reads
        self._elections = node._elections
        self._pre_vote = node._pre_vote
        self._replication = node._replication
        self._members = node._members

    def on_message(self, node: Node, message: Any) -> None:
        raft = self._raft
        if not isinstance(message, dict):
            raft.handle_message(node, message)
            return
        kind = message.get("type")
        if kind in MEMBERSHIP:
            self._members.on_message(node, kind, message)
            return
        if kind in _OURS:
            if kind == _HELLO:  # what the peer's version takes part in
                self._peers.on_hello(node, message)
                return
            if kind in (_READ_PING, _READ_PONG):
                self._reads.on_message(node, kind, message)
                return
            if self._pre_vote.enabled:
                self._pre_vote.on_message(node, kind, message)
                return
        elif kind == "append_entries":
            term = raft.term
            current = message.get("term", -1) >= term
            self._pre_vote.heard_append(message, term)
            self._members.heard_append(node, message)
            if "prevLogIdx" not in message and "commit_index" in message:
                # A snapshot chunk (or "none yet") checks nothing of our log, yet pysyncobj
                # raised our commit index to the leader's over whatever our log holds: an
                # old leader's unreplicated tail got applied (and, kept by the commit mark,
                # re-applied after a restart). Raft advances it only on a verified append.
                message["commit_index"] = min(message["commit_index"], raft.commit_index)
            self._elections.heard_append(message, current)
            if current and "prevLogIdx" in message and "transmission" not in message:
                self._replication.skip_known_entries(node, message)
            raft.handle_message(node, message)
            part = message.get("serialized")
            if part and not part[2]:
                # pysyncobj does not answer snapshot chunks: the leader hears nothing for the
                # whole transfer, drops the connection after CONNECTION_TIMEOUT and starts over
                # (a 100 MB snapshot never got through). A progress reply keeps it alive.
                self._replication.send(
                    node,
                    {"type": "next_node_idx", "next_node_idx": 0, "reset": False, "success": False},
                )
            return
        elif kind == "next_node_idx":
            replication = self._replication
            if replication.fix_acks and raft.state == LEADER:
                replication.on_ack(node, message)
                return
        raft.handle_message(node, message)

    def on_connected(self, node: Node) -> None:
        self._peers.connected(node)

    def on_disconnected(self, node: Node) -> None:
        self._peers.disconnected(node)
        self._elections.disconnected(node)
        self._members.disconnected(node)
