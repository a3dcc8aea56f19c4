"""Three node processes on 127.0.0.1: commit, failover, catch-up, full restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.raft.harness import RaftCluster, publish, wait_payloads

pytestmark = pytest.mark.slow


def test_commits_survive_leader_kill_restart_and_full_cluster_restart(
    tmp_path: Path, make_cluster: type[RaftCluster]
) -> None:
    c = make_cluster(tmp_path).start_all()
    assert c.propose([{"op": "create_topic", "topic": "t"}]) == [{"topic": "t", "created": True}]
    acked = []
    for i in range(20):
        res = c.propose([publish("t", f"m-{i}")])
        assert res[0]["messages"][0]["seq"] == i + 1
        acked.append(f"m-{i}")

    old = c.leader()
    old.kill()
    new = c.leader()
    assert new is not old
    # The survivors saw the leader's connection close and stood for election at once
    # instead of waiting out the election timeout.
    assert sum(p.ok("stats")["fast_elections"] for p in c.nodes.values() if p is not old) >= 1
    for i in range(20, 40):
        c.propose([publish("t", f"m-{i}")])
        acked.append(f"m-{i}")

    # The killed leader restarts on the same data dir and catches up as a follower.
    c.start(old.id)
    wait_payloads(old, "t", acked)
    digests = {p.ok("digest") for p in c.nodes.values()}
    assert len(digests) == 1

    terms = {nid: p.ok("status")["term"] for nid, p in c.nodes.items()}
    c.kill_all()
    c.start_all()
    for nid, p in c.nodes.items():  # term never goes back, even before any election
        assert p.ok("status")["term"] >= terms[nid]
    c.propose([publish("t", "after-restart")])  # commits an entry of the new term
    leader = c.leader()
    assert leader.ok("payloads", topic="t") == [*acked, "after-restart"]
    for p in c.nodes.values():
        wait_payloads(p, "t", [*acked, "after-restart"])
