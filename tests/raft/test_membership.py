"""The leader's membership rules (``_membership.Membership.refusal``) on a stand-in for the
seam's ``Raft``, the removal notice as the removed node sees it, and the Raft port probe. The
same rules on real processes: tests/node/test_membership.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from raftq.cluster.raft._membership import (
    _SIZE,
    LIVE_WITHIN,
    NOT_A_PEER,
    REMOVAL,
    REMOVAL_ACK,
    REMOVAL_CANCEL,
    Membership,
    open_frame,
    probe,
    seal_frame,
)
from raftq.cluster.raft._seam import FOLLOWER, LEADER, make_node, monotonic
from raftq.cluster.raft._wire import _Sealer


@dataclass
class FakeRaft:
    """What ``Membership`` reads of the seam's ``Raft``."""

    other_nodes: set[Any]
    state: int = LEADER
    term: int = 3
    commit_index: int = 5000
    last_log_index: int = 5000
    leader: Any = None
    connected_nodes: set[Any] = field(default_factory=set)
    last_response_time: dict[Any, float] = field(default_factory=dict)
    match_index: dict[Any, int] = field(default_factory=dict)

    def is_connected(self, node: Any) -> bool:
        return node in self.connected_nodes


Sent = list[tuple[Any, dict[str, Any]]]


def cluster(n: int, dead: tuple[int, ...] = ()) -> tuple[Membership, FakeRaft, list[Any], Sent]:
    """This node n1 leading n-1 others (n2...), all caught up; ``dead`` ones gone."""
    nodes = [
        make_node(f"127.0.0.1:{9000 + i}", f"n{i}", f"127.0.0.1:{8000 + i}")
        for i in range(2, n + 1)
    ]
    raft = FakeRaft(set(nodes))
    for i, nd in enumerate(nodes, start=2):
        raft.match_index[nd] = raft.commit_index
        if i not in dead:
            raft.connected_nodes.add(nd)
            raft.last_response_time[nd] = monotonic()
    sent: Sent = []

    def send(node: Any, message: dict[str, Any]) -> bool:
        sent.append((node, message))
        return True

    owner = SimpleNamespace(
        _raft=raft, _replication=SimpleNamespace(send=send), config=SimpleNamespace(node_id="n1"),
        _info={nd.id: (nd.raftq_id, nd.raftq_api) for nd in nodes},
    )  # fmt: skip
    return Membership(owner), raft, nodes, sent  # type: ignore[arg-type]


NEW = make_node("127.0.0.1:9009", "n9", "127.0.0.1:8009")


def test_adds_and_removes_that_keep_a_live_majority_are_allowed() -> None:
    m, _, nodes, _ = cluster(3)
    assert m.refusal("add", NEW) is None
    assert m.refusal("rem", nodes[0]) is None
    m, _, nodes, _ = cluster(3, dead=(3,))
    assert m.refusal("rem", nodes[1]) is None  # the dead one: two live of two left
    m, _, _, _ = cluster(1)
    assert m.refusal("add", NEW) is None  # one member may always add a second


def test_a_change_that_leaves_the_live_members_short_of_a_majority_is_refused() -> None:
    m, _, nodes, _ = cluster(3, dead=(3,))
    assert "whose majority is 3, and only 2 are live (n3 not)" in str(m.refusal("add", NEW))
    assert "whose majority is 2, and only 1 of them are live" in str(m.refusal("rem", nodes[0]))
    m, _, nodes, _ = cluster(2)
    assert m.refusal("rem", nodes[0]) is None  # two live, one left
    m, _, _, _ = cluster(5, dead=(4, 5))
    assert m.refusal("add", NEW) is not None  # 3 live of 6: no majority


def test_a_member_not_heard_from_lately_is_not_live() -> None:
    m, raft, nodes, _ = cluster(3)
    raft.last_response_time[nodes[1]] = monotonic() - LIVE_WITHIN - 0.1
    assert "only 2 are live (n3 not)" in str(m.refusal("add", NEW))


def test_no_change_while_a_new_member_has_not_caught_up_but_it_can_be_removed() -> None:
    m, raft, nodes, _ = cluster(3)
    m.adding(NEW)  # its add is the next entry
    raft.other_nodes.add(NEW)
    raft.match_index[NEW] = 0
    raft.last_log_index += 1
    raft.commit_index += 1
    other = make_node("127.0.0.1:9010", "n10", "127.0.0.1:8010")
    assert "n9 has not caught up" in str(m.refusal("add", other))
    assert "n9 has not caught up" in str(m.refusal("rem", nodes[0]))
    assert m.refusal("rem", NEW) is None  # (dead or alive: one of four may go)
    raft.match_index[NEW] = raft.last_log_index  # caught up: changes allowed again
    raft.connected_nodes.add(NEW)
    raft.last_response_time[NEW] = monotonic()
    assert m.refusal("add", other) is None


