"""Dynamic membership over the HTTP API, on real processes: the changes the live members could
not survive are refused, a removed node stops serving, and a lost majority is recovered with
``--force-new-cluster``."""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import subprocess
import threading
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from raftq.client import Client, InvalidArgument
from raftq.client.errors import Conflict
from raftq.cluster.raft._membership import _SIZE, open_frame, seal_frame
from raftq.cluster.raft._wire import _Sealer
from tests.node.cluster_fixture import Cluster, free_ports, http, wait_for

pytestmark = pytest.mark.slow


def test_remove_a_member_then_add_it_back(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 4)  # every node is configured with four members...
    try:
        for nid in ("n1", "n2", "n3"):  # ...but n4 never started
            c.start_node(nid)
        leader = c.wait_leader()
        topic = f"t-{uuid.uuid4().hex[:8]}"
        urls = [c.url(n) for n in ("n1", "n2", "n3")]
        with Client(urls, timeout=30) as cl:
            cl.create_topic(topic)
            res = cl.remove_member("n4")
            assert res["members"] == ["n1", "n2", "n3"]
            # Three members now: two of them are a majority, so losing a follower is fine
            # (with n4 still a member, two of four could not commit).
            follower = next(n for n in ("n1", "n2", "n3") if n != leader)
            c.kill(follower)
            cl.publish(topic, b"committed by two of three")
            c.start_node(follower)

            c.start_node("n4")
            n4 = c.nodes["n4"]
            res = cl.add_member("n4", n4.raft, n4.api)
            assert res["members"] == ["n1", "n2", "n3", "n4"]
            wait_for(
                "n4 to catch up",
                lambda: (
                    c.status("n4")["applied_index"] >= c.status(c.wait_leader())["commit_index"]
                ),
                30,
            )
            with Client(c.url("n4")) as direct:
                assert direct.topic(topic)["messages"] == 1
    finally:
        c.close()


def test_membership_input_errors_are_4xx(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 3).start()
    try:
        with Client([c.url(n) for n in c.nodes]) as cl:
            with pytest.raises(InvalidArgument):
                cl.add_member("n9", "no-port", "127.0.0.1:1")
            with pytest.raises(Conflict) as info:
                cl.remove_member("n9")
            assert info.value.status == 409
            n2 = c.nodes["n2"]
            # An id that is a member already (at another Raft address), or a Raft address
            # that is: refused, not a fourth member in disguise (which cost the majority).
            with pytest.raises(Conflict, match="is a member already"):
                cl.add_member("n2", "127.0.0.1:1", n2.api)
            with pytest.raises(Conflict, match="is a member already"):
                cl.add_member("n7", n2.raft, n2.api)
            # A node that is not running: refused before it counts toward the majority.
            with pytest.raises(Conflict, match="does not answer on its Raft port"):
                cl.add_member("n8", "127.0.0.1:1", "127.0.0.1:1")
            assert sorted(cl.cluster()["members"]) == ["n1", "n2", "n3"]
    finally:
        c.close()


class FakePeer:
    """A Raft port that answers the handshake sealed with ``secret`` (if it can open the
    caller's frames), greets the caller and then ignores everything: a member that never
    catches up."""

    def __init__(self, secret: str) -> None:
        sealer = _Sealer(secret)

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(30)
                try:
                    head = sock.recv(_SIZE.size, socket.MSG_WAITALL)
                    body = sock.recv(_SIZE.unpack(head)[0], socket.MSG_WAITALL)
                    key = open_frame(sealer, body)
                except Exception:
                    return  # (another secret: closes, as a node does)
                sock.sendall(seal_frame(sealer, (key, os.urandom(32))))
                head = sock.recv(_SIZE.size, socket.MSG_WAITALL)  # (its address)
                sock.recv(_SIZE.unpack(head)[0], socket.MSG_WAITALL)
                sock.sendall(seal_frame(sealer, (key, {"type": "raftq_hello"})))
                while sock.recv(1 << 16):
                    pass

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakePeer:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()


