"""The SQS endpoint over HTTPS: with TLS on, ``--sqs-listen`` serves HTTPS with the node's
certificate, and a follower forwards to the leader over HTTPS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.node.cluster_fixture import Node
from tests.node.test_tls_cluster import TlsCluster, https
from tests.support import free_ports

pytestmark = pytest.mark.slow


class TlsSqsCluster(TlsCluster):
    def __init__(self, root: Path) -> None:
        super().__init__(root, 3)
        self.sqs = dict(zip(self.nodes, (f"127.0.0.1:{p}" for p in free_ports(3)), strict=True))

    def command(self, node: Node) -> list[str]:
        return [*super().command(node), "--sqs-listen", self.sqs[node.id]]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[TlsSqsCluster]:
    c = TlsSqsCluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_sqs_over_https_through_a_follower(cluster: TlsSqsCluster) -> None:
    code, creds, _ = https("GET", cluster.url("n1") + "/sqs/credentials", cluster.ctx)
    assert code == 200, creds
    nid = cluster.followers()[0]
    sqs = boto3.client(
        "sqs", endpoint_url=f"https://{cluster.sqs[nid]}", region_name="us-east-1",
        aws_access_key_id=creds["access_key_id"],
        aws_secret_access_key=creds["secret_access_key"], verify=str(cluster.ca.ca_cert),
    )  # fmt: skip
    url = sqs.create_queue(QueueName="secure")["QueueUrl"]
    assert url == f"https://{cluster.sqs[nid]}/000000000000/secure"
    sqs.send_message(QueueUrl=url, MessageBody="over tls")
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert [m["Body"] for m in got] == ["over tls"]
