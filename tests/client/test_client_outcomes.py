"""Definite outcomes and bounded waits of both clients against scripted servers (raw HTTP on
127.0.0.1): what the caller is told when a try's outcome is unknown, when the leader it knows
stops leading, when a server drips or redirects, and at close."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tests.node.inprocess import app as inprocess_app

from raftq.client import AsyncClient, Client, RaftqTimeout, UnknownOutcome
from raftq.client._async import _Stream
from raftq.node.local import LocalRaft

# script(n, connection, request line, body) -> bytes to answer, None to close unanswered,
# or a list of (seconds to wait, bytes) pieces (dripped).
Script = Callable[[int, int, str, bytes], Any]


class Fake:
    """A scripted HTTP/1.1 server on its own thread; ``stop`` closes its listener."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[tuple[int, str, bytes]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        self.sock.close()
        for c in self._conns:
            c.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(c)
            threading.Thread(target=self._serve, args=(c, len(self._conns)), daemon=True).start()

    def _serve(self, c: socket.socket, conn: int) -> None:
        buf = b""
        with c:
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = c.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    lines = head.decode("latin-1").split("\r\n")
                    n = next(
                        (
                            int(x.split(":")[1])
                            for x in lines
                            if x.lower().startswith("content-length")
                        ),
                        0,
                    )
                    while len(buf) < n:
                        buf += c.recv(65536)
                    body, buf = buf[:n], buf[n:]
                    self.seen.append((conn, lines[0], body))
                    out = self.script(len(self.seen), conn, lines[0], body)
                    if out is None:
                        return
                    for wait, piece in out if isinstance(out, list) else [(0.0, out)]:
                        time.sleep(wait)
                        c.sendall(piece)
            except OSError:
                return


def answer(status: int, obj: Any = None, *headers: str) -> bytes:
    body = b"" if obj is None else json.dumps(obj).encode()
    head = [
        f"HTTP/1.1 {status} X",
        f"Content-Length: {len(body)}",
        "Content-Type: application/json",
    ]
    return ("\r\n".join([*head, *headers]) + "\r\n\r\n").encode() + body


NO_LEADER = {"code": "no_leader", "message": "no leader is known", "details": {}}
PUBLISHED = {"messages": [{"seq": 1, "duplicate": False}]}


@pytest.fixture
def fakes() -> Iterator[Callable[[Script], Fake]]:
    made: list[Fake] = []

    def make(script: Script) -> Fake:
        made.append(Fake(script))
        return made[-1]

    yield make
    for f in made:
        f.stop()


def run_both(fn: Callable[[Any], Any], urls: Callable[[], list[str]], **kw: Any) -> list[Any]:
    """``fn(client)`` with the async client, then the sync one, each against servers of its
    own (``urls()``); what each returned or raised."""

    async def with_async() -> Any:
        async with AsyncClient(urls(), **kw) as c:
            try:
                return await _maybe(fn(c))
            except Exception as e:
                return e

    out = [asyncio.run(with_async())]
    c = Client(urls(), **kw)
    try:
        out.append(fn(c))
    except Exception as e:
        out.append(e)
    finally:
        c.close()
    return out


async def _maybe(x: Any) -> Any:
    return await x if asyncio.iscoroutine(x) else x


def test_an_unknown_outcome_stays_unknown_when_later_tries_fail(
    fakes: Callable[[Script], Fake],
) -> None:
    # The first try is read and never answered, then the node is gone: the publish may have
    # been applied, so the caller must not be told "unavailable" (safe to resend: a duplicate).
    def gone_after_reading() -> list[str]:
        holder: list[Fake] = []

        def script(n: int, conn: int, line: str, body: bytes) -> Any:
            holder[0].stop()
            return None

        holder.append(fakes(script))
        return [holder[0].url]

    for got in run_both(lambda c: c.publish("t", b"x"), gone_after_reading, timeout=1.0):
        assert isinstance(got, UnknownOutcome), got


