"""Helpers for tests against one in-process node (``LocalRaft`` behind a real aiohttp app)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from raftq.node.app import NodeSettings, build_app
from raftq.node.auth import internal_token
from raftq.node.raftapi import Raft
from tests.support import ADMIN, ADMIN_TOKEN

Client = TestClient[web.Request, web.Application]
T = TypeVar("T")
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


@contextlib.asynccontextmanager
async def serving(
    application: web.Application, note: Callable[[web.Request], T]
) -> AsyncIterator[tuple[str, list[T]]]:
    """Run ``application`` on 127.0.0.1; yield its URL and ``note(request)`` of every request
    it answered, in order."""
    seen: list[T] = []

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        seen.append(note(request))

    application.on_response_prepare.append(record)
    srv = TestServer(application, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}", seen
    finally:
        await srv.close()
