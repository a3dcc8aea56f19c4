"""Access control: who is calling, and what each route lets them do.

A caller presents ``Authorization: Bearer rq_<id>.<secret>`` (a WebSocket may instead offer the
subprotocol ``bearer.rq_<id>.<secret>`` beside ``raftq``: a browser cannot set headers). The
token is looked up by id in this node's replicated state (``Broker.token``) and the secret
checked against the stored SHA-256: the secret carries 256 random bits, so a slow KDF would buy
nothing and cost every request. Two credentials live outside the replicated state: the
bootstrap admin token from configuration (``--admin-token``, ``RAFTQ_ADMIN_TOKEN``; only its
hash is kept) and the node's internal credential, derived from the cluster secret, which the
nodes use among themselves (a follower giving back a dropped long poll's deliveries at the
leader). ``X-Raftq-Forwarded`` is never a credential: a forwarded request carries the caller's
own, and the leader checks it again.

Every route declares a ``Permission``: an action and where its topic is (the ``{topic}`` in
the path, checked before the handler runs, or in the body, checked by the handler). A caller
with no right on a topic learns nothing about it: the answer is 403 whether it exists or not.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftq.cluster import grants
from raftq.node.errors import ApiError

log = logging.getLogger("raftq.node.audit")

# Actions a route may need.
PUBLIC = "public"  # nobody is asked (health probes)
OBSERVE = "observe"  # public unless the node is configured otherwise (metrics, the API doc)
AUTHENTICATED = "authenticated"  # any valid credential (the cluster view, the topic list)
TOPIC = "topic"  # some right on the topic (its stats)
PUBLISH, CONSUME, ADMIN = grants.ACTIONS  # on the topic (admin: config, purge, peek, redrive)
CLUSTER = "cluster"  # membership and token management (a token's ``cluster`` flag)
ACTIONS = (PUBLIC, OBSERVE, AUTHENTICATED, TOPIC, PUBLISH, CONSUME, ADMIN, CLUSTER)
# Where a route's topic is.
PATH = "path"  # the {topic} path parameter: checked before the handler runs
BODY = "body"  # in the request (or its frames, or its receipts): the handler checks it

PREFIX = "rq_"
_TOKEN = re.compile(r"rq_([A-Za-z0-9_-]{1,64})\.([A-Za-z0-9_-]{16,256})")
SUBPROTOCOL = "raftq"  # what a WebSocket server selects when a client offers a bearer one
BEARER_SUBPROTOCOL = "bearer."
INTERNAL = "internal"  # the id of the node's own credential
RELEASE_PATH = "/consumers/{consumer}/release"  # ... the one route it may use
RESERVED_NAMES = frozenset(["admin", "internal", "anonymous"])  # no token may be named so
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="raftq"'}


@dataclass(frozen=True)
class Permission:
    action: str
    topic: str | None = None  # PATH, BODY, or None: not about a topic

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}")
        on_topic = self.action in (TOPIC, PUBLISH, CONSUME, ADMIN)
        if on_topic != (self.topic in (PATH, BODY)):
            raise ValueError(f"{self.action} needs a topic (path or body), and only it does")


def new_token() -> tuple[str, str, str]:
    """A fresh token: (id, secret, the text a client presents)."""
    tid, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return tid, secret, f"{PREFIX}{tid}.{secret}"


def parse(text: str) -> tuple[str, str] | None:
    """``rq_<id>.<secret>`` as (id, secret); None if it is not one."""
    m = _TOKEN.fullmatch(text)
    return (m.group(1), m.group(2)) if m else None


def secret_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def internal_token(key: str) -> str:
    """The node's own credential, the same on every node that shares ``key`` (the cluster
    secret, else the bootstrap admin token)."""
    mac = hmac.new(key.encode(), b"raftq-internal-credential-v1", "sha256").digest()
    return f"{PREFIX}{INTERNAL}.{mac.hex()}"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name and rights (``everything``: the bootstrap admin, the
    node itself, or access control off)."""

    name: str
    token_id: str | None = None
    grants: tuple[Mapping[str, Any], ...] = ()
    cluster: bool = False
    everything: bool = False
    digest: bytes = field(default=b"", repr=False)  # a replicated token's hash, for ``recheck``
    only: str | None = None  # the one route (path) it may use: the node's own credential

    def may(self, action: str, topic: str | None = None) -> bool:
        if self.everything or action in (PUBLIC, OBSERVE, AUTHENTICATED):
            return True
        if action == CLUSTER:
            return self.cluster
        assert topic is not None
        if action == TOPIC:
            return grants.any_right(self.grants, topic)
        return grants.allows(self.grants, action, topic)

    def require(self, action: str, topic: str | None = None) -> None:
        if not self.may(action, topic):
            what = f"{action} on topic {topic!r}" if topic is not None else action
            raise ApiError(
                "forbidden",
                f"token {self.name!r} may not {what}",
                {"action": action, "topic": topic, "token": self.name},
            )

    def patterns(self, action: str) -> list[str] | None:
        """The topic patterns this caller may ``action`` on; None: every topic."""
        if self.everything:
            return None
        return grants.patterns(self.grants, action)


