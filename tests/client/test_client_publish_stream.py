"""The async client's publish stream: publishes ride one WebSocket to the leader once it is
open, go over HTTP until then, and fall back to HTTP with the same idempotency keys whenever the
stream cannot give a definite answer."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest
from aiohttp import web
from tests.node.inprocess import app as inprocess_app
from tests.node.inprocess import serving

from raftq.client import AsyncClient, TopicNotFound
from raftq.client._async import CLOSE_TIMEOUT, _Stream, _StreamClosed
from raftq.client._core import JSON
from raftq.client.errors import error_from_body
from raftq.node.errors import STATUS_BY_CODE
from raftq.node.local import LocalRaft


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not pred():  # noqa: ASYNC110 - polling the client's background open
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


def stream_open(c: AsyncClient) -> bool:
    return c._publisher is not None and c._publisher.stream is not None


def serve(app: web.Application) -> Any:
    """``serving`` noting each request's "METHOD path"."""
    return serving(app, lambda r: f"{r.method} {r.path}")


@pytest.fixture
async def node() -> AsyncIterator[tuple[LocalRaft, str, list[str]]]:
    raft = LocalRaft()
    async with serve(inprocess_app(raft)) as (url, seen):
        yield raft, url, seen


async def test_publishes_go_over_http_until_the_stream_is_open_then_over_it(
    node: tuple[LocalRaft, str, list[str]],
) -> None:
    raft, url, seen = node
    async with AsyncClient(url) as c:
        await c.create_topic("t")
        assert await c.publish("t", b"first") == 1  # no stream yet: HTTP, and one is opened
        await until(lambda: stream_open(c))
        seqs = [await c.publish("t", b"m%d" % i) for i in range(20)]
        seqs += await c.publish_batch("t", [b"b1", b"b2"])
        seqs += await asyncio.gather(*(c.publish("t", b"c%d" % i) for i in range(10)))
        assert sorted(seqs) == list(range(2, 34))
        assert raft.read(lambda b: b.topic_stats("t")["messages"]) == 33
    publishes = [s for s in seen if s.endswith("/publish") or s.endswith("/messages")]
    assert publishes == ["POST /topics/t/publish"]  # only the first one
    assert seen.count("GET /publish/stream") == 1


async def test_without_the_stream_option_or_with_json_publishes_stay_on_http(
    node: tuple[LocalRaft, str, list[str]],
) -> None:
    _, url, seen = node
    for kw in ({"publish_stream": False}, {"fmt": JSON}):
        async with AsyncClient(url, **kw) as c:
            await c.create_topic("t", if_not_exists=True)
            for _ in range(3):
                await c.publish("t", b"x")
            assert not stream_open(c)
    assert "GET /publish/stream" not in seen
    assert seen.count("POST /topics/t/publish") == 6


SILENT = object()  # (an ``on_frame`` answer: keep the socket open, answer nothing)


def scripted(
    on_frame: Callable[[dict[str, Any]], Any], stream: bool = True
) -> tuple[web.Application, list[tuple[str, Any]]]:
    """A server whose publish stream answers each frame with ``on_frame(frame)`` (a frame to
    send, or None to close the socket unanswered), and whose HTTP publish answers every
    message as a duplicate of seq 7. Returns the app and the frames and HTTP bodies it got."""
    got: list[tuple[str, Any]] = []

    async def publish_stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            frame = msgpack.unpackb(msg.data)
            got.append(("stream", frame))
            out = on_frame(frame)
            if out is None:
                break
            if out is not SILENT:
                await ws.send_bytes(msgpack.packb(out))
        await ws.close()
        return ws

    async def publish(request: web.Request) -> web.Response:
        body = msgpack.unpackb(await request.read())
        got.append(("http", body))
        res = {"messages": [{"seq": 7, "duplicate": True} for _ in body["messages"]]}
        return web.Response(body=msgpack.packb(res), content_type="application/msgpack")

    app = web.Application()
    if stream:  # (else an older server: 404)
        app.router.add_get("/publish/stream", publish_stream)
    app.router.add_post("/topics/t/publish", publish)
    return app, got


