"""What the client tests share: an in-process node (one ``LocalRaft`` behind the node's app,
access control on with the admin token) and unique topic names."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer
from tests.node.inprocess import app as inprocess_app

from raftq.node.local import LocalRaft


def name() -> str:
    """A topic name no other test uses."""
    return "t-" + uuid.uuid4().hex[:10]


@pytest.fixture
async def server() -> AsyncIterator[tuple[LocalRaft, str]]:
    """An in-process node: its Raft stand-in and its URL."""
    raft = LocalRaft()
    srv = TestServer(inprocess_app(raft), host="127.0.0.1")
    await srv.start_server()
    try:
        yield raft, f"http://127.0.0.1:{srv.port}"
    finally:
        await srv.close()
