"""The bytes that go through Raft: one versioned msgpack entry carrying a batch of commands.

``[ENTRY_VERSION, now_ms, [command, ...]]``. The leader builds it (group commit puts many
requests' commands into one entry); every replica decodes it and hands it to
``Broker.apply_batch``. Results come back in command order, one map each, an error as
``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

from typing import Any

import msgpack

from raftq.cluster.errors import InvalidArgument
from raftq.cluster.state import Broker

ENTRY_VERSION = 1


def encode_entry(now_ms: int, commands: list[dict[str, Any]]) -> bytes:
    return msgpack.packb([ENTRY_VERSION, now_ms, commands], use_bin_type=True)


def decode_entry(data: bytes) -> tuple[int, list[Any]]:
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(obj, list) or len(obj) != 3 or obj[0] != ENTRY_VERSION:
        raise ValueError("not a raftq log entry")
    now, commands = obj[1], obj[2]
    if not isinstance(now, int) or not isinstance(commands, list):
        raise ValueError("not a raftq log entry")
    return now, commands


def apply_entry(broker: Broker, data: bytes, read: bool = True) -> list[dict[str, Any]]:
    """Decode and apply one entry; a malformed entry changes nothing and yields no results.
    ``read``: deliveries' payloads are read from the store (only where somebody waits for the
    results: the leader that proposed it)."""
    try:
        now, commands = decode_entry(data)
        return broker.apply_batch(now, commands, read)
    except (ValueError, msgpack.UnpackException, TypeError, InvalidArgument):
        return []
