"""The ``http_headers`` hook on the async client's WebSocket handshakes (the consumer stream and
the publish stream), against an in-process node, also when a follower's 307 sends the handshake
to the leader on another port: aiohttp follows that redirect itself and would drop
``Authorization`` on the way (the HTTP requests are covered in test_client_transport.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from tests.node.inprocess import app as inprocess_app
from tests.node.inprocess import serving

from raftq.client import AsyncClient
from raftq.node.local import LocalRaft

# (method, path, Authorization or None) of every request a server got
Seen = list[tuple[str, str, str | None]]


def serve(app: web.Application) -> Any:
    """``serving`` noting each request's (method, path, Authorization)."""
    return serving(app, lambda r: (r.method, r.path, r.headers.get("Authorization")))


def follower_of(leader: str) -> web.Application:
    """A follower: every request is redirected to the leader, as a raftq follower does."""

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(
            leader + request.path_qs, headers={"X-Raftq-Leader": leader}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    return app


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[str, Seen, str, Seen]]:
    """A leader (a real node with topic ``t`` and group ``g``) and a follower on another port."""
    # (access control off: these tokens are made up, to tell the hops apart; what a node
    # does with them is tested in tests/node/test_auth.py)
    async with serve(inprocess_app(LocalRaft(), auth=False)) as (leader, at_leader):
        async with AsyncClient(leader, publish_stream=False) as setup:
            await setup.create_topic("t")
            await setup.create_group("t", "g", start="earliest")
        at_leader.clear()
        async with serve(follower_of(leader)) as (follower, at_follower):
            yield leader, at_leader, follower, at_follower


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not pred():  # noqa: ASYNC110 - polling the client's background open
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


class Tokens:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> dict[str, str]:
        self.n += 1
        return {"Authorization": f"Bearer t{self.n}"}


def handshakes(seen: Seen, path: str) -> list[str | None]:
    return [auth for method, p, auth in seen if method == "GET" and p == path]


async def test_the_consumer_streams_handshake_carries_the_hooks_headers_through_a_redirect(
    cluster: tuple[str, Seen, str, Seen],
) -> None:
    leader, at_leader, follower, at_follower = cluster
    hook = Tokens()
    async with AsyncClient(follower, publish_stream=False, http_headers=hook) as c:

        async def first_message() -> bytes:
            async for msg in c.consume("t", "g", stream=True):
                await msg.ack()
                return msg.payload
            raise AssertionError("the stream ended")

        # The stream is the first thing this client opens: the follower redirects it.
        first = asyncio.ensure_future(first_message())
        async with AsyncClient(leader, publish_stream=False) as producer:
            await producer.publish("t", b"hello")
        assert await asyncio.wait_for(first, 10) == b"hello"
    stream = "/topics/t/groups/g/stream"
    assert handshakes(at_follower, stream) == ["Bearer t1"]
    assert handshakes(at_leader, stream) == ["Bearer t2"]  # asked again for the second hop


async def test_the_publish_streams_handshake_carries_the_hooks_headers(
    cluster: tuple[str, Seen, str, Seen],
) -> None:
    leader, at_leader, follower, at_follower = cluster
    fixed = {"Authorization": "Bearer s3cret"}
    # Through the follower: open the stream before any request teaches the client the leader.
    async with AsyncClient(follower, http_headers=fixed) as c:
        assert c._publisher is not None
        assert c._publisher.get() is None  # (starts opening one)
        await until(lambda: c._publisher is not None and c._publisher.stream is not None)
        assert await c.publish("t", b"over the stream") >= 1
    assert handshakes(at_follower, "/publish/stream") == ["Bearer s3cret"]
    assert handshakes(at_leader, "/publish/stream") == ["Bearer s3cret"]
    # Straight to the leader, after an HTTP publish: every request carries it.
    at_leader.clear()
    async with AsyncClient(leader, http_headers=fixed) as c:
        await c.publish("t", b"over HTTP")
        await until(lambda: c._publisher is not None and c._publisher.stream is not None)
        await c.publish("t", b"over the stream")
    assert sorted(p for _, p, _ in at_leader) == ["/publish/stream", "/topics/t/publish"]
    assert {auth for _, _, auth in at_leader} == {"Bearer s3cret"}


async def test_a_hook_answer_naming_a_websocket_header_is_refused(
    cluster: tuple[str, Seen, str, Seen],
) -> None:
    leader, at_leader, _, _ = cluster
    answers: list[dict[str, Any]] = [{"Authorization": "Bearer ok"}]

    async with AsyncClient(leader, publish_stream=False, http_headers=lambda: answers[-1]) as c:
        await c.list_topics()
        answers.append({"Sec-WebSocket-Key": "chosen"})

        async def open_stream() -> None:
            async for _ in c.consume("t", "g", stream=True):
                break

        with pytest.raises(ValueError, match="http_headers"):
            await asyncio.wait_for(open_stream(), 5)
    assert handshakes(at_leader, "/topics/t/groups/g/stream") == []
