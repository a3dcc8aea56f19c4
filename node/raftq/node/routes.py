"""Route tables: what each HTTP route is, declared once.

Each transport module (``topics``, ``messages``, ``ops``, ``stream``) exports ``ROUTES``, a
list of ``Route``: method, path, handler, the query parameters it takes, whether the leader
serves it (followers forward it) or every node answers from its own state, whether it is a
WebSocket stream (a follower redirects instead of forwarding), and what the OpenAPI document
says of it. ``app.build_app``, the OpenAPI document and the follower proxy all derive from
these tables; nothing else lists routes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from raftq.node import commands, httpio
from raftq.node.auth import Authenticator, Permission, Principal
from raftq.node.errors import ApiError

if TYPE_CHECKING:
    from raftq.node.proxy import Forwarder
    from raftq.node.service import BrokerService, Leader

Handler = Callable[["BrokerService", web.Request], Awaitable[web.StreamResponse]]
# A route's own way of being forwarded to the leader (``forward``): given the forwarder, the
# request, the leader and the request body.
ForwardHook = Callable[["Forwarder", web.Request, "Leader", bytes], Awaitable[web.StreamResponse]]

LEADER = "leader"  # served by the leader; a follower forwards it (or, for a stream, redirects)
LOCAL = "local"  # every node answers from its own state

_INT_TEXT = re.compile(r"-?[0-9]{1,19}")


@dataclass(frozen=True)
class Query:
    """A query parameter: ``integer`` or ``number`` (within ``lo``..``hi``), one of
    ``choices`` (given at most once), a ``name`` (a topic or group name's rules), or a
    ``flag`` (true when ``1`` or ``true``)."""

    name: str
    kind: str = "integer"
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    default: Any = None
    doc: str = ""

    def parse(self, raw: str | None) -> Any:
        if self.kind == "flag":
            return raw in ("1", "true")
        if raw is None or (raw == "" and self.choices):  # (format= means the default)
            return self.default
        if self.kind == "name":
            return commands.name(raw, self.name)
        if self.choices:
            if raw not in self.choices:
                raise ApiError(
                    "invalid_argument",
                    f"{self.name} must be {' or '.join(self.choices)}",
                    {"field": self.name},
                )
            return raw
        value: float
        if self.kind == "integer":
            if not _INT_TEXT.fullmatch(raw):
                raise ApiError(
                    "invalid_argument", f"{self.name} must be an integer", {"field": self.name}
                )
            value = int(raw)
        else:
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
        if (self.lo is not None and not value >= self.lo) or (
            self.hi is not None and not value <= self.hi
        ) or value != value:  # fmt: skip
            raise ApiError(
                "invalid_argument",
                f"{self.name} must be a number between {self.lo} and {self.hi}",
                {"field": self.name},
            )
        return value


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    where: str = LEADER
    stream: bool = False  # a WebSocket endpoint (GET with Upgrade)
    query: tuple[Query, ...] = ()
    # Query parameters it does not declare are refused (400), except on LOCAL routes: probes
    # and scrapers add their own.
    strict_query: bool = True
    forward: ForwardHook | None = None  # how a follower forwards it, if not as is
    # What the caller needs (``auth.Permission``); a route without one does not start.
    perm: Permission | None = None
    # For the OpenAPI document: the request body's schema (None: no body), the success
    # statuses and the response schema (names in ``openapi.SCHEMAS``).
    body: str | None = None
    ok: tuple[int, ...] = (200,)
    answer: str = "Any"
    params: dict[str, str] = field(default_factory=dict)  # path parameter -> description
    # The OpenAPI operationId: camelCase, unique, stable (generated clients name their methods
    # after it: renaming one breaks them).
    op: str = ""

    def __post_init__(self) -> None:
        if self.where not in (LEADER, LOCAL):
            raise ValueError(f"{self.method} {self.path}: where must be leader or local")


_QUERY_KEY: web.RequestKey[dict[str, Any]] = web.RequestKey("query", dict)
_PRINCIPAL_KEY: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
AUTHN: web.AppKey[Authenticator] = web.AppKey("authenticator", Authenticator)


def parse_query(route: Route, request: web.Request) -> None:
    """Check the request's query against the route's declaration; keep the parsed values
    for ``query`` (the handler's view)."""
    declared = route.query
    if route.strict_query and request.query:
        names = {q.name for q in declared}
        unknown = sorted(k for k in request.query if k not in names)
        if unknown:
            raise ApiError(
                "unknown_field",
                f"unknown query parameter(s) {', '.join(unknown)}"
                + (f"; this route takes {', '.join(sorted(names))}" if names else ""),
                {"fields": unknown},
            )
    if declared:
        request[_QUERY_KEY] = {
            q.name: q.parse(
                request.query.get(q.name) if q.kind == "flag" else httpio.query_one(request, q.name)
            )
            for q in declared
        }


def query(request: web.Request) -> dict[str, Any]:
    """The request's declared query parameters, parsed (defaults for those not given)."""
    values: dict[str, Any] = request.get(_QUERY_KEY, {})
    return values


def path_name(request: web.Request, field: str) -> str:
    """A topic or group name from the path, checked (``commands.name``)."""
    return commands.name(request.match_info[field], field)


def set_principal(request: web.Request, principal: Principal) -> None:
    request[_PRINCIPAL_KEY] = principal


def principal(request: web.Request) -> Principal:
    """Who is calling (authenticated, and checked against the route's permission, before the
    handler runs)."""
    return request[_PRINCIPAL_KEY]


def recheck(request: web.Request, who: Principal) -> Principal:
    """``who`` as the replicated state says now (``Authenticator.recheck``): for streams,
    which authenticate once, at their handshake."""
    return request.app[AUTHN].recheck(who)
