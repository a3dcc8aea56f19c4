"""``AsyncClient``: the asyncio I/O loop around the pure core in ``_core``.

async with AsyncClient(["http://127.0.0.1:8001", "http://127.0.0.1:8002"]) as c:
    await c.create_topic("orders", if_not_exists=True)
    await c.publish("orders", b"hello", headers={"kind": "greeting"})
    async for msg in c.consume("orders", group="default", prefetch=10):
        handle(msg.payload)
        await msg.ack()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import aiohttp
import msgpack

from raftq.client import _core as core
from raftq.client import _http as http
from raftq.client import _requests as rq
from raftq.client import _tls
from raftq.client._coalesce import Coalescer, Pending
from raftq.client._events import DisconnectHook, Events, LeaderHook, log
from raftq.client._message import Delivery
from raftq.client.errors import (
    RaftqError,
    TLSError,
    TopicFull,
    Unavailable,
    UnknownOutcome,
    error_from_body,
)
from raftq.client.transport import AsyncTransport, TLSFailed, tls_failure
from raftq.client.types import (
    ClusterInfo,
    ClusterSettings,
    Created,
    Deleted,
    GroupConfigured,
    GroupInfo,
    Membership,
    PeekedMessage,
    Purged,
    Redriven,
    Released,
    SettleResult,
    TokenInfo,
    TopicConfigured,
    TopicInfo,
    TopicsPage,
)

# A node that does not accept a connection within this long is taken for down (they are on a
# LAN or loopback); the next node is tried.
CONNECT_TIMEOUT = 2.0
CLOSE_TIMEOUT = 2.0  # for the publish stream's closing handshake at close()


class AsyncMessage(Delivery):
    """A delivery from ``AsyncClient.consume`` / ``receive``; settle it exactly once.
    Streamed messages settle over their socket while it is open, else over HTTP."""

    def __init__(
        self,
        client: AsyncClient,
        data: Mapping[str, Any],
        topic: str,
        group: str,
        stream: _Stream | None = None,
    ):
        super().__init__(data, topic, group)
        self._client = client
        self._stream = stream

    async def _do(self, op: str, **extra: Any) -> Any:
        req = rq.settle(op, [self.receipt], **extra)
        maybe_applied = False
        if self._stream is not None and self._stream.open:
            try:
                res = await self._stream.call(op, req.body, self._client.timeout)
            except _StreamClosed as e:  # if the frame went out, it may have been applied
                maybe_applied = e.sent
            except UnknownOutcome:  # the server could not tell (a commit timed out)
                maybe_applied = True
            except Unavailable:  # the node lost the leadership: not applied
                pass
            else:
                core.raise_receipt_errors(res, 1)
                return res
        # Over HTTP instead (which finds the leader).
        return await self._client._settle(req, maybe_applied)

    async def ack(self) -> None:
        """Acknowledge; returns once the ack is committed (raises ``ReceiptStale`` if the
        delivery had already expired)."""
        await self._do("ack")
        self.settled = True

    def ack_nowait(self) -> None:
        """Acknowledge without waiting for the outcome (like NATS ``msg.ack()``): acks made in
        the same event-loop turn share one request. If the ack does not take (the delivery
        expired, the connection dropped), the message is simply delivered again."""
        self.settled = True
        if self._stream is not None and self._stream.open:
            self._stream.ack_later(self.receipt)
        else:
            self._client._ack_later(self.receipt)

    async def nack(self, delay: float | None = None) -> None:
        await self._do("nack", delay=delay)
        self.settled = True

    async def extend(self, seconds: float) -> None:
        await self._do("extend", seconds=seconds)

    async def term(self, reason: str = "terminated") -> None:
        await self._do("term", reason=reason)
        self.settled = True

    @contextlib.asynccontextmanager
    async def process(self, nack_delay: float | None = None) -> AsyncIterator[AsyncMessage]:
        """``async with msg.process():`` acks the message when the block ends normally and
        nacks it (redelivered after ``nack_delay``, default the group's backoff) when it
        raises, then lets the exception through (as aio-pika's ``process``). A message the
        block settled itself is left alone. Cancelled (or a ``BaseException``), it is not
        settled: it comes back when its consumer is released or its visibility expires."""
        try:
            yield self
        except Exception:
            if not self.settled:
                await self.nack(nack_delay)
            raise
        if not self.settled:
            await self.ack()


class _StreamClosed(Exception):
    def __init__(self, sent: bool, silent: bool = False) -> None:
        super().__init__("the stream closed" if sent else "the stream closed before sending")
        self.sent = sent  # the frame went out: the server may have applied it
        self.silent = silent  # no answer in time, the connection still up (a frozen node)


class _Stream:
    """One WebSocket stream (a consumer's, or the publish stream): a reader task routes
    deliveries to a queue and results to the futures of the calls (settles, publishes) waiting
    for them."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        url: str,
        unsent_acks: Callable[[list[str]], None],
    ) -> None:
        self.ws = ws
        self.url = url
        self._unsent_acks = unsent_acks  # acks given while it was open, left when it closed
        self.deliveries: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = 0
        self.close_code: int | None = None
        self._acks: list[str] = []
        self._sends: set[asyncio.Future[None]] = set()
        self.reader = asyncio.ensure_future(self._read())

    @property
    def open(self) -> bool:
        return not self.ws.closed and not self.reader.done()

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                if frame.type != aiohttp.WSMsgType.BINARY:
                    continue
                obj = msgpack.unpackb(frame.data, raw=False)
                kind = obj.get("type")
                if kind == "delivery":
                    self.deliveries.put_nowait(obj["delivery"])
                    continue
                if kind == "deliveries":
                    for d in obj["deliveries"]:
                        self.deliveries.put_nowait(d)
                    continue
                fut = self._calls.pop(obj.get("id"), None)
                if fut is None or fut.done():
                    continue
                if kind == "result":
                    fut.set_result(obj["result"])
                else:
                    err = error_from_body(400, obj)
                    err.retry_after = core.parse_retry_after(obj.get("retry_after"))
                    fut.set_exception(err)
        finally:
            self.close_code = self.ws.close_code
            for fut in self._calls.values():
                if not fut.done():
                    fut.set_exception(_StreamClosed(sent=True))
            self._calls.clear()
            self.deliveries.put_nowait(None)

    def ack_later(self, receipt: str) -> None:
        if not self._acks:
            asyncio.get_running_loop().call_soon(self._flush_acks)
        self._acks.append(receipt)

    def _flush_acks(self) -> None:
        receipts, self._acks = self._acks, []
        if receipts and not self.open:
            self._unsent_acks(receipts)  # over HTTP instead of a redelivery
        elif receipts:
            frame = msgpack.packb({"id": None, "op": "ack", "receipts": receipts})
            task = asyncio.ensure_future(self.ws.send_bytes(frame))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
            task.add_done_callback(_ignore_result)

    async def call(self, op: str, body: dict[str, Any], timeout: float) -> Any:
        if not self.open:
            raise _StreamClosed(sent=False)
        self._ids += 1
        fid = self._ids
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._calls[fid] = fut
        # No answer in time ends the call as "may have been applied" (a timer, not
        # ``asyncio.wait``: cheaper, and the server's own UnknownOutcome is a TimeoutError too).
        timer = loop.call_later(timeout, self._expire, fid)
        try:
            try:
                async with asyncio.timeout(timeout):  # (the send may wait for a full buffer)
                    await self.ws.send_bytes(msgpack.packb({"id": fid, "op": op, **body}))
            except (ConnectionError, RuntimeError, TimeoutError) as e:
                # aiohttp writes the frame before it waits for the buffer to drain: it may be
                # out.
                self._calls.pop(fid, None)
                raise _StreamClosed(sent=True) from e
            return await fut
        finally:
            timer.cancel()
            self._calls.pop(fid, None)
            if not fut.done():  # (the caller was cancelled, or the send failed)
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved: the call raised its own error already

    def _expire(self, fid: int) -> None:
        fut = self._calls.pop(fid, None)
        if fut is not None and not fut.done():
            fut.set_exception(_StreamClosed(sent=True, silent=True))

    async def close(self) -> None:
        self._flush_acks()  # acks given before leaving the loop go out before the close
        if self._sends:
            await asyncio.wait(set(self._sends), timeout=5)
        await self.ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader


class _Publisher:
    """The client's publish stream: one WebSocket to the leader, opened in the background. A
    publish never waits for it: with no stream open it goes over HTTP (and starts opening one)."""

    RETRY_S = 1.0  # after a failed open (no leader yet, a node down), doubling up to REFUSED_S
    REFUSED_S = 60.0  # after the server refused (an older version, a proxy without WebSockets)

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.stream: _Stream | None = None
        self.opening: asyncio.Task[None] | None = None
        self.retry_at = 0.0
        # Opens since a publish was last answered over a stream: an unreachable leader address
        # or a leader that takes streams but never answers backs off.
        self.failures = 0
        self.closed = False

    def get(self) -> _Stream | None:
        if self.closed:
            return None
        st = self.stream
        if st is not None and st.open:
            return st
        if st is not None:  # closed under us (leader change, node stop): open another
            self.drop(st)
        if self.opening is None and time.monotonic() >= self.retry_at:
            self.opening = asyncio.ensure_future(self._open())
        return None

    def drop(self, st: _Stream) -> None:
        """Stop using ``st`` (closed, or it left a publish unanswered); the next one opens anew."""
        if self.stream is st:
            self.stream = None
            log.info("publish stream to %s dropped (code %s)", st.url, st.close_code)
        self.client._spawn(_close_within(st, CLOSE_TIMEOUT))

    async def _open(self) -> None:
        client = self.client
        url = client.endpoints.pick()
        target = url + "/publish/stream"
        backoff = min(self.REFUSED_S, self.RETRY_S * 2**self.failures)
        self.retry_at = time.monotonic() + backoff
        self.failures += 1
        try:
            for _ in range(core.MAX_REDIRECTS + 1):
                try:
                    async with asyncio.timeout(client.attempt_timeout):
                        ws = await client._http().ws_connect(target, heartbeat=10.0, max_msg_size=0)
                except aiohttp.WSServerHandshakeError as e:
                    location = e.headers.get("Location") if e.headers else None
                    if core.is_redirect(e.status) and location:
                        target = core.redirected(target, location)  # to the leader
                        client.endpoints.learn(core.normalize_url(target))
                        continue
                    if 400 <= e.status < 500 and e.status != 429:
                        self.retry_at = time.monotonic() + self.REFUSED_S
                    return
                if self.closed:  # (the client closed meanwhile)
                    await ws.close()
                    return
                self.stream = _Stream(ws, url, client._ack_all_later)
                return
        except aiohttp.ClientSSLError:  # (publishes over HTTP meet the TLSError themselves)
            self.retry_at = time.monotonic() + self.REFUSED_S
            return
        except (aiohttp.ClientError, OSError, TimeoutError, RaftqError, RuntimeError, ValueError):
            return  # (over HTTP meanwhile; tried again after the backoff)
        finally:
            self.opening = None

    async def close(self) -> None:
        self.closed = True
        if self.opening is not None:
            self.opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.opening
        if self.stream is not None:
            st, self.stream = self.stream, None
            await _close_within(st, CLOSE_TIMEOUT)


async def _close_within(st: _Stream, timeout: float) -> None:
    """Close a stream, not waiting on a leader gone silent for its closing handshake."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(st.close(), timeout)


def _ignore_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a lost fire-and-forget ack just means a redelivery


def _with_headers(extra: Callable[[], dict[str, str]], secure: bool) -> type[aiohttp.ClientRequest]:
    """A request class putting the ``http_headers`` hook's headers on every request of the
    WebSocket session, each redirect hop included. (aiohttp follows a follower's 307 to the
    leader during a handshake itself, and drops ``Authorization`` when the origin changes:
    another port is another origin. Given to ``ws_connect``, the headers would reach the
    follower only.)"""

    class WithHeaders(aiohttp.ClientRequest):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if secure and self.url.scheme not in ("https", "wss"):
                # (a redirect aiohttp follows itself: the token must not go in the clear)
                raise aiohttp.InvalidURL(f"{self.url}: not https, and the seeds are")
            for name, value in extra().items():
                self.headers[name] = value

    return WithHeaders


def _ws_tls_error(e: aiohttp.ClientSSLError) -> TLSError | None:
    """aiohttp's TLS failure opening a WebSocket as the client's ``TLSError``; None for a
    handshake the server cut short (a node going down: retried as such)."""
    cause: BaseException | None = e.__cause__
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        cause = e.certificate_error
    elif isinstance(e.os_error, ssl.SSLError):
        cause = e.os_error
    failure: BaseException = e
    if isinstance(cause, ssl.SSLError):
        failure = tls_failure(cause)
        if not isinstance(failure, TLSFailed):
            return None
    host = f"[{e.host}]" if ":" in e.host else e.host
    return core.tls_error(f"https://{host}:{e.port}", failure)


def _topic_group(p: str) -> tuple[str, str]:
    from urllib.parse import unquote

    parts = p.split("?")[0].split("/")
    return unquote(parts[2]), unquote(parts[4])


class AsyncClient:
    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = 30.0,
        attempt_timeout: float = 10.0,
        producer_id: str | None = None,
        fmt: str = core.MSGPACK,
        publish_stream: bool = True,
        transport: AsyncTransport | None = None,
        http_headers: core.HeadersHook | None = None,
        token: str | None = None,
        ca: _tls.CA | None = None,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        on_leader_change: LeaderHook | None = None,
        on_disconnect: DisconnectHook | None = None,
        max_pending: int | None = 10_000,
    ) -> None:
        """``transport``: what sends the HTTP requests (``raftq.client.transport.AsyncTransport``;
        by default ``_http.HttpPool``). The client closes it at ``close``. WebSockets (the
        streams) go through aiohttp whatever the transport.

        ``ca``: for ``https://`` URLs, the CA file (PEM) to verify nodes with, or an
        ``ssl.SSLContext`` (default: the system's store); ``cert``, ``key``: a client
        certificate for nodes that require one. They apply to the default transport and to
        WebSockets. A certificate that cannot be verified raises ``TLSError`` at once.

        ``http_headers``: extra headers (e.g. ``Authorization``) for every HTTP request and
        every WebSocket handshake request the client sends: a mapping, or a callable returning
        one, called anew for each of them (every try, every redirect hop) on the event loop, so
        it must not block. They cannot replace the client's own: a name among Accept,
        Accept-Encoding, Connection, Content-Encoding, Content-Length, Content-Type, Host, TE,
        Transfer-Encoding, Upgrade and Sec-WebSocket-* (in any case), a name given twice, or
        a name or value not valid in HTTP raises ``ValueError``: at construction for a
        mapping, from the client call for a callable's answer.

        ``token``: the API token (``rq_<id>.<secret>``) sent as ``Authorization: Bearer``;
        by default ``RAFTQ_TOKEN`` from the environment, if set (an ``Authorization`` from
        ``http_headers`` then wins; with ``token=`` it is an error); ``""``: none.

        ``max_pending``: how many ``publish_nowait`` messages may await their answer at once
        (default 10,000; None: no bound); past it, ``publish_nowait`` waits for one to be
        answered (the producer is slowed to what the cluster takes, as nats.py's
        ``publish_async`` with its pending limit).

        ``on_leader_change(old, new)``: called when the client learns of a leader other than
        the last one it knew (``old`` None for the first), with their URLs.
        ``on_disconnect(url, error)``: called when a node cannot be reached or drops a
        connection or a stream. Both run on the event loop and must not block; what they raise is
        logged and ignored. The client logs to ``logging.getLogger("raftq.client")``: retries
        at DEBUG, leader changes and lost nodes at INFO."""
        self._events = Events(on_leader_change, on_disconnect)
        if max_pending is not None and max_pending < 1:
            raise ValueError("max_pending must be at least 1 (None: no bound)")
        # Queued publishes not yet answered: past ``max_pending``, ``publish_nowait`` waits.
        self._pending = Pending(max_pending)
        self.endpoints = core.Endpoints(
            [urls] if isinstance(urls, str) else list(urls),
            on_leader_change=self._events.leader_changed,
        )
        self.timeout = timeout
        # One try may take this long (plus a long poll's wait) before another node is tried.
        self.attempt_timeout = attempt_timeout
        self.retries = 0  # tries beyond the first, over this client's life
        self.producer = core.Producer(producer_id)
        self.fmt = fmt
        self._ssl = _tls.client_context(ca, cert, key)
        self._requests: AsyncTransport | None = transport
        from_env = token is None
        if from_env:
            token = os.environ.get(core.TOKEN_ENV) or None
        self._extra_headers = core.header_source(core.with_token(token, http_headers, from_env))
        self._session: aiohttp.ClientSession | None = None
        # Consumers whose loop has not finished: close() releases them before it goes.
        self._consumers: set[str] = set()
        self._subscriptions: set[Subscription] = set()
        self._coalescers: dict[str, Coalescer] = {}
        self._closed = False
        self._pending_acks: list[str] = []
        self._background: set[asyncio.Future[Any]] = set()
        # Publishes ride one WebSocket to the leader when it is open (msgpack only).
        self._publisher = _Publisher(self) if publish_stream and fmt == core.MSGPACK else None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop subscriptions, release the deliveries of consume loops left open, then close
        the connections.
        (A loop left with ``break`` is finalized by the event loop a moment later.) Messages
        given to ``publish_nowait`` are sent first, within the client's timeout."""
        for sub in list(self._subscriptions):
            await sub.stop(self.timeout)
        if self._coalescers:  # all together, within one timeout
            await asyncio.gather(*(c.flush(self.timeout) for c in self._coalescers.values()))
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.timeout)
        for consumer in list(self._consumers):
            await self._release_quietly(consumer)
        if self._publisher is not None:
            await self._publisher.close()
        if self._requests is not None:
            self._requests.close()
            self._requests = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._closed = True

    def _pool(self) -> AsyncTransport:
        if self._closed:
            raise RaftqError("the client is closed")
        if self._requests is None:
            self._requests = http.HttpPool(
                limit=256, connect_timeout=CONNECT_TIMEOUT, ssl_context=self._ssl
            )
        return self._requests

    def _http(self) -> aiohttp.ClientSession:
        """aiohttp, for WebSockets only: requests go through ``_pool``."""
        if self._closed:
            raise RaftqError("the client is closed")
        if self._session is None:
            kw: dict[str, Any] = {}
            if self._ssl is not None:
                kw["connector"] = aiohttp.TCPConnector(ssl=self._ssl)
            if self._extra_headers is not None:
                secure = any(u.startswith("https:") for u in self.endpoints.seeds)
                kw["request_class"] = _with_headers(self._extra_headers, secure)
            self._session = aiohttp.ClientSession(**kw)
        return self._session

    # ------------------------------------------------------------------ the I/O loop

    async def request(
        self,
        req: core.Request,
        timeout: float | None = None,
        unknown: UnknownOutcome | None = None,
    ) -> Any:
        """Send ``req`` until it gets a definite answer or ``timeout`` passes. ``unknown``: an
        earlier try (over a stream) whose outcome is unknown."""
        timeout = self.timeout if timeout is None else timeout
        end = time.monotonic() + timeout + req.hold
        wire = core.prepare(req, self.fmt)
        last: RaftqError | None = unknown
        # A try whose outcome is unknown: it sticks.
        attempt = 0
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise core.deadline_error(last, req, timeout, unknown)
            url = self.endpoints.pick()
            try:
                result = await self._send(
                    url, wire, min(remaining, self.attempt_timeout + req.hold), req.idempotent
                )
                return core.after_retry(req, result, unknown)
            except RaftqError as err:
                last = err
                if isinstance(err, UnknownOutcome):
                    unknown = err
                if core.node_failed(err):
                    self.endpoints.failed(url)
                    self._events.disconnected(url, err)
                elif err.server_code == "no_leader":
                    self.endpoints.no_leader(url)
                delay = core.retry_delay(err, req, attempt, end - time.monotonic())
                if delay is None:
                    final = core.final_error(err, unknown)
                    if final is err:
                        raise
                    raise final from err
                self._events.retrying(req, url, err, delay, attempt)
                attempt += 1
                self.retries += 1
                await asyncio.sleep(delay)

    async def _send(self, url: str, wire: core.Wire, remaining: float, idempotent: bool) -> Any:
        target = url + wire.path
        redirects = 0
        fresh_retry = idempotent
        deadline = time.monotonic() + remaining  # for every redirect hop together
        while True:
            left = deadline - time.monotonic()
            if left <= 0:  # (only after a redirect, which applied nothing)
                raise Unavailable(f"{url}: redirected until the time ran out")
            headers = core.with_headers(wire.headers, self._extra_headers)
            try:
                resp = await self._pool().request(wire.method, target, headers, wire.body, left)
            except http.HttpError as e:
                if isinstance(e, http.TLSFailed):
                    raise core.tls_error(target, e) from e
                if e.stale and fresh_retry:  # (never from HttpPool: see ``transport``)
                    fresh_retry = False
                    continue
                raise core.unavailable(url, e, sent=not isinstance(e, http.ConnectFailed)) from e
            location = resp.headers.get("location")
            if core.is_redirect(resp.status) and location:
                target = core.redirected(target, location)  # (a relative Location is allowed)
                self.endpoints.learn(core.normalize_url(target))
                redirects += 1
                if redirects > core.MAX_REDIRECTS:
                    raise Unavailable(f"too many redirects from {url}")
                continue
            leader = resp.headers.get("x-raftq-leader")
            if leader:
                self.endpoints.learn(leader)
            return core.decode(
                resp.status,
                resp.headers.get("content-type"),
                resp.body,
                resp.headers.get("retry-after"),
            )

    # ------------------------------------------------------------------ cluster

    async def cluster(self) -> ClusterInfo:
        body: ClusterInfo = await self.request(rq.cluster())
        self.endpoints.learn(core.leader_from_cluster(body))
        return body

    async def cluster_settings(self) -> ClusterSettings:
        """The cluster settings (``max_retained_bytes``: None when unlimited) and the payload
        bytes retained over every topic."""
        return cast(ClusterSettings, await self.request(rq.cluster_settings()))

    async def update_cluster_settings(self, **changes: Any) -> ClusterSettings:
        """Change cluster settings (a ``cluster`` token): ``max_retained_bytes=N`` (None: no
        limit). A publish that would retain more payload bytes over every topic raises
        ``StorageFull``; dead letters and redrives pass; lowering it deletes nothing."""
        return cast(ClusterSettings, await self.request(rq.update_cluster_settings(changes)))

    async def add_member(self, node_id: str, raft: str, api: str) -> Membership:
        """Add a node to the cluster (start it first, with every member as a peer)."""
        return cast(Membership, await self.request(rq.add_member(node_id, raft, api)))

    async def remove_member(self, node_id: str) -> Membership:
        return cast(Membership, await self.request(rq.remove_member(node_id)))

    # ------------------------------------------------------------------ tokens (cluster flag)

    async def create_token(
        self,
        name: str,
        grants: Sequence[Mapping[str, Any]] = (),
        *,
        cluster: bool = False,
        expires_in: float | None = None,
    ) -> TokenInfo:
        """A new API token: the answer's ``token`` is its secret, shown only this once.
        ``grants``: ``[{"topics": "orders.*", "actions": ["publish", "consume"]}]``."""
        return cast(
            TokenInfo, await self.request(rq.create_token(name, grants, cluster, expires_in))
        )

    async def sqs_credentials(self) -> dict[str, str]:
        """This token's SQS access key id and secret access key (for the SQS endpoint)."""
        return dict(await self.request(rq.sqs_credentials()))

    async def list_tokens(self) -> list[TokenInfo]:
        return list((await self.request(rq.list_tokens()))["tokens"])

    async def token(self, token_id: str) -> TokenInfo:
        return cast(TokenInfo, await self.request(rq.token(token_id)))

    async def update_token(self, token_id: str, **changes: Any) -> TokenInfo:
        """Change ``disabled``, ``name``, ``grants``, ``cluster`` or ``expires_in``."""
        return cast(TokenInfo, await self.request(rq.update_token(token_id, changes)))

    async def revoke_token(self, token_id: str) -> Any:
        """Revoke a token: every node refuses it once the revoke is applied there."""
        return await self.request(rq.revoke_token(token_id))

    # ------------------------------------------------------------------ topics and groups

    async def create_topic(
        self,
        topic: str,
        config: Mapping[str, Any] | None = None,
        groups: Sequence[Mapping[str, Any]] | None = None,
        if_not_exists: bool = False,
    ) -> Created:
        return cast(
            Created, await self.request(rq.create_topic(topic, config, groups, if_not_exists))
        )

    async def list_topics(self) -> list[str]:
        """Every topic name the token has a right on, in name order (page after page)."""
        names: list[str] = []
        after: str | None = None
        while True:
            page = await self.request(rq.list_topics(after))
            names += page["topics"]
            after = core.next_topics_page(page, after)
            if after is None:
                return names

    async def list_topics_page(
        self, after: str | None = None, limit: int | None = None
    ) -> TopicsPage:
        """One page of topic names: ``{"topics": [...], "next": <the after of the next page,
        or None on the last>}`` (the server's page size when ``limit`` is None)."""
        return cast(TopicsPage, await self.request(rq.list_topics(after, limit)))

    async def topic(self, topic: str) -> TopicInfo:
        return cast(TopicInfo, await self.request(rq.topic(topic)))

    async def update_topic(self, topic: str, config: Mapping[str, Any]) -> TopicConfigured:
        return cast(TopicConfigured, await self.request(rq.update_topic(topic, config)))

    async def delete_topic(self, topic: str) -> Deleted:
        return cast(Deleted, await self.request(rq.delete_topic(topic)))

    async def purge(self, topic: str) -> Purged:
        return cast(Purged, await self.request(rq.purge(topic)))

    async def create_group(
        self,
        topic: str,
        group: str,
        config: Mapping[str, Any] | None = None,
        start: str = "latest",
        if_not_exists: bool = False,
    ) -> Created:
        return cast(
            Created, await self.request(rq.create_group(topic, group, config, start, if_not_exists))
        )

    async def group(self, topic: str, group: str) -> GroupInfo:
        return cast(GroupInfo, await self.request(rq.group(topic, group)))

    async def update_group(
        self, topic: str, group: str, config: Mapping[str, Any]
    ) -> GroupConfigured:
        return cast(GroupConfigured, await self.request(rq.update_group(topic, group, config)))

    async def delete_group(self, topic: str, group: str) -> Deleted:
        return cast(Deleted, await self.request(rq.delete_group(topic, group)))

    # ------------------------------------------------------------------ publish

    async def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        headers: Mapping[str, str] | None = None,
        key: str | None = None,
        delay: float | None = None,
        ordering_key: str | None = None,
    ) -> int:
        """Publish one message; returns its sequence number once it is committed. Retries are
        deduplicated. Concurrent calls share batch requests (see ``_coalesce``).
        ``ordering_key``: a group with ``ordered: true`` delivers the messages of one key one
        held run at a time, in order (SQS FIFO message groups)."""
        message = core.message_body(self.producer, payload, headers, key, delay, ordering_key)
        seq: int = await self._coalescer(topic).submit(message)
        return seq

    async def publish_nowait(
        self,
        topic: str,
        payload: bytes | str,
        *,
        headers: Mapping[str, str] | None = None,
        key: str | None = None,
        delay: float | None = None,
        ordering_key: str | None = None,
    ) -> asyncio.Future[int]:
        """Like ``publish``, without waiting for the answer: returns a future of the sequence
        number (as nats.py's JetStream ``publish_async``). Outstanding messages share batch
        requests. Returns at once unless ``max_pending`` messages (the constructor's) await
        their answers: it then waits until one is answered (back-pressure)."""
        message = core.message_body(self.producer, payload, headers, key, delay, ordering_key)
        await self._pending.room()
        fut: asyncio.Future[int] = self._coalescer(topic).submit_nowait(message)
        return fut

    def _coalescer(self, topic: str) -> Coalescer:
        coalescer = self._coalescers.get(topic)
        if coalescer is None:

            async def send(messages: list[dict[str, Any]]) -> list[Any]:
                # (a batch refused as full is split at once: each message then waits alone)
                res = await self._publish(topic, messages, wait_full=len(messages) == 1)
                return [int(m["seq"]) for m in res["messages"]]

            coalescer = self._coalescers[topic] = Coalescer(send, pending=self._pending)
        return coalescer

    async def publish_batch(self, topic: str, messages: Sequence[Any]) -> list[int]:
        """Publish payloads (or dicts with payload/headers/key/delay/ordering_key) as one
        request."""
        body = core.batch_body(self.producer, messages)
        res = await self._publish(topic, body["messages"])
        return [int(m["seq"]) for m in res["messages"]]

    async def _publish(
        self, topic: str, messages: list[dict[str, Any]], wait_full: bool = True
    ) -> Any:
        """One publish request: over the publish stream when one is open, else (or when the
        stream cannot give a definite answer) over HTTP, with the same idempotency keys."""
        publisher = self._publisher
        st = publisher.get() if publisher is not None else None
        req = dataclasses.replace(rq.publish_batch(topic, messages), wait_full=wait_full)
        if st is None or publisher is None:
            return await self.request(req)
        end = time.monotonic() + self.timeout
        unknown: UnknownOutcome | None = None
        refused: RaftqError | None = None
        try:
            body = {"topic": topic, "messages": messages}
            # (half the budget at most: a silent stream leaves time for the HTTP try)
            res = await st.call("publish", body, min(self.timeout / 2, self.attempt_timeout))
            publisher.failures = 0  # (a stream that answers: no backoff)
            return res
        except _StreamClosed as e:
            publisher.drop(st)  # (closed, or silent for attempt_timeout: not used again)
            if e.silent:  # a frozen or unplugged node, the leader a follower forwards to:
                # the HTTP try goes to another node, not into the same silence again
                leader = self.endpoints.leader
                for url in {st.url} if leader is None else {st.url, leader}:
                    self.endpoints.failed(url)
            if e.sent:  # (it may have been applied: the HTTP try finds out, by the keys)
                unknown = UnknownOutcome(f"{st.url}: the publish stream gave no answer")
        except UnknownOutcome as e:
            unknown = e
        except (Unavailable, TopicFull) as e:  # not applied (no leader, stopping, overloaded...)
            refused = e
        if refused is not None:  # back off first (Retry-After), as HTTP would
            delay = core.retry_delay(refused, req, 0, end - time.monotonic())
            if delay is None and isinstance(refused, TopicFull):
                raise refused  # (full, and no retry in time)
            await asyncio.sleep(delay or 0)
        return await self.request(req, timeout=max(0.0, end - time.monotonic()), unknown=unknown)

    # ------------------------------------------------------------------ consume

    async def receive(
        self,
        topic: str,
        group: str = "default",
        *,
        max: int = 1,
        wait: float = 0.0,
        visibility: float | None = None,
        consumer: str | None = None,
    ) -> list[AsyncMessage]:
        res = await self.request(rq.receive(topic, group, max, wait, visibility, consumer))
        return [AsyncMessage(self, d, topic, group) for d in res["deliveries"]]

    async def consume(
        self,
        topic: str,
        group: str = "default",
        *,
        prefetch: int = 10,
        wait: float = 20.0,
        visibility: float | None = None,
        auto_extend: bool = False,
        stream: bool = False,
    ) -> AsyncIterator[AsyncMessage]:
        """Yield messages as they come. Leaving the loop releases this consumer's unsettled
        deliveries at once. With ``auto_extend``, a yielded message's deadline is pushed out
        while the loop body runs. With ``stream``, deliveries are pushed over a WebSocket
        (up to ``prefetch`` unsettled at a time) instead of long polls, and a consumer process
        that dies has its messages released the moment its socket closes."""
        if stream:
            async for msg in self._consume_stream(topic, group, prefetch, visibility, auto_extend):
                yield msg
            return
        consumer = f"{self.producer.id}-{secrets.token_hex(4)}"
        self._consumers.add(consumer)
        extender: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    batch = await self.receive(
                        topic, group, max=prefetch, wait=wait, visibility=visibility,
                        consumer=consumer,
                    )  # fmt: skip
                except UnknownOutcome:
                    continue  # what it may have delivered comes back after its deadline
                for msg in batch:
                    if auto_extend:
                        extender = asyncio.create_task(self._keep_extending(msg))
                    try:
                        yield msg
                    finally:
                        if extender is not None:
                            extender.cancel()
                            extender = None
        finally:
            await self._release_quietly(consumer)

    async def subscribe(
        self,
        topic: str,
        group: str,
        handler: Callable[[AsyncMessage], Awaitable[None]],
        *,
        concurrency: int = 10,
        wait: float = 20.0,
        visibility: float | None = None,
        nack_delay: float | None = None,
    ) -> Subscription:
        """Call ``handler(msg)`` for each message of ``topic``/``group``, up to
        ``concurrency`` at once, in ``msg.process()``: acked when the handler returns, nacked
        (redelivered after ``nack_delay``) when it raises (logged at WARNING). The group must
        exist (checked here, so a wrong name fails now). Returns a ``Subscription``; its
        ``stop()`` ends it, letting running handlers finish."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        await self.group(topic, group)
        sub = Subscription(self, topic, group, handler, concurrency, wait, visibility, nack_delay)
        sub.start()
        return sub

    async def _release_quietly(self, consumer: str) -> None:
        if consumer not in self._consumers:
            return
        self._consumers.discard(consumer)
        with contextlib.suppress(RaftqError, RuntimeError, asyncio.CancelledError):
            await asyncio.shield(self.request(rq.release(consumer), timeout=5.0))

    async def _consume_stream(
        self,
        topic: str,
        group: str,
        prefetch: int,
        visibility: float | None,
        auto_extend: bool,
    ) -> AsyncIterator[AsyncMessage]:
        query = f"?prefetch={int(prefetch)}&batch=1"
        if visibility is not None:
            query += f"&visibility={float(visibility)}"
        p = core.path("topics", topic, "groups", group, "stream") + query
        attempt = 0
        while True:
            st = await self._open_stream(p, attempt)
            attempt = 0
            try:
                while True:
                    d = await st.deliveries.get()
                    if d is None:
                        break
                    msg = AsyncMessage(self, d, topic, group, st)
                    extender = (
                        asyncio.create_task(self._keep_extending(msg)) if auto_extend else None
                    )
                    try:
                        yield msg
                    finally:
                        if extender is not None:
                            extender.cancel()
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(st.close())
            # The socket closed under us (leader change, node stop): reconnect, asking anew
            # who leads.
            log.info("consume stream %s/%s to %s closed (code %s): reconnecting", topic, group,
                     st.url, st.close_code)  # fmt: skip
            self._events.disconnected(st.url, ConnectionError(f"stream closed ({st.close_code})"))
            # (No cooldown for ``st.url``: aiohttp may have followed a redirect from
            # it, and a node that is really down fails to connect and is passed over then.)
            self.endpoints.no_leader(st.url)
            attempt += 1

    async def _open_stream(self, p: str, attempt: int) -> _Stream:
        end = time.monotonic() + self.timeout
        last: RaftqError | None = None
        # (for the retry decisions: a handshake that failed applied nothing, so any is safe)
        req = core.Request("GET", p, idempotent=True)
        while True:
            if time.monotonic() >= end:
                raise core.deadline_error(last, req, self.timeout)
            url = self.endpoints.pick()
            try:
                # Bounded like a request: a node that accepts and never answers is passed over.
                async with asyncio.timeout(
                    max(0.05, min(end - time.monotonic(), self.attempt_timeout))
                ):
                    ws = await self._http().ws_connect(url + p, heartbeat=10.0, max_msg_size=0)
                return _Stream(ws, url, self._ack_all_later)
            except aiohttp.ClientSSLError as e:  # (the node's or, after a redirect, the leader's)
                tls = _ws_tls_error(e)
                if tls is not None:
                    raise tls from e
                last = core.unavailable(url, e, sent=False)
                self.endpoints.failed(url)
            except aiohttp.WSServerHandshakeError as e:
                location = e.headers.get("Location") if e.headers else None
                if e.status in (301, 302, 307, 308) and location:
                    self.endpoints.learn(core.normalize_url(core.redirected(url + p, location)))
                    continue
                if e.status < 500 and e.status != 429:
                    # Ask over HTTP to get the error body (404 topic, 400 bad query...).
                    await self.group(*_topic_group(p))
                    raise Unavailable(f"stream refused with HTTP {e.status}") from e
                last = Unavailable(f"{url}: stream refused with HTTP {e.status}")
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                last = core.unavailable(url, e, sent=False)
                self.endpoints.failed(url)
                self._events.disconnected(url, last)
            delay = core.retry_delay(last, req, attempt, end - time.monotonic())
            attempt += 1
            await asyncio.sleep(delay or 0.05)

    async def _keep_extending(self, msg: AsyncMessage) -> None:
        period = max(0.5, (msg.deadline_ms - time.time() * 1000) / 2000)
        with contextlib.suppress(RaftqError):
            while not msg.settled:
                await asyncio.sleep(period)
                if not msg.settled:
                    await msg.extend(period * 2)

    async def ack(self, receipts: Sequence[str]) -> SettleResult:
        return cast(SettleResult, await self._settle(rq.settle("ack", receipts)))

    async def nack(self, receipts: Sequence[str], delay: float | None = None) -> SettleResult:
        return cast(SettleResult, await self._settle(rq.settle("nack", receipts, delay=delay)))

    async def extend(self, receipts: Sequence[str], seconds: float) -> SettleResult:
        return cast(
            SettleResult, await self._settle(rq.settle("extend", receipts, seconds=seconds))
        )

    async def term(self, receipts: Sequence[str], reason: str = "terminated") -> SettleResult:
        return cast(SettleResult, await self._settle(rq.settle("term", receipts, reason=reason)))

    async def _settle(self, req: core.Request, maybe_applied: bool = False) -> Any:
        res = await self.request(req)
        if maybe_applied:  # sent once over a stream that closed before answering
            res = core.after_retry(req, res, UnknownOutcome("sent over a stream that closed"))
        core.raise_receipt_errors(res, len(req.body["receipts"]))
        return res

    def _ack_all_later(self, receipts: list[str]) -> None:
        for r in receipts:
            self._ack_later(r)

    def _ack_later(self, receipt: str) -> None:
        if not self._pending_acks:
            asyncio.get_running_loop().call_soon(self._flush_acks)
        self._pending_acks.append(receipt)

    def _flush_acks(self) -> None:
        receipts, self._pending_acks = self._pending_acks, []
        if receipts:
            self._spawn(self._settle(rq.settle("ack", receipts)))

    def _spawn(self, coro: Any) -> None:
        """Background work that ``close()`` waits for; its failure is dropped."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_ignore_result)

    async def release(self, consumer: str) -> Released:
        return cast(Released, await self.request(rq.release(consumer)))

    # ------------------------------------------------------------------ dead letters

    async def peek(
        self, topic: str, from_seq: int | None = None, limit: int = 10
    ) -> list[PeekedMessage]:
        return list((await self.request(rq.peek(topic, from_seq, limit)))["messages"])

    async def redrive(self, topic: str, max: int = 100) -> Redriven:
        return cast(Redriven, await self.request(rq.redrive(topic, max)))


class Subscription:
    """A running ``AsyncClient.subscribe``: one task receives as many messages as there are
    free handler slots (long polls), one task per message runs the handler. Each poll has a
    consumer id of its own: the server releases what a poll's consumer holds when the poll's
    connection drops, so ``stop()`` can cut a poll short without taking messages away from
    running handlers. ``wait()`` waits for the end (raising what ended it, e.g.
    ``GroupNotFound`` if the group was deleted)."""

    def __init__(
        self,
        client: AsyncClient,
        topic: str,
        group: str,
        handler: Callable[[AsyncMessage], Awaitable[None]],
        concurrency: int,
        wait: float,
        visibility: float | None,
        nack_delay: float | None,
    ) -> None:
        self.topic = topic
        self.group = group
        self.concurrency = concurrency
        self._prefix = f"{client.producer.id}-{secrets.token_hex(4)}"
        self._polls = 0
        self._client = client
        self._handler = handler
        self._wait = wait
        self._visibility = visibility
        self._nack_delay = nack_delay
        self._slots = asyncio.Semaphore(concurrency)
        self._handlers: dict[asyncio.Task[None], str] = {}  # -> the consumer id of its message
        self._receiver: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._client._subscriptions.add(self)
        self._receiver = asyncio.create_task(self._receive())

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._handlers)

    async def _receive(self) -> None:
        c = self._client
        while True:
            await self._slots.acquire()
            free = 1
            while not self._slots.locked() and free < self.concurrency:
                await self._slots.acquire()  # (does not wait: a slot is free)
                free += 1
            self._polls += 1
            consumer = f"{self._prefix}-{self._polls}"
            try:
                batch = await c.receive(
                    self.topic, self.group, max=free, wait=self._wait,
                    visibility=self._visibility, consumer=consumer,
                )  # fmt: skip
            except UnknownOutcome:
                batch = []  # what it may have delivered comes back after its deadline
            except BaseException:
                for _ in range(free):
                    self._slots.release()
                raise
            for _ in range(free - len(batch)):
                self._slots.release()
            for msg in batch:
                task = asyncio.create_task(self._handle(msg))
                self._handlers[task] = consumer
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._handlers.pop(task, None)
        self._slots.release()

    async def _handle(self, msg: AsyncMessage) -> None:
        try:
            async with msg.process(self._nack_delay):
                await self._handler(msg)
        except Exception as e:  # (nacked by process() unless settling it failed)
            log.warning(
                "%s/%s seq %d: %s: %s", self.topic, self.group, msg.seq, type(e).__name__, e,
                exc_info=not isinstance(e, RaftqError),
            )  # fmt: skip

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop receiving, let running handlers finish (cancelled after ``timeout``: their
        messages are then released, for other consumers)."""
        self._client._subscriptions.discard(self)
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()  # (a poll cut short: the server releases what it held)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._receiver
        if not self._handlers:
            return
        _, late = await asyncio.wait(set(self._handlers), timeout=timeout)
        consumers = {self._handlers[t] for t in late}
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        for consumer in consumers:
            self._client._consumers.add(consumer)
            await self._client._release_quietly(consumer)

    async def wait(self) -> None:
        """Until the subscription ends: by ``stop()``, or by an error receiving (raised)."""
        if self._receiver is not None:
            await asyncio.wait([self._receiver])
            failure = None if self._receiver.cancelled() else self._receiver.exception()
            if failure is not None:
                raise failure
