"""The SQS endpoint as part of the cluster: a leader killed mid-run loses nothing that was
acknowledged, a long poll whose client goes away gives its messages back at once, and the CLI
hands a token its own SQS credentials."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.sqs.conftest import SqsCluster
from tests.support import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SqsCluster]:
    c = SqsCluster(tmp_path, 3)
    try:
        c.start()
        yield c
    finally:
        c.close()


def receive_all(sqs: Any, url: str, want: int, timeout: float) -> list[str]:
    bodies: list[str] = []

    def more() -> bool:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        msgs = got.get("Messages", [])
        if msgs:
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)
                ],
            )
        bodies.extend(m["Body"] for m in msgs)
        return len(set(bodies)) >= want

    wait_for(f"{want} messages", more, timeout, every=0)
    return bodies


def test_a_leader_kill_loses_no_acknowledged_message(cluster: SqsCluster, qname: str) -> None:
    leader = cluster.leader()
    assert leader is not None
    first, second = (n for n in cluster.nodes if n != leader)
    sqs = cluster.client(first, max_attempts=10)
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    sent: list[str] = []
    for b in range(10):
        entries = [{"Id": str(i), "MessageBody": f"m-{b}-{i}"} for i in range(10)]
        res = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert not res["Failed"]
        sent += [e["MessageBody"] for e in entries]
    cluster.kill(leader)
    cluster.wait_leader(not_=leader)
    # Through the other survivor, retrying while the new leader settles in (503s).
    other = cluster.client(second, max_attempts=10)
    more = [f"after-{i}" for i in range(5)]
    for body in more:
        other.send_message(QueueUrl=url, MessageBody=body)
    bodies = receive_all(other, url, len(sent) + len(more), 60)
    assert set(sent + more) <= set(bodies)
    print(f"duplicates after the failover: {len(bodies) - len(set(bodies))}")


def _signed_receive(
    c: SqsCluster, nid: str, url: str, wait: int
) -> tuple[str, bytes, dict[str, str]]:
    creds = c.credentials()
    body = json.dumps({"QueueUrl": url, "WaitTimeSeconds": wait, "MaxNumberOfMessages": 10,
                       "VisibilityTimeout": 600}).encode()  # fmt: skip
    endpoint = c.sqs_url(nid) + "/"
    req = AWSRequest(
        "POST",
        endpoint,
        data=body,
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "AmazonSQS.ReceiveMessage",
        },
    )
    SigV4Auth(Credentials(creds["access_key_id"], creds["secret_access_key"]), "sqs",
              "us-east-1").add_auth(req)  # fmt: skip
    return endpoint, body, dict(req.headers.items())


@pytest.mark.parametrize("via", ["leader", "follower"])
def test_a_long_poll_whose_client_leaves_gives_its_messages_back(
    cluster: SqsCluster, qname: str, via: str
) -> None:
    nid = cluster.leader() if via == "leader" else cluster.followers()[0]
    assert nid is not None
    sqs = cluster.client(nid)
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    endpoint, body, headers = _signed_receive(cluster, nid, url, 20)
    parts = urllib.parse.urlsplit(endpoint)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=5)
    conn.request("POST", "/", body=body, headers=headers)
    # The poll waits; its client goes away; then a message comes.
    wait_for("the long poll to wait", lambda: _waiting(cluster, nid) >= 1, 10)
    conn.sock.close()
    conn.close()
    sqs.send_message(QueueUrl=url, MessageBody="not lost")
    # Nobody may hold it for the poll's 600 s visibility timeout: another receive gets it now.
    start = time.monotonic()
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)
    assert [m["Body"] for m in got.get("Messages", [])] == ["not lost"]
    assert time.monotonic() - start < 10


def _waiting(c: SqsCluster, nid: str) -> float:
    """raftq_long_polls_waiting on the leader (where the long poll waits, forwarded or not)."""
    import urllib.request

    lid = c.leader() or nid
    req = urllib.request.Request(c.url(lid) + "/metrics")
    req.add_header("Authorization", f"Bearer {c.token}")
    with urllib.request.urlopen(req, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("raftq_long_polls_waiting"):
                return float(line.split()[-1])
    return 0.0


def test_the_cli_prints_a_tokens_own_sqs_credentials(cluster: SqsCluster, qname: str) -> None:
    text, creds = cluster.new_token([{"topics": qname, "actions": ["publish", "consume"]}])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAFTQ_", "AWS_"))}
    env["RAFTQ_TOKEN"] = text
    done = subprocess.run(
        [sys.executable, "-m", "raftq.node", "sqs", "credentials", "--url",
         cluster.url(cluster.followers()[0])],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    exports = dict(kv.split("=", 1) for kv in done.stdout.split()[1:])
    assert exports["AWS_ACCESS_KEY_ID"] == creds["access_key_id"] != "admin"
    assert exports["AWS_SECRET_ACCESS_KEY"] == creds["secret_access_key"]
    mine = cluster.client("n1", {
        "access_key_id": exports["AWS_ACCESS_KEY_ID"],
        "secret_access_key": exports["AWS_SECRET_ACCESS_KEY"],
    })  # fmt: skip
    cluster.client().create_queue(QueueName=qname)
    assert [u.rsplit("/", 1)[1] for u in mine.list_queues()["QueueUrls"]] == [qname]
