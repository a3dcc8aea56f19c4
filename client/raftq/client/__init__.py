"""raftq client library: ``AsyncClient`` and its blocking twin ``Client``.

Imports nothing from ``raftq.node`` or ``raftq.cluster``; needs only aiohttp and msgpack.
Errors are in ``raftq.client.errors`` (tree drawn in its docstring).
"""

from raftq.client._async import AsyncClient, AsyncMessage
from raftq.client._sync import Client, Message
from raftq.client.errors import (
    Conflict,
    Forbidden,
    GroupExists,
    GroupNotFound,
    InvalidArgument,
    InvalidName,
    MessageTooLarge,
    NotFound,
    ProtocolError,
    RaftqError,
    RaftqTimeout,
    ReceiptError,
    ReceiptInvalid,
    ReceiptStale,
    ServerError,
    TLSError,
    TokenExists,
    TokenNotFound,
    TopicExists,
    TopicFull,
    TopicNotFound,
    Unauthenticated,
    Unavailable,
    UnknownOutcome,
)

__all__ = [
    "AsyncClient",
    "AsyncMessage",
    "Client",
    "Conflict",
    "Forbidden",
    "GroupExists",
    "GroupNotFound",
    "InvalidArgument",
    "InvalidName",
    "Message",
    "MessageTooLarge",
    "NotFound",
    "ProtocolError",
    "RaftqError",
    "RaftqTimeout",
    "ReceiptError",
    "ReceiptInvalid",
    "ReceiptStale",
    "ServerError",
    "TLSError",
    "TokenExists",
    "TokenNotFound",
    "TopicExists",
    "TopicFull",
    "TopicNotFound",
    "Unauthenticated",
    "Unavailable",
    "UnknownOutcome",
]