def test_a_live_member_far_behind_blocks_changes() -> None:
    m, raft, nodes, _ = cluster(3)
    raft.match_index[nodes[0]] = 0
    assert "n2 has not caught up" in str(m.refusal("add", NEW))


def test_a_removed_node_is_told_and_knows_it_until_added_back() -> None:
    leader, _, nodes, sent = cluster(3)
    gone = nodes[0]
    acked: list[Any] = []
    leader.notify(gone, lambda res, err: acked.append((res, err)))
    assert sent[-1] == (gone, {"type": REMOVAL, "term": 3})
    # On the node told: from its current leader, in its term only.
    me, mine, _, replies = cluster(1)
    mine.state, mine.leader = FOLLOWER, make_node("127.0.0.1:9001", "n1", "")
    me.on_message(make_node("127.0.0.1:9003", "n3", ""), REMOVAL, {"term": 3})
    assert not me.removed  # not the leader
    me.on_message(mine.leader, REMOVAL, {"term": 2})
    assert not me.removed  # an old term
    me.on_message(mine.leader, REMOVAL, {"term": 3})
    assert me.removed and replies[-1] == (mine.leader, {"type": REMOVAL_ACK, "term": 3})
    leader.on_message(gone, REMOVAL_ACK, {"term": 3})
    assert acked == [(True, None)]
    # Entries over the same connection (before the removal is appended) change nothing...
    me.heard_append(mine.leader, {"type": "append_entries", "term": 3})
    assert me.removed
    # ...over a new one, they mean it was added back.
    me.disconnected(mine.leader)
    me.heard_append(mine.leader, {"type": "append_entries", "term": 3})
    assert not me.removed
    # A cancel (the removal was refused), or a leader of a later term, also end it.
    me.on_message(mine.leader, REMOVAL, {"term": 3})
    me.on_message(mine.leader, REMOVAL_CANCEL, {"term": 3})
    assert not me.removed
    me.on_message(mine.leader, REMOVAL, {"term": 3})
    me.heard_append(make_node("127.0.0.1:9003", "n3", ""), {"type": "append_entries", "term": 4})
    assert not me.removed


def test_a_removal_refused_or_of_a_node_not_connected_tells_nobody() -> None:
    m, _, nodes, sent = cluster(3, dead=(3,))
    got: list[Any] = []
    m.notify(nodes[1], lambda res, err: got.append((res, err)))
    assert got == [(False, None)] and not sent  # n3 is down: removing it is fine, untold
    m.notify(nodes[0], lambda res, err: got.append((res, err)))
    assert got[-1][0] is None and "majority" in got[-1][1] and not sent


ME = "127.0.0.1:9001"


async def test_the_probe_needs_the_cluster_secret_on_the_raft_port() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()  # (a node with another secret closes at once)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        why = await probe(f"127.0.0.1:{port}", _Sealer("secret"), ME, 1.0)
        assert why is not None and "another cluster secret" in why
        assert await probe(f"127.0.0.1:{port}", None, ME, 1.0) is None  # (insecure: it connects)
    finally:
        server.close()
        await server.wait_closed()
    why = await probe(f"127.0.0.1:{port}", _Sealer("secret"), ME, 1.0)
    assert why is not None and "cannot connect" in why


async def test_the_probe_needs_the_node_to_take_this_one_as_a_peer() -> None:
    """As a node does: the key exchange, then it closes the connection unless the address
    that follows is one of its peers (then it greets)."""
    sealer = _Sealer("secret")

    def server(peers: set[str]) -> Any:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def receive() -> Any:
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
                return open_frame(sealer, await reader.readexactly(size))

            try:
                key, mine = await receive(), b"k" * 32
                writer.write(seal_frame(sealer, (key, mine)))
                echoed, address = await receive()
                if echoed == mine and address in peers:
                    writer.write(seal_frame(sealer, (key, {"type": "raftq_hello"})))
                    await reader.read()
            finally:
                writer.close()

        return asyncio.start_server(answer, "127.0.0.1", 0)

    for peers, expected in (({ME}, None), ({"127.0.0.1:9002"}, NOT_A_PEER)):
        srv = await server(peers)
        port = srv.sockets[0].getsockname()[1]
        try:
            assert await probe(f"127.0.0.1:{port}", sealer, ME, 1.0) == expected
        finally:
            srv.close()
            await srv.wait_closed()