ANYONE = Principal("anonymous", everything=True)  # access control off
# The nodes' own calls: giving back, at the leader, deliveries whose client went away here.
INTERNAL_PRINCIPAL = Principal(
    "internal", grants=({"topics": "*", "actions": ["consume"]},), only=RELEASE_PATH
)
NOBODY = Principal("anonymous")  # a public route's caller: no rights


@dataclass
class Authenticator:
    """Checks credentials against ``lookup`` (a token id -> its record in the replicated
    state, or None). With ``enabled`` False everyone may do everything."""

    lookup: Callable[[str], Mapping[str, Any] | None]
    enabled: bool = True
    admin_token: str | None = None
    internal: str | None = None
    clock: Callable[[], float] = time.time
    waiting: int = field(default=0, init=False)  # requests waiting to learn a token (app)
    _admin: bytes | None = field(default=None, init=False, repr=False)
    _internal: bytes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        # Only hashes are kept; the texts are dropped.
        if self.admin_token:
            self._admin = secret_hash(self.admin_token)
        if self.internal:
            self._internal = secret_hash(self.internal)
        self.admin_token = self.internal = None

    def authenticate(self, credential: str | None) -> Principal:
        if not self.enabled:
            return ANYONE
        if not credential:
            raise unauthenticated("this node needs a token: send Authorization: Bearer rq_...")
        if not credential.isascii():
            raise unauthenticated("malformed token: expected rq_<id>.<secret>")
        digest = secret_hash(credential)
        if self._admin is not None and hmac.compare_digest(digest, self._admin):
            return Principal("admin", everything=True, cluster=True)
        parsed = parse(credential)
        if parsed is None:
            raise unauthenticated("malformed token: expected rq_<id>.<secret>")
        tid, secret = parsed
        if tid == INTERNAL:
            if self._internal is not None and hmac.compare_digest(digest, self._internal):
                return INTERNAL_PRINCIPAL
            raise unauthenticated("invalid token")
        record = self.lookup(tid)
        if record is None:
            raise UnknownToken("invalid token", headers=_CHALLENGE)
        if not hmac.compare_digest(secret_hash(secret), record["hash"]):
            raise unauthenticated("invalid token")  # (the same answer as an unknown id)
        return self._valid(tid, record)

    def recheck(self, who: Principal) -> Principal:
        """``who`` as the replicated state says now: a stream authenticated at its handshake
        asks again before each thing it does, so a revoke, a disable, an expiry or new grants
        take effect on an open stream too (a lookup, no hashing)."""
        if who.token_id is None or not self.enabled:
            return who
        record = self.lookup(who.token_id)
        if record is None or record["hash"] != who.digest:
            raise unauthenticated(f"token {who.name!r} was revoked")
        return self._valid(who.token_id, record)

    def _valid(self, tid: str, record: Mapping[str, Any]) -> Principal:
        if record.get("disabled"):
            raise unauthenticated(f"token {record['name']!r} is disabled")
        expires = record.get("expires_at")
        if expires is not None and expires <= self.clock() * 1000:
            raise unauthenticated(f"token {record['name']!r} has expired")
        return Principal(
            record["name"],
            tid,
            tuple(record.get("grants") or ()),
            bool(record.get("cluster")),
            digest=record["hash"],
        )


def credential(headers: Mapping[str, str]) -> str | None:
    """The bearer token of a request: ``Authorization``, else a WebSocket subprotocol."""
    value = headers.get("Authorization")
    if value is not None:
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthenticated("Authorization must be: Bearer rq_<id>.<secret>")
        return token.strip()
    if headers.get("Upgrade", "").lower() != "websocket":
        return None  # (a subprotocol is a credential on a WebSocket handshake only)
    for proto in headers.get("Sec-WebSocket-Protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith(BEARER_SUBPROTOCOL):
            return proto[len(BEARER_SUBPROTOCOL) :]
    return None


class UnknownToken(ApiError):
    """A well-formed token whose id this node's state does not hold (yet: a token created a
    moment ago may not be applied here). Answered as any invalid token."""

    def __init__(self, message: str, headers: dict[str, str]) -> None:
        super().__init__("unauthenticated", message, headers=headers)


def unauthenticated(message: str) -> ApiError:
    return ApiError("unauthenticated", message, headers=_CHALLENGE)


def audit(principal: Principal, action: str, target: str) -> None:
    """One line per administrative action (never a secret): the token's name and id."""
    who = principal.name
    if principal.token_id is not None:
        who += f" ({principal.token_id})"
    log.info("audit: token %s: %s %s", who, action, target)


_SECRETS = re.compile(r"rq_[A-Za-z0-9_-]{1,64}\.[A-Za-z0-9_-]+")


class RedactTokens(logging.Filter):
    """Hides token secrets in what a library logs (aiohttp names the subprotocols a client
    offered when none match, and a browser's token may be one of them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "rq_" in text:
            record.msg, record.args = _SECRETS.sub("rq_<redacted>", text), ()
        return True


def redact_library_logs() -> None:
    """Install ``RedactTokens`` on the loggers that may print request headers (once)."""
    for name in ("aiohttp.websocket", "aiohttp.server", "aiohttp.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())
