"""End-to-end tests on a real 3-process cluster on loopback (see cluster_fixture.py)."""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import signal
import socket
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.node.cluster_fixture import Cluster, http, wait_for

pytestmark = pytest.mark.slow


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def uniq() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def call(c: Cluster, nid: str, method: str, path: str, body: Any = None, status: int = 200) -> Any:
    code, data = http(method, c.url(nid) + path, body, timeout=30)
    assert code == status, (code, data)
    return data


def receive(c: Cluster, nid: str, topic: str, group: str = "default", **kw: Any) -> list[Any]:
    got = call(c, nid, "POST", f"/topics/{topic}/groups/{group}/receive", kw)
    deliveries: list[Any] = got["deliveries"]
    return deliveries


def test_publish_receive_ack_through_any_node(shared_cluster3: Cluster) -> None:
    c = shared_cluster3
    n1, n2, n3 = c.nodes
    topic = uniq()
    call(c, n1, "POST", "/topics", {"topic": topic}, 201)
    res = call(c, n2, "POST", f"/topics/{topic}/publish",
               {"messages": [{"payload": b64(b"a")}, {"payload": b64(b"b")}]})  # fmt: skip
    assert [m["seq"] for m in res["messages"]] == [1, 2]
    got = receive(c, n3, topic, max=10)
    assert [base64.b64decode(d["payload"]) for d in got] == [b"a", b"b"]
    acked = call(c, n1, "POST", "/ack", {"receipts": [d["receipt"] for d in got]})
    assert acked == {"acked": 2, "errors": []}
    assert receive(c, n2, topic) == []
    stats = call(c, n3, "GET", f"/topics/{topic}/groups/default")
    assert (stats["acked_total"], stats["in_flight"], stats["pending"]) == (2, 0, 0)
    for nid in c.nodes:  # every node agrees on the leader, answers, is ready, reports metrics
        st = c.status(nid)
        assert st["leader"] == c.leader()
        assert all(m["answers"] for m in st["members"].values())
        url = c.url(nid)
        wait_for(f"{nid} ready", lambda: http("GET", url + "/readyz")[0] == 200, 10)  # noqa: B023
        line = f'raftq_group_acked_total{{group="default",topic="{topic}"}} 2.0'

        def counted(url: str = url, line: str = line) -> bool:
            code, text = http("GET", url + "/metrics")  # a follower applies a little later
            return code == 200 and line in text.decode()

        wait_for(f"{nid} metrics", counted, 10)


def test_visibility_expiry_redelivers_with_next_attempt(shared_cluster3: Cluster) -> None:
    c = shared_cluster3
    f = c.followers()[0]
    topic = uniq()
    call(c, f, "POST", "/topics", {"topic": topic}, 201)
    call(c, f, "POST", f"/topics/{topic}/messages", {"payload": b64(b"v")})
    [first] = receive(c, f, topic, visibility=0.5)
    [again] = receive(c, f, topic, wait=10)
    assert (again["seq"], again["attempt"]) == (first["seq"], 2)
    assert time.time() * 1000 >= first["deadline"]
    stale = call(c, f, "POST", "/ack", {"receipts": [first["receipt"]]})
    assert stale["errors"][0]["code"] == "receipt_stale"


def test_nack_with_delay_redelivers_after_the_delay(shared_cluster3: Cluster) -> None:
    c = shared_cluster3
    f = c.followers()[-1]
    topic = uniq()
    call(c, f, "POST", "/topics", {"topic": topic}, 201)
    call(c, f, "POST", f"/topics/{topic}/messages", {"payload": b64(b"n")})
    [d] = receive(c, f, topic)
    t0 = time.monotonic()
    assert call(c, f, "POST", "/nack", {"receipts": [d["receipt"]], "delay": 0.5})["nacked"] == 1
    assert receive(c, f, topic) == []
    [d2] = receive(c, f, topic, wait=10)
    assert d2["attempt"] == 2 and time.monotonic() - t0 >= 0.45


def test_max_attempts_dead_letter_then_redrive(shared_cluster3: Cluster) -> None:
    c = shared_cluster3
    nid = next(iter(c.nodes))
    topic = uniq()
    groups = [{"group": "g", "config": {"max_attempts": 2}}]
    call(c, nid, "POST", "/topics", {"topic": topic, "groups": groups}, 201)
    call(c, nid, "POST", f"/topics/{topic}/messages", {"payload": b64(b"poison")})
    for attempt in (1, 2):
        [d] = receive(c, nid, topic, "g")
        assert d["attempt"] == attempt
        call(c, nid, "POST", "/nack", {"receipts": [d["receipt"]]})
    dead = call(c, nid, "GET", f"/topics/{topic}.dlq/messages")["messages"]
    assert [base64.b64decode(m["payload"]) for m in dead] == [b"poison"]
    assert dead[0]["headers"]["x-raftq-dlq-attempts"] == "2"
    assert call(c, nid, "POST", f"/topics/{topic}.dlq/redrive", {})["redriven"] == 1
    [d] = receive(c, nid, topic, "g")
    assert d["attempt"] == 1 and d["headers"]["x-raftq-redrives"] == "1"


