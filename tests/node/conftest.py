from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from raftq.node.local import LocalRaft
from tests.node.cluster_fixture import Cluster
from tests.node.inprocess import admin_client, app

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def node() -> AsyncIterator[tuple[LocalRaft, Client]]:
    """One in-process node (a 64 KiB body limit, to test it cheaply) and a client of it."""
    raft = LocalRaft()
    async with admin_client(app(raft, max_body=64 * 1024)) as c:
        yield raft, c


@pytest.fixture
async def leader_and_follower() -> AsyncIterator[tuple[LocalRaft, Client, LocalRaft, Client]]:
    """Two in-process nodes: n1 leads, n2 follows it (and forwards to it)."""
    leader = LocalRaft("n1")
    async with admin_client(app(leader)) as lc:
        follower = LocalRaft("n2")
        follower.set_follower("n1", f"{lc.host}:{lc.port}")
        async with admin_client(app(follower, node_id="n2")) as fc:
            yield leader, lc, follower, fc


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    """A fresh 3-node cluster of real processes, stopped after the test."""
    c = Cluster(tmp_path, 3)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def shared_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 3-node cluster shared by a module's non-destructive tests (use unique topics)."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), 3)
    try:
        yield c.start()
    finally:
        c.close()
