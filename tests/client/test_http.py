"""The client's HTTP/1.1 transport against a scripted loopback server: framing, reuse, failures."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from raftq.client import _http as http
from raftq.client._http_sync import SyncHttpPool

# A script answers each request head (bytes up to the blank line, then the body) with raw bytes
# to write, or None to close the connection without answering.
Script = Callable[[bytes, bytes], bytes | None]


class Server:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.url = ""
        self._open: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await r.readexactly(length)
                self.requests.append(head + body)
                out = self.script(head, body)
                if out is None:
                    break
                w.write(out)
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = w
        try:
            await self._handle(r, w)
        finally:
            del self._open[task]

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        # Connections the client keeps alive would outlive the test's loop: end them here.
        for task, w in list(self._open.items()):
            w.close()
            task.cancel()
        if self._open:
            await asyncio.wait(set(self._open), timeout=5)
        await asyncio.wait_for(self.server.wait_closed(), 5)


def always(reply: bytes) -> Script:
    return lambda head, body: reply


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@pytest.fixture
async def pool() -> AsyncIterator[http.HttpPool]:
    p = http.HttpPool(connect_timeout=2.0)
    yield p
    p.close()


async def test_content_length_and_keep_alive(pool: http.HttpPool) -> None:
    async with Server(lambda head, body: ok(b"echo:" + body, "X-A: 1\r\nx-a: 2\r\n")) as srv:
        for i in range(3):
            resp = await pool.request("POST", srv.url + "/p?q=1", {"Accept": "x"}, b"b%d" % i, 5)
            assert (resp.status, resp.body) == (200, b"echo:b%d" % i)
            assert resp.headers["x-a"] == "1, 2"
        assert srv.connections == 1  # one kept-alive connection served all three
        assert srv.requests[0].startswith(b"POST /p?q=1 HTTP/1.1\r\n")
        assert b"\r\nContent-Length: 2\r\n" in srv.requests[0]


async def test_response_split_across_writes_and_interim_response(pool: http.HttpPool) -> None:
    async with Server(lambda h, b: b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"x" * 100_000)) as srv:
        resp = await pool.request("GET", srv.url + "/", {}, None, 5)
        assert resp.body == b"x" * 100_000


async def test_chunked_body(pool: http.HttpPool) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: t\r\n\r\n"
    )
    async with Server(lambda h, b: chunked) as srv:
        assert (await pool.request("GET", srv.url + "/", {}, None, 5)).body == b"hello world"
        assert (await pool.request("GET", srv.url + "/", {}, None, 5)).body == b"hello world"
        assert srv.connections == 1


class AnswerThenClose(Server):
    """Answers the first request with the script's bytes, then closes the connection."""

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        await r.readuntil(b"\r\n\r\n")
        w.write(self.script(b"", b"") or b"")
        await w.drain()
        w.close()


async def test_body_framed_by_close_and_connection_close(pool: http.HttpPool) -> None:
    async with AnswerThenClose(lambda h, b: b"HTTP/1.1 200 OK\r\n\r\nuntil-eof") as srv:
        assert (await pool.request("GET", srv.url + "/", {}, None, 5)).body == b"until-eof"
    async with Server(lambda h, b: ok(b"bye", "Connection: close\r\n")) as srv:
        await pool.request("GET", srv.url + "/", {}, None, 5)
        await pool.request("GET", srv.url + "/", {}, None, 5)
        assert srv.connections == 2  # not reused after "Connection: close"


