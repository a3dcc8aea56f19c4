"""kill -9 chaos on 3 node processes: every outcome stays true to its word."""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import pytest

from tests.raft.harness import RaftCluster, RaftProc, publish

pytestmark = pytest.mark.slow


def test_outcomes_are_definite_under_repeated_kills(
    tmp_path: Path, make_cluster: type[RaftCluster]
) -> None:
    """Bursts of proposals while random nodes are killed and restarted (compaction every 16
    entries, so snapshots and installs happen too). Acknowledged messages are never lost,
    NotLeader/QueueFull ones never appear, nothing appears twice."""
    rng = random.Random(3)
    c = make_cluster(tmp_path, extra=["--compaction-entries", "16"]).start_all()
    c.propose([{"op": "create_topic", "topic": "t"}])
    acked: list[str] = []
    not_applied: list[str] = []
    n = 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        alive = [p for p in c.nodes.values() if p.alive]
        target: RaftProc = rng.choice(alive)
        if rng.random() < 0.8:
            with contextlib.suppress(AssertionError):
                target = c.leader(3)
        sent = []
        for _ in range(rng.randint(1, 20)):
            rid = target.send("propose", commands=[publish("t", f"m-{n}")], timeout=2.0)
            sent.append((rid, f"m-{n}"))
            n += 1
        if rng.random() < 0.3:
            rng.choice(alive).kill()
        for rid, m in sent:
            try:
                r = target.answer(rid, 10)
            except AssertionError:
                continue  # the target was killed: unknown
            if "ok" in r:
                acked.append(m)
            elif r["error"] in ("NotLeader", "QueueFull"):
                not_applied.append(m)
        for p in c.nodes.values():
            if not p.alive and rng.random() < 0.7:
                c.start(p.id)
    for p in c.nodes.values():
        if not p.alive:
            c.start(p.id)
    c.propose([{"op": "create_topic", "topic": "probe"}], timeout=30)
    got = c.leader().ok("payloads", topic="t")
    assert len(acked) > 50  # enough happened to mean something
    assert [m for m in acked if m not in got] == []
    assert [m for m in not_applied if m in got] == []
    assert len(got) == len(set(got))
