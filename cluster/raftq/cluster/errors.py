"""Domain errors of the broker state machine.

Every error has a stable string ``code`` (what the HTTP layer maps to a status and what the client
maps back to an exception class) and carries its data as attributes, also collected in
``details`` for the wire.

    BrokerError                       code            data
    ├── InvalidArgument               invalid_argument  field
    │   ├── InvalidName               invalid_name      field, name
    │   └── MessageTooLarge           message_too_large size, limit, index
    ├── NotFound                      not_found
    │   ├── TopicNotFound             topic_not_found   topic
    │   ├── GroupNotFound             group_not_found   topic, group
    │   └── TokenNotFound             token_not_found   id
    ├── Conflict                      conflict
    │   ├── TopicExists               topic_exists      topic
    │   ├── GroupExists               group_exists      topic, group
    │   └── TokenExists               token_exists      field, id or name
    ├── TopicFull                     topic_full        topic, count, bytes, max_messages, max_bytes
    ├── StorageFull                   storage_full      retained_bytes, max_retained_bytes, bytes
    └── ReceiptError                  receipt_error
        ├── ReceiptInvalid            receipt_invalid   receipt
        └── ReceiptStale              receipt_stale     receipt

Errors raised by ``apply`` leave the state unchanged: every command validates before it mutates.
This module must never import anything but the standard library.
"""

from __future__ import annotations

from typing import Any, ClassVar


class BrokerError(Exception):
    """Base of all domain errors."""

    code: ClassVar[str] = "broker_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details
        for key, value in details.items():
            if key not in _RESERVED:
                setattr(self, key, value)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


_RESERVED = frozenset(["code", "message", "details", "args", "to_wire", "with_traceback"])


class InvalidArgument(BrokerError):
    code = "invalid_argument"


class InvalidName(InvalidArgument):
    code = "invalid_name"


class MessageTooLarge(InvalidArgument):
    code = "message_too_large"


class NotFound(BrokerError):
    code = "not_found"


class TopicNotFound(NotFound):
    code = "topic_not_found"


class GroupNotFound(NotFound):
    code = "group_not_found"


class TokenNotFound(NotFound):
    code = "token_not_found"


class Conflict(BrokerError):
    code = "conflict"


class TopicExists(Conflict):
    code = "topic_exists"


class GroupExists(Conflict):
    code = "group_exists"


class TokenExists(Conflict):
    code = "token_exists"


class TopicFull(BrokerError):
    code = "topic_full"


class StorageFull(BrokerError):
    """The node-wide limit on retained bytes (or, raised by the node, its free-disk reserve)
    refuses a publish; nothing was stored."""

    code = "storage_full"


class ReceiptError(BrokerError):
    code = "receipt_error"


class ReceiptInvalid(ReceiptError):
    code = "receipt_invalid"


class ReceiptStale(ReceiptError):
    code = "receipt_stale"


def _all_subclasses(cls: type[BrokerError]) -> list[type[BrokerError]]:
    out: list[type[BrokerError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


_ALL_ERRORS: list[type[BrokerError]] = [BrokerError, *_all_subclasses(BrokerError)]
ERRORS_BY_CODE: dict[str, type[BrokerError]] = {cls.code: cls for cls in _ALL_ERRORS}


def from_wire(data: dict[str, Any]) -> BrokerError:
    """Rebuild an error from its wire form (used where results cross a process boundary)."""
    cls = ERRORS_BY_CODE.get(str(data.get("code")), BrokerError)
    details = data.get("details")
    details = dict(details) if isinstance(details, dict) else {}
    details.pop("message", None)
    return cls(str(data.get("message", "")), **{str(k): v for k, v in details.items()})
