"""A node whose Raft stopped says so: a follower whose disk fills turns unhealthy and unready,
shows why in /cluster and /metrics, exits with code 3, and comes back when restarted with
space (real processes; the follower's data dir is a small tmpfs this test mounts). When every
node's disk fills, the cluster stops (each node exits 3), and restarted with space it holds
every acknowledged message."""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.cluster_fixture import Cluster, http, wait_for

pytestmark = pytest.mark.slow

EXIT_RAFT_STOPPED = 3


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """Write zeros to ``path`` until the file system is full."""
    with open(path, "wb") as f:
        chunk = bytes(64 << 10)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return path


def publish(c: Cluster, nid: str, topic: str, n: int, size: int) -> None:
    payload = base64.b64encode(os.urandom(size)).decode()
    code, body = http(
        "POST",
        c.url(nid) + f"/topics/{topic}/publish",
        {"messages": [{"payload": payload} for _ in range(n)]},
        timeout=30,
    )
    assert code == 200, (code, body)


def test_a_follower_whose_disk_fills_stops_says_why_exits_3_and_recovers(
    tmp_path: Path,
) -> None:
    # (no free-disk reserve: this is about the journal's own ENOSPC, were n3 to lead)
    c = Cluster(tmp_path, 3, extra_args=["--min-free-disk", "0"])
    n3 = c.nodes["n3"]
    with small_tmpfs(n3.data_dir / "data", "16m") as data:
        try:
            # n3 starts last, so it follows (pre-vote: it cannot depose the leader).
            c.start_node("n1")
            c.start_node("n2")
            lid = wait_for("a leader among n1, n2", c.leader, 30)
            c.start_node("n3")
            wait_for("n3 ready", lambda: http("GET", n3.url + "/readyz")[0] == 200, 20)
            topic = "t-" + uuid.uuid4().hex[:10]
            assert http("POST", c.url(lid) + "/topics", {"topic": topic})[0] == 201
            publish(c, lid, topic, 10, 100)
            filler = fill(data / "filler")

            # The follower's journal runs out of space as the cluster goes on.
            def stopped() -> bool:
                if http("GET", n3.url + "/healthz", timeout=2, token=None)[0] == 503:
                    return True
                publish(c, lid, topic, 50, 4096)
                return False

            wait_for("n3 to turn unhealthy", stopped, 30, every=0.01)
            code, ready = http("GET", n3.url + "/readyz", token=None)
            assert code == 503 and ready["ready"] is False, ready
            assert "No space left on device" in ready["raft_error"], ready
            code, health = http("GET", n3.url + "/healthz", token=None)
            assert code == 503 and "No space left" in health["raft_error"], health
            st = c.status("n3")
            assert st["role"] == "stopped" and st["running"] is False, st
            assert "No space left on device" in st["error"], st
            code, metrics = http("GET", n3.url + "/metrics")
            text = metrics.decode()
            assert "raftq_raft_running 0.0" in text
            assert any(
                line.startswith("raftq_raft_stopped{") and "No space left" in line
                for line in text.splitlines()
            ), text
            publish(c, lid, topic, 1, 10)  # the others go on

            assert n3.proc is not None
            assert n3.proc.wait(30) == EXIT_RAFT_STOPPED, c.tail("n3")
            assert f"exit code {EXIT_RAFT_STOPPED}" in n3.log.read_text()

            filler.unlink()  # space again: it comes back and catches up
            c.start_node("n3")
            wait_for("n3 ready again", lambda: http("GET", n3.url + "/readyz")[0] == 200, 30)
            publish(c, lid, topic, 5, 100)

            def same_state() -> bool:
                digests = {nid: http("GET", c.url(nid) + "/cluster?digest=1")[1] for nid in c.nodes}
                applied = {d["applied_index"] for d in digests.values()}
                return len(applied) == 1 and len({d["digest"] for d in digests.values()}) == 1

            wait_for("n3 to hold the same state as the others", same_state, 30, every=0.1)
        finally:
            c.close()


def test_when_every_journal_fills_the_nodes_stop_and_restarted_with_space_lose_no_ack(
    tmp_path: Path,
) -> None:
    """ENOSPC on every node at once (the same log on disks of one size): each one's Raft
    stops and it exits 3; nothing acknowledged is lost, and the cluster serves again once
    there is space (the tmpfs remounted larger). No free-disk reserve, so the journal itself
    runs out (with one, the leader refuses publishes before: tests/node/test_limits.py)."""
    c = Cluster(tmp_path, 3, fsync="always", extra_args=["--min-free-disk", "0"])
    acked: list[str] = []
    with contextlib.ExitStack() as stack:
        mounts = [
            stack.enter_context(small_tmpfs(n.data_dir / "data", "6m")) for n in c.nodes.values()
        ]
        try:
            c.start()
            topic = "t-" + uuid.uuid4().hex[:10]
            assert http("POST", c.url(c.wait_leader()) + "/topics", {"topic": topic})[0] == 201
            pad = "x" * 3000

            def stopped(nid: str) -> bool:
                node = c.nodes[nid]
                if not node.alive:
                    return True
                try:
                    return http("GET", node.url + "/healthz", timeout=2, token=None)[0] == 503
                except OSError:
                    return False

            def majority_stopped() -> bool:
                if sum(stopped(nid) for nid in c.nodes) >= 2:
                    return True
                batch = [f"{len(acked) + i}-{uuid.uuid4().hex}" for i in range(20)]
                alive = [nid for nid in c.nodes if not stopped(nid)]
                try:
                    code, _ = http(
                        "POST",
                        c.url(alive[0]) + f"/topics/{topic}/publish",
                        {"messages": [{"text": m + pad} for m in batch]},
                        timeout=10,
                    )
                except OSError:
                    return False
                if code == 200:
                    acked.extend(batch)
                return False

            wait_for("two journals to fill", majority_stopped, 120, every=0.01)
            assert len(acked) > 100, len(acked)  # (several MB went through first)
            for nid, node in c.nodes.items():
                assert node.proc is not None
                if stopped(nid):
                    assert node.proc.wait(30) == EXIT_RAFT_STOPPED, c.tail(nid)
                    assert "No space left on device" in node.log.read_text(), c.tail(nid)
                else:
                    c.stop_node(nid)
            for m in mounts:  # space again
                subprocess.run(["mount", "-o", "remount,size=64m", str(m)], check=True)
            for nid in c.nodes:
                c.start_node(nid)
            lid = c.wait_leader(60)
            seen: list[str] = []
            after = 0
            while True:
                code, body = http(
                    "GET",
                    c.url(lid) + f"/topics/{topic}/messages?payload_encoding=utf-8"
                    f"&limit=1000&from_seq={after + 1}",
                )
                assert code == 200, body
                if not body["messages"]:
                    break
                seen.extend(m["text"][: -len(pad)] for m in body["messages"])
                after = body["messages"][-1]["seq"]
            missing = sorted(set(acked) - set(seen))
            assert not missing, (len(missing), len(acked))
            assert len(seen) == len(set(seen))  # and nothing twice
            publish(c, lid, topic, 5, 100)  # serving again
        finally:
            c.close()
