"""Membership changes made safe (after etcd's strict reconfiguration check), and what a removed
member learns.

pysyncobj takes any change: a member that does not exist counts toward the majority all the
same, so three bogus adds stopped a 3-node cluster for good. Here, on the leader:

* one change at a time: refused while another is being made here, while pysyncobj holds an
  uncommitted one, while a member this leader added does not hold the log up to its add, and
  while a live member trails the commit index by more than ``CATCH_UP_GAP`` (the member to
  remove excepted: that is how a new member that never catches up goes). So a new member
  catches up before the next change; it counts toward the majority from its add (pysyncobj has
  no learners), and the next rule leaves room for it never to;
* an add only if the live members (the new one not counted) are a majority of the new
  configuration (but one member may always add a second), and the new member answers on its
  Raft port with the cluster secret and takes this node as a peer (``probe``: pysyncobj's
  handshake, sealed, up to the first message after it) within ``PROBE_TIMEOUT``. A node
  started without us in its peers never votes for us: a single member that added it could
  never be elected again;
* a remove only if the live members left are a majority of the new configuration.

"Live": connected, and heard from within ``LIVE_WITHIN``. A refusal changes nothing and names
the rule.

pysyncobj drops a member from the leader the moment the removal is appended, so the removed
node never receives it. Before appending it, the leader tells the node (``REMOVAL``, its term)
and waits up to ``NOTICE_WAIT`` for its ack. From then on the node reports itself removed (not
ready; the API refuses broker requests), until the leader cancels (the removal was refused), a
leader of a later term sends it entries (the removal did not survive a leader change), or that
leader does over a new connection (it connects only to members: the node was added back).

``force_new_cluster`` is the way back from a lost majority: at start, commit and apply the
whole journal, then make this node the only member (a snapshot written at once keeps that).
It names the node's last log index (``RaftNode.start`` refuses another: ``ForceRefused``), so
a flag left set does nothing once the log has moved on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import struct
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raftq.cluster.raft._seam import LEADER, Node, monotonic
from raftq.cluster.raft._tuning import PICKLE_PROTOCOL
from raftq.cluster.raft._wire import _Sealer, _stored_zlib

if TYPE_CHECKING:
    from raftq.cluster.raft._node import RaftNode

log = logging.getLogger("raftq.cluster.raft")  # one logger for the whole package

REMOVAL, REMOVAL_ACK, REMOVAL_CANCEL = "raftq_removal", "raftq_removal_ack", "raftq_removal_cancel"
KINDS = frozenset([REMOVAL, REMOVAL_ACK, REMOVAL_CANCEL])

# A member whose match index trails the leader's commit index by more has not caught up. A
# healthy follower outside the quorum trails by one heartbeat of entries (50 ms); a new one
# waiting for the snapshot, by everything.
CATCH_UP_GAP = 1000
# A follower answers every heartbeat (50 ms); a loaded box has stalled a tick for ~1 s.
LIVE_WITHIN = 2.0
PROBE_TIMEOUT = 2.0
# A node that takes us as a peer and dials us retries every RECONNECT (0.3 s) while refused.
PROBE_DIALED_WITHIN = 1.0
NOTICE_WAIT = 1.0

_SIZE = struct.Struct("i")  # pysyncobj's frame header: the sealed body's length


def quorum(members: int) -> int:
    return members // 2 + 1


def seal_frame(sealer: _Sealer, message: Any) -> bytes:
    """``message`` framed as pysyncobj's transport sends it (sealed with ``sealer``)."""
    body = sealer.encrypt_at_time(
        _stored_zlib(pickle.dumps(message, PICKLE_PROTOCOL)), int(time.monotonic())
    )
    return _SIZE.pack(len(body)) + body


def open_frame(sealer: _Sealer, body: bytes) -> Any:
    """A frame's body opened; raises if it was not sealed with this cluster's secret (only
    then is it unpickled)."""
    sealer.extract_timestamp(body)
    return pickle.loads(zlib.decompress(sealer.decrypt(body)))  # (authenticated first)


