"""The client's log (``logging.getLogger("raftq.client")``) and its connection-event hooks,
shared by both clients. A hook that raises is logged and otherwise ignored: it never breaks a
call. Hooks run in the calling thread (the event loop for ``AsyncClient``): they must not
block."""

from __future__ import annotations

import logging
from collections.abc import Callable

from raftq.client._core import Request
from raftq.client.errors import RaftqError

log = logging.getLogger("raftq.client")

LeaderHook = Callable[[str | None, str], None]
DisconnectHook = Callable[[str, BaseException], None]


class Events:
    def __init__(
        self, on_leader_change: LeaderHook | None, on_disconnect: DisconnectHook | None
    ) -> None:
        self._on_leader_change = on_leader_change
        self._on_disconnect = on_disconnect

    def leader_changed(self, old: str | None, new: str) -> None:
        if old is None:
            log.debug("leader is %s", new)
        else:
            log.info("leader changed: %s -> %s", old, new)
        if self._on_leader_change is not None:
            try:
                self._on_leader_change(old, new)
            except Exception:
                log.exception("the on_leader_change hook failed")

    def disconnected(self, url: str, err: BaseException) -> None:
        """A node could not be reached, or dropped a connection or a stream."""
        log.info("lost %s: %s", url, err)
        if self._on_disconnect is not None:
            try:
                self._on_disconnect(url, err)
            except Exception:
                log.exception("the on_disconnect hook failed")

    @staticmethod
    def retrying(req: Request, url: str, err: RaftqError, delay: float, attempt: int) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s %s via %s failed (%s); try %d in %.3f s",
                req.method, req.path, url, err, attempt + 2, delay,
            )  # fmt: skip
