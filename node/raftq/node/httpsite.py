"""The API's HTTPS listener: an aiohttp site that serves TLS only, and answers a plain-HTTP
request on its port with a plain ``400 tls_required`` naming the ``https://`` URL (as nginx and
Go do) instead of closing the connection without a word, which a client cannot tell from a node
that died mid-request. Likewise, where client certificates are required, a TLS connection
without one gets ``401 client_certificate_required``: the context asks for a certificate and
verifies any presented (``CERT_OPTIONAL``: a bad one fails the handshake), and this site serves
only connections that presented one. (A certificate the node does not accept still ends in a
bare close: asyncio drops the TLS alert of a failed handshake, so the client sees the
connection dropped.)

Each accepted connection's first byte is peeked at (not read): a TLS handshake starts with 0x16
and is handed, untouched, to aiohttp's server with the TLS context; anything else is read up to
the end of its head, answered and closed. A connection that sends nothing for ``PEEK_S`` seconds,
or does not finish its handshake within ``HANDSHAKE_S``, is closed. With ``protocols``
(``httplimits.ApiProtocols``), connections are served by its handlers and count against its cap
from accept to close; one past the cap is closed at once (a plain 503 cannot be said before
the handshake).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

from raftq.node.commands import host_port
from raftq.node.httplimits import ACCEPT_FAILED, REFUSED, ApiProtocols, listen

log = logging.getLogger("raftq.node")

PEEK_S = 10.0
HANDSHAKE_S = 10.0
LINGER_S = 2.0  # after answering plain HTTP: read (and drop) what the client still sends
MAX_HEAD = 16 << 10
TLS_HANDSHAKE = 0x16  # the content type of a TLS record carrying a ClientHello


class HttpsSite(web.BaseSite):
    """Like ``web.TCPSite(runner, host, port, ssl_context=...)``, plus the plain-HTTP answer."""

    __slots__ = (
        "_accepting", "_host", "_listeners", "_port", "_protocols", "_require_client_cert",
        "_serving",
    )  # fmt: skip

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        *,
        require_client_cert: bool = False,
        backlog: int = 128,
        protocols: ApiProtocols | None = None,
    ) -> None:
        """``require_client_cert``: serve only connections that presented a client certificate
        (``ssl_context`` verifies those presented: ``CERT_OPTIONAL``); the others are answered
        401 ``client_certificate_required``."""
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        if require_client_cert and ssl_context.verify_mode == ssl.CERT_NONE:
            raise ValueError("require_client_cert needs a context that verifies client certs")
        self._require_client_cert = require_client_cert
        self._protocols = protocols
        self._host = host
        self._port = port
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._serving: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"https://{host}:{self._port}"

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the system chose for 0)."""
        if self._listeners:
            port: int = self._listeners[0].getsockname()[1]
            return port
        return self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._listeners, self._port = await listen(self._host, self._port, self._backlog)
        self._accepting = [loop.create_task(self._accept(s)) for s in self._listeners]

    async def stop(self) -> None:
        tasks = [*self._accepting, *self._serving]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._accepting = []
        self._close_listeners()
        await super().stop()

    def _close_listeners(self) -> None:
        for sock in self._listeners:
            sock.close()
        self._listeners = []

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as e:  # out of descriptors, a connection reset before accept...
                ACCEPT_FAILED("accepting an API connection failed: %s", e.strerror or e)
                await asyncio.sleep(0.1)
                continue
            if self._protocols is not None and not self._protocols.count.take():
                REFUSED("API connection refused: %d open, the most allowed (--max-connections)",
                        self._protocols.count.open)  # fmt: skip
                conn.close()
                continue
            task = loop.create_task(self._serve(conn))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        counted = self._protocols is not None

        def release() -> None:  # its slot under the cap, once (the protocol's close, or here)
            nonlocal counted
            if counted and self._protocols is not None:
                counted = False
                self._protocols.count.give_back()

        try:
            first = await _peek(conn)
            if not first:  # closed, or silent
                conn.close()
                release()
            elif first[0] == TLS_HANDSHAKE:
                assert self._ssl_context is not None
                server: Callable[[], asyncio.BaseProtocol]
                if self._protocols is not None:
                    server = functools.partial(self._protocols.handler, release)
                else:
                    assert self._runner.server is not None
                    server = self._runner.server
                factory: Callable[[], asyncio.BaseProtocol] = server
                if self._require_client_cert:
                    factory = functools.partial(_ClientCertGate, server, release)
                await loop.connect_accepted_socket(
                    factory, conn, ssl=self._ssl_context, ssl_handshake_timeout=HANDSHAKE_S
                )  # (the transport owns the socket now)
            else:
                await loop.connect_accepted_socket(functools.partial(_PlainHttp, release), conn)
        except (OSError, TimeoutError):  # a failed handshake, a client gone: nothing to say
            conn.close()  # (a no-op if its transport closed it)
            release()
        except BaseException:
            conn.close()
            release()
            raise


