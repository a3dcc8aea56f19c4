"""A 3-node test cluster (tests/node/cluster_fixture.py) whose nodes also serve the SQS API on
``--sqs-listen`` ports of their own, and the admin token's SQS credentials
(``GET /sqs/credentials``). Used by tests/sqs/test_celery.py, test_query_old_botocore.py and
bench/sqs_bench.py."""

from __future__ import annotations

from pathlib import Path

from tests.node.cluster_fixture import Cluster, Node, http
from tests.support import free_ports, wait_for


class SqsCluster(Cluster):
    def __init__(self, root: Path, n: int = 3, fsync: str = "never") -> None:
        super().__init__(root, n, fsync=fsync)
        ports = free_ports(n)
        self.sqs = {nid: f"127.0.0.1:{p}" for nid, p in zip(self.nodes, ports, strict=True)}

    def command(self, node: Node) -> list[str]:
        return [*super().command(node), "--sqs-listen", self.sqs[node.id]]

    def sqs_url(self, nid: str) -> str:
        return f"http://{self.sqs[nid]}"

    def credentials(self) -> tuple[str, str, str]:
        """(access key id, secret access key, region) of the admin token."""

        def get() -> dict[str, str] | None:
            code, body = http("GET", self.url(next(iter(self.nodes))) + "/sqs/credentials")
            assert code in (200, 503), body
            return body if code == 200 else None

        body = wait_for("the admin token's SQS credentials", get, 15)
        return body["access_key_id"], body["secret_access_key"], body["region"]

    def sqs_endpoint(self, nid: str | None = None) -> tuple[str, str, str, str]:
        """(url, key, secret, region) of node ``nid``'s SQS listener (default: the leader's)."""
        return (self.sqs_url(nid or self.wait_leader()), *self.credentials())
