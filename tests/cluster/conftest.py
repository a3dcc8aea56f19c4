"""Fixtures for the state machine tests: a broker driven by a fake leader clock."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from raftq.cluster.state import Broker

T0 = 1_700_000_000_000  # ms


class Harness:
    """Plays the leader: stamps ``now`` and receive tokens, applies one command at a time."""

    def __init__(self) -> None:
        self.b = Broker()
        self.now = T0
        self._tokens = 0

    def token(self) -> bytes:
        self._tokens += 1
        return hashlib.sha256(b"token-%d" % self._tokens).digest()[:16]

    def __call__(self, op: str, **fields: Any) -> dict[str, Any]:
        cmd: dict[str, Any] = {"op": op, "now": self.now, **fields}
        if op == "receive" and "token" not in fields:
            cmd["token"] = self.token()
        return self.b.apply(cmd)

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 1000)

    def topic(self, name: str = "t", **config: Any) -> str:
        self("create_topic", topic=name, config=config)
        return name

    def publish(self, topic: str, *payloads: bytes, **extra: Any) -> list[int]:
        res = self("publish", topic=topic, messages=[{"payload": p, **extra} for p in payloads])
        return [m["seq"] for m in res["messages"]]

    def receive(
        self,
        topic: str = "t",
        group: str = "default",
        consumer: str = "c1",
        max: int = 10,
        **kw: Any,
    ) -> list[dict[str, Any]]:
        res = self("receive", topic=topic, group=group, consumer=consumer, max=max, **kw)
        deliveries: list[dict[str, Any]] = res["deliveries"]
        return deliveries

    def gstats(self, topic: str = "t", group: str = "default") -> dict[str, Any]:
        return self.b.group_stats(topic, group)


@pytest.fixture
def h() -> Harness:
    return Harness()
