"""The node's errors: the one table from error ``code`` to HTTP status, and ``ApiError``.

Every error response is ``{"code", "message", "details"}``. Domain codes come from
``raftq.cluster.errors`` (the state machine); the node adds codes for transport-level problems
(malformed bodies, no leader, unknown outcome). ``STATUS_BY_CODE`` is the only place that decides
a status; a test checks it covers every domain error class. Every 429 and 503 carries
``Retry-After`` (``RETRY_AFTER_S``, unless the raiser names its own delay).
"""

from __future__ import annotations

from typing import Any

STATUS_BY_CODE: dict[str, int] = {
    # domain errors (raftq.cluster.errors)
    "broker_error": 400,
    "invalid_argument": 400,
    "invalid_name": 400,
    "message_too_large": 413,
    "not_found": 404,
    "topic_not_found": 404,
    "group_not_found": 404,
    "token_not_found": 404,
    "conflict": 409,
    "topic_exists": 409,
    "group_exists": 409,
    "token_exists": 409,
    "topic_full": 429,
    # the cluster's max_retained_bytes, or this node's free-disk reserve: nothing stored; no
    # Retry-After (room comes back as consumers drain, not after a set time)
    "storage_full": 507,
    "receipt_error": 400,
    "receipt_invalid": 400,  # not a receipt this cluster issued (or tampered with)
    "receipt_stale": 409,  # a real receipt whose delivery is over (acked, expired, redelivered)
    # node errors
    "unauthenticated": 401,  # no token, or one that is invalid, disabled or expired
    "forbidden": 403,  # a valid token without the right (names the action and topic)
    "malformed_body": 400,
    "malformed_request": 400,  # not HTTP aiohttp can parse (a huge header, a NUL in one...)
    "unknown_field": 400,
    "unsupported_media_type": 415,
    "not_acceptable": 406,
    "body_too_large": 413,
    "request_timeout": 408,  # the request body did not arrive in time (--idle-timeout)
    "entry_too_large": 413,
    "route_not_found": 404,
    "method_not_allowed": 405,
    "upgrade_required": 426,  # a plain GET of a WebSocket endpoint
    "tls_required": 400,  # plain HTTP on a TLS port (answered by raftq.node.httpsite)
    "client_certificate_required": 401,  # TLS without the client certificate the node requires
    "membership_refused": 409,  # unsafe now (names the rule), not a member, or already one
    "no_leader": 503,
    "removed_from_cluster": 503,  # this node was removed: use another
    "overloaded": 503,
    "shutting_down": 503,
    "outcome_unknown": 504,
    "internal": 500,
}


# Seconds a client should wait before trying again, by code (the ``Retry-After`` header):
# a full topic drains as consumers ack, an overloaded leader works through its queue, an
# election ends within about one election timeout.
RETRY_AFTER_S: dict[str, int] = {
    "topic_full": 1,
    "overloaded": 1,
    "no_leader": 1,
    "shutting_down": 1,
    "removed_from_cluster": 1,
}


def status_for(code: str) -> int:
    # An unknown code is a bug on our side, never the client's: say so with 500.
    return STATUS_BY_CODE.get(code, 500)


class ApiError(Exception):
    """An error answered to the client; ``status`` always comes from ``STATUS_BY_CODE``."""

    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        retry_after: float | None = None,
        close: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after = RETRY_AFTER_S.get(code) if retry_after is None else retry_after
        self.close = close  # close the connection after answering (unread request bytes)
        self.headers = headers or {}  # response headers of its own (WWW-Authenticate)

    @property
    def status(self) -> int:
        return status_for(self.code)

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}

    @classmethod
    def from_wire(cls, err: dict[str, Any]) -> ApiError:
        """From a state machine result item ``{"code", "message", "details"}``."""
        details = err.get("details")
        return cls(
            str(err.get("code", "internal")),
            str(err.get("message", "")),
            details if isinstance(details, dict) else {},
        )