async def _peek(conn: socket.socket) -> bytes:
    """The connection's first byte, left unread; b"" if it closes or says nothing in time."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), readable)
    try:
        async with asyncio.timeout(PEEK_S):
            while True:
                await ready
                try:
                    return conn.recv(1, socket.MSG_PEEK)
                except (BlockingIOError, InterruptedError):
                    ready = loop.create_future()
                    loop.remove_reader(conn.fileno())
                    loop.add_reader(conn.fileno(), readable)
    except TimeoutError:
        return b""
    finally:
        loop.remove_reader(conn.fileno())


class _Refusal(asyncio.Protocol):
    """Answer one request with an error and close: read its head, answer, then close (after
    reading what the client still sends for a moment, so that the close does not reset the
    connection before the answer is read)."""

    def __init__(self, on_close: Callable[[], None] = lambda: None) -> None:
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.answered = False
        self.timer: asyncio.TimerHandle | None = None

    def answer(self, head: bytes) -> tuple[bytes, dict[str, Any]]:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(PEEK_S, transport.abort)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # (lingering: dropped)
        self.head += data
        if b"\r\n\r\n" in self.head or len(self.head) > MAX_HEAD:
            self._answer()

    def eof_received(self) -> bool:
        if not self.answered:
            self._answer()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.on_close()

    def _answer(self) -> None:
        assert self.transport is not None
        self.answered = True
        status, error = self.answer(bytes(self.head))
        body = json.dumps(error).encode()
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (status, len(body), body)
        )
        if self.transport.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                self.transport.write_eof()
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)


class _PlainHttp(_Refusal):
    """A plain-HTTP request on the TLS port: 400 ``tls_required``, naming the https:// URL."""

    def answer(self, head: bytes) -> tuple[bytes, dict[str, Any]]:
        url = _https_url(head)
        message = "this port serves HTTPS only: use an https:// URL"
        if url:
            message += f" ({url})"
        return b"400 Bad Request", {"code": "tls_required", "message": message, "details": {}}


class _NoClientCert(_Refusal):
    """A TLS connection without a client certificate where one is required: 401
    ``client_certificate_required`` (the handshake itself may not refuse it: in TLS 1.3 the
    client learns of that only from an alert that asyncio does not send)."""

    def answer(self, head: bytes) -> tuple[bytes, dict[str, Any]]:
        message = (
            "this node requires a client certificate signed by its client CA; present one"
            " (raftq clients: cert= and key=; the CLI: --client-cert and --client-key)"
        )
        return b"401 Unauthorized", {
            "code": "client_certificate_required",
            "message": message,
            "details": {},
        }


class _ClientCertGate(asyncio.Protocol):
    """The protocol of a TLS connection until its handshake is done: then aiohttp's handler if
    the client presented a certificate (verified by the context), else ``_NoClientCert``."""

    def __init__(
        self, handler: Callable[[], asyncio.BaseProtocol], on_close: Callable[[], None]
    ) -> None:
        self.handler = handler
        self.on_close = on_close

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        verified = transport.get_extra_info("peercert")
        proto = self.handler() if verified else _NoClientCert(self.on_close)
        transport.set_protocol(proto)
        proto.connection_made(transport)


def _https_url(head: bytes) -> str | None:
    """``https://<Host><path>`` of a plain request's head, when both are well-formed."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    host = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            host = value.strip().decode("latin-1")
            break
    if host is None or host_port(host) is None or len(parts) != 3:
        return None
    target = parts[1].decode("latin-1")
    if not target.startswith("/") or not target.isprintable() or " " in target:
        target = "/"
    return f"https://{host}{target}"
