"""WebSocket responses that refuse unmasked client frames.

RFC 6455 (5.1): a client masks every frame it sends, and a server that receives an unmasked
frame fails the connection (close code 1002, protocol error). aiohttp's server reader accepts
them and has no option to refuse them, so ``MaskedWebSocketResponse`` puts ``FrameScanner``
in front of it: the scanner reads each frame's header (2-10 bytes) and skips its mask and
payload, so it costs next to nothing; at the first unmasked frame, the frames before it are
passed on, nothing after, and the stream ends in aiohttp's own protocol error, on which the
response closes with 1002 (``receive`` answers an ``ERROR`` message, then ``CLOSED``).

It relies on aiohttp internals, checked at import: ``WebSocketResponse._post_start`` (where
the reader is made), its ``_reader`` queue, and the request handler's ``_payload_parser`` and
``_message_tail`` (bytes that came with the handshake, fed to the reader as it is installed).
An aiohttp that changed them still serves streams, without this check, and logs a warning once
(this module's tests fail, so an upgrade that breaks it is seen).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import WSCloseCode, web
from aiohttp.http_websocket import WebSocketError
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("raftq.node")

_SLOTS = getattr(RequestHandler, "__slots__", None)
# An aiohttp without these internals still serves (plain responses: unmasked frames accepted,
# as before this module), and says so once at the first stream; the tests of this module fail.
HOOKABLE = callable(getattr(web.WebSocketResponse, "_post_start", None)) and (
    _SLOTS is None or {"_payload_parser", "_message_tail"} <= set(_SLOTS)
)
_warned = False

UNMASKED = "client frames must be masked (RFC 6455 5.1)"
_LENGTH_BYTES = {126: 2, 127: 8}  # a 7-bit length of 126 / 127: the length follows in 2 / 8


class FrameScanner:
    """Follows the frame boundaries of a client's byte stream, chunk by chunk."""

    def __init__(self) -> None:
        self._head = bytearray()  # the current frame's header, as far as it has come
        self._skip = 0  # bytes of the current frame (mask and payload) still to pass

    def scan(self, data: bytes) -> int | None:
        """Where in ``data`` the first unmasked frame starts (0 if its header began in an
        earlier chunk), or None if every frame so far is masked."""
        pos, start, n = 0, 0, len(data)
        while pos < n:
            if self._skip:
                step = min(self._skip, n - pos)
                self._skip -= step
                pos += step
                continue
            head = self._head
            if not head:
                start = pos
            want = 2 if len(head) < 2 else 2 + _LENGTH_BYTES.get(head[1] & 0x7F, 0)
            take = data[pos : pos + want - len(head)]
            head += take
            pos += len(take)
            if len(head) < 2:
                continue
            if not head[1] & 0x80:
                return start
            length = head[1] & 0x7F
            extra = _LENGTH_BYTES.get(length, 0)
            if len(head) < 2 + extra:
                continue
            if extra:
                length = int.from_bytes(head[2 : 2 + extra], "big")
            self._skip = 4 + length  # the masking key, then the payload
            self._head = bytearray()
        return None


class _Guard:
    """Stands between the connection and aiohttp's reader as the handler's payload parser."""

    def __init__(self, reader: Any, queue: Any, scanner: FrameScanner) -> None:
        self._reader = reader
        self._queue = queue
        self._scanner = scanner
        self._failed = False

    def fail(self) -> None:
        self._failed = True
        self._queue.set_exception(WebSocketError(WSCloseCode.PROTOCOL_ERROR, UNMASKED))

    def feed_data(self, data: bytes) -> Any:
        if self._failed:
            return False, b""
        bad = self._scanner.scan(data)
        if bad is None:
            return self._reader.feed_data(data)
        if bad:
            self._reader.feed_data(data[:bad])
        self.fail()
        return False, b""

    def feed_eof(self) -> None:
        self._reader.feed_eof()


class MaskedWebSocketResponse(web.WebSocketResponse):
    """A ``WebSocketResponse`` that closes with 1002 at the first unmasked client frame."""

    def _post_start(self, request: web.BaseRequest, protocol: str | None, writer: Any) -> None:
        handler = request.protocol
        if not HOOKABLE or not hasattr(handler, "_payload_parser"):  # pragma: no cover
            global _warned
            if not _warned:
                _warned = True
                log.warning("this aiohttp lacks the internals wsmask hooks: unmasked WebSocket"
                            " frames are not refused")  # fmt: skip
            super()._post_start(request, protocol, writer)
            return
        scanner = FrameScanner()
        # Bytes a client sent along with its handshake reach the reader as it is installed.
        tail = handler._message_tail
        bad = scanner.scan(tail) if tail else None
        if bad is not None:
            handler._message_tail = tail[:bad]
        super()._post_start(request, protocol, writer)
        guard = _Guard(handler._payload_parser, self._reader, scanner)
        handler._payload_parser = guard
        if bad is not None:
            guard.fail()
