"""raftq client library: ``AsyncClient`` and its blocking twin ``Client``.

Imports nothing from ``raftq.node`` or ``raftq.cluster``; needs only aiohttp and msgpack.
Errors are in ``raftq.client.errors`` (tree drawn in its docstring).
"""

from raftq.client._async import AsyncClient, AsyncMessage
from raftq.client._sync import Client, Message
from raftq.client.errors import (
    Conflict,
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
    TopicExists,
    TopicFull,
    TopicNotFound,
    Unavailable,
    UnknownOutcome,
)

__all__ = [
    "AsyncClient",
    "AsyncMessage",
    "Client",
    "Conflict",
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
    "TopicExists",
    "TopicFull",
    "TopicNotFound",
    "Unavailable",
    "UnknownOutcome",
]