NOT_A_PEER = "it does not list this node as a peer"


async def probe(
    addr: str, sealer: _Sealer | None, self_addr: str | None, timeout: float = PROBE_TIMEOUT
) -> str | None:
    """Does the node at Raft address ``addr`` have the cluster secret and, if ``self_addr`` is
    given, take this node (at ``self_addr``) as a peer? None if so, else why not
    (``NOT_A_PEER`` when only that is missing). The handshake every connection starts with:
    our random key, sealed; the node answers with it and its own, sealed with the same secret;
    we send our address with its key; a node that does not list that address closes the
    connection, one that does greets us (raftq's hello). (Without a secret: it accepts a
    connection.) Only for a node that does not dial us (``_seam.dials``): one that does would
    take this connection for ours and, once it closes, redial with it, without a handshake."""
    host, _, port = addr.rpartition(":")
    key = os.urandom(32)
    connected = greeting = False
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            connected = True
            try:
                if sealer is None:
                    return None

                async def receive() -> Any:
                    (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
                    if not 0 < size <= 4096:
                        raise _NotOurs(f"it answered a frame of {size} bytes: not a raftq node")
                    reply = open_frame(sealer, await reader.readexactly(size))
                    if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] == key):
                        raise _NotOurs("it did not answer the key exchange")
                    return reply[1]

                writer.write(seal_frame(sealer, key))
                await writer.drain()
                theirs = await receive()
                if self_addr is None:
                    return None
                greeting = True
                writer.write(seal_frame(sealer, (theirs, self_addr)))
                await writer.drain()
                await receive()  # (whatever it sends first: it took us)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except _NotOurs as e:
        return str(e)
    except (OSError, asyncio.IncompleteReadError) as e:
        if not connected:
            return f"cannot connect ({getattr(e, 'strerror', None) or e})"
        if greeting:
            return NOT_A_PEER
        return "it closed the connection (another cluster secret, or not a raftq node)"
    except Exception:  # (InvalidTag, or not a frame of ours)
        return "its answer is not sealed with this cluster's secret"
    return None


class _NotOurs(Exception):
    pass


Callback = Callable[[Any, Any], None]


