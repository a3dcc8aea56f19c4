"""Exceptions raised by the raftq client.

Every server error arrives as ``{"code", "message", "details"}``; the client maps ``code`` to one
class below and sets each entry of ``details`` as an attribute (``TopicFull.max_messages``,
``MessageTooLarge.size``...). Timeouts are also ``TimeoutError``. ``retry_after``: the seconds
the server asked the client to wait (its ``Retry-After``, on 429 and 503), else None.

    RaftqError                          .code .status .message .details
    ├── InvalidArgument                 invalid_argument (400)
    │   ├── InvalidName                 invalid_name
    │   └── MessageTooLarge             message_too_large (413)
    ├── Unauthenticated                 unauthenticated (401): no token, or a bad one
    ├── Forbidden                       forbidden (403): .action, .topic the token may not
    ├── NotFound                        (404)
    │   ├── TopicNotFound               topic_not_found
    │   ├── GroupNotFound               group_not_found
    │   └── TokenNotFound               token_not_found
    ├── Conflict                        (409)
    │   ├── TopicExists                 topic_exists
    │   ├── GroupExists                 group_exists
    │   └── TokenExists                 token_exists
    ├── TopicFull                       topic_full (429)
    ├── StorageFull                     storage_full (507): the cluster's max_retained_bytes or
    │                                   a node's free-disk reserve; not retried
    ├── ReceiptError
    │   ├── ReceiptInvalid              receipt_invalid
    │   └── ReceiptStale                receipt_stale
    ├── Unavailable                     no leader / node unreachable (503); safe to retry
    │   ├── TLSError                    TLS failed (untrusted certificate...): not retried
    │   └── RaftqTimeout (+TimeoutError) the overall deadline passed
    │       └── UnknownOutcome          the server could not tell whether it was applied
    ├── ProtocolError                   the server answered something this client cannot read
    └── ServerError                     internal (500): a bug on the server; not retried
"""

from __future__ import annotations

from typing import Any, ClassVar


class RaftqError(Exception):
    code: ClassVar[str] = "error"
    retry_after: float | None = None  # the server's Retry-After, in seconds

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.details: dict[str, Any] = dict(details or {})
        self.server_code: str | None = None  # the server's code, when a server answered
        for key, value in self.details.items():
            if not hasattr(type(self), key) and key not in (
                "message",
                "status",
                "details",
                "server_code",
            ):
                setattr(self, key, value)


class InvalidArgument(RaftqError):
    code = "invalid_argument"


class InvalidName(InvalidArgument):
    code = "invalid_name"


class MessageTooLarge(InvalidArgument):
    code = "message_too_large"


class Unauthenticated(RaftqError):
    """No token was sent, or it is unknown, malformed, disabled or expired."""

    code = "unauthenticated"


class Forbidden(RaftqError):
    """The token is valid but lacks the right: ``action`` (on ``topic``)."""

    code = "forbidden"


class NotFound(RaftqError):
    code = "not_found"


class TopicNotFound(NotFound):
    code = "topic_not_found"


class GroupNotFound(NotFound):
    code = "group_not_found"


class TokenNotFound(NotFound):
    code = "token_not_found"


class Conflict(RaftqError):
    code = "conflict"


class TopicExists(Conflict):
    code = "topic_exists"


class GroupExists(Conflict):
    code = "group_exists"


class TokenExists(Conflict):
    code = "token_exists"


class TopicFull(RaftqError):
    code = "topic_full"


class StorageFull(RaftqError):
    """The cluster holds as many payload bytes as its ``max_retained_bytes`` allows
    (``retained_bytes``, ``max_retained_bytes``), or the leader's data disk is below its
    reserve (``node``, ``free_bytes``, ``min_free_bytes``). Nothing was stored. Raised at once
    (room comes back only as consumers drain, or an operator acts), and retried only after a
    ``Retry-After`` if the server sends one."""

    code = "storage_full"


class ReceiptError(RaftqError):
    code = "receipt_error"


class ReceiptInvalid(ReceiptError):
    code = "receipt_invalid"


class ReceiptStale(ReceiptError):
    code = "receipt_stale"


class Unavailable(RaftqError):
    code = "unavailable"


class TLSError(Unavailable):
    """TLS could not be set up with a node, so nothing was sent: its certificate could not be
    verified (give the CA that signed it: ``ca=``, ``--ca``), the node refused ours or requires
    one (``cert=``, ``key=``), or the URL's scheme is not the node's (``http://`` to an HTTPS
    node or the reverse). The message names the URL. A configuration error, not an outage: the
    client raises it at once instead of retrying until its timeout."""

    code = "tls_error"


class RaftqTimeout(Unavailable, TimeoutError):
    code = "timeout"


class UnknownOutcome(RaftqTimeout):
    code = "unknown_outcome"


class ProtocolError(RaftqError):
    code = "protocol_error"


class ServerError(RaftqError):
    """The server failed while handling the request (500, a bug: see its log). Not retried; a
    write may or may not have been applied."""

    code = "internal"


def _walk(cls: type[RaftqError]) -> list[type[RaftqError]]:
    out: list[type[RaftqError]] = [cls]
    for sub in cls.__subclasses__():
        out.extend(_walk(sub))
    return out


BY_CODE: dict[str, type[RaftqError]] = {c.code: c for c in _walk(RaftqError)}
# Codes the server may use that are not classes of their own.
BY_CODE.update(
    {
        "no_leader": Unavailable,
        "overloaded": Unavailable,
        "shutting_down": Unavailable,
        "removed_from_cluster": Unavailable,  # (another node serves)
        "request_timeout": Unavailable,  # (the body did not arrive: nothing was done)
        "outcome_unknown": UnknownOutcome,
        "malformed_body": InvalidArgument,
        "malformed_request": InvalidArgument,
        "unknown_field": InvalidArgument,
        "unsupported_media_type": InvalidArgument,
        "not_acceptable": InvalidArgument,
        "body_too_large": InvalidArgument,
        "entry_too_large": MessageTooLarge,
        "membership_refused": Conflict,
        "route_not_found": NotFound,
        "method_not_allowed": InvalidArgument,
        "upgrade_required": InvalidArgument,
        "tls_required": TLSError,
        "client_certificate_required": TLSError,
    }
)


def error_from_body(status: int, body: Any) -> RaftqError:
    """Build the exception for an error response (pure; used by both clients)."""
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        code = body["code"]
        cls = BY_CODE.get(code)
        if cls is None:
            cls = _by_status(status)
        details = body.get("details") if isinstance(body.get("details"), dict) else {}
        err = cls(str(body.get("message") or code), status=status, details=details)
        err.server_code = code
        return err
    return _by_status(status)(f"HTTP {status}", status=status)


def _by_status(status: int) -> type[RaftqError]:
    if status == 401:
        return Unauthenticated
    if status == 403:
        return Forbidden
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status == 413:
        return MessageTooLarge
    if status == 429:
        return TopicFull
    if status == 507:
        return StorageFull
    if status in (502, 503, 504):
        return Unavailable
    if 400 <= status < 500:
        return InvalidArgument
    return RaftqError
