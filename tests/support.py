"""Helpers shared by the process-level test suites: free loopback ports, bounded waits."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, every: float = 0.05) -> T:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except Exception as e:  # the condition may raise while processes come up
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(every)


# Access control is on in every test cluster, as in production: nodes get this bootstrap admin
# token, and clients (RAFTQ_TOKEN, set for the whole test session in tests/conftest.py) send it.
ADMIN_TOKEN = "rq_admin.test-suite-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