def raft_admin(addr: str, secret: str, command: list[str]) -> object:
    """pysyncobj's admin ("utility") message sent to a Raft port, sealed with ``secret``: the
    node's answer."""
    sealer = _Sealer(secret)
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:

        def receive() -> Any:
            head = sock.recv(_SIZE.size, socket.MSG_WAITALL)
            return open_frame(sealer, sock.recv(_SIZE.unpack(head)[0], socket.MSG_WAITALL))

        ours = os.urandom(32)
        sock.sendall(seal_frame(sealer, ours))
        echoed, theirs = receive()
        assert echoed == ours
        sock.sendall(seal_frame(sealer, (theirs, command)))
        echoed, answer = receive()
        return answer


def test_a_lone_member_adds_only_a_node_that_lists_it_as_a_peer(tmp_path: Path) -> None:
    # A node started without n1 in its peers never votes for it: once added, the two could
    # never elect a leader again, nor undo the add. pysyncobj has the larger address dial, so
    # n1 sits between the two others: it dials n2, n3 dials it.
    c = Cluster(tmp_path / "a", 1)
    others = Cluster(tmp_path / "b", 2)  # same secret, n1 not among their peers
    others.secret = c.secret
    n1 = c.nodes["n1"]
    n2, n3 = others.nodes.pop("n1"), others.nodes.pop("n2")
    n2.raft, n1.raft, n3.raft = sorted([n1.raft, n2.raft, n3.raft])
    n2.id, n3.id = "n2", "n3"
    others.nodes.update(n2=n2, n3=n3)
    try:
        c.start()
        for nid in ("n2", "n3"):
            others.start_node(nid)
        with Client(c.url("n1"), timeout=30) as cl:
            for node in (n2, n3):
                with pytest.raises(Conflict, match=f"{node.id} does not list this node") as info:
                    cl.add_member(node.id, node.raft, node.api)
                assert info.value.server_code == "membership_refused"
            assert sorted(cl.cluster()["members"]) == ["n1"]
            cl.create_topic(f"t-{uuid.uuid4().hex[:8]}")  # (still the leader)
            # Restarted empty with n1 among their peers, both are added.
            for node in (n3, n2):
                assert others.stop_node(node.id) == 0
                node.data_dir = node.data_dir.parent / f"{node.id}-again"
                node.data_dir.mkdir()
                node.log = node.data_dir / "node.log"
            others.nodes["n1"] = n1
            for node in (n3, n2):
                others.start_node(node.id)
                assert node.id in cl.add_member(node.id, node.raft, node.api)["members"]
                wait_for(
                    f"{node.id} to catch up",
                    lambda: (
                        others.status(node.id)["applied_index"]  # noqa: B023
                        >= c.status("n1")["commit_index"]
                    ),
                    10,
                )
    finally:
        others.nodes.pop("n1", None)
        others.close()
        c.close()


def test_changes_the_live_members_could_not_survive_are_refused_and_change_nothing(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path, 3).start()
    try:
        topic = f"t-{uuid.uuid4().hex[:8]}"
        with Client([c.url(n) for n in c.nodes], timeout=30) as cl:
            cl.create_topic(topic)
            members = ["n1", "n2", "n3"]

            def unchanged() -> None:
                assert sorted(cl.cluster()["members"]) == members
                cl.publish(topic, b"still writable")

            def refused(match: str, change: object, *args: str) -> None:
                with pytest.raises(Conflict, match=match) as info:
                    change(*args)  # type: ignore[operator]
                assert info.value.server_code == "membership_refused"
                unchanged()

            # pysyncobj's own admin messages on the Raft port bypass no check: refused.
            leader = c.wait_leader()
            for command in (["add", "127.0.0.1:1"], ["remove", c.nodes["n3"].raft]):
                answer = raft_admin(c.nodes[leader].raft, c.secret, command)
                assert str(answer).startswith("FAIL"), answer
                unchanged()

            # Nothing on that Raft port; a port that does not know the cluster secret.
            nowhere = f"127.0.0.1:{free_ports(1)[0]}"
            refused("does not answer on its Raft port", cl.add_member, "n4", nowhere, nowhere)
            with FakePeer("another cluster's secret") as other:
                refused("another cluster secret", cl.add_member, "n4", other.addr, nowhere)

            # A member that never catches up: no further change until it has, but it can go.
            with FakePeer(c.secret) as slow, FakePeer(c.secret) as next_:
                assert cl.add_member("n4", slow.addr, nowhere)["members"] == [*members, "n4"]
                members.append("n4")
                refused("n4 has not caught up", cl.add_member, "n5", next_.addr, nowhere)
                assert cl.remove_member("n4")["members"] == members[:3]
                members.remove("n4")
            unchanged()

            # A follower down: two of three live. Removing the other follower (two members, one
            # live) or adding a fourth (majority three) would leave no majority.
            down, other_follower = (n for n in members if n != leader)
            c.kill(down)
            wait_for(
                f"the leader to see {down} gone",
                lambda: not c.status(leader)["members"][down]["connected"],
                10,
            )
            refused("2 members, whose majority is 2", cl.remove_member, other_follower)
            with FakePeer(c.secret) as fresh:
                refused("4 members, whose majority is 3", cl.add_member, "n4", fresh.addr, nowhere)
    finally:
        c.close()


