"""Helpers for tests against one in-process node (``LocalRaft`` behind a real aiohttp app)."""

from __future__ import annotations

import uuid

from aiohttp import web
from aiohttp.test_utils import TestClient

Client = TestClient[web.Request, web.Application]


async def topic_of(client: Client) -> str:
    """Create a topic with a fresh name; return its name."""
    topic = "t-" + uuid.uuid4().hex[:10]
    r = await client.post("/topics", json={"topic": topic})
    assert r.status == 201, await r.text()
    return topic