@pytest.mark.parametrize("via", ["leader", "follower"])
def test_dropped_consumer_connection_releases_at_once(shared_cluster3: Cluster, via: str) -> None:
    """A consumer that stops reading and then resets its connection, while its deliveries are
    still being written, gets them released at once (not after the 10-minute visibility)."""
    c = shared_cluster3
    nid = c.leader() if via == "leader" else c.followers()[0]
    assert nid is not None
    topic = uniq()
    call(c, nid, "POST", "/topics", {"topic": topic}, 201)
    big = b64(b"x" * 700_000)
    for _ in range(12):  # ~11 MB of response: more than the socket buffers hold
        call(c, nid, "POST", f"/topics/{topic}/messages", {"payload": big})
    body = b'{"visibility": 600, "max": 12}'
    host, port = c.nodes[nid].api.split(":")
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        s.sendall(
            f"POST /topics/{topic}/groups/default/receive HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {c.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # (from /metrics: a GET of the stats would wait for the followers to answer a ping
        # behind 8 MB of appends, while the response ends up in the kernel's buffers)
        line = f'raftq_group_in_flight{{group="default",topic="{topic}"}} 12.0'
        metrics = c.url(nid) + "/metrics"
        wait_for("the deliveries", lambda: line in http("GET", metrics)[1].decode(), 10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        s.close()  # reset, with most of the response unread
    got = receive(c, nid, topic, wait=10, max=12)
    assert [d["attempt"] for d in got] == [2] * 12
    assert call(c, nid, "GET", f"/topics/{topic}/groups/default")["released_total"] == 12


def test_bad_input_gets_4xx_through_a_follower(shared_cluster3: Cluster) -> None:
    c = shared_cluster3
    f = c.followers()[0]
    topic = uniq()
    call(c, f, "POST", "/topics", {"topic": topic, "config": {"max_messages": 1}}, 201)
    cases: list[tuple[str, str, Any, int, str]] = [
        ("POST", f"/topics/{topic}/messages", {"payload": "!"}, 400, "invalid_argument"),
        ("POST", f"/topics/{topic}/messages", {"payload": b64(b"x"), "z": 1}, 400, "unknown_field"),
        ("POST", "/topics/nope/messages", {"payload": b64(b"x")}, 404, "topic_not_found"),
        ("POST", "/topics", {"topic": "bad name"}, 400, "invalid_name"),
        ("POST", "/ack", {"receipts": ["junk"]}, 200, ""),
    ]
    for method, path, body, status, code in cases:
        got = call(c, f, method, path, body, status)
        if code:
            assert got["code"] == code
    call(c, f, "POST", f"/topics/{topic}/messages", {"payload": b64(b"1")})
    full = call(c, f, "POST", f"/topics/{topic}/messages", {"payload": b64(b"2")}, 429)
    assert full["code"] == "topic_full"


def test_kill9_leader_keeps_deliveries_acks_and_dead_lettering(cluster3: Cluster) -> None:
    c = cluster3
    old = c.wait_leader()
    entry = c.followers()[0]
    topic = uniq()
    cfg = {"visibility_timeout": 2, "max_attempts": 2}
    call(
        c,
        entry,
        "POST",
        "/topics",
        {"topic": topic, "groups": [{"group": "g", "config": cfg}]},
        201,
    )
    msgs = [{"payload": b64(b"m%d" % i)} for i in range(10)]
    call(c, entry, "POST", f"/topics/{topic}/publish", {"messages": msgs})
    first = receive(c, entry, topic, "g", max=6)
    assert len(first) == 6
    acked = {d["seq"] for d in first[:3]}
    unacked = {d["seq"]: d for d in first[3:]}
    call(c, entry, "POST", "/ack", {"receipts": [d["receipt"] for d in first[:3]]})

    c.kill(old)
    new = c.wait_leader(not_=old)
    survivor = entry if entry != old else new

    seen: dict[int, dict[str, Any]] = {}

    def drain() -> bool:
        for d in receive(c, survivor, topic, "g", max=10, wait=2, visibility=30):
            assert d["seq"] not in acked, f"acked seq {d['seq']} came back"
            assert d["seq"] not in seen, f"seq {d['seq']} delivered twice after failover"
            seen[d["seq"]] = d
        return len(seen) == 7

    wait_for("the 7 unacked messages", drain, 30)
    now_ms = time.time() * 1000
    for seq, d in seen.items():
        if seq in unacked:
            assert d["attempt"] == 2
            assert now_ms >= unacked[seq]["deadline"]
        else:
            assert d["attempt"] == 1
    # Dead-lettering goes on under the new leader: attempt 2 of 2 failing is final.
    res = call(c, survivor, "POST", "/nack", {"receipts": [seen[s]["receipt"] for s in unacked]})
    assert res["dead_lettered"] == 3
    dead = call(c, survivor, "GET", f"/topics/{topic}.dlq/messages")["messages"]
    assert sorted(int(m["headers"]["x-raftq-dlq-seq"]) for m in dead) == sorted(unacked)

    c.start_node(old)  # the old leader rejoins with its data dir and catches up
    wait_for(
        f"{old} to catch up",
        lambda: (
            c.status(old)["leader"] == new
            and c.status(old)["applied_index"] >= c.status(new)["commit_index"]
        ),
        20,
    )


def test_a_frozen_leader_is_replaced_and_rejoins_as_a_follower(cluster3: Cluster) -> None:
    """SIGSTOP of the leader closes no socket (as a frozen or unplugged host): the followers
    notice the missing heartbeats, elect a leader that takes publishes, and the old one, once
    resumed, follows it and holds the same state."""
    c = cluster3
    old = c.wait_leader()
    entry = c.followers()[0]
    topic = uniq()
    call(c, entry, "POST", "/topics", {"topic": topic}, 201)
    call(c, entry, "POST", f"/topics/{topic}/messages", {"payload": b64(b"before")})
    c.signal(old, signal.SIGSTOP)
    try:
        new = c.wait_leader(15, not_=old)
        wait_for(
            "a publish through the new leader",
            lambda: http("POST", c.url(new) + f"/topics/{topic}/messages",
                         {"payload": b64(b"after")}, timeout=2)[0] == 200,
            15,
        )  # fmt: skip
    finally:
        c.signal(old, signal.SIGCONT)

    def digest(nid: str) -> Any:
        return call(c, nid, "GET", "/cluster?digest=1")

    wait_for(
        f"{old} to follow {new} with its state",
        lambda: (
            (st := digest(old))["role"] == "follower"
            and st["leader"] == new
            and st["digest"] == digest(new)["digest"]
        ),
        20,
    )
    assert c.wait_leader() == new


def test_sigterm_loses_nothing_and_restart_recovers(cluster3: Cluster) -> None:
    c = cluster3
    leader = c.wait_leader()
    others = c.followers()
    topic = uniq()
    call(c, others[0], "POST", "/topics", {"topic": topic}, 201)
    n = 120

    def publish(i: int) -> int:
        """Publish with a dedup key, retrying until a definite answer: never lost, never twice."""
        body = {"payload": b64(b"p%d" % i), "key": f"k{i}"}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            nid = others[i % len(others)]
            try:
                code, data = http("POST", c.url(nid) + f"/topics/{topic}/messages", body, 10)
            except OSError:
                code, data = 0, None
            if code == 200:
                return int(data["seq"])
            assert code in (0, 503, 504), (code, data)
            time.sleep(0.05)
        raise AssertionError(f"message {i} never got a definite answer")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(publish, i) for i in range(n)]
        wait_for("some publishes", lambda: sum(f.done() for f in futures) >= n // 4, 30)
        t0 = time.monotonic()
        assert c.stop_node(leader, timeout=20) == 0
        stop_took = time.monotonic() - t0
        seqs = [f.result(timeout=60) for f in futures]
    assert stop_took < 20
    assert len(set(seqs)) == n  # one seq per message: none lost, none stored twice
    c.wait_leader(not_=leader)

    c.start_node(leader)
    for nid in list(c.nodes):  # then stop and restart everyone: data survives
        assert c.stop_node(nid) == 0
    for nid in c.nodes:
        c.start_node(nid)
    lid = c.wait_leader()
    got: list[Any] = []

    def drain() -> bool:
        got.extend(receive(c, lid, topic, max=1000, wait=1))
        return len(got) >= n

    wait_for("every message after restart", drain, 30)
    assert sorted(base64.b64decode(d["payload"]) for d in got) == sorted(
        b"p%d" % i for i in range(n)
    )


def test_sigterm_on_a_follower_ends_its_long_polls_at_once(cluster3: Cluster) -> None:
    c = cluster3
    f = c.followers()[0]
    topic = uniq()
    call(c, f, "POST", "/topics", {"topic": topic}, 201)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        poll = pool.submit(http, "POST", c.url(f) + f"/topics/{topic}/groups/default/receive",
                           {"wait": 20}, 30)  # fmt: skip
        time.sleep(0.3)  # let the poll start waiting (nothing observable to wait on)
        t0 = time.monotonic()
        assert c.stop_node(f, timeout=20) == 0
        assert time.monotonic() - t0 < 5
        code, body = poll.result(timeout=10)
    assert code == 200 and body["deliveries"] == []
    # and nothing was left in flight for the stopped node's consumer
    lid = c.wait_leader()
    assert call(c, lid, "GET", f"/topics/{topic}/groups/default")["in_flight"] == 0


def test_without_a_quorum_answers_are_definite_and_a_keyed_retry_stores_once(
    cluster3: Cluster,
) -> None:
    c = cluster3
    lid = c.wait_leader()
    topic = uniq()
    call(c, lid, "POST", "/topics", {"topic": topic}, 201)
    followers = c.followers()
    for f in followers:
        c.kill(f)
    body = {"payload": b64(b"once"), "key": "only-once"}
    code, err = http("POST", c.url(lid) + f"/topics/{topic}/messages", body, 30)
    assert (code, err["code"]) in (
        (504, "outcome_unknown"),
        (503, "no_leader"),
        (503, "overloaded"),
    )

    def refused() -> bool:
        code, _ = http("GET", c.url(lid) + "/readyz")
        return code == 503

    wait_for("the lone node to notice it has no quorum", refused, 15)
    code, err = http("POST", c.url(lid) + f"/topics/{topic}/messages", body, 30)
    assert code == 503 and err["code"] == "no_leader"

    c.start_node(followers[0])
    new = c.wait_leader()
    wait_for(
        "a publish to succeed again",
        lambda: http("POST", c.url(new) + f"/topics/{topic}/messages", body, 10)[0] == 200,
        20,
        every=0.2,
    )
    assert call(c, new, "GET", f"/topics/{topic}")["messages"] == 1  # stored exactly once


def test_access_control_on_every_node_and_across_the_forward(shared_cluster3: Cluster) -> None:
    """Every node refuses a call without a valid token, a follower included; the probes need
    none; a follower forwards a caller's own token, and the leader checks it again."""
    c = shared_cluster3
    lid = c.wait_leader()
    f = c.followers()[0]
    topic = uniq()
    call(c, lid, "POST", "/topics", {"topic": topic}, 201)
    for nid in (lid, f):
        url = c.url(nid)
        for method, path, body in (
            ("GET", "/cluster", None),
            ("GET", "/topics", None),
            ("POST", f"/topics/{topic}/messages", {"payload": b64(b"x")}),
        ):
            for token in (None, "rq_nobody.not-a-token-of-this-cluster"):
                code, err = http(method, url + path, body, token=token)
                assert (code, err["code"]) == (401, "unauthenticated"), (nid, path, err)
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert http("GET", url + path, token=None)[0] in (200, 503), path  # never 401
    for node in c.nodes.values():  # the admin token went by the environment, not argv
        assert node.proc is not None
        assert c.token.encode() not in Path(f"/proc/{node.proc.pid}/cmdline").read_bytes()

    grants = [{"topics": topic, "actions": ["publish"]}]
    made = call(c, lid, "POST", "/tokens", {"name": f"pub-{topic}", "grants": grants}, 201)
    token = made["token"]
    # (a follower learns of a token when it applies its creation: wait for that here)
    wait_for(
        "the follower to know the new token",
        lambda: http("GET", c.url(f) + "/cluster", token=token)[0] == 200,
        10,
    )
    url = c.url(f)
    code, res = http("POST", url + f"/topics/{topic}/messages", {"payload": b64(b"ok")}, 10, token)
    assert code == 200 and res["seq"] == 1, res
    code, err = http("POST", url + f"/topics/{topic}/groups/default/receive", {}, 10, token)
    assert (code, err["code"]) == (403, "forbidden")
    code, err = http("POST", url + "/topics", {"topic": uniq()}, 10, token)
    assert (code, err["code"]) == (403, "forbidden")

    call(c, lid, "DELETE", f"/tokens/{made['id']}")

    def refused(nid: str) -> bool:
        return http("GET", c.url(nid) + "/cluster", token=token)[0] == 401

    for nid in c.nodes:
        wait_for(f"{nid} to refuse the revoked token", functools.partial(refused, nid), 10)
    code, _ = http("POST", url + f"/topics/{topic}/messages", {"payload": b64(b"no")}, 10, token)
    assert code == 401