def test_the_sync_client_does_not_resend_a_non_idempotent_request(
    fakes: Callable[[Script], Fake],
) -> None:
    def script(n: int, conn: int, line: str, body: bytes) -> Any:
        return answer(200, {"topics": []}) if line.startswith("GET") else None

    f = fakes(script)
    c = Client(f.url, timeout=2.0)
    try:
        c.list_topics()  # leaves a kept-alive connection
        with pytest.raises(UnknownOutcome):
            c.create_topic("t")
    finally:
        c.close()
    assert [line.split()[0] for _, line, _ in f.seen] == ["GET", "POST"]


def test_redirects_share_one_deadline(fakes: Callable[[Script], Fake]) -> None:
    made: list[Fake] = []

    def redirecting() -> list[str]:
        holder: list[Fake] = []

        def script(n: int, conn: int, line: str, body: bytes) -> Any:
            return [(0.4, answer(307, None, f"Location: {holder[0].url}/topics"))]

        holder.append(fakes(script))
        made.append(holder[0])
        return [holder[0].url]

    for got in run_both(lambda c: c.list_topics(), redirecting, timeout=1.0):
        assert isinstance(got, RaftqTimeout), got
    # 0.4 s a hop, 1 s for all: the third hop is cut short (each used to get the whole
    # second: 4 hops, 1.6 s per try, then more tries).
    assert [len(f.seen) for f in made] == [3, 3]