async def test_no_body_statuses_and_head(pool: http.HttpPool) -> None:
    async with Server(lambda h, b: b"HTTP/1.1 204 No Content\r\n\r\n") as srv:
        assert (await pool.request("DELETE", srv.url + "/", {}, None, 5)).status == 204
    async with Server(lambda h, b: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n") as srv:
        assert (await pool.request("HEAD", srv.url + "/", {}, None, 5)).body == b""


async def test_dropped_after_sending_is_connection_dropped(pool: http.HttpPool) -> None:
    async with Server(lambda h, b: None) as srv:
        with pytest.raises(http.ConnectionDropped, match="connection lost"):
            await pool.request("POST", srv.url + "/", {}, b"x", 5)
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    async with AnswerThenClose(lambda h, b: short) as srv:
        with pytest.raises(http.BadResponse, match="3 bytes into a 10-byte body"):
            await pool.request("GET", srv.url + "/", {}, None, 5)
    async with Server(lambda h, b: short) as srv:  # short body, connection left open
        with pytest.raises(http.ConnectionDropped, match="no response within"):
            await pool.request("GET", srv.url + "/", {}, None, 0.3)


async def test_stale_idle_connection_is_not_reused(pool: http.HttpPool) -> None:
    async with AnswerThenClose(lambda h, b: ok(b"1")) as srv:
        await pool.request("GET", srv.url + "/", {}, None, 5)
        # The server closed the kept connection after answering; wait until the client saw it.
        for _ in range(500):
            idle = next(iter(pool._idle.values()), None)
            if not idle or all(c.closed for c in idle):
                break
            await asyncio.sleep(0.01)
        assert (await pool.request("GET", srv.url + "/", {}, None, 5)).body == b"1"
        assert srv.connections == 2


async def test_garbage_is_bad_response(pool: http.HttpPool) -> None:
    async with Server(lambda h, b: b"SMTP ready\r\n\r\n") as srv:
        with pytest.raises(http.BadResponse):
            await pool.request("GET", srv.url + "/", {}, None, 5)
    hostile = [
        b"HTTP/1.1 200 OK\r\nContent-Length: zz\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        b"HTTP/1.1 +20 OK\r\nContent-Length: 0\r\n\r\n",
        # a negative chunk size used to loop forever without consuming anything
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\nxx",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * (70 << 10),
    ]
    for reply in hostile:
        async with Server(always(reply)) as srv:
            with pytest.raises(http.BadResponse):
                await pool.request("GET", srv.url + "/", {}, None, 5)


async def test_refused_is_connect_failed(pool: http.HttpPool) -> None:
    async with Server(lambda h, b: ok(b"")) as srv:
        url = srv.url
    with pytest.raises(http.ConnectFailed):
        await pool.request("GET", url + "/", {}, None, 5)


async def test_a_cancelled_request_closes_its_connection(pool: http.HttpPool) -> None:
    arrived = asyncio.Event()
    closed = asyncio.Event()

    class Slow(Server):
        async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                while True:
                    head = await r.readuntil(b"\r\n\r\n")
                    tag = head.split(b" ")[1]
                    if tag == b"/slow":  # never answered: wait for the client to hang up
                        arrived.set()
                        if not await r.read(1):
                            closed.set()
                        return
                    w.write(ok(tag))
                    await w.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                w.close()

    async with Slow(lambda h, b: b"") as srv:
        slow = asyncio.ensure_future(pool.request("GET", srv.url + "/slow", {}, None, 5))
        await asyncio.wait_for(arrived.wait(), 5)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        await asyncio.wait_for(closed.wait(), 5)  # not left open (nor ever reused)
        resp = await pool.request("GET", srv.url + "/fast", {}, None, 5)
        assert resp.body == b"/fast" and srv.connections == 2


async def test_limit_queues_requests(pool: http.HttpPool) -> None:
    limited = http.HttpPool(limit=2)
    try:
        async with Server(lambda h, b: ok(b"k")) as srv:
            got = await asyncio.gather(
                *(limited.request("GET", srv.url + "/", {}, None, 5) for _ in range(20))
            )
            assert {r.body for r in got} == {b"k"}
            assert srv.connections <= 2
    finally:
        limited.close()


def test_split_url() -> None:
    origin, target = http.split_url("https://h.example/a/b?x=1")
    assert (origin.scheme, origin.host, origin.port, target) == (
        "https",
        "h.example",
        443,
        "/a/b?x=1",
    )
    with pytest.raises(ValueError):
        http.split_url("ftp://h/")


async def test_bytes_on_an_idle_connection_are_never_taken_for_an_answer(
    pool: http.HttpPool,
) -> None:
    class Timeout408(Server):
        """Answers, then later sends an unsolicited 408 and keeps the connection open."""

        async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.connections += 1
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await r.readuntil(b"\r\n\r\n")
                w.write(ok(b"%d" % self.connections))
                await w.drain()
                await asyncio.sleep(0.05)  # the server's idle timeout
                w.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
                await w.drain()
                await r.readuntil(b"\r\n\r\n")  # (a request on it would get no answer)
            w.close()

    async with Timeout408(lambda h, b: b"") as srv:
        assert (await pool.request("GET", srv.url + "/", {}, None, 5)).body == b"1"
        (conn,) = next(iter(pool._idle.values()))
        for _ in range(500):  # until the 408 arrived
            if conn.closed:
                break
            await asyncio.sleep(0.01)
        assert conn.closed
        assert (await pool.request("GET", srv.url + "/", {}, None, 5)).body == b"2"


# The blocking pool (``Client``'s default transport), against the same servers from a thread.


async def test_the_blocking_pool_keeps_a_connection_and_reads_headers() -> None:
    pool = SyncHttpPool(connect_timeout=2.0)
    try:
        async with Server(lambda head, body: ok(b"echo:" + body, "X-A: 1\r\nx-a: 2\r\n")) as srv:
            for i in range(3):
                resp = await asyncio.to_thread(
                    pool.request, "POST", srv.url + "/p?q=1", {"Accept": "x"}, b"b%d" % i, 5
                )
                assert (resp.status, resp.body) == (200, b"echo:b%d" % i)
                assert resp.headers["x-a"] == "1, 2"
            assert srv.connections == 1
            assert srv.requests[0].startswith(b"POST /p?q=1 HTTP/1.1\r\n")
            assert b"\r\nAccept: x\r\n" in srv.requests[0]
            pool.close()  # closes the connection; the pool can still be used
            await asyncio.to_thread(pool.request, "GET", srv.url + "/", {}, None, 5)
            assert srv.connections == 2
    finally:
        pool.close()


async def test_the_blocking_pool_says_which_failures_are_stale() -> None:
    pool = SyncHttpPool(connect_timeout=2.0)
    answered: list[bytes] = []

    def first_only(head: bytes, body: bytes) -> bytes | None:
        answered.append(head)
        return ok(b"1") if len(answered) == 1 else None

    try:
        async with Server(first_only) as srv:
            await asyncio.to_thread(pool.request, "GET", srv.url + "/", {}, None, 5)
            # read, then closed unanswered, on the kept-alive connection: stale
            with pytest.raises(http.ConnectionDropped) as e1:
                await asyncio.to_thread(pool.request, "POST", srv.url + "/", {}, b"x", 5)
            assert e1.value.stale
            # the same on a new connection: the server did read it
            with pytest.raises(http.ConnectionDropped) as e2:
                await asyncio.to_thread(pool.request, "POST", srv.url + "/", {}, b"x", 5)
            assert not e2.value.stale
            url = srv.url
        with pytest.raises(http.ConnectFailed) as e3:
            await asyncio.to_thread(pool.request, "GET", url + "/", {}, None, 5)
        assert not e3.value.stale
    finally:
        pool.close()
