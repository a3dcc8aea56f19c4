"""A small keep-alive HTTP/1.1 client for ``AsyncClient``'s request/response calls: its
default ``transport.AsyncTransport``.

aiohttp's client costs ~0.3 ms of CPU and several event-loop turns per request beyond what this
needs (sequential publishes on a 2-core box: 0.43 ms of client CPU each through aiohttp, 0.11 ms
through a bare connection), a fifth of a sequential publish's latency. This is the bare
connection, made safe to use: one request at a time per connection; the request body framed by
Content-Length; the response framed by Content-Length, chunked encoding, or the connection's close.
Idle connections are kept per origin (at most ``max_idle``, reused for ``idle_for`` seconds, well
inside the server's keep-alive timeout); at most ``limit`` are open per origin, further requests
wait for one. WebSockets stay on aiohttp.

Failures say whether the request may have reached the server: ``ConnectFailed`` (it did not) and
``ConnectionDropped`` (it may have), as ``transport`` describes (``TLSFailed`` when TLS cannot be
set up: ``ssl_context`` verifies ``https://`` servers, by default against the system's store);
none is marked ``stale`` (an
idle connection the server closed reads as EOF and is not reused). A request cancelled or timed
out mid-way closes its connection, so a late response can never be read as the answer to
another request.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from raftq.client.transport import (
    ConnectFailed,
    ConnectionDropped,
    HttpError,
    Response,
    TLSFailed,
    tls_failure,
)

__all__ = [
    "BadResponse",
    "ConnectFailed",
    "ConnectionDropped",
    "HttpError",
    "HttpPool",
    "Response",
    "TLSFailed",
    "split_url",
]

MAX_HEAD = 64 << 10  # status line + headers (and a chunked body's size line or trailers)
NO_BODY = (204, 304)
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")


class BadResponse(ConnectionDropped):
    """The server's bytes are not an HTTP/1.1 response we can frame."""


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int