def test_a_dripping_response_is_cut_off_at_the_deadline(fakes: Callable[[Script], Fake]) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n"
    f = fakes(lambda n, conn, line, body: [(0, head)] + [(0.3, b" ")] * 20)
    c = Client(f.url, timeout=1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(RaftqTimeout):
            c.list_topics()
    finally:
        c.close()
    assert time.monotonic() - t0 < 2.5


def test_a_leader_that_lost_the_leadership_is_not_asked_forever(
    fakes: Callable[[Script], Fake],
) -> None:
    def old_leader_and_another() -> list[str]:
        holder: list[Fake] = []

        def old_leader(n: int, conn: int, line: str, body: bytes) -> Any:
            if n == 1:
                return answer(200, {"topics": ["a"]}, f"X-Raftq-Leader: {holder[0].url}")
            return answer(503, NO_LEADER)  # cut off from the majority now

        holder.append(fakes(old_leader))
        other = fakes(lambda n, conn, line, body: answer(200, {"topics": ["b"]}))
        return [holder[0].url, other.url]

    async def twice_async(c: AsyncClient) -> Any:
        return [await c.list_topics(), await c.list_topics()]

    def twice(c: Any) -> Any:
        if isinstance(c, AsyncClient):
            return twice_async(c)
        return [c.list_topics(), c.list_topics()]

    for got in run_both(twice, old_leader_and_another, timeout=3.0):
        assert got == [["a"], ["b"]], got


def test_a_retried_settle_that_finds_its_receipt_stale_is_unknown(
    fakes: Callable[[Script], Fake],
) -> None:
    stale = {
        "acked": 0,
        "errors": [{"receipt": "r", "code": "receipt_stale", "message": "no longer in flight"}],
    }
    calls = {"n": 0}

    def script(n: int, conn: int, line: str, body: bytes) -> Any:
        calls["n"] += 1
        return None if calls["n"] % 2 == 1 else answer(200, stale)  # 1st try: applied, lost

    f = fakes(script)
    for got in run_both(lambda c: c.ack(["r"]), lambda: [f.url], timeout=3.0):
        assert isinstance(got, UnknownOutcome), got
    # Without an unknown try before it, a stale receipt is a plain refusal.
    g = fakes(lambda n, conn, line, body: answer(200, stale))
    for got in run_both(lambda c: c.ack(["r"]), lambda: [g.url], timeout=3.0):
        assert type(got).__name__ == "ReceiptStale", got


def test_redirects_keep_the_query_and_may_be_relative(fakes: Callable[[Script], Fake]) -> None:
    def script(n: int, conn: int, line: str, body: bytes) -> Any:
        if n % 2 == 1:
            return answer(307, None, "Location: /topics/d/messages?limit=2&from_seq=5")
        return answer(200, {"topic": "d", "messages": []})

    f = fakes(script)
    assert run_both(lambda c: c.peek("d", from_seq=5, limit=2), lambda: [f.url]) == [[], []]
    targets = [line.split()[1] for _, line, _ in f.seen]
    assert targets[1] == targets[3] == "/topics/d/messages?limit=2&from_seq=5"


def test_a_stream_to_a_node_that_never_answers_gives_up_in_time() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"

    async def go() -> None:
        async with AsyncClient(url, timeout=1.0) as c:
            async for _ in c.consume("t", stream=True):
                pass

    t0 = time.monotonic()
    try:
        with pytest.raises(RaftqTimeout):
            asyncio.run(asyncio.wait_for(go(), 10))
    finally:
        silent.close()
    assert time.monotonic() - t0 < 5


async def test_close_sends_what_publish_nowait_accepted() -> None:
    raft = LocalRaft()
    srv = TestServer(inprocess_app(raft), host="127.0.0.1")
    await srv.start_server()
    try:
        url = f"http://127.0.0.1:{srv.port}"
        async with AsyncClient(url) as c:
            await c.create_topic("t")
            futures = [await c.publish_nowait("t", b"m%d" % i) for i in range(10)]
        assert all(f.done() and not f.exception() for f in futures)
        assert raft.read(lambda b: b.topic_stats("t")["messages"]) == 10
        with pytest.raises(Exception, match="closed"):
            await c.list_topics()
    finally:
        await srv.close()


@pytest.mark.parametrize("lost", ["socket closed", "outcome_unknown frame"])
async def test_a_streamed_settle_lost_with_its_socket_is_retried_over_http_as_unknown(
    lost: str,
) -> None:
    # The server applies the ack frame, then the socket dies before the answer (or the server
    # answers that it cannot tell): the HTTP retry finds the receipt stale, which must read
    # as "unknown", not as a refusal.
    stale = {
        "acked": 0,
        "errors": [{"receipt": "r1", "code": "receipt_stale", "message": "no longer in flight"}],
    }
    delivery = {"topic": "t", "group": "g", "seq": 1, "attempt": 1, "receipt": "r1",
                "payload": b"x", "headers": {}, "deadline": 2**42, "published_at": 0}  # fmt: skip

    async def stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(msgpack.packb({"type": "delivery", "delivery": delivery}))
        async for frame in ws:  # the ack frame: "applied", then the answer is lost
            if lost == "outcome_unknown frame":
                fid = msgpack.unpackb(frame.data)["id"]
                unknown = {"type": "error", "id": fid, "code": "outcome_unknown",
                           "message": "commit timed out", "details": {}}  # fmt: skip
                await ws.send_bytes(msgpack.packb(unknown))
                await asyncio.sleep(1)  # (the client has moved on to HTTP by then)
            break
        await ws.close()
        return ws

    async def ack(request: web.Request) -> web.Response:
        return web.json_response(stale)

    app = web.Application()
    app.router.add_get("/topics/t/groups/g/stream", stream)
    app.router.add_post("/ack", ack)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        async with AsyncClient(f"http://127.0.0.1:{srv.port}", timeout=3.0) as c:
            async for msg in c.consume("t", "g", stream=True):
                with pytest.raises(UnknownOutcome):
                    await msg.ack()
                break
    finally:
        await srv.close()


async def test_acks_given_to_a_stream_that_closes_before_sending_go_over_http() -> None:
    class ClosedSocket:
        closed, close_code = True, 1000

        def __aiter__(self) -> ClosedSocket:
            return self

        async def __anext__(self) -> Any:
            raise StopAsyncIteration

    unsent: list[list[str]] = []
    st = _Stream(ClosedSocket(), "http://x", unsent.append)  # type: ignore[arg-type]
    st.ack_later("r1")
    st.ack_later("r2")
    await asyncio.sleep(0.01)
    assert unsent == [["r1", "r2"]]
