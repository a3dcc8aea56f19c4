"""Limits of the API's HTTP listener, and what it says when one is hit.

- **Idle and header-read timeout** (``idle_timeout``): aiohttp's ``keepalive_timeout``. Its timer
  runs from the moment a connection is accepted and again from the end of each response, and
  bytes of an unfinished request head do not reset it; so it closes both a connection that
  says nothing and one whose head never ends (slowloris). One budget for both: a separate,
  shorter header timeout would not help, since an attacker could just as well hold the
  connection idle.
- **Head sizes**: aiohttp's ``max_line_size`` / ``max_field_size`` / ``max_headers``.
- **Connection cap** (``max_connections``, ``ApiProtocols``, ``ApiSite``): the site counts
  connections from accept to close; past the cap a new one is answered ``503 overloaded``
  (``Retry-After``) at once and closed, so the node keeps serving the ones it has and never
  runs out of file descriptors on API sockets. The default leaves room under ``ulimit -n``
  for Raft, the journal, the forwarder's connections and refusals.
- **Malformed requests** (what aiohttp's parser refuses: a head too large, a NUL in a header):
  ``ApiRequestHandler`` answers them with the JSON error envelope (400 ``malformed_request``)
  and one log line, not aiohttp's plain-text 400 and traceback.
- **Rate-limited logging** (``RateLimitedLog``): those lines, refusals and failed accepts (out
  of descriptors: the listener then rests ``ACCEPT_PAUSE_S``) are written at most a few times
  per ten seconds, with a count of those left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from raftq.node.errors import RETRY_AFTER_S, ApiError

log = logging.getLogger("raftq.node")

MAX_CONNECTIONS_CAP = 10_000  # the default's upper bound
BACKLOG = 128  # the listener's (and the most connections accepted in one go)
ACCEPT_PAUSE_S = 0.5  # a listener that failed to accept (out of descriptors) rests this long
BUSY_LINGER_S = 1.0  # a refused connection: read (and drop) what the client still sends
MAX_MESSAGE = 200  # characters of a parser's message kept (it may quote the request)


def default_max_connections() -> int:
    """``ulimit -n`` less a quarter (at least 64) for Raft, the journal, the forwarder and
    refused connections; at most ``MAX_CONNECTIONS_CAP``, at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 20
    return max(16, min(MAX_CONNECTIONS_CAP, soft - max(64, soft // 4)))


@dataclass(frozen=True)
class HttpLimits:
    idle_timeout: float = 60.0
    max_connections: int | None = None  # None: default_max_connections()
    max_line_size: int = 8190  # (aiohttp's defaults, named here)
    max_field_size: int = 8190
    max_headers: int = 128

    def cap(self) -> int:
        return self.max_connections or default_max_connections()

    def handler_args(self) -> dict[str, Any]:
        """Keyword arguments of aiohttp's request handler (``web.AppRunner(**...)``)."""
        return {
            "keepalive_timeout": self.idle_timeout,
            "max_line_size": self.max_line_size,
            "max_field_size": self.max_field_size,
            "max_headers": self.max_headers,
        }


class RateLimitedLog:
    """At most ``burst`` lines per ``period`` seconds for one kind of event; the next line
    written after some were left out says how many."""

    def __init__(
        self, logger: logging.Logger, level: int, period: float = 10.0, burst: int = 3
    ) -> None:
        self.logger = logger
        self.level = level
        self.period = period
        self.burst = burst
        self._window = -period
        self._written = 0
        self.suppressed = 0

    def __call__(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._window >= self.period:
            self._window = now
            self._written = 0
        if self._written >= self.burst:
            self.suppressed += 1
            return
        self._written += 1
        if self.suppressed:
            msg += " (%d more like it not logged)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self.logger.log(self.level, msg, *args)


MALFORMED = RateLimitedLog(log, logging.INFO)
REFUSED = RateLimitedLog(log, logging.WARNING)
ACCEPT_FAILED = RateLimitedLog(log, logging.ERROR)


class ApiRequestHandler(RequestHandler):
    """aiohttp's connection handler, with malformed requests answered in the JSON error
    envelope (``handle_error``) and its slot given back when the connection closes."""

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close: Callable[[], None] | None = on_close

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        why = " ".join(str(message or exc or "unreadable request").split())[:MAX_MESSAGE]
        # (logged without the quoted bytes: they may hold a credential)
        kind = type(exc).__name__ if exc is not None else "error"
        MALFORMED(
            "malformed HTTP request from %s refused: %s (%s)",
            request.remote, why.partition(":")[0], kind,
        )  # fmt: skip
        err = ApiError("malformed_request", f"malformed HTTP request: {why}")
        resp = web.json_response(err.body(), status=err.status)
        resp.force_close()
        return resp


class ConnectionCount:
    """Open API connections, against a cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0
        self.refusing = 0  # refused connections still lingering (Busy)
        self.lingering_cap = max(8, cap // 16)

    def take(self) -> bool:
        if self.open >= self.cap:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open -= 1

    def refused(self) -> None:
        """A refused connection (``Busy``) is closed."""
        self.refusing -= 1


class ApiProtocols:
    """The listeners' connections: their count against the cap, and an ``ApiRequestHandler``
    for each one served (``ApiSite``, ``httpsite.HttpsSite``)."""

    def __init__(self, server: web.Server, limits: HttpLimits, **handler_args: Any) -> None:
        self.server = server
        self.count = ConnectionCount(limits.cap())
        self.handler_args = {**limits.handler_args(), **handler_args}
        self.loop = asyncio.get_running_loop()

    def handler(self, on_close: Callable[[], None]) -> ApiRequestHandler:
        """A handler for a connection counted already (``on_close`` gives its slot back)."""
        return ApiRequestHandler(
            self.server, loop=self.loop, on_close=on_close, **self.handler_args
        )


class Busy(asyncio.Protocol):
    """A connection past the cap: ``503 overloaded`` with ``Retry-After`` at once (before
    the request is read: the client learns it was not served, whatever it sent), then close,
    after reading for a moment what the client still sends (closing on unread bytes would
    reset the connection and could lose the answer). While ``lingering_cap`` refused
    connections linger, ``ApiSite`` closes more at once (their descriptors count too)."""

    def __init__(self, count: ConnectionCount) -> None:
        self.count = count  # (which counted this one in ``refusing``)
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        REFUSED("API connection refused: %d open, the most allowed", self.count.open)
        err = ApiError(
            "overloaded",
            f"this node has {self.count.open} connections open, its limit; retry shortly",
        )
        body = json.dumps(err.body()).encode()
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (RETRY_AFTER_S["overloaded"], len(body), body)
        )
        if transport.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(BUSY_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # (dropped)

    def eof_received(self) -> bool:
        return False  # (the transport closes)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.count.refused()


async def listen(host: str | None, port: int, backlog: int) -> tuple[list[socket.socket], int]:
    """Non-blocking listening sockets on every address ``host`` resolves to (IPv6 ones
    v6-only), all on one port (port 0: the one the first got); the port. All or none."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    seen: set[Any] = set()
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port:
                addr = (addr[0], port, *addr[2:])
            sock.bind(addr)
            if port == 0:
                port = sock.getsockname()[1]
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks, port


class ApiSite(web.BaseSite):
    """``web.TCPSite`` serving ``ApiProtocols``, with an accept loop of its own so that the
    cap counts descriptors exactly: each connection is counted (or refused) the moment it is
    accepted. (Behind ``loop.create_server`` the factory runs a loop turn or two after the
    accept, and asyncio accepts up to ``backlog`` at a time: a flood past the cap still ran a
    node with ``ulimit -n`` 256 out of descriptors at a cap of 64.)"""

    __slots__ = ("_host", "_listeners", "_port", "_tasks", "protocols")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        protocols: ApiProtocols,
        *,
        backlog: int = BACKLOG,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self.protocols = protocols
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the system chose for 0)."""
        if self._listeners:
            return int(self._listeners[0].getsockname()[1])
        return self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._listeners, self._port = await listen(self._host, self._port, self._backlog)
        for sock in self._listeners:
            loop.add_reader(sock.fileno(), self._accept, sock)

    async def stop(self) -> None:
        self._close_listeners()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().stop()

    def _close_listeners(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self._listeners:
            loop.remove_reader(sock.fileno())
            sock.close()
        self._listeners = []

    def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        count = self.protocols.count
        for _ in range(self._backlog):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors...: pause this listener for a moment
                ACCEPT_FAILED(
                    "accepting API connections failed: %s (see ulimit -n and --max-connections)",
                    e.strerror or e,
                )
                loop.remove_reader(listener.fileno())
                loop.call_later(ACCEPT_PAUSE_S, self._resume, listener)
                return
            conn.setblocking(False)
            if count.take():
                self._spawn(self.protocols.handler(count.give_back), conn, count.give_back)
            elif count.refusing < count.lingering_cap:
                count.refusing += 1
                self._spawn(Busy(count), conn, count.refused)
            else:
                REFUSED("API connection refused: %d open, the most allowed", count.open)
                conn.close()  # (many refusals at once: no answer, to keep descriptors free)

    def _resume(self, listener: socket.socket) -> None:
        if listener in self._listeners:
            asyncio.get_running_loop().add_reader(listener.fileno(), self._accept, listener)

    def _spawn(
        self, proto: asyncio.BaseProtocol, conn: socket.socket, failed: Callable[[], None]
    ) -> None:
        async def connect() -> None:
            try:
                await asyncio.get_running_loop().connect_accepted_socket(lambda: proto, conn)
            except OSError:  # (gone before its transport was made)
                conn.close()
                failed()

        task = asyncio.get_running_loop().create_task(connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
