"""Streams over WebSocket: consumers (``GET /topics/{topic}/groups/{group}/stream``) and
publishers (``GET /publish/stream``).

Query: ``prefetch`` (1..1000, default 10), ``visibility`` (seconds, optional), ``format``
(``msgpack``, the default: binary frames; or ``json``: text frames, payloads base64), ``batch``
(``1``: the deliveries of one receive come in one ``deliveries`` frame, not one frame each;
``0``, the default). Any other parameter is refused (400), as is a request without
``Upgrade: websocket`` (426).

The server keeps up to ``prefetch`` unsettled deliveries pushed to the socket; once it has some
out, it tops up when a quarter of ``prefetch`` is free (fewer, larger receives):

    server -> client  {"type": "delivery", "delivery": {topic, group, seq, attempt, receipt, ...}}
                      {"type": "deliveries", "deliveries": [{...}, ...]}       (batch=1)
                      {"type": "result", "id": N, "result": {...}}
                      {"type": "error", "id": N | null, "code", "message", "details"}
    client -> server  {"id": N, "op": "ack" | "nack" | "extend" | "term", "receipts": [...],
                       "delay"?: s, "seconds"?: s, "reason"?: str}   (id null: no answer wanted)

Each settle is one command through group commit, answered after commit and apply. A delivery
stops counting against ``prefetch`` when it is acked, nacked or termed, or when its deadline
passes. When the socket closes, for whatever reason, this consumer's in-flight deliveries are
released at once (a replicated ``release``): a crashed consumer's messages come back without
waiting for their visibility timeout. Streams are served by the leader: a follower answers 307
to the leader's URL (or 503 without one), and a stream whose node loses leadership is closed with
code 4001 so the client reconnects to the new leader (1001 when the node shuts down).

A publish stream (query: ``format`` only) saves a sequential producer the cost of one HTTP
request per publish (about a fifth of a round trip on 2 cores). Each frame is one
``POST /topics/{topic}/publish``, checked and answered the same way, after commit and apply:

    client -> server  {"id": N, "op": "publish", "topic": "t", "messages": [{payload, key?, ...}]}
    server -> client  {"type": "result", "id": N, "result": {"messages": [{seq, duplicate?}]}}
                      {"type": "error", "id": N, "code", "message", "details",
                       "retry_after"?: s}      (topic_full, overloaded...: as Retry-After)

Payloads are raw bytes in binary (msgpack) frames and base64 in text (JSON) frames, whatever
``format`` the answers use. Frames are applied concurrently (up to 1000, or 2 x the body limit
in bytes, in flight per socket; then the server stops reading), so answers may come out of
order: match them by ``id``. A frame over the body limit closes the socket (1009). A frame the
socket closed under may or may not have been applied; publish again with the same keys (over
HTTP or a new stream) to find out without storing twice. At shutdown a publish stream stops
reading, answers what it read, then closes (1001); consumer streams close with 1001 too. One
whose answer cannot be sent (a client gone, or reading nothing for ``SEND_TIMEOUT``) closes
(1008). A client frame that is not masked closes the socket (1002, RFC 6455; ``wsmask``).

Access control: a stream authenticates at its handshake (``Authorization``, or the subprotocol
``bearer.<token>`` beside ``raftq``) and rechecks its token against the replicated state before
each receive, settle and publish frame, so a stream whose token is revoked, disabled or expired
closes (1008); each publish frame needs ``publish`` on its topic, a settle ``consume`` on its
receipts' topics.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgpack
from aiohttp import WSMessage, WSMsgType, web

from raftq.node import codec, commands
from raftq.node.auth import (
    BEARER_SUBPROTOCOL,
    BODY,
    CONSUME,
    PATH,
    PUBLISH,
    SUBPROTOCOL,
    Permission,
)
from raftq.node.errors import ApiError
from raftq.node.messages import may_settle
from raftq.node.routes import Query, Route, path_name, principal, query, recheck
from raftq.node.service import BrokerService, LeaderLost
from raftq.node.wsmask import MaskedWebSocketResponse

log = logging.getLogger(__name__)

MAX_PREFETCH = 1000
FORMAT = Query(
    "format",
    choices=("msgpack", "json"),
    default="msgpack",
    doc="frame format: msgpack (binary frames) or json (text frames, payloads base64)",
)
PUBLISH_FIELDS = dict.fromkeys(("id", "op", "topic", "messages"), commands.ANY)
STREAM_GRACE_S = 1.0  # at shutdown, consumer streams still open after this are cancelled
MAX_PUBLISHES_IN_FLIGHT = 1000  # per publish stream (and 2 x max_body of frames); then it waits
LEADER_CHECK_S = 1.0  # an idle stream on a node that lost the leadership ends within this
SEND_TIMEOUT = 30.0  # a client that reads nothing for this long is cut off (its deliveries return)
CLOSE_GOING_AWAY = 1001  # the node is shutting down
CLOSE_LEADER_CHANGED = 4001
CLOSE_POLICY = 1008  # its answers are not read, or its token was revoked, disabled or expired


def _leader_stream(svc: BrokerService, request: web.Request) -> str:
    """What every stream checks before it upgrades: a WebSocket upgrade, and that this node
    leads (a follower redirects to the leader); returns the ``format`` asked for."""
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    if any(p.startswith(BEARER_SUBPROTOCOL) for p in offered) and SUBPROTOCOL not in offered:
        raise ApiError(
            "invalid_argument",
            f"a token sent as a subprotocol needs the subprotocol {SUBPROTOCOL!r} offered too",
            {"field": "Sec-WebSocket-Protocol"},
        )
    if not web.WebSocketResponse(protocols=(SUBPROTOCOL,)).can_prepare(request).ok:
        raise ApiError(
            "upgrade_required", "this endpoint streams over a WebSocket: send Upgrade: websocket"
        )
    if not svc.leads():
        leader = svc.settings.url(svc.leader_elsewhere().api)
        raise web.HTTPTemporaryRedirect(
            leader + request.path_qs, headers={"X-Raftq-Leader": leader}
        )
    fmt: str = query(request)["format"]
    return fmt


class _Socket:
    """Frames in the negotiated format."""

    def __init__(self, ws: web.WebSocketResponse, fmt: str) -> None:
        self.ws = ws
        self.json = fmt == "json"

    @classmethod
    async def open(cls, svc: BrokerService, request: web.Request, fmt: str) -> _Socket:
        # (protocols: a browser that sent its token as a subprotocol expects one chosen)
        ws = MaskedWebSocketResponse(  # (an unmasked client frame closes it: 1002)
            heartbeat=10.0, max_msg_size=svc.settings.max_body, protocols=(SUBPROTOCOL,)
        )
        await ws.prepare(request)
        return cls(ws, fmt)

    async def send(self, obj: dict[str, Any]) -> None:
        if self.ws.closed:
            return
        try:
            async with asyncio.timeout(SEND_TIMEOUT):
                if self.json:
                    await self.ws.send_str(json.dumps(_b64(obj)))
                else:
                    await self.ws.send_bytes(msgpack.packb(obj, use_bin_type=True))
        except TimeoutError:
            raise ConnectionResetError("the client reads nothing; stream cut off") from None

    async def reply(self, obj: dict[str, Any]) -> None:
        """``send`` for an answer that may find the socket gone (nobody is left to tell)."""
        with contextlib.suppress(ConnectionError):
            await self.send(obj)

    def decode(self, data: str | bytes) -> Any:
        if isinstance(data, bytes):
            return msgpack.unpackb(data, raw=False)
        return json.loads(data)

    async def frames(self) -> AsyncIterator[tuple[Any, WSMessage]]:
        """The client's data frames, decoded (one that does not decode is answered here)."""
        async for msg in self.ws:
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            try:
                frame = self.decode(msg.data)
            except (ValueError, msgpack.UnpackException, RecursionError):
                bad = ApiError("malformed_body", "frame is not valid JSON or msgpack")
                await self.send(_frame_error(None, bad))
                continue
            yield frame, msg


