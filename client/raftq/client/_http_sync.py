"""``Client``'s default ``transport.Transport``: one kept-alive standard-library
``http.client`` connection per origin (a ``Client`` is not thread-safe, so one is enough).

A kept-alive connection the server has closed meanwhile (it reads as EOF) is dropped before use.
One that fails anyway in the way such a connection fails (the server closed it between that
check and the send) is reported ``stale``: the client resends a request that is safe to repeat.
"""

from __future__ import annotations

import http.client
import select
import ssl
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from raftq.client.transport import ConnectFailed, ConnectionDropped, Response, tls_failure

_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class SyncHttpPool:
    def __init__(
        self, *, connect_timeout: float = 2.0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        """``ssl_context`` verifies ``https://`` servers (default: the system's store)."""
        self.connect_timeout = connect_timeout
        self._ssl = ssl_context
        self._conns: dict[str, http.client.HTTPConnection] = {}

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response:
        """Send one request and read its response, all within ``timeout`` seconds."""
        parts = urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        deadline = time.monotonic() + timeout
        self._drop_if_closed(base)
        reused = base in self._conns and self._conns[base].sock is not None
        sent = False
        try:
            conn = self._conn(base, timeout)
            conn.request(method, target, body=body, headers=headers)
            sent = True
            resp = conn.getresponse()
            data = _read_body(conn, resp, deadline)
        except (OSError, http.client.HTTPException) as e:
            dead = self._conns.pop(base, None)
            if dead is not None:
                dead.close()
            if isinstance(e, ssl.SSLError) and not sent and not reused:  # (in the handshake)
                raise tls_failure(e) from e
            err = ConnectionDropped if sent else ConnectFailed
            raise err(repr(e), stale=reused and isinstance(e, _STALE)) from e
        if resp.getheader("Connection", "").lower() == "close":
            conn.close()
            self._conns.pop(base, None)
        got: dict[str, str] = {}
        for name, value in resp.getheaders():
            name = name.lower()
            got[name] = f"{got[name]}, {value}" if name in got else value
        return Response(resp.status, got, data)

    def close(self) -> None:
        """Close the connections; a later request opens new ones."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def _drop_if_closed(self, base: str) -> None:
        """A kept-alive connection the server has closed meanwhile (it reads as EOF) is dropped
        before use: sending on it would leave the outcome of a non-idempotent request unknown."""
        conn = self._conns.get(base)
        sock = conn.sock if conn is not None else None
        if conn is None or sock is None:
            return
        try:
            poller = select.poll()  # (select.select fails for descriptors >= 1024)
            poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            readable = poller.poll(0)
        except (OSError, ValueError):
            readable = [(0, 0)]
        if readable:  # EOF, or bytes nobody asked for: either way not reusable
            conn.close()
            del self._conns[base]

    def _conn(self, base: str, timeout: float) -> http.client.HTTPConnection:
        conn = self._conns.get(base)
        if conn is None:
            parts = urlsplit(base)
            if parts.scheme == "https":
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                conn = http.client.HTTPSConnection(
                    parts.netloc, timeout=min(timeout, self.connect_timeout), context=self._ssl
                )
            else:
                conn = http.client.HTTPConnection(
                    parts.netloc, timeout=min(timeout, self.connect_timeout)
                )
            self._conns[base] = conn
        if conn.sock is None:
            conn.timeout = min(timeout, self.connect_timeout)
            conn.connect()
        conn.sock.settimeout(timeout)
        return conn


def _read_body(
    conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, deadline: float
) -> bytes:
    """The response body, within the deadline as a whole (a socket timeout bounds each read
    only: a server sending a byte now and then would hold the caller for ever)."""
    parts = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the response did not arrive in time")
        if conn.sock is not None:
            conn.sock.settimeout(left)
        part = resp.read1(65536)
        if not part:
            parts.append(resp.read())  # nothing left: this marks the response done (reuse)
            return b"".join(parts)
        parts.append(part)
