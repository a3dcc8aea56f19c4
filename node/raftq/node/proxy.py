"""HTTP calls from this node to the others: forwarding a request to the leader (one hop), giving
a consumer's deliveries back at the leader, and health probes of members.

A follower forwards each leader route to the leader as it came (or through the route's own
``forward`` hook: a receive names its consumer first), marked with ``X-Raftq-Forwarded`` so it
never loops, and answers the leader's response with ``X-Raftq-Leader``. Only the request
headers in ``FORWARD_HEADERS`` and the response headers in ``ANSWER_HEADERS`` cross the hop;
``X-Raftq-Forwarded`` is never a credential.
"""

from __future__ import annotations

import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator
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


class Forwarder:
    def __init__(self, svc: BrokerService) -> None:
        self.svc = svc
        self.settings = svc.settings
        self.session: aiohttp.ClientSession | None = None
        svc.release_remote = self.release_at

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        # No pool limit: every proxied long poll holds one connection to the leader.
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await self.session.close()

    def _ssl(self) -> ssl.SSLContext | bool:
        """How calls to other nodes verify them: the node's peer context (TLS on; it may have
        been reloaded since the last call), else aiohttp's default (unused over http)."""
        peer = self.settings.peer_ssl
        return peer() if peer is not None else True

    async def forward(self, route: Route, request: web.Request) -> web.StreamResponse:
        """Forward a leader route to the leader, once; answer its response as is."""
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
        if route.forward is not None:
            return await route.forward(self, request, leader, body)
        return await self.send(request, leader, body)

    async def send(self, request: web.Request, leader: Leader, body: bytes) -> web.Response:
        """``request`` (with ``body``) sent to the leader; its answer as a response here."""
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
                timeout=aiohttp.ClientTimeout(total=self.settings.proxy_timeout),
                ssl=self._ssl(),
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
        except aiohttp.ClientConnectorError:
            raise ApiError(
                "no_leader",
                f"leader {name} at {leader.api} is unreachable",
                {"leader": leader.id},
                retry_after=self.settings.retry_after,
            ) from None
        except (aiohttp.ClientError, TimeoutError):
            if request.method in ("GET", "HEAD"):
                raise ApiError("no_leader", "the leader did not answer", retry_after=1) from None
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

    async def probe(self, api: Any, timeout: float = 0.5) -> bool:
        """Does the node at ``api`` (host:port) answer ``/healthz``?"""
        if not api or self.session is None:
            return False
        try:
            async with self.session.get(
                f"{self.settings.url(api)}/healthz",
                timeout=aiohttp.ClientTimeout(total=timeout),
                ssl=self._ssl(),
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False
