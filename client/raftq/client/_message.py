"""What a delivery carries, shared by the async and sync message classes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Delivery:
    """One delivery attempt of a message to this consumer."""

    __slots__ = (
        "attempt",
        "deadline_ms",
        "first_received_at_ms",
        "group",
        "headers",
        "ordering_key",
        "payload",
        "published_at_ms",
        "receipt",
        "seq",
        "settled",
        "topic",
    )

    def __init__(self, data: Mapping[str, Any], topic: str, group: str) -> None:
        self.topic: str = str(data.get("topic") or topic)
        self.group: str = str(data.get("group") or group)
        self.seq: int = int(data["seq"])
        self.attempt: int = int(data["attempt"])
        self.receipt: str = str(data["receipt"])
        payload = data["payload"]
        self.payload: bytes = payload if isinstance(payload, bytes) else bytes(payload)
        self.headers: dict[str, str] = dict(data.get("headers") or {})
        self.published_at_ms: int = int(data.get("published_at") or 0)
        self.deadline_ms: int = int(data.get("deadline") or 0)
        # (0 from a node that does not tell)
        self.first_received_at_ms: int = int(data.get("first_received_at") or 0)
        okey = data.get("ordering_key")
        self.ordering_key: str | None = None if okey is None else str(okey)
        self.settled = False

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.topic}/{self.group} seq={self.seq} "
            f"attempt={self.attempt} {len(self.payload)} B>"
        )
