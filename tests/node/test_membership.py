"""Dynamic membership over the HTTP API, on real processes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from raftq.client import Client, InvalidArgument
from raftq.client.errors import Conflict
from tests.node.cluster_fixture import Cluster, wait_for

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
            with pytest.raises(Conflict, match="start it first"):
                cl.add_member("n8", "127.0.0.1:1", "127.0.0.1:1")
            assert sorted(cl.cluster()["members"]) == ["n1", "n2", "n3"]
    finally:
        c.close()