def test_a_removed_node_turns_unready_and_refuses_broker_requests(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 3).start()
    try:
        leader = c.wait_leader()
        gone, stays = (n for n in c.nodes if n != leader)
        topic = f"t-{uuid.uuid4().hex[:8]}"
        with Client(c.url(leader), timeout=30) as cl:
            cl.create_topic(topic)
            assert cl.remove_member(gone)["members"] == sorted([leader, stays])
            # (Told before the removal was made: at once, unless its ack was late.)
            code, ready = wait_for(
                f"{gone} to know it was removed",
                lambda: (r := http("GET", c.url(gone) + "/readyz", token=None))[1]["removed"] and r,
                5,
            )
            assert (code, ready["ready"], ready["removed"]) == (503, False, True)
            for method, path, body in (
                ("POST", f"/topics/{topic}/messages", {"payload": "eA=="}),
                ("GET", f"/topics/{topic}", None),
                ("POST", "/topics", {"topic": f"{topic}-2"}),
            ):
                code, err = http(method, c.url(gone) + path, body)
                assert (code, err["code"]) == (503, "removed_from_cluster"), (path, err)
            # The two left are a cluster of two, and serve.
            cl.publish(topic, b"after")
            assert http("GET", c.url(stays) + "/readyz", token=None)[0] == 200
            assert sorted(c.status(stays)["members"]) == sorted([leader, stays])
            # Added back, it serves again.
            node = c.nodes[gone]
            assert gone in cl.add_member(gone, node.raft, node.api)["members"]
            wait_for(
                f"{gone} ready again",
                lambda: http("GET", c.url(gone) + "/readyz", token=None)[0] == 200,
                10,
            )
            with Client(c.url(gone), timeout=30) as direct:
                direct.publish(topic, b"through the node added back")
    finally:
        c.close()


def readyz(c: Cluster, nid: str) -> tuple[int, Any]:
    return http("GET", c.url(nid) + "/readyz", token=None)


def test_a_node_removed_while_stopped_names_no_leader_and_forwards_nothing(
    tmp_path: Path,
) -> None:
    # Stopped long enough for the leader to drop its connection, it is never told; pysyncobj
    # kept its old leader for good (nobody answers its pre-votes): ready, and forwarding.
    c = Cluster(tmp_path, 3).start()
    try:
        leader = c.wait_leader()
        gone, stays = (n for n in c.nodes if n != leader)
        topic = f"t-{uuid.uuid4().hex[:8]}"
        with Client(c.url(leader), timeout=30) as cl:
            cl.create_topic(topic)
            c.signal(gone, signal.SIGSTOP)
            published = 0

            def dropped() -> bool:
                # Entries fill the socket buffers to it: the leader's sends queue, and it drops
                # the connection (no reads for 10 s) on the next write event.
                nonlocal published
                cl.publish(topic, b"x" * (512 << 10))
                published += 1
                return not c.status(leader)["members"][gone]["connected"]

            try:
                wait_for(f"the leader to drop its connection to {gone}", dropped, 30, every=0.2)
                assert cl.remove_member(gone)["members"] == sorted([leader, stays])
            finally:
                c.signal(gone, signal.SIGCONT)
            wait_for(f"{gone} to name no leader", lambda: readyz(c, gone)[0] == 503, 5)
            ready = readyz(c, gone)[1]
            assert (ready["leader"], ready["ready"], ready["removed"]) == (None, False, False)
            code, err = http("POST", c.url(gone) + f"/topics/{topic}/messages", {"payload": "eA=="})
            assert (code, err["code"]) == (503, "no_leader")
            assert cl.topic(topic)["messages"] == published
    finally:
        c.close()