def _frame_error(fid: Any, e: ApiError) -> dict[str, Any]:
    frame = {"type": "error", "id": fid, **e.body()}
    if e.retry_after:  # (an HTTP answer's Retry-After)
        frame["retry_after"] = e.retry_after
    return frame


def _b64(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode()
    if isinstance(obj, dict):
        return {k: _b64(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_b64(v) for v in obj]
    return obj


async def consume(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """``GET /topics/{topic}/groups/{group}/stream``: deliveries pushed over one WebSocket,
    settles read from it (see the module docstring)."""
    topic, group = path_name(request, "topic"), path_name(request, "group")
    q = query(request)
    prefetch = int(q["prefetch"])
    visibility = q["visibility"]
    batch = q["batch"] == "1"
    low_water = max(1, prefetch // 4)
    fmt = _leader_stream(svc, request)
    # The group must exist before the socket opens, so a typo is a plain 404.
    svc.read(lambda b: b.group_stats(topic, group))
    sock = await _Socket.open(svc, request, fmt)
    ws = sock.ws
    who = principal(request)
    consumer = f"ws-{secrets.token_hex(8)}"
    outstanding: dict[str, int] = {}  # receipt -> deadline (ms)
    credit = asyncio.Event()
    receive: dict[str, Any] = {
        "op": "receive",
        "topic": topic,
        "group": group,
        "consumer": consumer,
    }
    if visibility is not None:
        receive["visibility"] = visibility

    def may_receive() -> None:
        recheck(request, who).require(CONSUME, topic)

    async def settle(frame: Any) -> None:
        fid = frame.get("id") if isinstance(frame, dict) else None
        checked = False  # past the frame's own checks: a frame without id gets no answer now
        try:
            if not isinstance(frame, dict):
                raise ApiError("malformed_body", "a frame must be a map")
            codec.check_frame(frame)
            op = frame.get("op")
            if not isinstance(op, str) or op not in commands.SETTLE_FIELDS:
                raise ApiError(
                    "invalid_argument", "frame needs op ack, nack, extend or term", {"field": "op"}
                )
            # The same rules as the HTTP routes (POST /ack ...).
            cmd = commands.settle(op, {k: v for k, v in frame.items() if k not in ("id", "op")})
            may_settle(recheck(request, who), cmd)
            checked = True
            result = await svc.call(cmd)
            receipts: list[str] = cmd["receipts"]
            if op == "extend":
                for r in receipts:
                    if r in outstanding:
                        outstanding[r] = int(result.get("deadline", 0))
            else:
                for r in receipts:
                    outstanding.pop(r, None)
                credit.set()
            if fid is not None:  # a frame without id asks for no answer (fire-and-forget acks)
                await sock.send({"type": "result", "id": fid, "result": result})
        except ApiError as e:
            if fid is not None or not checked:
                await sock.reply(_frame_error(fid, e))
        except LeaderLost:
            # Not applied. The client settles over HTTP instead (which finds the new leader);
            # the stream itself ends with CLOSE_LEADER_CHANGED from the delivery loop.
            if fid is not None:
                lost = ApiError("no_leader", "this node lost the leadership; not applied")
                await sock.reply(_frame_error(fid, lost))
        except ConnectionError:
            pass  # the socket is gone; the stream's own loop ends it
        except Exception:
            log.exception("stream settle failed")
            await sock.reply(_frame_error(fid, ApiError("internal", "internal error; see the log")))

    settles: set[asyncio.Task[None]] = set()

    async def read_loop() -> None:
        async for frame, _ in sock.frames():
            task = asyncio.ensure_future(settle(frame))
            settles.add(task)
            task.add_done_callback(settles.discard)

    reader = asyncio.ensure_future(read_loop())
    close_code, close_msg = 1000, b"done"
    with svc.hold_consumer(consumer, stream=True):
        try:
            loop = asyncio.get_running_loop()
            while not ws.closed and not reader.done() and not svc.draining.is_set():
                if not svc.leads():  # looked at least every LEADER_CHECK_S, idle or not
                    raise LeaderLost()
                may_receive()  # a revoked, disabled or narrowed token's stream ends (1008)
                now_ms = time.time() * 1000
                for r in [r for r, d in outstanding.items() if d <= now_ms]:
                    del outstanding[r]
                room = prefetch - len(outstanding)
                if room <= 0 or (outstanding and room < low_water):
                    credit.clear()
                    soonest = min(outstanding.values()) / 1000 - time.time()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(
                            credit.wait(), timeout=min(LEADER_CHECK_S, max(0.05, soonest))
                        )
                    continue
                # Propose a receive only when one may deliver (a cheap read): an empty receive
                # costs a commit round, and a publish applied meanwhile would wait for it.
                if not await svc.wait_deliverable(topic, group, loop.time() + LEADER_CHECK_S):
                    continue
                may_receive()  # (and again right before each receive: it may have changed)
                res = await svc.call({**receive, "max": room, "token": secrets.token_bytes(16)})
                deliveries = res["deliveries"]
                if not deliveries:
                    await svc.wait_deliverable(topic, group, loop.time() + LEADER_CHECK_S)
                    continue
                for d in deliveries:
                    outstanding[d["receipt"]] = d["deadline"]
                if batch:
                    out = [{"topic": topic, "group": group, **d} for d in deliveries]
                    await sock.send({"type": "deliveries", "deliveries": out})
                    continue
                for d in deliveries:
                    await sock.send(
                        {"type": "delivery", "delivery": {"topic": topic, "group": group, **d}}
                    )
        except ApiError as e:
            code = CLOSE_POLICY if e.code in ("unauthenticated", "forbidden") else 1011
            close_code, close_msg = code, e.message.encode()[:120]
        except LeaderLost:  # the client reconnects to the new leader
            close_code, close_msg = CLOSE_LEADER_CHANGED, b"leader changed"
        except ConnectionError:
            pass
        finally:
            if svc.draining.is_set() and close_code == 1000:  # (or cancelled after the grace)
                close_code, close_msg = CLOSE_GOING_AWAY, b"node shutting down"
            # Settles the client sent before it closed still count: let them finish first,
            # then give back whatever is still in flight.
            await _end(svc, ws, reader, settles, close_code, close_msg)
            svc.spawn(svc.release(consumer))
    return ws


async def publish(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """``GET /publish/stream``: publishes over one WebSocket, each answered after commit and
    apply, exactly as ``POST /topics/{topic}/publish`` (see the module docstring)."""
    sock = await _Socket.open(svc, request, _leader_stream(svc, request))
    ws = sock.ws
    who = principal(request)  # authenticated at the handshake; rechecked for each frame
    lost = asyncio.Event()  # a publish found this node no longer leads
    revoked = asyncio.Event()  # the token is no longer valid (revoked, disabled, expired)
    broken = asyncio.Event()  # an answer could not be sent: the client is gone or reads nothing
    room = asyncio.Semaphore(MAX_PUBLISHES_IN_FLIGHT)
    max_held = 2 * svc.settings.max_body  # (an HTTP connection holds one body at a time)
    publishes: set[asyncio.Task[None]] = set()

    async def publish_frame(frame: Any, binary: bool) -> None:
        fid = frame.get("id") if isinstance(frame, dict) else None
        if not (type(fid) is str or (type(fid) is int and -(2**63) <= fid < 2**64)):
            fid = None  # (an answer could not carry it)
        code = "unanswered"  # (the socket closed, or the stream ended, before the answer)
        try:
            if not isinstance(frame, dict):
                raise ApiError("malformed_body", "a frame must be a map")
            codec.check_frame(frame)
            if fid is None:
                raise ApiError(
                    "invalid_argument",
                    "a publish frame needs an id (a 64-bit integer or a string); its answer "
                    "carries it",
                    {"field": "id"},
                )
            if frame.get("op") != "publish":
                raise ApiError("invalid_argument", "frame needs op publish", {"field": "op"})
            commands.check_fields(frame, PUBLISH_FIELDS)
            messages = frame.get("messages")
            if not isinstance(messages, list):
                raise ApiError("invalid_argument", "messages must be a list", {"field": "messages"})
            topic = commands.name(frame.get("topic"), "topic")
            try:
                current = recheck(request, who)
            except ApiError:
                revoked.set()
                raise
            current.require(PUBLISH, topic)
            # Payloads as the frame came: raw bytes in a binary (msgpack) frame, base64 in text.
            cmd, size = commands.publish(topic, messages, binary)
            res = await svc.call(cmd, size)
            if ws.closed:
                raise ConnectionResetError("the socket closed before the answer")
            await sock.send({"type": "result", "id": fid, "result": {"messages": res["messages"]}})
            code = "ok"
        except ApiError as e:
            code = e.code
            await sock.reply(_frame_error(fid, e))
        except LeaderLost:  # not applied: the client publishes again where the leader is now
            lost.set()
            code = "no_leader"
            gone = ApiError("no_leader", "this node lost the leadership; not applied")
            await sock.reply(_frame_error(fid, gone))
        except ConnectionError:  # (the client learns the outcome by retrying with its keys)
            broken.set()
        except Exception:
            log.exception("stream publish failed")
            code = "internal"
            await sock.reply(_frame_error(fid, ApiError("internal", "internal error; see the log")))
        finally:
            (answered if code == "ok" else svc.metrics.stream_publishes.labels(code)).inc()

    answered = svc.metrics.stream_publishes.labels("ok")
    held = [0]  # bytes of the frames in flight
    freed = asyncio.Event()

    def done(task: asyncio.Task[None], size: int) -> None:
        publishes.discard(task)
        room.release()
        held[0] -= size
        freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("stream publish failed: %r", task.exception())

    async def read_loop() -> None:
        async for frame, msg in sock.frames():
            # Too many frames or bytes in flight: stop reading (TCP pushes back on the client).
            await room.acquire()
            size = len(msg.data)
            while publishes and held[0] + size > max_held:
                freed.clear()
                await freed.wait()
            held[0] += size
            task = asyncio.ensure_future(publish_frame(frame, msg.type == WSMsgType.BINARY))
            publishes.add(task)
            task.add_done_callback(functools.partial(done, size=size))

    reader = asyncio.ensure_future(read_loop())
    stop = asyncio.ensure_future(_first(svc.draining, lost, broken, revoked))
    close_code, close_msg = 1000, b"done"
    try:
        while not reader.done() and not stop.done():
            if not svc.leads():  # looked at least every LEADER_CHECK_S, idle or not
                lost.set()
                break
            await asyncio.wait(
                {reader, stop}, timeout=LEADER_CHECK_S, return_when=asyncio.FIRST_COMPLETED
            )
    finally:  # (also when shutdown cancels this handler: what was read is still answered)
        if lost.is_set():  # the client reconnects to the new leader
            close_code, close_msg = CLOSE_LEADER_CHANGED, b"leader changed"
        elif svc.draining.is_set():
            close_code, close_msg = CLOSE_GOING_AWAY, b"node shutting down"
        elif broken.is_set():
            close_code, close_msg = CLOSE_POLICY, b"answers are not read"
        elif revoked.is_set():
            close_code, close_msg = CLOSE_POLICY, b"the token is no longer valid"
        stop.cancel()
        # Publishes already read are answered before the close (frames not read yet are not
        # applied; the client's retry with the same keys publishes them once).
        await _end(svc, ws, reader, publishes, close_code, close_msg)
    return ws


async def _end(
    svc: BrokerService,
    ws: web.WebSocketResponse,
    reader: asyncio.Future[None],
    pending: set[asyncio.Task[None]],
    close_code: int,
    close_msg: bytes,
) -> None:
    """End a stream: stop reading frames, let those already read finish (bounded), close."""
    if reader.done() and not reader.cancelled() and reader.exception() is not None:
        err = reader.exception()
        if not isinstance(err, ConnectionError):
            log.error("stream reader failed: %r", err)
            close_code, close_msg = 1011, b"internal error reading frames"
    if not reader.done():
        reader.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await reader
    if pending:
        await asyncio.wait(set(pending), timeout=svc.settings.propose_timeout + 1)
    for task in list(pending):
        task.cancel()
    with contextlib.suppress(Exception):
        await ws.close(code=close_code, message=close_msg)


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class Streams:
    """The open streams, for shutdown: publishers end by themselves once what they read is
    answered (bounded by the propose timeout), so no answer is lost to a grace period;
    consumers still open ``STREAM_GRACE_S`` after shutdown began are cancelled (their cleanup
    still releases their consumer)."""

    def __init__(self, svc: BrokerService) -> None:
        self.svc = svc
        self.consumers: set[asyncio.Task[Any]] = set()
        self.publishers: set[asyncio.Task[Any]] = set()
        svc.metrics.gauge(
            "raftq_streams_open", "open WebSocket streams (consumers and publishers)",
            lambda: len(self.consumers) + len(self.publishers),
        )  # fmt: skip

    async def run(
        self, handler: Awaitable[web.StreamResponse], streams: set[asyncio.Task[Any]]
    ) -> web.StreamResponse:
        """Run a WebSocket handler as one of ``streams``."""
        task = asyncio.current_task()
        assert task is not None
        streams.add(task)
        try:
            return await handler
        finally:
            streams.discard(task)

    async def on_shutdown(self, app: web.Application) -> None:
        # Streams notice draining at their next turn; one still blocked after a grace period
        # is cancelled, so shutdown stays bounded.
        if self.consumers:
            asyncio.get_running_loop().call_later(STREAM_GRACE_S, self._cancel_consumers)

    def _cancel_consumers(self) -> None:
        if not self.consumers:
            return
        self.svc.release_streams()
        for task in list(self.consumers):
            task.cancel()


STREAMS: web.AppKey[Streams] = web.AppKey("streams", Streams)


async def consume_stream(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    streams = request.app[STREAMS]
    return await streams.run(consume(svc, request), streams.consumers)


async def publish_stream(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    streams = request.app[STREAMS]
    return await streams.run(publish(svc, request), streams.publishers)


ROUTES = [
    Route("GET", "/topics/{topic}/groups/{group}/stream", consume_stream,
          "WebSocket streaming consumer (see raftq.node.stream); a follower redirects (307) to "
          "the leader", stream=True, ok=(101,),
          query=(Query("prefetch", kind="number", lo=1, hi=MAX_PREFETCH, default=10,
                       doc="unsettled deliveries kept out at once"),
                 Query("visibility", kind="number", lo=0.001, hi=12 * 3600,
                       doc="visibility timeout of each delivery, seconds (else the group's)"),
                 FORMAT,
                 Query("batch", choices=("0", "1"), default="0",
                       doc="1: the deliveries of one receive in one frame")),
          op="consumeStream", perm=Permission(CONSUME, PATH)),
    Route("GET", "/publish/stream", publish_stream,
          "WebSocket publisher: each frame is one batch publish, answered after commit (see "
          "raftq.node.stream); a follower redirects (307) to the leader",
          stream=True, ok=(101,), query=(FORMAT,), op="publishStream",
          perm=Permission(PUBLISH, BODY)),
]  # fmt: skip