class Membership:
    """The leader's checks and the removal notices (both sides). Under the tick lock, except
    ``removed`` (read anywhere)."""

    def __init__(self, node: RaftNode) -> None:
        self._raft = node._raft
        self._send = node._replication.send
        self._node_id = node.config.node_id
        self._info = node._info
        # Members added by this leader that do not hold the log up to their add yet.
        self.joining: dict[Node, int] = {}
        self.removed_in: int | None = None  # the term in which a leader said we are removed
        self._removed_by: Node | None = None  # ...that leader
        self._dropped = False  # ...which has closed its connection to us since
        self._notices: dict[str, tuple[int, Callback]] = {}  # node id -> (term, callback)

    @property
    def removed(self) -> bool:
        return self.removed_in is not None

    def _name(self, node: Node) -> str:
        return self._info.get(node.id, (getattr(node, "raftq_id", node.id),))[0]

    def _names(self, nodes: Any) -> str:
        return ", ".join(sorted(self._name(n) for n in nodes))

    # ------------------------------------------------------------------ the leader's checks

    def refusal(self, op: str, node: Node) -> str | None:
        """Why adding (``op`` "add") or removing ("rem") ``node`` now is unsafe, or None."""
        raft = self._raft
        if raft.state != LEADER:
            return None  # (pysyncobj answers NOT_LEADER)
        others = raft.other_nodes
        now = monotonic()
        seen, connected = raft.last_response_time, raft.connected_nodes
        live = {n for n in others if n in connected and seen.get(n, -1e9) > now - LIVE_WITHIN}
        commit, match = raft.commit_index, raft.match_index
        joining = self.joining
        for n, target in list(joining.items()):
            if n not in others or match.get(n, 0) >= target:
                del joining[n]  # (gone, or it holds every entry up to its own add)
        behind = {n for n in live if match.get(n, 0) + CATCH_UP_GAP < commit} | set(joining)
        behind.discard(node)
        if behind:
            return (
                f"{self._names(behind)} has not caught up with the log yet (one change at a"
                f" time: retry once it has, or remove it)"
            )
        size = len(others) + 1
        down = others - live
        if op == "add":
            live_after = 1 + len(live)
            if size > 1 and live_after < quorum(size + 1):
                return (
                    f"with {self._name(node)} there would be {size + 1} members, whose majority"
                    f" is {quorum(size + 1)}, and only {live_after} are live"
                    f" ({self._names(down)} not): the cluster could not commit if the new member"
                    " failed; remove the dead members first"
                )
        else:
            live_after = 1 + len(live - {node})
            if live_after < quorum(size - 1):
                return (
                    f"without {self._name(node)} there would be {size - 1} members, whose"
                    f" majority is {quorum(size - 1)}, and only {live_after} of them are live"
                    f" ({self._names(down - {node})} not): the cluster could not commit"
                )
        return None

    def adding(self, node: Node) -> None:
        """``node``'s add is about to be appended (at the next index)."""
        self.joining[node] = self._raft.last_log_index + 1

    # ------------------------------------------------------------------ removal notices

    def notify(self, node: Node, callback: Callback) -> None:
        """Tell ``node`` it is being removed; ``callback(True, None)`` once it acknowledged,
        ``(False, None)`` if it is not connected, ``(None, why)`` if the removal is refused."""
        why = self.refusal("rem", node)
        if why is not None:
            callback(None, why)
            return
        raft = self._raft
        if raft.state != LEADER or not raft.is_connected(node):
            callback(False, None)
            return
        self._notices[node.id] = (raft.term, callback)
        if not self._send(node, {"type": REMOVAL, "term": raft.term}):
            self._notices.pop(node.id, None)
            callback(False, None)

    def cancel(self, node: Node) -> None:
        """The removal ``node`` was told of did not happen."""
        self._notices.pop(node.id, None)
        self._send(node, {"type": REMOVAL_CANCEL, "term": self._raft.term})

    def on_message(self, node: Node, kind: str, m: dict[str, Any]) -> None:
        raft = self._raft
        term = m.get("term")
        if type(term) is not int:
            return
        if kind == REMOVAL_ACK:
            notice = self._notices.pop(node.id, None)
            if notice is not None and notice[0] == term:
                notice[1](True, None)
            return
        if node != raft.leader or term != raft.term:
            return  # only our current leader says so
        if kind == REMOVAL:
            if self.removed_in is None:
                log.warning(
                    "raft %s: leader %s is removing this node from the cluster (term %d): not"
                    " serving any more",
                    self._node_id,
                    self._name(node),
                    term,
                )
            self.removed_in = term
            self._removed_by, self._dropped = node, False
            self._send(node, {"type": REMOVAL_ACK, "term": term})
        elif kind == REMOVAL_CANCEL and self.removed_in == term:
            log.warning("raft %s: the removal did not happen: serving again", self._node_id)
            self.removed_in = None

    def disconnected(self, node: Node) -> None:
        if self.removed_in is not None and node == self._removed_by:
            self._dropped = True

    def heard_append(self, node: Node, message: dict[str, Any]) -> None:
        """Entries from a leader of a later term than the one that said we are removed, or
        from that leader over a new connection (it drops a removed member's, and connects
        only to members): we are a member (again)."""
        if self.removed_in is None:
            return
        term = message.get("term")
        if type(term) is not int or term < self.removed_in:
            return
        if term > self.removed_in or (self._dropped and node == self._removed_by):
            log.warning(
                "raft %s: leader %s (term %d) counts this node as a member: serving again",
                self._node_id,
                self._name(node),
                term,
            )
            self.removed_in = None
