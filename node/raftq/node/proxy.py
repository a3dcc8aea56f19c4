"""HTTP calls from this node to the others: forwarding a request to the leader (one hop), giving
a consumer's deliveries back at the leader, and health probes of members.

A follower forwards each leader route to the leader as it came (or through the route's own
``forward`` hook: a receive names its consumer first), marked with ``X-Raftq-Forwarded`` so it
never loops, and answers the leader's response with ``X-Raftq-Leader``. Only the request
headers in ``FORWARD_HEADERS`` and the response headers in ``ANSWER_HEADERS`` cross the hop;
``X-Raftq-Forwarded`` is never a credential.

A forward fails over as fast as this node learns of a new leader: while one is out, the Raft
status is looked at every ``LEADER_POLL_S``, and a forward whose leader is no longer the one
named there ends at once. One that certainly did not reach it (no connection yet: refused, or
not made within ``CONNECT_TIMEOUT_S``, as to a host that is gone) is sent again to the leader
known next (``Resend``), waiting for one up to ``propose_timeout``; so is a read. A write that
may have reached it answers 504 ``outcome_unknown`` (publishes carry keys: clients resend
them). If this node is the one elected, the request is served here (``LeadsHere``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from raftq.node import httpio
from raftq.node.errors import ApiError
from raftq.node.routes import Route
from raftq.node.service import BrokerService, Leader

log = logging.getLogger("raftq.node")

FORWARDED = "X-Raftq-Forwarded"
LEADER_HEADER = "X-Raftq-Leader"
# Request headers a forwarded request keeps (everything else stays on this hop). The body is
# forwarded as read, so Content-Encoding, Content-Length and Transfer-Encoding are this hop's.
FORWARD_HEADERS = ("Accept", "Authorization", "Content-Type", "User-Agent")
# Response headers of the leader's answer passed back to the client.
ANSWER_HEADERS = ("Retry-After", "WWW-Authenticate")
# A connection to a live leader is made in well under a millisecond on a LAN (a few ms across
# zones); a killed container's address answers nothing (no RST), so without this bound a
# forward waited out the whole proxy timeout there (35 s; clients gave up first, at 10 s).
CONNECT_TIMEOUT_S = 1.0
# A peer's /healthz answer is shared for this long by every GET /cluster asking meanwhile
# (open consoles each poll it: one probe per peer per second, whatever their number).
HEALTH_TTL_S = 1.0
LEADER_POLL_S = 0.05  # how often a node with forwards out looks whether the leader changed
RETRY_SAME_S = 0.1  # a leader still named after it could not be reached is tried again after


class Resend(Exception):
    """A forward that may be sent again, to whichever node leads next: it certainly did not
    reach the leader (or it is a read)."""


class LeadsHere(Exception):
    """This node was elected while a request waited to be forwarded: serve it here."""


class Forwarder:
    def __init__(self, svc: BrokerService) -> None:
        self.svc = svc
        self.settings = svc.settings
        self.session: aiohttp.ClientSession | None = None
        svc.release_remote = self.release_at
        # Waiters for a leader change, each with the leader it saw (None: none known).
        self._watching: dict[asyncio.Future[None], Leader | None] = {}
        self._poller: asyncio.Task[None] | None = None
        self._health: dict[str, tuple[float, asyncio.Task[dict[str, Any] | None]]] = {}

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        # The connection is marked made in each request's trace context: a forward cut short
        # before that certainly did not reach the leader.
        trace = aiohttp.TraceConfig()

        async def connected(session: Any, ctx: SimpleNamespace, params: Any) -> None:
            if ctx.trace_request_ctx is not None:
                ctx.trace_request_ctx.connected = True

        trace.on_connection_create_end.append(connected)
        trace.on_connection_reuseconn.append(connected)
        # No pool limit: every proxied long poll holds one connection to the leader.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), trace_configs=[trace]
        )
        yield
        if self._poller is not None:
            self._poller.cancel()
        probes = [task for _, task in self._health.values() if not task.done()]
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        await self.session.close()

    # ------------------------------------------------------------------ leadership changes

    def _current(self) -> Leader | None:
        st = self.svc.raft.status()
        return Leader(st.leader_id, st.leader_api) if st.leader_api else None

    async def _moved(self, seen: Leader | None, timeout: float) -> bool:
        """Wait until the leader named here is no longer ``seen``; False if ``timeout``
        passed first."""
        fut = self._watch(seen)
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            self._unwatch(fut)

    def _watch(self, seen: Leader | None) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        self._watching[fut] = seen
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll())
        return fut

    def _unwatch(self, fut: asyncio.Future[None]) -> None:
        self._watching.pop(fut, None)
        fut.cancel()

    async def _poll(self) -> None:
        """One poller for every waiter, only while there are some (a Raft status read costs
        ~30 us on the 2-core box: 0.06 % of a core at this rate)."""
        while self._watching:
            now = self._current()
            for fut, seen in list(self._watching.items()):
                if now != seen:
                    del self._watching[fut]
                    if not fut.done():
                        fut.set_result(None)
            await asyncio.sleep(LEADER_POLL_S)

    async def _next_leader(self, tried: Leader, deadline: float, why: str) -> Leader:
        """The leader to send a request to again after ``tried`` could not take it: the next
        one named here (``tried`` again after ``RETRY_SAME_S`` if it still is), waiting for
        one until ``deadline`` (loop time). ``LeadsHere`` if this node leads by then."""
        loop = asyncio.get_running_loop()
        await self._moved(tried, min(RETRY_SAME_S, deadline - loop.time()))
        while True:
            if self.svc.draining.is_set():
                raise ApiError(
                    "shutting_down", "this node is shutting down",
                    retry_after=self.settings.retry_after,
                )  # fmt: skip
            if self.svc.leads():
                raise LeadsHere()
            if loop.time() >= deadline:
                raise ApiError(
                    "no_leader",
                    f"{why}; no leader took the request within {self.settings.propose_timeout:g} s",
                    {"leader": tried.id},
                    retry_after=self.settings.retry_after,
                )
            try:
                return self.svc.leader_elsewhere()
            except ApiError as e:
                if e.code != "no_leader":
                    raise
            await self._moved(None, deadline - loop.time())

    # ------------------------------------------------------------------ forwarding

    def _ssl(self) -> ssl.SSLContext | bool:
        """How calls to other nodes verify them: the node's peer context (TLS on; it may have
        been reloaded since the last call), else aiohttp's default (unused over http)."""
        peer = self.settings.peer_ssl
        return peer() if peer is not None else True

    async def forward(self, route: Route, request: web.Request) -> web.StreamResponse:
        """Forward a leader route to the leader; answer its response as is. Sent again, to the
        leader named next, while it may be (``Resend``), for up to ``propose_timeout``."""
        if request.headers.get(FORWARDED):
            raise ApiError(
                "no_leader",
                "forwarded to a node that is not the leader",
                retry_after=self.settings.retry_after,
            )
        if self.svc.draining.is_set():
            raise ApiError(
                "shutting_down", "this node is shutting down", retry_after=self.settings.retry_after
            )
        leader = self.svc.leader_elsewhere()
        body = await httpio.read_raw(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.propose_timeout
        while True:
            try:
                if route.forward is not None:
                    return await route.forward(self, request, leader, body)
                return await self.send(request, leader, body)
            except Resend as e:
                log.debug("forward to leader %s: %s; sending again", leader.id, e)
                leader = await self._next_leader(leader, deadline, str(e))

    async def send(self, request: web.Request, leader: Leader, body: bytes) -> web.Response:
        """``request`` (with ``body``) sent to ``leader`` once; its answer as a response here.
        It ends as soon as ``leader`` is no longer the leader named here: ``Resend`` if the
        request certainly did not reach it or is a read, else 504 outcome_unknown."""
        sent = SimpleNamespace(connected=False)
        call = asyncio.ensure_future(self._exchange(request, leader, body, sent))
        moved = self._watch(leader)
        try:
            await asyncio.wait((call, moved), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            self._unwatch(moved)
        if not call.done():
            call.cancel()
            await asyncio.wait((call,))  # (its connection is closed, not reused)
        if not call.cancelled():
            return call.result()  # (or its error)
        name = leader.id or leader.api
        if not sent.connected or request.method in ("GET", "HEAD"):
            raise Resend(f"leader {name} stopped leading before it answered")
        raise ApiError(
            "outcome_unknown",
            f"leader {name} stopped leading before it answered; the request may have been applied",
            {"leader": leader.id},
        )

    async def _exchange(
        self, request: web.Request, leader: Leader, body: bytes, sent: SimpleNamespace
    ) -> web.Response:
        headers = {FORWARDED: self.settings.node_id}
        for h in FORWARD_HEADERS:
            if h in request.headers:
                headers[h] = request.headers[h]
        assert self.session is not None
        url = self.settings.url(leader.api) + request.path_qs
        self.svc.metrics.proxied.inc()
        name = leader.id or leader.api
        try:
            async with self.session.request(
                request.method,
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(
                    total=self.settings.proxy_timeout, sock_connect=CONNECT_TIMEOUT_S
                ),
                ssl=self._ssl(),
                trace_request_ctx=sent,
            ) as r:
                data = await r.read()
                status, ctype, upstream = r.status, r.content_type, r.headers
        except aiohttp.ClientSSLError as e:  # this node's --tls-ca does not trust the leader
            log.error("forwarding to leader %s at %s: TLS failed: %s", name, leader.api, e)
            raise ApiError(
                "no_leader",
                f"this node could not set up TLS with leader {name} at {leader.api}"
                " (its certificate is not trusted here: see this node's log)",
                {"leader": leader.id},
                retry_after=self.settings.retry_after,
            ) from None
        except (aiohttp.ClientError, TimeoutError) as e:
            if not sent.connected:  # (refused, or no connection within CONNECT_TIMEOUT_S)
                raise Resend(f"leader {name} at {leader.api} is unreachable") from None
            if request.method in ("GET", "HEAD"):
                raise Resend(f"lost the connection to leader {name} ({e!r})") from None
            raise ApiError(
                "outcome_unknown",
                f"lost the connection to leader {name}; the request may have been applied",
                {"leader": leader.id},
            ) from None
        out = {LEADER_HEADER: self.settings.url(leader.api)}
        for h in ANSWER_HEADERS:
            if h in upstream:
                out[h] = upstream[h]
        return web.Response(status=status, body=data, headers=out, content_type=ctype)

    async def give_back(self, consumer: str, topics: list[str] | None = None) -> None:
        """Release a consumer's deliveries wherever the leader is now (a receive's answer may
        have been lost with a leader that went away: its successor has them as handed out),
        waiting up to ``propose_timeout`` for one to be known."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.propose_timeout
        while not self.svc.leads():
            with contextlib.suppress(ApiError):
                leader = self.svc.leader_elsewhere()
                await self.release_at(leader.api, consumer, topics)
                return
            if loop.time() >= deadline:
                log.warning("release of consumer %s failed: no leader", consumer)
                return
            await self._moved(None, deadline - loop.time())
        await self.svc.release(consumer, topics)

    async def release_at(
        self, leader_api: str, consumer: str, topics: list[str] | None = None
    ) -> None:
        """Give a consumer's deliveries back at the leader (its client went away here); with
        ``topics``, only those on topics matching them (the caller's consume patterns)."""
        if self.session is None:
            return
        headers = {FORWARDED: self.settings.node_id}
        if self.settings.internal_token:  # the node's own credential (raftq.node.auth)
            headers["Authorization"] = f"Bearer {self.settings.internal_token}"
        quoted = urllib.parse.quote(consumer, safe="")
        try:
            async with self.session.post(
                f"{self.settings.url(leader_api)}/consumers/{quoted}/release",
                json=None if topics is None else {"topics": topics},
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.settings.propose_timeout + 1),
                ssl=self._ssl(),
            ) as r:
                answer = await r.read()
                if r.status >= 300:
                    log.warning(
                        "release of consumer %s via the leader refused: %d %s",
                        consumer, r.status, answer[:200].decode("utf-8", "replace"),
                    )  # fmt: skip
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("release of consumer %s via the leader failed: %r", consumer, e)

    async def health(self, api: Any, timeout: float = 0.5) -> dict[str, Any] | None:
        """The ``/healthz`` answer of the node at ``api`` (host:port) when it is 200 (its
        ``figures`` included where it shows them); None when it does not answer so. Asked at
        most once per ``HEALTH_TTL_S`` (callers meanwhile share the answer)."""
        if not api or self.session is None:
            return None
        now = time.monotonic()
        asked = self._health.get(api)
        if asked is None or now - asked[0] > HEALTH_TTL_S:
            asked = (now, asyncio.ensure_future(self._ask_health(api, timeout)))
            self._health[api] = asked
        return await asyncio.shield(asked[1])  # (a caller that goes away cancels no other's)

    async def _ask_health(self, api: str, timeout: float) -> dict[str, Any] | None:
        assert self.session is not None
        try:
            async with self.session.get(
                f"{self.settings.url(api)}/healthz",
                timeout=aiohttp.ClientTimeout(total=timeout),
                ssl=self._ssl(),
            ) as r:
                if r.status != 200:
                    return None
                try:
                    body = await r.json(content_type=None)
                except ValueError:
                    body = None
                return body if isinstance(body, dict) else {}
        except (aiohttp.ClientError, TimeoutError):
            return None
