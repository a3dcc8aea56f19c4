"""Helpers for tests against one in-process node (``LocalRaft`` behind a real aiohttp app)."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from raftq.node.app import NodeSettings, build_app
from raftq.node.auth import internal_token
from raftq.node.raftapi import Raft
from tests.support import ADMIN, ADMIN_TOKEN

Client = TestClient[web.Request, web.Application]
INTERNAL = internal_token("in-process test cluster secret")


async def topic_of(client: Client) -> str:
    """Create a topic with a fresh name; return its name."""
    topic = "t-" + uuid.uuid4().hex[:10]
    r = await client.post("/topics", json={"topic": topic})
    assert r.status == 201, await r.text()
    return topic


def settings(**kw: Any) -> NodeSettings:
    """In-process nodes run with access control on, like real ones: the suite's admin token,
    and one internal credential shared by every in-process node (as by a cluster's)."""
    return NodeSettings(admin_token=ADMIN_TOKEN, internal_token=INTERNAL, **kw)


def app(raft: Raft, **kw: Any) -> web.Application:
    """``build_app`` with ``settings(**kw)``."""
    return build_app(raft, settings(**kw))


def admin_client(application: web.Application, **kw: Any) -> Client:
    """A test client of ``application`` that sends the admin token."""
    return TestClient(TestServer(application, **kw), headers=ADMIN)
