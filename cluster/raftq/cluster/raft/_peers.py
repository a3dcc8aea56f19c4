"""What each connected peer's version takes part in, as its hello says: pre-votes, read pings
(a peer of an older version says nothing, and is counted as it voted and read before)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raftq.cluster.raft._seam import Node, monotonic
from raftq.cluster.raft._wire import _HELLO


class Peers:
    """Under the tick lock; times on pysyncobj's clock."""

    def __init__(self, send: Callable[[Node, Any], bool], pre_vote: bool) -> None:
        self._send = send
        self._pre_vote = pre_vote  # what our hello says
        self.pre_voters: set[str] = set()  # peers that said they take part in pre-votes
        self.readers: set[str] = set()  # peers that answer read pings
        self.connected_at: dict[str, float] = {}
        self.hello_due: set[Node] = set()  # connected peers not yet greeted

    def connected(self, node: Node) -> None:
        self.connected_at[node.id] = monotonic()
        self.hello_due.add(node)
        self.greet()

    def disconnected(self, node: Node) -> None:
        self.hello_due.discard(node)
        self.pre_voters.discard(node.id)  # the next connection may be another version
        self.readers.discard(node.id)

    def greet(self) -> None:
        """Tell newly connected peers what this version takes part in: pre-votes, read pings
        (pysyncobj ignores a type it does not know). Retried each tick: without a secret,
        pysyncobj reports an outgoing connection before it can carry messages."""
        hello = {"type": _HELLO, "pre_vote": self._pre_vote, "reads": True}
        for node in list(self.hello_due):
            if self._send(node, hello):
                self.hello_due.discard(node)

    def on_hello(self, node: Node, message: dict[str, Any]) -> None:
        if message.get("reads") is True:
            self.readers.add(node.id)
        if message.get("pre_vote", True) is True:  # (the first hello had no keys)
            self.pre_voters.add(node.id)