@lru_cache(maxsize=256)
def split_url(url: str) -> tuple[_Origin, str]:
    """``http://h:p/a/b?q`` → (origin, ``/a/b?q``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Origin(parts.scheme, parts.hostname, port), target


class _Conn(asyncio.Protocol):
    """One connection; parses one response at a time into ``self._waiter``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._buf = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._head: tuple[int, dict[str, str], bool] | None = None  # status, headers, keep-alive
        self._no_body = False
        self._chunks: list[bytes] = []  # chunked body read so far
        self.eof = False  # the server closed its side

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for (an idle timeout's 408?): unusable
            self.close()
            return
        self._buf += data
        self._parse()

    def eof_received(self) -> bool:
        self.eof = True
        if self._waiter is not None:
            self._parse()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.eof = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._parse()  # a body framed by the close is complete now
            if not waiter.done():
                self._waiter = None
                waiter.set_exception(ConnectionDropped(f"connection lost ({exc!r})"))

    # ours
    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def send(self, data: bytes, head_only: bool) -> asyncio.Future[Response]:
        assert self.transport is not None and self._waiter is None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._head, self._chunks, self._no_body = None, [], head_only
        waiter = self._waiter
        self.transport.write(data)
        return waiter

    def _done(self, status: int, headers: dict[str, str], body: bytes, keep: bool) -> None:
        waiter, self._waiter = self._waiter, None
        if not keep or self._buf:  # stray bytes after a response: do not reuse
            self.close()
        assert waiter is not None
        if not waiter.done():
            waiter.set_result(Response(status, headers, body))

    def _fail(self, why: str) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(BadResponse(why))

    def _parse(self) -> None:
        try:
            if self._head is None:
                self._parse_head()
            if self._head is not None:
                self._parse_body()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            self._fail(f"malformed response: {e}")

    def _parse_head(self) -> None:
        while self._head is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise ValueError("response head too large")
                return
            lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            del self._buf[: end + 4]
            version, code = lines[0].split(" ", 2)[:2]
            if not version.startswith("HTTP/1.") or not (len(code) == 3 and code.isdigit()):
                raise ValueError(f"not an HTTP/1.x status line: {lines[0][:40]!r}")
            status = int(code)
            if 100 <= status < 200:
                continue  # an interim response: the real one follows
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name, value = name.strip().lower(), value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            conn = headers.get("connection", "").lower()
            keep = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
            self._head = (status, headers, keep)

    def _parse_body(self) -> None:
        assert self._head is not None
        status, headers, keep = self._head
        if self._no_body or status in NO_BODY:
            return self._done(status, headers, b"", keep)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            if "content-length" in headers:  # conflicting framing: never reuse (RFC 9112)
                self._head = (status, headers, False)
            return self._parse_chunks()
        length = headers.get("content-length")
        if length is not None:
            if not (length.isascii() and length.isdigit()):
                raise ValueError(f"bad content-length {length[:20]!r}")
            n = int(length)
            if len(self._buf) >= n:
                body = bytes(self._buf[:n])
                del self._buf[:n]
                self._done(status, headers, body, keep)
            elif self.eof:
                self._fail(f"connection closed {len(self._buf)} bytes into a {n}-byte body")
            return None
        if self.eof:  # framed by the close
            body = bytes(self._buf)
            self._buf.clear()
            self._done(status, headers, body, False)
        return None

    def _parse_chunks(self) -> None:
        assert self._head is not None
        status, headers, keep = self._head
        buf = self._buf
        while True:
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                if len(buf) > MAX_HEAD:
                    raise ValueError("chunk size line too long")
                break
            field = bytes(buf[:line_end]).split(b";", 1)[0].strip()
            if not _CHUNK_SIZE.fullmatch(field):
                raise ValueError(f"bad chunk size {field[:20]!r}")
            size = int(field, 16)
            if size == 0:  # the last chunk: then trailers (ignored) and an empty line
                end = buf.find(b"\r\n\r\n", line_end)
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise ValueError("chunked trailers too long")
                    break
                del buf[: end + 4]
                return self._done(status, headers, b"".join(self._chunks), keep)
            start, stop = line_end + 2, line_end + 2 + size
            if len(buf) < stop + 2:
                break
            if buf[stop : stop + 2] != b"\r\n":
                raise ValueError("chunk data not followed by CRLF")
            self._chunks.append(bytes(buf[start:stop]))
            del buf[: stop + 2]
        if self.eof:
            self._fail("connection closed inside a chunked body")
        return None


class HttpPool:
    def __init__(
        self,
        *,
        limit: int = 256,
        max_idle: int = 32,
        idle_for: float = 30.0,
        connect_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.limit = limit
        self.max_idle = max_idle
        self.idle_for = idle_for
        self.connect_timeout = connect_timeout
        self._ssl = ssl_context
        self._idle: dict[_Origin, deque[_Conn]] = {}
        self._slots: dict[_Origin, asyncio.Semaphore] = {}
        self.closed = False

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response:
        """Send one request and read its response, all within ``timeout`` seconds (a timeout is
        ``ConnectFailed`` while connecting, else ``ConnectionDropped``)."""
        if self.closed:
            raise ConnectFailed("the client is closed")
        origin, target = split_url(url)
        host = f"[{origin.host}]" if ":" in origin.host else origin.host  # an IPv6 literal
        head = [f"{method} {target} HTTP/1.1", f"Host: {host}:{origin.port}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        slots = self._slots.get(origin)
        if slots is None:
            slots = self._slots[origin] = asyncio.Semaphore(self.limit)
        conn: _Conn | None = None
        sent = False
        try:
            async with asyncio.timeout(timeout), slots:
                conn = self._take_idle(origin) or await self._connect(origin)
                sent = True
                resp = await conn.send(data, method == "HEAD")
        except TimeoutError as e:
            if conn is not None:
                conn.close()
            err = ConnectionDropped if sent else ConnectFailed
            raise err(f"no response within {timeout:.3g} s") from e
        except BaseException:
            if conn is not None:
                conn.close()  # cancelled or failed mid-way: the connection's state is unknown
            raise
        self._put_idle(origin, conn)
        return resp

    def _take_idle(self, origin: _Origin) -> _Conn | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be closing
            if not conn.closed and not conn.eof and now - conn.idle_since < self.idle_for:
                return conn
            conn.close()
        return None

    def _put_idle(self, origin: _Origin, conn: _Conn) -> None:
        if conn.closed or self.closed:
            conn.close()
            return
        idle = self._idle.setdefault(origin, deque())
        if len(idle) >= self.max_idle:
            idle.popleft().close()
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def _connect(self, origin: _Origin) -> _Conn:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(_Conn, origin.host, origin.port, ssl=tls)
        except ssl.SSLError as e:
            raise tls_failure(e) from e
        except (OSError, TimeoutError) as e:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {e!r}") from e
        return conn

    def close(self) -> None:
        self.closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
