"""kill -9 of the leader while clients publish and receive through one follower only, on a
real 3-process cluster whose nodes reach each other's APIs through ``SilentRelay``s: the
killed leader's address goes silent (as a killed container's), so a forward to it hangs
unless the follower cuts it short when it learns of the new leader."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftq.node.bench import SilentRelay
from tests.node.cluster_fixture import Cluster, Node, http, wait_for

pytestmark = pytest.mark.slow


class RelayedCluster(Cluster):
    """Each node advertises its API through a relay (what the others forward to); ``kill``
    silences it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, 3)
        self.relays = {nid: SilentRelay(n.api) for nid, n in self.nodes.items()}

    def command(self, node: Node) -> list[str]:
        cmd = super().command(node)
        cmd[cmd.index("--peers") + 1] = ",".join(
            f"{o.id}={o.raft}/{self.relays[o.id].addr}"
            for o in self.nodes.values()
            if o.id != node.id
        )
        return [*cmd, "--advertise", self.relays[node.id].addr]

    def kill(self, nid: str) -> None:
        self.relays[nid].silence()
        super().kill(nid)

    def close(self) -> None:
        super().close()
        for relay in self.relays.values():
            relay.close()


@pytest.fixture
def relayed(tmp_path: Path) -> Iterator[RelayedCluster]:
    c = RelayedCluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_kill9_of_the_leader_through_one_follower_fails_over_without_waiting_it_out(
    relayed: RelayedCluster,
) -> None:
    c = relayed
    old = c.wait_leader()
    entry = c.url(c.followers()[0])  # every request below goes to this node only
    topic = "t-" + uuid.uuid4().hex[:10]
    code, body = http("POST", entry + "/topics", {"topic": topic})
    assert code == 201, body
    stop = threading.Event()
    published: list[tuple[float, float, str]] = []  # (started, answered, key) of each publish
    received: list[tuple[float, float, int]] = []  # (started, answered, deliveries)
    answers: list[tuple[int, str]] = []  # every answer but 200
    failures: list[BaseException] = []

    def publish() -> None:
        n = 0
        while not stop.is_set():
            key, n = f"k{n}", n + 1
            started = time.monotonic()
            while True:  # the same key until a definite answer, as the client libraries do
                code, body = http("POST", f"{entry}/topics/{topic}/messages",
                                  {"payload": "eA==", "key": key}, timeout=60)  # fmt: skip
                if code == 200:
                    break
                answers.append((code, body["code"]))
                if code not in (503, 504) or stop.wait(0.05):
                    return
            published.append((started, time.monotonic(), key))

    def consume() -> None:
        while not stop.is_set():
            started = time.monotonic()
            code, body = http("POST", f"{entry}/topics/{topic}/groups/default/receive",
                              {"max": 10, "wait": 1}, timeout=60)  # fmt: skip
            if code != 200:
                answers.append((code, body["code"]))
                if code not in (503, 504) or stop.wait(0.05):
                    return
                continue
            got = body["deliveries"]
            if got:
                receipts = [d["receipt"] for d in got]
                code, _ = http("POST", f"{entry}/ack", {"receipts": receipts}, timeout=60)
                # (an ack cut short by the kill may find its receipts gone: redelivered later)
            received.append((started, time.monotonic(), len(got)))

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as e:
                failures.append(e)

        return run

    threads = [threading.Thread(target=guarded(f)) for f in (publish, consume)]
    for t in threads:
        t.start()
    try:
        wait_for("publishes and receives to flow", lambda: len(published) > 20 and received, 20)
        killed = time.monotonic()
        c.kill(old)
        # Both resume once the follower learns of the new leader, not after the 35 s a
        # forward to the silent address took (clients gave up after 10 s).
        wait_for(
            "a publish started after the kill to be answered",
            lambda: any(s > killed for s, _, _ in published) or failures,
            10,
        )
        wait_for(
            "a receive started after the kill to deliver",
            lambda: any(s > killed and n for s, _, n in received) or failures,
            10,
        )
    finally:
        stop.set()
        for t in threads:
            t.join(70)
    assert not failures, failures
    assert all(a in ((503, "no_leader"), (504, "outcome_unknown")) for a in answers), answers
    # Every publish answered is stored, and once, whatever the kill cut short: sent again
    # with its key, each is a duplicate; nothing else was stored (one more at most: a key
    # whose retries the stop ended).
    new = c.wait_leader(not_=old)
    keys = [k for _, _, k in published]
    code, got = http("POST", f"{c.url(new)}/topics/{topic}/publish",
                     {"messages": [{"payload": "eA==", "key": k} for k in keys]})  # fmt: skip
    assert code == 200, got
    assert all(m["duplicate"] for m in got["messages"])
    code, stats = http("GET", f"{c.url(new)}/topics/{topic}")
    assert code == 200, stats
    assert len(keys) <= stats["last_seq"] <= len(keys) + 1