def error_frame(code: str) -> Callable[[dict[str, Any]], Any]:
    def on_frame(frame: dict[str, Any]) -> Any:
        return {"type": "error", "id": frame["id"], "code": code, "message": code, "details": {}}

    return on_frame


@pytest.mark.parametrize(
    "on_frame",
    [lambda f: None, error_frame("outcome_unknown"), error_frame("no_leader")],
    ids=["socket closed unanswered", "outcome_unknown", "no_leader"],
)
async def test_a_publish_the_stream_cannot_answer_is_sent_again_over_http_with_its_key(
    on_frame: Callable[[dict[str, Any]], Any],
) -> None:
    app, got = scripted(on_frame)
    async with serve(app) as (url, _), AsyncClient(url, timeout=5.0) as c:
        await c.publish("t", b"warm-up")  # over HTTP; opens the stream
        await until(lambda: stream_open(c))
        assert await c.publish("t", b"p", key="k1") == 7
    assert [(how, body["messages"][0]["payload"]) for how, body in got[1:]] == [
        ("stream", b"p"),
        ("http", b"p"),
    ]
    assert got[1][1]["messages"][0]["key"] == got[2][1]["messages"][0]["key"] == "k1"


async def test_a_stream_that_leaves_a_publish_unanswered_is_dropped_and_http_finds_out() -> None:
    app, got = scripted(lambda f: SILENT)
    async with serve(app) as (url, _), AsyncClient(url, timeout=5.0, attempt_timeout=0.3) as c:
        await c.publish("t", b"warm-up")
        await until(lambda: stream_open(c))
        assert c._publisher is not None
        silent = c._publisher.stream
        assert await c.publish("t", b"p") == 7
        assert c._publisher.stream is not silent  # not used again
    assert [how for how, _ in got] == ["http", "stream", "http"]