def test_a_follower_cut_off_from_every_other_node_is_not_ready_until_it_hears_a_leader(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path, 3).start()
    try:
        leader = c.wait_leader()
        alone = next(n for n in c.nodes if n != leader)
        others = [n for n in c.nodes if n != alone]
        for n in others:
            c.signal(n, signal.SIGSTOP)
        try:
            # (before pysyncobj's 10 s connection timeout, which ends the connections too)
            wait_for(f"{alone} to name no leader", lambda: readyz(c, alone)[0] == 503, 6)
            code, err = http("POST", c.url(alone) + "/topics", {"topic": "t"})
            assert (code, err["code"]) == (503, "no_leader")
        finally:
            for n in others:
                c.signal(n, signal.SIGCONT)
        wait_for(f"{alone} ready again", lambda: readyz(c, alone)[0] == 200, 15)
    finally:
        for n in c.nodes:
            c.signal(n, signal.SIGCONT)
        c.close()


def test_force_new_cluster_recovers_a_lost_majority_with_the_committed_data(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path, 3).start()
    try:
        leader = c.wait_leader()
        survivor = next(n for n in c.nodes if n != leader)
        topic = f"t-{uuid.uuid4().hex[:8]}"
        with Client([c.url(n) for n in c.nodes], timeout=30) as cl:
            cl.create_topic(topic)
            for i in range(3):
                cl.publish(topic, b"m%d" % i)
        # Committed by a majority; the survivor must hold it too (Raft keeps it on a majority
        # only, and this one may have been outside it).
        commit = c.status(leader)["commit_index"]
        wait_for(f"{survivor} to apply", lambda: c.status(survivor)["applied_index"] >= commit, 10)
        for nid in c.nodes:  # two of three lost for good (the survivor's log stops growing)
            if nid != survivor:
                c.kill(nid)
        last = c.status(survivor)["last_log_index"]
        assert last >= commit and c.status(survivor)["last_log_term"] >= 1
        c.kill(survivor)  # ...and it restarts

        def forced(index: int) -> subprocess.CompletedProcess[str]:
            """A start with ``--force-new-cluster index`` that is refused."""
            node = c.nodes[survivor]
            env = dict(os.environ, RAFTQ_SECRET=c.secret, RAFTQ_ADMIN_TOKEN=c.token)
            cmd = [*c.command(node), "--force-new-cluster", str(index)]
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)

        def leads_alone() -> bool:
            st = c.status(survivor)
            return st["leader"] == survivor and sorted(st["members"]) == [survivor]

        # Another index than its log's last: nothing done, exit 2 naming the current one.
        refused = forced(last - 1)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"last log index is {last}, not forcing" in refused.stderr + refused.stdout
        c.extra_args = ["--force-new-cluster", str(last)]
        c.start_node(survivor)
        wait_for(f"{survivor} to lead alone", leads_alone, 15)
        with Client(c.url(survivor), timeout=30) as cl:
            assert cl.topic(topic)["messages"] == 3
            cl.publish(topic, b"after the recovery")
        assert "FORCED NEW CLUSTER" in c.tail(survivor, 200)
        # The new membership is kept (in a snapshot): a restart without the flag leads alone too.
        snapshot = c.nodes[survivor].data_dir / "data" / "snapshot.bin"
        wait_for("the snapshot that keeps the membership", snapshot.exists, 15)
        assert c.stop_node(survivor) == 0
        # The flag left set (compose, k8s env): the log has moved on, so it is refused.
        moved = forced(last)
        assert moved.returncode == 2, moved.stdout + moved.stderr
        assert f"--force-new-cluster {last}: this node's last log index is" in moved.stderr
        c.extra_args = []
        c.start_node(survivor)
        wait_for(f"{survivor} to lead alone again", leads_alone, 15)
        with Client(c.url(survivor), timeout=30) as cl:
            assert cl.topic(topic)["messages"] == 4
    finally:
        c.close()
