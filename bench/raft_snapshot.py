"""Compaction with 1M retained messages must not trigger an election (not a test).

    .venv/bin/python bench/raft_snapshot.py [--messages 1000000]

3 node processes; publishes N x 100 B messages in batches of 1000, then forces a snapshot on
every node at once and reports, per node, the snapshot time (forked writer), the longest tick
of the Raft thread during compaction, and whether the term or the leader changed. Then a
follower is stopped, the leader compacts past it, and the follower is restarted: it installs
the whole snapshot from the leader; same checks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.raft.harness import RaftCluster, RaftProc, wait_for


def caught_up(p: RaftProc, leader: RaftProc) -> Callable[[], bool]:
    return lambda: bool(p.ok("status")["applied_index"] >= leader.ok("status")["applied_index"])


def snapshots(p: RaftProc, n: int) -> Callable[[], bool]:
    return lambda: bool(p.ok("stats")["snapshots"] >= n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        c = RaftCluster(Path(tmp), 3, extra=["--compaction-entries", "1000000"]).start_all()
        try:
            c.propose([{"op": "create_topic", "topic": "big"}])
            leader = c.leader()
            t0 = time.perf_counter()
            res = leader.ok(
                "bench",
                timeout=900,
                topic="big",
                batches=args.messages // 1000,
                batch=1000,
                size=100,
            )
            print(
                f"published {args.messages} in {time.perf_counter() - t0:.1f} s"
                f" ({res['msgs_per_s']:.0f} msgs/s, fsync always)",
                flush=True,
            )
            term = leader.ok("status")["term"]
            for p in c.nodes.values():
                wait_for(f"{p.id} applied", caught_up(p, leader), 120)
                p.ok("stats", reset=True)
            for p in c.nodes.values():
                p.ok("compact")
            for p in c.nodes.values():
                wait_for(f"{p.id} compaction", snapshots(p, 1), 300)
            for p in c.nodes.values():
                st, s = p.ok("stats"), p.ok("status")
                print(
                    f"{p.id}: snapshot {st['last_snapshot_ms']} ms, longest tick"
                    f" {st['max_tick_ms']} ms, log {st['log_len']} entries, term {s['term']}"
                    f" (was {term}), leader {s['leader_id']}",
                    flush=True,
                )
            assert c.leader() is leader and leader.ok("status")["term"] == term, "election!"
            # Snapshot install on a restarted follower.
            f = next(p for p in c.nodes.values() if p is not leader)
            f.kill()
            for _ in range(3):
                leader.ok("bench", timeout=60, topic="big", batches=10, batch=10, size=100)
            leader.ok("compact")
            wait_for("leader compaction", lambda: leader.ok("stats")["snapshots"] >= 2, 300)
            leader.ok("stats", reset=True)
            t0 = time.perf_counter()
            c.start(f.id)
            wait_for(
                "install",
                lambda: f.ok("status")["applied_index"] >= leader.ok("status")["applied_index"],
                300,
                0.2,
            )
            st, s = f.ok("stats"), leader.ok("status")
            print(
                f"{f.id}: restart + snapshot install {time.perf_counter() - t0:.1f} s, longest"
                f" tick {st['max_tick_ms']} ms; leader longest tick"
                f" {leader.ok('stats')['max_tick_ms']} ms, term {s['term']} (was {term})"
            )
            assert c.leader() is leader and s["term"] == term, "election!"
        finally:
            c.close()


if __name__ == "__main__":
    main()