@pytest.mark.parametrize("stream_on", ["leader", "follower"])
async def test_after_a_silent_stream_the_http_try_goes_to_another_node(stream_on: str) -> None:
    """A frozen leader keeps its sockets open and answers nothing: once a publish stream (to
    it, or to a follower forwarding to it) was silent for attempt_timeout, the HTTP try goes to
    another node instead of into the same silence for another attempt_timeout."""
    servers = [scripted(lambda f: SILENT) for _ in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        urls = [(await stack.enter_async_context(serve(app)))[0] for app, _ in servers]
        c = await stack.enter_async_context(AsyncClient(urls, timeout=5.0, attempt_timeout=0.3))
        await c.publish("t", b"warm-up")
        await until(lambda: stream_open(c))
        assert c._publisher is not None and c._publisher.stream is not None
        streamed = c._publisher.stream.url
        leader = streamed if stream_on == "leader" else next(u for u in urls if u != streamed)
        c.endpoints.learn(leader)  # as a node's answer would have named it
        for _, got in servers:
            got.clear()
        assert await c.publish("t", b"p") == 7
    hows = {url: [how for how, _ in got] for url, (_, got) in zip(urls, servers, strict=True)}
    assert hows.pop(streamed) == ["stream"]
    assert sorted(hows.values()) == [[], ["http"]]  # one try, to a third node
    if stream_on == "follower":
        assert hows[leader] == []  # not to the leader the follower forwarded to


async def test_a_refusal_over_the_stream_is_the_callers_answer() -> None:
    app, got = scripted(error_frame("topic_not_found"))
    async with serve(app) as (url, _), AsyncClient(url, timeout=5.0) as c:
        await c.publish("t", b"warm-up")
        await until(lambda: stream_open(c))
        with pytest.raises(TopicNotFound):
            await c.publish("t", b"p")
    assert [how for how, _ in got] == ["http", "stream"]  # not sent again


@pytest.mark.parametrize("code", ["overloaded", "topic_full"])
async def test_a_refusal_with_retry_after_over_the_stream_waits_then_goes_over_http(
    code: str,
) -> None:
    def on_frame(frame: dict[str, Any]) -> Any:
        return {**error_frame(code)(frame), "retry_after": 1}

    app, got = scripted(on_frame)
    async with serve(app) as (url, _), AsyncClient(url, timeout=5.0) as c:
        await c.publish("t", b"warm-up")
        await until(lambda: stream_open(c))
        t0 = time.monotonic()
        assert await c.publish("t", b"p") == 7
        assert time.monotonic() - t0 >= 1.0  # the server's Retry-After, not the 50 ms backoff
    assert [how for how, _ in got] == ["http", "stream", "http"]


async def test_a_server_without_a_publish_stream_is_not_asked_again_at_every_publish() -> None:
    app, _ = scripted(lambda f: None, stream=False)
    async with serve(app) as (url, seen), AsyncClient(url, timeout=5.0) as c:
        await c.publish("t", b"x")
        await until(lambda: c._publisher is not None and c._publisher.opening is None)
        for _ in range(2):
            await c.publish("t", b"x")
        assert not stream_open(c)
    assert seen.count("GET /publish/stream") == 1
    assert seen.count("POST /topics/t/publish") == 3


@pytest.mark.parametrize("code", sorted(STATUS_BY_CODE))
def test_an_error_frame_raises_what_the_same_error_over_http_raises(code: str) -> None:
    """Error frames carry no HTTP status: every code must map to its class by itself."""
    body = {"code": code, "message": "m", "details": {}}
    assert type(error_from_body(400, body)) is type(error_from_body(STATUS_BY_CODE[code], body))


async def test_a_frame_whose_send_fails_may_be_out_so_its_outcome_is_unknown() -> None:
    class FailingSocket:  # aiohttp writes a frame, then fails while waiting for the drain
        closed, close_code = False, None

        def __aiter__(self) -> FailingSocket:
            return self

        async def __anext__(self) -> Any:
            await asyncio.Event().wait()  # no frames come in (cancelled at the end)

        async def send_bytes(self, data: bytes) -> None:
            raise ConnectionResetError("reset while draining")

    st = _Stream(FailingSocket(), "http://x", lambda receipts: None)  # type: ignore[arg-type]
    with pytest.raises(_StreamClosed) as e:
        await st.call("publish", {"topic": "t", "messages": []}, 1.0)
    assert e.value.sent  # so the HTTP try carries an unknown outcome, never "not done"
    st.reader.cancel()


async def test_close_does_not_wait_long_for_a_leader_that_stopped_reading() -> None:
    release = asyncio.Event()

    async def frozen(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await release.wait()  # reads nothing: the closing handshake is never answered
        return ws

    app, _ = scripted(lambda f: None, stream=False)
    app.router.add_get("/publish/stream", frozen)
    async with serve(app) as (url, _):
        c = AsyncClient(url, timeout=30.0)
        await c.publish("t", b"warm-up")
        await until(lambda: stream_open(c))
        t0 = time.monotonic()
        await c.close()
        assert time.monotonic() - t0 < CLOSE_TIMEOUT + 1
        release.set()


async def test_a_call_whose_send_blocks_past_its_timeout_leaves_no_future_unretrieved() -> None:
    class StuckSocket:  # the server stopped reading: the send waits for the buffer to drain
        closed, close_code = False, None

        def __aiter__(self) -> StuckSocket:
            return self

        async def __anext__(self) -> Any:
            await asyncio.Event().wait()

        async def send_bytes(self, data: bytes) -> None:
            await asyncio.Event().wait()

    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        st = _Stream(StuckSocket(), "http://x", lambda receipts: None)  # type: ignore[arg-type]

        async def sent(st: _Stream) -> bool:  # (no traceback kept: it holds the future)
            try:
                await st.call("publish", {"topic": "t", "messages": []}, 0.1)
            except _StreamClosed as e:
                return e.sent
            return False

        assert await sent(st)
        assert st._calls == {}
        st.reader.cancel()
        await asyncio.sleep(0)
        del st
        gc.collect()
        await asyncio.sleep(0)
        assert errors == []  # (before: "Future exception was never retrieved")
    finally:
        loop.set_exception_handler(None)


async def test_a_closed_client_opens_no_publish_stream(
    node: tuple[LocalRaft, str, list[str]],
) -> None:
    _, url, _ = node
    c = AsyncClient(url)
    await c.create_topic("t")
    await c.publish("t", b"x")  # starts opening the stream
    await c.close()
    assert c._publisher is not None
    c._publisher.retry_at = 0.0  # (no backoff left either)
    assert c._publisher.get() is None and c._publisher.opening is None
    assert c._publisher.stream is None
