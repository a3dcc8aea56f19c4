"""The HTTP API of one node, assembled: ``build_app(raft, settings)`` binds the route tables of
the transport modules (``topics``, ``messages``, ``ops``, ``stream``, ``tokens``, and
``console``: the web console's static files) to one ``BrokerService``.

Every request passes ``_errors`` (one JSON error envelope, status from ``errors.STATUS_BY_CODE``,
request metrics) and its route's dispatcher (``_bind``): the query checked against the route's
declaration, the caller authorized for the route's permission (``auth``), then the one
leadership rule: a leader route on a node that does not lead, or
whose command found it no longer leads (``LeaderLost``), is forwarded to the leader once
(``proxy``); a stream redirects there itself; a local route answers here. Adding a surface
means a module with a ``ROUTES`` table, listed in ``ROUTE_MODULES``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from raftq.cluster.errors import BrokerError
from raftq.node import auth, console, httpio, messages, ops, stream, tokens, topics
from raftq.node.auth import (
    ADMIN,
    CLUSTER,
    NOBODY,
    OBSERVE,
    PATH,
    PUBLIC,
    Authenticator,
    Permission,
    Principal,
    UnknownToken,
)
from raftq.node.errors import ApiError
from raftq.node.openapi import document
from raftq.node.proxy import Forwarder, LeadsHere
from raftq.node.raftapi import Raft
from raftq.node.routes import AUTHN, LEADER, Route, parse_query, path_name, set_principal
from raftq.node.service import BrokerService, LeaderLost, NodeSettings
from raftq.node.sqs import routes as sqs
from raftq.node.stream import STREAMS, Streams

__all__ = ["ROUTE_MODULES", "SERVICE", "NodeSettings", "all_routes", "build_app"]

log = logging.getLogger("raftq.node")

ROUTE_MODULES = (topics, messages, stream, tokens, ops, sqs, console)
SERVICE: web.AppKey[BrokerService] = web.AppKey("service", BrokerService)
CATCH_UP_S = 1.0  # how long a follower waits at most to learn a token it does not know
CATCH_UP_MIN_S = 0.1
MAX_HANDOFFS = 3  # times a request may move between running here and forwarding
MAX_TOKEN_WAITERS = 64
_METHODS = frozenset(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])  # (labels)
AioHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def all_routes() -> list[Route]:
    routes: list[Route] = []
    for module in ROUTE_MODULES:
        routes.extend(module.ROUTES)
    return routes


def _route_name(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def _errors(svc: BrokerService) -> Middleware:
    metrics = svc.metrics

    @web.middleware
    async def errors(request: web.Request, handler: AioHandler) -> web.StreamResponse:
        route = _route_name(request)
        t0 = time.perf_counter()
        status = 500
        try:
            if request.method not in ("GET", "HEAD") and route != sqs.FORWARD_PATH:
                httpio.check_accept(request)  # before a write is applied; a read falls back to JSON
            resp = await handler(request)
            status = resp.status
            return resp
        except BrokerError as e:
            err = ApiError.from_wire(e.to_wire())
            status = err.status
            return httpio.error_response(err)
        except web.HTTPException as e:
            if e.status < 400:  # a redirect (streams on a follower)
                status = e.status
                raise
            code = {404: "route_not_found", 405: "method_not_allowed"}.get(e.status)
            if e.status == 413:
                code = "body_too_large"
            message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
            if e.status == 405:
                message = f"{request.method} is not allowed here; allowed: {e.headers['Allow']}"
            err = ApiError(code or "malformed_body", message)
            status = err.status
            resp = httpio.error_response(err)
            if "Allow" in e.headers:  # a 405 says what is allowed (RFC 9110)
                resp.headers["Allow"] = e.headers["Allow"]
            if e.status == 413:  # (as httpio.read_raw: the rest of the body is no request)
                resp.force_close()
            return resp
        except ApiError as e:
            status = e.status
            resp = httpio.error_response(e)
            if e.close:
                resp.force_close()
            return resp
        except (asyncio.CancelledError, ConnectionError):  # the client went away
            status = 499
            raise
        except Exception:
            log.exception("internal error on %s %s", request.method, request.path)
            return httpio.error_response(ApiError("internal", "internal error; see the node log"))
        finally:
            method = request.method if request.method in _METHODS else "other"
            metrics.requests.labels(method, route, str(status)).inc()
            metrics.latency.labels(route).observe(time.perf_counter() - t0)

    return errors


def _authorize(
    route: Route, perm: Permission, authn: Authenticator, observe: bool, request: web.Request
) -> Principal:
    """Who calls, allowed the route's action (on its path's topic); 401 / 403 otherwise."""
    if perm.action == PUBLIC or (perm.action == OBSERVE and not observe):
        who = NOBODY
    else:
        who = authn.authenticate(auth.credential(request.headers))
        if who.only is not None and who.only != route.path:
            raise ApiError(
                "forbidden", f"the {who.name} credential serves {who.only} only",
                {"action": perm.action, "topic": None, "token": who.name},
            )  # fmt: skip
        if perm.topic == PATH:
            who.require(perm.action, path_name(request, "topic"))
        elif perm.topic is None:
            who.require(perm.action)
    set_principal(request, who)
    return who


async def _authorize_here(
    route: Route,
    perm: Permission,
    authn: Authenticator,
    svc: BrokerService,
    request: web.Request,
) -> Principal:
    """``_authorize``; but a token this node does not know, while another node leads, may have
    just been created there (used through a follower the moment it was made): asked about
    again as entries are applied here, for at least ``CATCH_UP_MIN_S`` (a heartbeat or two)
    and while this node trails what it heard the leader commit, at most ``CATCH_UP_S``."""
    observe = svc.settings.auth_observe
    try:
        return _authorize(route, perm, authn, observe, request)
    except UnknownToken:
        if svc.leads() or authn.waiting >= MAX_TOKEN_WAITERS:
            raise  # (junk tokens cannot tie up a follower: a bounded number wait)
    authn.waiting += 1
    try:
        start = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            try:
                return _authorize(route, perm, authn, observe, request)
            except UnknownToken:
                waited = time.monotonic() - start
                if svc.leads() or waited >= CATCH_UP_S:
                    raise
                if waited >= CATCH_UP_MIN_S:
                    st = svc.raft.status()
                    if st.leader_commit is None or st.applied_index >= st.leader_commit:
                        raise  # caught up: unknown here means unknown (revoked ones too)
    finally:
        authn.waiting -= 1


def _bind(route: Route, svc: BrokerService, fwd: Forwarder, authn: Authenticator) -> AioHandler:
    """The aiohttp handler of one route: its query checked, the caller authorized, then the
    leadership rule."""
    handler = functools.partial(route.handler, svc)
    perm = route.perm
    if perm is None:
        raise ValueError(f"{route.method} {route.path} declares no permission")
    audited = perm.action in (ADMIN, CLUSTER)

    async def run(request: web.Request, who: Principal) -> web.StreamResponse:
        resp = await handler(request)
        if audited and resp.status < 400:
            auth.audit(who, f"{route.method} {route.path}", request.path)
        return resp

    if route.where != LEADER or route.stream:
        # Local routes answer here; streams redirect to the leader themselves (a WebSocket
        # is not forwarded).
        async def here(request: web.Request) -> web.StreamResponse:
            parse_query(route, request)
            return await run(request, await _authorize_here(route, perm, authn, svc, request))

        return here

    async def at_leader(request: web.Request) -> web.StreamResponse:
        parse_query(route, request)
        # Checked here with this node's own replicated state, and again at the leader.
        who = await _authorize_here(route, perm, authn, svc, request)
        here = svc.leads()
        for _ in range(MAX_HANDOFFS):
            if here:
                try:
                    return await run(request, who)
                except LeaderLost:
                    pass
            try:
                return await fwd.forward(route, request)
            except LeadsHere:  # elected while the forward waited for a leader
                here = True
        raise ApiError(
            "no_leader", "the leadership kept moving; retry shortly",
            retry_after=svc.settings.retry_after,
        )  # fmt: skip

    return at_leader


def build_app(
    raft: Raft, settings: NodeSettings | None = None, routes: Sequence[Route] | None = None
) -> web.Application:
    settings = settings or NodeSettings()
    svc = BrokerService(raft, settings)
    fwd = Forwarder(svc)
    streams = Streams(svc)
    routes = all_routes() if routes is None else list(routes)
    app = web.Application(client_max_size=settings.max_body, middlewares=[_errors(svc)])
    app[SERVICE] = svc
    if settings.body_timeout is not None:
        app[httpio.BODY_TIMEOUT] = settings.body_timeout
    app[ops.FORWARDER] = fwd
    app[STREAMS] = streams
    app[ops.DOCUMENT] = document(routes)
    authn = Authenticator(
        lambda tid: raft.read(lambda b: b.token(tid)),
        enabled=settings.auth,
        admin_token=settings.admin_token,
        internal=settings.internal_token,
    )
    app[AUTHN] = authn
    auth.redact_library_logs()
    for route in routes:
        aio = _bind(route, svc, fwd, authn)
        app.router.add_route(route.method, route.path, aio)
        if route.method == "GET" and not route.stream:
            app.router.add_route("HEAD", route.path, aio)  # (load balancers' health checks)
    # Cleanup runs in reverse: the service drains (releases may go through the forwarder)
    # before the forwarder's session closes.
    app.on_response_prepare.append(console.add_headers)
    app.cleanup_ctx.append(fwd.lifecycle)
    app.cleanup_ctx.append(svc.lifecycle)

    async def on_shutdown(app: web.Application) -> None:
        # Runs before aiohttp waits for in-flight handlers: make long polls answer now.
        svc.drain()
        await streams.on_shutdown(app)

    app.on_shutdown.append(on_shutdown)
    return app
