"""Fixtures for the SQS-compatible endpoint: a 3-node cluster of real processes with
``--sqs-listen`` on every node, SQS credentials for its admin token or for a new token, and
boto3 clients of any node. Other suites (Celery, benchmarks) can build on them:

    def test_x(sqs_cluster: SqsCluster) -> None:
        sqs = sqs_cluster.client()            # boto3, admin credentials, the leader's node
        sqs = sqs_cluster.client("n2")        # ... a follower's (it forwards)
        creds = sqs_cluster.credentials()     # {"access_key_id", "secret_access_key", ...}
        url = sqs_cluster.sqs_url("n1")       # http://127.0.0.1:<port>
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.cluster_fixture import Cluster, Node, http
from tests.support import free_ports

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402


class SqsCluster(Cluster):
    """``Cluster`` whose nodes also serve SQS (``--sqs-listen``), each on its own port."""

    def __init__(self, root: Path, n: int = 3, **kwargs: Any) -> None:
        super().__init__(root, n, **kwargs)
        ports = free_ports(n)
        self.sqs: dict[str, str] = {
            nid: f"127.0.0.1:{p}" for nid, p in zip(self.nodes, ports, strict=True)
        }

    def command(self, node: Node) -> list[str]:
        return [*super().command(node), "--sqs-listen", self.sqs[node.id]]

    def sqs_url(self, nid: str) -> str:
        return f"http://{self.sqs[nid]}"

    def credentials(self, token: str | None = None) -> dict[str, str]:
        """The SQS credentials of ``token`` (default: the admin token), from GET
        /sqs/credentials of any running node."""
        nid = next(n for n, node in self.nodes.items() if node.alive)
        code, body = http("GET", self.url(nid) + "/sqs/credentials", token=token or self.token)
        assert code == 200, body
        creds: dict[str, str] = body
        return creds

    def new_token(self, grants: list[dict[str, Any]]) -> tuple[str, dict[str, str]]:
        """A new token with ``grants``: (its text, its SQS credentials)."""
        lid = self.leader() or "n1"
        name = f"t-{uuid.uuid4().hex[:8]}"
        code, body = http("POST", self.url(lid) + "/tokens", {"name": name, "grants": grants},
                          token=self.token)  # fmt: skip
        assert code == 201, body
        return body["token"], self.credentials(body["token"])

    def client(
        self, nid: str | None = None, creds: dict[str, str] | None = None, **config: Any
    ) -> Any:
        """A boto3 SQS client of node ``nid`` (default: the leader), signing with ``creds``
        (default: the admin token's)."""
        nid = nid or self.leader() or "n1"
        creds = creds or self.credentials()
        cfg = Config(
            retries={"max_attempts": config.pop("max_attempts", 3), "mode": "standard"},
            connect_timeout=5, read_timeout=30, **config,
        )  # fmt: skip
        return boto3.client(
            "sqs",
            endpoint_url=self.sqs_url(nid),
            region_name=creds.get("region", "us-east-1"),
            aws_access_key_id=creds["access_key_id"],
            aws_secret_access_key=creds["secret_access_key"],
            config=cfg,
        )


@pytest.fixture(scope="module")
def sqs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqsCluster]:
    """One 3-node cluster serving SQS, shared by a module's tests (use unique queue names)."""
    c = SqsCluster(tmp_path_factory.mktemp("sqs"), 3)
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture
def qname() -> str:
    """A queue name of this test's own."""
    return f"q-{uuid.uuid4().hex[:10]}"
