"""Raft binding benchmark (not a test): 3 local node processes, load generated in the leader.

    .venv/bin/python bench/raft_bench.py [--batches 2000] [--singles 2000]

For fsync always and never: sequential batches of 100 x 100 B (msgs/s, p50/p99 per batch) and
one small command at a time (p50/p99). Failover time after kill -9 of the leader. Then 8
concurrent proposers with and without the leader's stale-ack fix: next-index rewinds avoided,
re-sent entries the followers kept instead of truncating (follower fix, always on), and
pysyncobj's "truncating already-applied" logs. Numbers are noisy on a shared 2-core box.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.raft.harness import RaftCluster


def run(
    root: Path, extra: list[str], req: dict[str, object]
) -> tuple[dict[str, object], RaftCluster]:
    c = RaftCluster(root, 3, extra=extra).start_all()
    c.propose([{"op": "create_topic", "topic": "b"}])
    leader = c.leader()
    res = leader.ok("bench", timeout=600, topic="b", **req)
    res["stats"] = leader.ok("stats")
    return res, c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--singles", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for fsync in ("always", "never"):
            for name, req in (
                ("100 x 100 B batches", {"batches": args.batches, "batch": 100, "size": 100}),
                ("1 x 100 B", {"batches": args.singles, "batch": 1, "size": 100}),
                (
                    "1000 x 100 B batches",
                    {"batches": args.batches // 5, "batch": 1000, "size": 100},
                ),
            ):
                root = Path(tmp) / f"{fsync}-{req['batch']}"
                res, c = run(root, ["--fsync", fsync], req)
                c.close()
                print(
                    f"fsync={fsync:6} {name:20} {res['msgs_per_s']:>10.0f} msgs/s"
                    f"  p50 {res['p50_ms']:.2f} ms  p99 {res['p99_ms']:.2f} ms",
                    flush=True,
                )
        root = Path(tmp) / "failover"
        c = RaftCluster(root, 3).start_all()
        c.propose([{"op": "create_topic", "topic": "f"}])
        times = []
        for _ in range(3):
            leader = c.leader()
            t0 = time.perf_counter()
            leader.kill()
            c.propose([{"op": "tick"}], timeout=30)  # retried on the new leader
            times.append(time.perf_counter() - t0)
            c.start(leader.id)
        c.close()
        print(
            "failover (kill -9 leader -> next commit): " + ", ".join(f"{t:.2f} s" for t in times),
            flush=True,
        )
        for fix in (True, False):
            root = Path(tmp) / f"acks-{fix}"
            extra = [] if fix else ["--no-ack-fix"]
            req = {"batches": args.batches, "batch": 100, "size": 100, "concurrency": 8}
            res, c = run(root, extra, req)
            dups = sum(p.ok("stats")["duplicate_appends"] for p in c.nodes.values())
            c.close()
            logs = "".join(p.read_text() for p in root.glob("*.log"))
            print(
                f"8 concurrent, leader ack fix={'on ' if fix else 'off'}"
                f"  {res['msgs_per_s']:>10.0f} msgs/s  p50 {res['p50_ms']:.2f} ms"
                f"  rewinds avoided: {res['stats']['stale_acks_ignored']}"  # type: ignore[index]
                f"  re-sent appends kept by followers: {dups}"
                f"  'truncating already-applied': {logs.count('truncating already-applied')}",
                flush=True,
            )


if __name__ == "__main__":
    main()
