"""The seam between the clients and HTTP: what ``AsyncClient(transport=...)`` and
``Client(transport=...)`` call, and the types that cross it.

A transport sends one HTTP/1.1 request to an absolute URL and returns its response, whatever
the status (a 307 or a 503 is an answer: the client follows redirects, learns the leader from
``X-Raftq-Leader`` and decides about retries itself). It follows no redirects and retries
nothing. The defaults are ``raftq.client._http.HttpPool`` (async) and
``raftq.client._http_sync.SyncHttpPool`` (blocking); a test can pass an object that answers
from a script, with no server.

A failure to get a response is one of two exceptions, by whether the request may have reached
the server; the client's retry decisions rest on that:

- ``ConnectFailed``: it certainly did not (no connection, or the send failed before the whole
  request was out). The client tries again, on another node.
- ``ConnectionDropped``: it may have (the connection died or timed out after the request was
  written, or the response could not be framed). The outcome is unknown: only a request that
  is safe to repeat is sent again.

``TLSFailed`` (a ``ConnectFailed``) says TLS could not be set up: the server's certificate was
not verified, or the handshake failed otherwise (a plain-HTTP server on an ``https://`` URL...).
Nothing was sent; the client does not retry it (``errors.TLSError``). A handshake cut short by
the server closing the connection is a plain ``ConnectFailed``: a node going down does that.

Either may say ``stale=True``: the failure came on a kept-alive connection reused from the pool,
in the way a connection the server had closed while idle fails (reset, broken pipe, closed
before any response byte), so the server most likely never read the request. A request that is
safe to repeat is then sent once more at once (no backoff); any other is treated as above.

Any other exception propagates to the caller of the client method. ``close()`` is called by the
client's own ``close()``: the client owns the transport it is given.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    body: bytes


class HttpError(Exception):
    """A transport failure (not an HTTP error status: those are answers)."""

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


class ConnectFailed(HttpError):
    """The request was not sent (no connection was made, or the send failed)."""


class TLSFailed(ConnectFailed):
    """TLS could not be set up with the server (not a passing failure): nothing was sent."""


def tls_failure(e: ssl.SSLError) -> ConnectFailed:
    """A TLS error met while connecting: ``TLSFailed`` with a message saying what to do, or
    a plain ``ConnectFailed`` when the server just closed the connection mid-handshake."""
    if isinstance(e, ssl.SSLCertVerificationError):
        why = e.verify_message or e.reason or str(e)
        return TLSFailed(
            f"the server's certificate could not be verified ({why}); give the CA that signed"
            " it (ca=, --ca, RAFTQ_CA)"
        )
    if isinstance(e, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return ConnectFailed(f"the server closed the connection during the TLS handshake ({e})")
    reason = e.reason or str(e)
    hint = ""
    if reason == "WRONG_VERSION_NUMBER":
        hint = ": the server does not seem to speak TLS (an http:// node?)"
    elif "ALERT" in reason:
        hint = ": the server refused the handshake (does it require a client certificate?)"
    return TLSFailed(f"TLS handshake failed ({reason}){hint}")


class ConnectionDropped(HttpError):
    """The connection failed after the request was written: it may have been processed."""


class AsyncTransport(Protocol):
    """What ``AsyncClient`` calls. ``headers`` are the complete request headers (the client's
    own and its ``http_headers`` hook's) but ``Host`` and ``Content-Length``, which the
    transport adds; ``timeout`` bounds the whole exchange."""

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """What ``Client`` calls: the blocking twin of ``AsyncTransport``. ``Client`` may be used
    again after ``close()`` (its default transport reconnects), so ``close`` should only drop
    connections."""

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response: ...

    def close(self) -> None: ...
