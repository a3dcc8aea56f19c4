"""The HTTP API of one node: routes, handlers, leader proxying, long polls, the tick timer.

``build_app(raft, settings)`` returns an aiohttp application bound to anything implementing the
``raftapi.Raft`` protocol (the real ``RaftNode`` or ``LocalRaft``). Every state change is one
command submitted to the group-commit ``Batcher`` and answered only after commit and apply. A
node that is not the leader forwards every broker request to the leader (one hop, marked with
``X-Raftq-Forwarded``); with no known leader it answers 503 + ``Retry-After``. Handlers never
read broker state except through ``raft.read`` and never change it except through a proposal.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from raftq.cluster import validate
from raftq.cluster.errors import BrokerError
from raftq.cluster.state import Broker
from raftq.node import codec
from raftq.node.batcher import Batcher
from raftq.node.httperrors import ApiError
from raftq.node.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from raftq.node.metrics import NodeMetrics
from raftq.node.raftapi import (
    EntryTooLarge,
    NotLeader,
    QueueFull,
    Raft,
    RaftError,
    ReadNotReady,
    UnknownOutcome,
)
from raftq.node.stream import PUBLISH_QUERY
from raftq.node.stream import QUERY as STREAM_QUERY

log = logging.getLogger("raftq.node")

FORWARDED = "X-Raftq-Forwarded"
READ_RETRY_S = 0.02  # a read that reached a leader not ready yet (see Api.read_latest)
LEADER_HEADER = "X-Raftq-Leader"
MAX_WAIT_S = 20.0
STREAM_GRACE_S = 1.0
FOLLOWER_TICKER_S = 0.05  # how soon a new leader's timer starts (due deadlines slip this much)
# Served by every node from its own state; everything else is the leader's business.
LOCAL_PATHS = frozenset(["/cluster", "/healthz", "/readyz", "/metrics", "/openapi.json"])
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class NodeSettings:
    node_id: str = "n1"
    max_body: int = 8 << 20
    batch_max_ops: int = 512
    batch_max_bytes: int = 1 << 20
    batch_linger: float = 0.001
    max_inflight: int = 4
    propose_timeout: float = 5.0
    proxy_timeout: float = MAX_WAIT_S + 15.0
    retry_after: int = 1


def _raft_stopped(e: RaftError, retry_after: int) -> ApiError:
    return ApiError(
        "shutting_down",
        f"this node's Raft has stopped ({e}); see its log, and use another node",
        retry_after=retry_after,
    )


class LeaderLost(Exception):
    """The proposal was refused because this node is not (or no longer) the leader: the command
    was definitely not applied, so the request may be forwarded to the leader."""


# ---------------------------------------------------------------------- input checking

NUM = "number"
INT = "integer"
STR = "string"
MAP = "map"
LIST = "list"
BOOL = "boolean"


def _is(value: Any, kind: str) -> bool:
    if kind == NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    if kind == MAP:
        return isinstance(value, dict)
    if kind == LIST:
        return isinstance(value, list)
    if kind == BOOL:
        return isinstance(value, bool)
    return True  # "any": checked later (payload)


def check_fields(
    body: dict[str, Any], allowed: dict[str, str], required: tuple[str, ...] = (), where: str = ""
) -> dict[str, Any]:
    """Reject unknown fields, missing required ones and wrong JSON types, naming the field."""
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise ApiError(
            "unknown_field",
            f"unknown field(s) {where}{', '.join(unknown)}",
            {"fields": unknown},
        )
    for f in required:
        if body.get(f) is None:
            raise ApiError("invalid_argument", f"{where}{f} is required", {"field": f})
    for f, kind in allowed.items():
        value = body.get(f)
        if value is not None and not _is(value, kind):
            raise ApiError("invalid_argument", f"{where}{f} must be a {kind}", {"field": f})
    return body


def _name(value: Any, field: str) -> str:
    try:
        return validate.name(value, field)
    except BrokerError as e:
        raise ApiError.from_wire(e.to_wire()) from None


MESSAGE_FIELDS = {"payload": "any", "headers": MAP, "key": STR, "delay": NUM}


_PLAIN_MESSAGE_KEYS = frozenset(("payload", "key"))


def _message(m: Any, where: str, msgpack_body: bool) -> tuple[dict[str, Any], int]:
    # Fast path for the common msgpack shape {payload: bytes, key?: str} (the client's own):
    # nothing to convert or drop, so the decoded map itself becomes the command's message.
    if msgpack_body and type(m) is dict and m.keys() <= _PLAIN_MESSAGE_KEYS:
        payload = m.get("payload")
        key = m.get("key", "-")
        if type(payload) is bytes and type(key) is str and key:
            return m, len(payload)
    if not isinstance(m, dict):
        raise ApiError("invalid_argument", f"{where} must be a map", {"field": "messages"})
    check_fields(m, MESSAGE_FIELDS, ("payload",), where + ".")
    if m.get("key") == "":
        # A key names one message for dedup: "" would make every keyed publish after the
        # first a "duplicate" of it (dropped) for the whole dedup window.
        raise ApiError(
            "invalid_argument", f"{where}.key must not be empty (omit it for no key)",
            {"field": "key"},
        )  # fmt: skip
    out = dict(m)
    out["payload"] = codec.payload_in(m["payload"], where + ".payload", msgpack_body)
    for k in ("headers", "key", "delay"):
        if out.get(k) is None:
            out.pop(k, None)
    return out, len(out["payload"])


def publish_command(
    topic: str, messages: list[Any], msgpack_body: bool
) -> tuple[dict[str, Any], int]:
    """The ``publish`` command for a batch of wire messages, and its payload bytes."""
    if not messages:
        raise ApiError("invalid_argument", "messages must not be empty", {"field": "messages"})
    msgs, size = [], 0
    for i, m in enumerate(messages):
        msg, n = _message(m, f"messages[{i}]", msgpack_body)
        msgs.append(msg)
        size += n
    return {"op": "publish", "topic": topic, "messages": msgs}, size


# ---------------------------------------------------------------------- the API


class Api:
    def __init__(self, raft: Raft, settings: NodeSettings) -> None:
        self.raft = raft
        self.settings = settings
        self.metrics = NodeMetrics(raft)
        self.batcher = Batcher(
            raft.propose,
            max_ops=settings.batch_max_ops,
            max_bytes=settings.batch_max_bytes,
            linger=settings.batch_linger,
            max_inflight=settings.max_inflight,
            timeout=settings.propose_timeout,
            on_batch=self.metrics.on_batch,
            # refused before anything was appended, so a batch may be retried in halves
            splittable=lambda e: isinstance(
                e, EntryTooLarge | TypeError | OverflowError | UnicodeEncodeError
            ),
        )
        self.session: aiohttp.ClientSession | None = None
        self.draining = asyncio.Event()
        self._caught_up = False  # /readyz: applied the leader's commit index once since start
        # The ticker's wake-up on the next applied entries (leader only; see _ticker).
        self._apply_signal: asyncio.Future[None] | None = None
        # What the ticker sleeps until (ms: the next due time, at most 1 s ahead); None while
        # it is not asleep on one.
        self._ticker_until: float | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # consumer id -> number of open connections holding it (long polls, streams)
        self.held_consumers: dict[str, int] = {}
        self.stream_consumers: set[str] = set()  # the streams' own (ids unique per stream)
        self.started = time.monotonic()
        # long polls waiting for something deliverable, per (topic, group)
        self._waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self._streams: set[asyncio.Task[Any]] = set()  # consumers': cancelled after a grace
        # Publishers' end by themselves at shutdown once what they read is answered (bounded
        # by propose_timeout), so an answer is not lost to the grace period.
        self._publish_streams: set[asyncio.Task[Any]] = set()
        self.metrics.gauge(
            "raftq_long_polls_waiting",
            "receive requests waiting for a deliverable message",
            lambda: sum(len(w) for w in self._waiters.values()),
        )
        self.metrics.gauge(
            "raftq_streams_open", "open WebSocket streams (consumers and publishers)",
            lambda: len(self._streams) + len(self._publish_streams),
        )  # fmt: skip
        self.metrics.gauge(
            "raftq_consumers_held",
            "consumer ids held by open connections (long polls, streams)",
            lambda: len(self.held_consumers),
        )
        self.stream_resources: set[web.AbstractResource] = set()
        self.receive_resource: web.AbstractResource | None = None

    # ------------------------------------------------------------------ plumbing

    def _wants_apply(self) -> bool:
        """Asked on the Raft thread after entries were applied: wake the loop only if somebody
        waits (a follower's loop then sleeps through replication), and the leader's ticker
        only if something now falls due before it wakes anyway (a plain publish moves nothing
        earlier: its wake-up per entry cost ~35 us on the way to the response)."""
        if self._waiters:
            return True
        if self._apply_signal is None:
            return False
        until = self._ticker_until
        if until is None:
            return True
        due = self.raft.read(lambda b: b.next_due())
        return due is not None and due < until

    def _on_apply(self) -> None:
        """On the loop, after a Raft tick that applied entries (if ``_wants_apply``)."""
        signal, self._apply_signal = self._apply_signal, None
        if signal is not None and not signal.done():
            signal.set_result(None)
        if self._waiters:
            self._check_waiters()

    def _arm_apply_signal(self) -> asyncio.Future[None]:
        """Arm before reading the state the wait depends on (see ``add_apply_listener``)."""
        signal = self._apply_signal
        if signal is None or signal.done():
            signal = self._apply_signal = asyncio.get_running_loop().create_future()
        return signal

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run background work (releases) that must outlive the request that started it."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def call(self, command: dict[str, Any], size: int = 0) -> dict[str, Any]:
        """Propose one command through group commit; return its result or raise ApiError."""
        try:
            result = await self.batcher.submit(command, size)
        except NotLeader:
            raise LeaderLost() from None
        except EntryTooLarge as e:
            raise ApiError(
                "entry_too_large", f"the request is too large to replicate: {e}"
            ) from None
        except (TypeError, OverflowError, UnicodeEncodeError) as e:  # could not be encoded
            raise ApiError(
                "invalid_argument", f"the request holds an unsupported value: {e}"
            ) from None
        except QueueFull:
            raise ApiError(
                "overloaded",
                "the Raft queue is full; the command was not applied",
                retry_after=self.settings.retry_after,
            ) from None
        except (UnknownOutcome, TimeoutError):
            raise ApiError(
                "outcome_unknown",
                "the command may or may not have been applied (timeout or leader change)",
            ) from None
        except RaftError as e:  # this node's Raft stopped (a failed disk): not applied here
            raise _raft_stopped(e, self.settings.retry_after) from None
        err = result.get("error")
        if err is not None:
            raise ApiError.from_wire(err)
        return result

    def read(self, fn: Callable[[Broker], Any]) -> Any:
        try:
            return self.raft.read(fn)
        except BrokerError as e:
            raise ApiError.from_wire(e.to_wire()) from None

    async def read_latest(self, fn: Callable[[Broker], Any]) -> Any:
        """``read`` that sees every write acknowledged before the request (linearizable): the
        leader first confirms, with a majority, that it still leads (``read_barrier``). A
        leader cut off from the others no longer answers from stale state."""
        deadline = time.monotonic() + self.settings.propose_timeout
        while True:
            try:
                await self.raft.read_barrier(max(0.0, deadline - time.monotonic()))
                break
            except NotLeader:
                raise LeaderLost() from None
            except ReadNotReady:  # just elected: its first entry commits within a heartbeat
                if time.monotonic() + READ_RETRY_S < deadline:
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                raise ApiError(
                    "no_leader",
                    "the new leader is not ready to serve reads yet; retry shortly",
                    retry_after=self.settings.retry_after,
                ) from None
            except TimeoutError:
                raise ApiError(
                    "no_leader",
                    "could not confirm with a majority that this node still leads; retry",
                    retry_after=self.settings.retry_after,
                ) from None
            except RaftError as e:
                raise _raft_stopped(e, self.settings.retry_after) from None
        return self.read(fn)

    @contextlib.contextmanager
    def hold_consumer(self, consumer: str, stream: bool = False) -> Iterator[None]:
        """Mark a consumer id as owned by an open connection; at shutdown, whatever is still
        held is released (so its deliveries go back at once instead of timing out)."""
        self.held_consumers[consumer] = self.held_consumers.get(consumer, 0) + 1
        if stream:
            self.stream_consumers.add(consumer)
        try:
            yield
        finally:
            n = self.held_consumers[consumer] - 1
            if n:
                self.held_consumers[consumer] = n
            else:
                del self.held_consumers[consumer]
            if stream:
                self.stream_consumers.discard(consumer)

    async def release(self, consumer: str) -> None:
        """Give back a consumer's deliveries now (here, or at the leader if it moved)."""
        try:
            await self.call({"op": "release", "consumer": consumer})
        except LeaderLost:
            st = self.raft.status()
            if st.leader_api and st.leader_id != st.node_id and self.session is not None:
                await self._release_at(st.leader_api, consumer)
            else:
                log.warning("release of consumer %s failed: no leader", consumer)
        except ApiError as e:
            log.warning("release of consumer %s failed: %s", consumer, e)

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        self.raft.add_apply_listener(self._on_apply, self._wants_apply)
        # No pool limit: every proxied long poll holds one connection to the leader.
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.batcher.start()
        ticker = asyncio.ensure_future(self._ticker())
        yield
        self.draining.set()
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        for consumer in list(self.held_consumers):
            self.spawn(self.release(consumer))
        # Releases and group commit share one bound (server.DRAIN_S).
        drain_end = time.monotonic() + self.settings.propose_timeout + 1
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.settings.propose_timeout + 1)
        await self.batcher.stop(max(0.0, drain_end - time.monotonic()))
        await self.session.close()

    async def on_shutdown(self, app: web.Application) -> None:
        # Runs before aiohttp waits for in-flight handlers: make long polls answer now.
        self.draining.set()
        self._wake_all_waiters()
        # Streams notice draining at their next turn; one still blocked after a grace period
        # is cancelled (its cleanup still releases its consumer), so shutdown stays bounded.
        if self._streams:
            asyncio.get_running_loop().call_later(STREAM_GRACE_S, self._cancel_streams)

    def _cancel_streams(self) -> None:
        if not self._streams:
            return
        # Give back what the still-open streams hold first: a cancelled handler's own cleanup
        # may itself be cut short. (Not long polls' consumers: a release applied before their
        # receive would leave what it delivers held.)
        for consumer in list(self.stream_consumers):
            self.spawn(self.release(consumer))
        for task in list(self._streams):
            task.cancel()

    async def _ticker(self) -> None:
        """Leader only: propose a ``tick`` when the earliest deadline / delay / retention is due.
        Re-armed after every tick that applied entries, so there is no fixed-rate scan; a
        follower looks every ``FOLLOWER_TICKER_S`` whether it leads now."""
        last_ticked: int | None = None
        while True:
            try:
                self._ticker_until = None  # first: an apply from here on wakes us
                if not self.raft.is_leader():
                    self._apply_signal = None
                    await asyncio.sleep(FOLLOWER_TICKER_S)
                    continue
                signal = self._arm_apply_signal()
                due = self.raft.read(lambda b: b.next_due())
                now = time.time() * 1000
                if due is not None and due <= now:
                    if due == last_ticked:  # a tick did not move it: never spin on that
                        await asyncio.sleep(0.05)
                    last_ticked = due
                    await self.call({"op": "tick"})
                    continue
                wait = 1.0 if due is None else min(1.0, (due - now) / 1000 + 0.001)
                self._ticker_until = now + 1000 if due is None else min(due, now + 1000)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await signal  # cancelled by the timeout: the next turn arms anew
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let the timer die; try again shortly
                log.debug("tick failed: %r", e)
                await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ middlewares

    @web.middleware
    async def errors_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = _route_name(request)
        t0 = time.perf_counter()
        status = 500
        try:
            if request.method not in ("GET", "HEAD"):
                codec.check_accept(request)  # before a write is applied; a read falls back to JSON
            if request.query and request.path not in LOCAL_PATHS:
                _check_query(request, route)  # (probes and scrapers may add their own)
            resp = await handler(request)
            status = resp.status
            return resp
        except BrokerError as e:
            err = ApiError.from_wire(e.to_wire())
            status = err.status
            return _error_response(err)
        except web.HTTPException as e:
            if e.status < 400:  # a redirect (streams on a follower)
                status = e.status
                raise
            code = {404: "route_not_found", 405: "method_not_allowed"}.get(e.status)
            if e.status == 413:
                code = "body_too_large"
            message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
            if e.status == 405:
                message = f"{request.method} is not allowed here; allowed: {e.headers['Allow']}"
            err = ApiError(code or "malformed_body", message)
            status = err.status
            resp = _error_response(err)
            if "Allow" in e.headers:  # a 405 says what is allowed (RFC 9110)
                resp.headers["Allow"] = e.headers["Allow"]
            return resp
        except ApiError as e:
            status = e.status
            resp = _error_response(e)
            if e.close:
                resp.force_close()
            return resp
        except (asyncio.CancelledError, ConnectionError):  # the client went away
            status = 499
            raise
        except Exception:
            log.exception("internal error on %s %s", request.method, request.path)
            return _error_response(ApiError("internal", "internal error; see the node log"))
        finally:
            method = request.method if request.method in _METHODS else "other"
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - t0)

    @web.middleware
    async def leader_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.path in LOCAL_PATHS
            or request.match_info.http_exception is not None
            or request.match_info.route.resource in self.stream_resources
        ):
            # Streams (WebSocket) redirect to the leader themselves instead of being proxied.
            return await handler(request)
        if not self.raft.is_leader():
            return await self.proxy(request)
        try:
            return await handler(request)
        except LeaderLost:
            return await self.proxy(request)

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        """Forward a request to the leader, once; answer its response as is."""
        if request.headers.get(FORWARDED):
            raise ApiError(
                "no_leader",
                "forwarded to a node that is not the leader",
                retry_after=self.settings.retry_after,
            )
        if self.draining.is_set():
            raise ApiError(
                "shutting_down", "this node is shutting down", retry_after=self.settings.retry_after
            )
        st = self.raft.status()
        if not st.leader_api or st.leader_id == st.node_id:
            raise ApiError(
                "no_leader",
                "no leader is known right now; retry shortly",
                retry_after=self.settings.retry_after,
            )
        body = await codec.read_raw(request)
        if request.match_info.route.resource is not self.receive_resource:
            return await self._forward(request, st, body)
        # A proxied receive: name its consumer here, so that if our client goes away before
        # the deliveries are written to it, we can give them back at once (second hop of the
        # dead man's switch; the leader covers the first).
        mp = codec.is_msgpack_request(request)
        try:
            obj = codec.decode_body(body, mp)
        except ApiError:
            return await self._forward(request, st, body)  # the leader explains the error
        consumer = obj.get("consumer")
        if consumer is None or consumer == "":  # anything else goes as is: the leader checks it
            consumer = obj["consumer"] = f"c-{secrets.token_hex(8)}"
            body = codec.encode(obj, mp)[0]
        fwd = asyncio.ensure_future(self._forward(request, st, body))
        try:
            drain = asyncio.ensure_future(self.draining.wait())
            try:
                await asyncio.wait({fwd, drain}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                drain.cancel()
            if not fwd.done():
                # Shutting down: end the long poll now (as if it timed out); closing the
                # upstream connection makes the leader release anything it had just handed out.
                fwd.cancel()
                with contextlib.suppress(asyncio.CancelledError, ApiError):
                    await fwd
                if isinstance(consumer, str) and st.leader_api:
                    self.spawn(self._release_at(st.leader_api, consumer))
                return codec.respond(request, {"consumer": consumer, "deliveries": []})
            resp = fwd.result()
            if resp.status == 200:
                transport = request.transport
                if transport is None or transport.is_closing():
                    raise ConnectionResetError("client went away")
                await resp.prepare(request)
                await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionError):
            fwd.cancel()
            if isinstance(consumer, str) and st.leader_api:
                self.spawn(self._release_at(st.leader_api, consumer))
            raise
        except ApiError as e:
            # Lost the leader's answer (504): whatever it handed out reaches nobody; give it
            # back, as the leader does when its own client goes away.
            if e.code == "outcome_unknown" and isinstance(consumer, str) and st.leader_api:
                self.spawn(self._release_at(st.leader_api, consumer))
            raise

    async def _forward(self, request: web.Request, st: Any, body: bytes) -> web.Response:
        headers = {FORWARDED: self.settings.node_id}
        for h in ("Content-Type", "Accept"):
            if h in request.headers:
                headers[h] = request.headers[h]
        assert self.session is not None
        url = f"http://{st.leader_api}{request.path_qs}"
        self.metrics.proxied.inc()
        try:
            async with self.session.request(
                request.method,
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.settings.proxy_timeout),
            ) as r:
                data = await r.read()
                status, ctype, upstream = r.status, r.content_type, r.headers
        except aiohttp.ClientConnectorError:
            raise ApiError(
                "no_leader",
                f"leader {st.leader_id} at {st.leader_api} is unreachable",
                {"leader": st.leader_id},
                retry_after=self.settings.retry_after,
            ) from None
        except (aiohttp.ClientError, TimeoutError):
            if request.method in ("GET", "HEAD"):
                raise ApiError("no_leader", "the leader did not answer", retry_after=1) from None
            raise ApiError(
                "outcome_unknown",
                f"lost the connection to leader {st.leader_id}; the request may have been applied",
                {"leader": st.leader_id},
            ) from None
        out = {LEADER_HEADER: f"http://{st.leader_api}" if st.leader_api else ""}
        if "Retry-After" in upstream:
            out["Retry-After"] = upstream["Retry-After"]
        return web.Response(status=status, body=data, headers=out, content_type=ctype)

    async def _release_at(self, leader_api: str, consumer: str) -> None:
        assert self.session is not None
        try:
            async with self.session.post(
                f"http://{leader_api}/consumers/{urllib.parse.quote(consumer, safe='')}/release",
                headers={FORWARDED: self.settings.node_id},
                timeout=aiohttp.ClientTimeout(total=self.settings.propose_timeout + 1),
            ) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("release of consumer %s via the leader failed: %r", consumer, e)

    # ------------------------------------------------------------------ topics and groups

    async def list_topics(self, request: web.Request) -> web.StreamResponse:
        topics = await self.read_latest(lambda b: b.list_topics())
        return codec.respond(request, {"topics": topics})

    async def create_topic(self, request: web.Request) -> web.StreamResponse:
        body = check_fields(
            await codec.read_body(request),
            {"topic": STR, "config": MAP, "groups": LIST, "if_not_exists": BOOL},
            ("topic",),
        )
        _name(body["topic"], "topic")
        for i, spec in enumerate(body.get("groups") or []):
            where = f"groups[{i}]."
            if not isinstance(spec, dict):
                raise ApiError(
                    "invalid_argument", f"groups[{i}] must be a map", {"field": "groups"}
                )
            check_fields(spec, {"group": STR, "config": MAP}, ("group",), where)
        cmd = {"op": "create_topic", **{k: v for k, v in body.items() if v is not None}}
        res = await self.call(cmd)
        return codec.respond(request, res, 201 if res.get("created") else 200)

    async def get_topic(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        return codec.respond(request, await self.read_latest(lambda b: b.topic_stats(topic)))

    async def update_topic(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        body = check_fields(await codec.read_body(request), {"config": MAP}, ("config",))
        res = await self.call({"op": "update_topic", "topic": topic, "config": body["config"]})
        return codec.respond(request, res)

    async def delete_topic(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        return codec.respond(request, await self.call({"op": "delete_topic", "topic": topic}))

    async def purge_topic(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        check_fields(await codec.read_body(request), {})
        return codec.respond(request, await self.call({"op": "purge", "topic": topic}))

    async def list_groups(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        stats = await self.read_latest(lambda b: b.topic_stats(topic))
        return codec.respond(request, {"topic": topic, "groups": stats["groups"]})

    async def create_group(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        body = check_fields(
            await codec.read_body(request),
            {"group": STR, "config": MAP, "start": STR, "if_not_exists": BOOL},
            ("group",),
        )
        _name(body["group"], "group")
        cmd = {"op": "create_group", "topic": topic}
        cmd.update({k: v for k, v in body.items() if v is not None})
        res = await self.call(cmd)
        return codec.respond(request, res, 201 if res.get("created") else 200)

    def _tg(self, request: web.Request) -> tuple[str, str]:
        return (
            _name(request.match_info["topic"], "topic"),
            _name(request.match_info["group"], "group"),
        )

    async def get_group(self, request: web.Request) -> web.StreamResponse:
        topic, group = self._tg(request)
        stats = await self.read_latest(lambda b: b.group_stats(topic, group))
        return codec.respond(request, stats)

    async def update_group(self, request: web.Request) -> web.StreamResponse:
        topic, group = self._tg(request)
        body = check_fields(await codec.read_body(request), {"config": MAP}, ("config",))
        cmd = {"op": "update_group", "topic": topic, "group": group, "config": body["config"]}
        return codec.respond(request, await self.call(cmd))

    async def delete_group(self, request: web.Request) -> web.StreamResponse:
        topic, group = self._tg(request)
        cmd = {"op": "delete_group", "topic": topic, "group": group}
        return codec.respond(request, await self.call(cmd))

    async def purge_group(self, request: web.Request) -> web.StreamResponse:
        topic, group = self._tg(request)
        check_fields(await codec.read_body(request), {})
        cmd = {"op": "purge", "topic": topic, "group": group}
        return codec.respond(request, await self.call(cmd))

    # ------------------------------------------------------------------ messages

    async def publish_one(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        msg, size = _message(
            await codec.read_body(request), "message", codec.is_msgpack_request(request)
        )
        res = await self.call({"op": "publish", "topic": topic, "messages": [msg]}, size)
        return codec.respond(request, res["messages"][0])

    async def publish_batch(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        body = check_fields(await codec.read_body(request), {"messages": LIST}, ("messages",))
        cmd, size = publish_command(topic, body["messages"], codec.is_msgpack_request(request))
        res = await self.call(cmd, size)
        return codec.respond(request, {"messages": res["messages"]})

    async def publish_stream(self, request: web.Request) -> web.StreamResponse:
        from raftq.node.stream import publish_stream

        return await self._as_stream(publish_stream(self, request), self._publish_streams)

    async def peek(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        from_seq = _query_int(codec.query_one(request, "from_seq"), "from_seq", None)
        limit = _query_int(codec.query_one(request, "limit"), "limit", 10)
        assert limit is not None
        msgs = await self.read_latest(lambda b: b.peek(topic, from_seq, limit))
        return codec.respond(request, {"topic": topic, "messages": msgs})

    async def redrive(self, request: web.Request) -> web.StreamResponse:
        topic = _name(request.match_info["topic"], "topic")
        body = check_fields(await codec.read_body(request), {"max": INT})
        cmd: dict[str, Any] = {"op": "redrive", "topic": topic}
        if body.get("max") is not None:
            cmd["max"] = body["max"]
        return codec.respond(request, await self.call(cmd))

    async def receive(self, request: web.Request) -> web.StreamResponse:
        """Long poll: propose a receive; while it comes back empty, wait for applied entries
        that may have made something deliverable, up to ``wait`` seconds. Deliveries whose
        connection closes before the response is written are released at once."""
        topic, group = self._tg(request)
        body = check_fields(
            await codec.read_body(request),
            {"consumer": STR, "max": INT, "wait": NUM, "visibility": NUM},
        )
        consumer = body.get("consumer") or f"c-{secrets.token_hex(8)}"
        if len(consumer) > 256:
            raise ApiError(
                "invalid_argument", "consumer is longer than 256 characters", {"field": "consumer"}
            )
        wait = body.get("wait") or 0
        if not 0 <= wait <= MAX_WAIT_S:
            raise ApiError(
                "invalid_argument",
                f"wait must be between 0 and {MAX_WAIT_S} seconds",
                {"field": "wait"},
            )
        cmd: dict[str, Any] = {
            "op": "receive",
            "topic": topic,
            "group": group,
            "consumer": consumer,
        }
        for k in ("max", "visibility"):
            if body.get(k) is not None:
                cmd[k] = body[k]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        proposed = False
        deliveries: list[dict[str, Any]] = []
        with self.hold_consumer(consumer):
            try:
                while True:
                    proposed = True
                    res = await self.call({**cmd, "token": secrets.token_bytes(16)})
                    deliveries = res["deliveries"]
                    if deliveries or self.draining.is_set():
                        break
                    if not await self._wait_deliverable(topic, group, deadline):
                        break
                out = {
                    "consumer": consumer,
                    "deliveries": [{"topic": topic, "group": group, **d} for d in deliveries],
                }
                resp = codec.respond(request, out)
                transport = request.transport
                if deliveries and (transport is None or transport.is_closing()):
                    raise ConnectionResetError("client went away")
                await resp.prepare(request)
                await resp.write_eof()
                return resp
            except (asyncio.CancelledError, ConnectionError):
                if proposed:
                    self.spawn(self.release(consumer))
                raise
            except ApiError as e:
                if e.code == "outcome_unknown":  # it may have handed out deliveries: undo
                    self.spawn(self.release(consumer))
                raise

    async def _wait_deliverable(self, topic: str, group: str, deadline: float) -> bool:
        """Wait until the group may have something to deliver; False when time is up.

        Waiters register per (topic, group); after each applied entry one read checks every
        group somebody waits on and wakes only those waiters (``_check_waiters``)."""
        loop = asyncio.get_running_loop()
        key = (topic, group)
        while not self.draining.is_set():
            # Registered before the read: an entry applied after the read then wakes it.
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(key, set()).add(fut)
            try:
                if self.raft.read(lambda b: _maybe_ready(b, topic, group)):
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                return False
            finally:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del self._waiters[key]
        return False

    def _check_waiters(self) -> None:
        if not self._waiters:
            return
        keys = list(self._waiters)
        ready = self.raft.read(lambda b: [k for k in keys if _maybe_ready(b, *k)])
        for key in ready:
            for fut in self._waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    def _wake_all_waiters(self) -> None:
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)

    async def _settle(self, request: web.Request, op: str, extra: dict[str, str]) -> web.Response:
        allowed = {"receipts": LIST, **extra}
        required = ("receipts", "seconds") if op == "extend" else ("receipts",)
        body = check_fields(await codec.read_body(request), allowed, required)
        if not body["receipts"]:
            raise ApiError("invalid_argument", "receipts must not be empty", {"field": "receipts"})
        cmd = {"op": op, **{k: v for k, v in body.items() if v is not None}}
        return codec.respond(request, await self.call(cmd))

    async def ack(self, request: web.Request) -> web.StreamResponse:
        return await self._settle(request, "ack", {})

    async def nack(self, request: web.Request) -> web.StreamResponse:
        return await self._settle(request, "nack", {"delay": NUM})

    async def extend(self, request: web.Request) -> web.StreamResponse:
        return await self._settle(request, "extend", {"seconds": NUM})

    async def term(self, request: web.Request) -> web.StreamResponse:
        return await self._settle(request, "term", {"reason": STR})

    async def release_consumer(self, request: web.Request) -> web.StreamResponse:
        consumer = request.match_info["consumer"]
        if not consumer or len(consumer) > 256:
            raise ApiError(
                "invalid_argument", "consumer must be 1 to 256 characters", {"field": "consumer"}
            )
        check_fields(await codec.read_body(request), {})
        return codec.respond(request, await self.call({"op": "release", "consumer": consumer}))

    # ------------------------------------------------------------------ cluster

    async def add_member(self, request: web.Request) -> web.StreamResponse:
        """Dynamic membership: start the new node with every member as a peer, then add it."""
        body = check_fields(
            await codec.read_body(request),
            {"id": STR, "raft": STR, "api": STR},
            ("id", "raft", "api"),
        )
        node_id = _name(body["id"], "id")
        for field in ("raft", "api"):
            if not _host_port(body[field]):
                raise ApiError(
                    "invalid_argument",
                    f"{field} must be host:port (a DNS name, IPv4 or [IPv6] address, and a port"
                    " 1-65535)",
                    {"field": field},
                )
        if not await self._probe(body["api"], timeout=2.0):
            # A member that is not running counts toward the majority all the same: in a
            # cluster of three, adding it and then losing one node stops all writes.
            raise ApiError(
                "membership_refused",
                f"{node_id} does not answer at http://{body['api']}/healthz; start it first"
                " (with every member as a peer), then add it",
                {"api": body["api"]},
            )
        await self._membership(self.raft.add_member(node_id, body["raft"], body["api"]))
        return codec.respond(request, {"added": node_id, "members": self._member_ids()})

    async def remove_member(self, request: web.Request) -> web.StreamResponse:
        node_id = _name(request.match_info["node"], "node")
        check_fields(await codec.read_body(request), {})
        await self._membership(self.raft.remove_member(node_id))
        return codec.respond(request, {"removed": node_id, "members": self._member_ids()})

    async def _membership(self, change: Awaitable[None]) -> None:
        try:
            await change
        except NotLeader:
            raise LeaderLost() from None
        except QueueFull:
            raise ApiError("overloaded", "a membership change is in progress; not applied",
                           retry_after=self.settings.retry_after) from None  # fmt: skip
        except UnknownOutcome:
            raise ApiError("outcome_unknown", "the membership change may or may not have been "
                           "applied; see GET /cluster") from None  # fmt: skip
        except RaftError as e:
            raise ApiError("membership_refused", str(e)) from None

    def _member_ids(self) -> list[str]:
        return sorted(self.raft.status().members)

    async def cluster(self, request: web.Request) -> web.StreamResponse:
        st = self.raft.status()
        members = {k: dict(v) for k, v in st.members.items()}
        probes = {
            mid: asyncio.ensure_future(self._probe(m.get("api")))
            for mid, m in members.items()
            if not m.get("self")
        }
        if probes:
            await asyncio.wait(probes.values())
        for mid, m in members.items():
            m["answers"] = True if m.get("self") else probes[mid].result()
        body: dict[str, Any] = {
            "node": st.node_id,
            "role": st.role,
            "leader": st.leader_id,
            "leader_api": st.leader_api,
            "term": st.term,
            "commit_index": st.commit_index,
            "applied_index": st.applied_index,
            "members": members,
        }
        if request.query.get("digest") in ("1", "true"):
            # Fingerprint of this replica's state (O(state): for checks, not for polling).
            body["digest"] = self.raft.read(lambda b: b.digest())
        return codec.respond(request, body)

    async def _probe(self, api: str | None, timeout: float = 0.5) -> bool:
        if not api or self.session is None:
            return False
        try:
            async with self.session.get(
                f"http://{api}/healthz", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        return codec.respond(request, {"ok": True, "node": self.settings.node_id})

    async def readyz(self, request: web.Request) -> web.StreamResponse:
        st = self.raft.status()
        if not self._caught_up and st.leader_id:
            # Once since start: applied what the leader had committed (a restarted follower's
            # own commit index is capped at its log, so it cannot tell on its own). Not checked
            # again after that: a follower always trails a busy leader by an entry or two.
            target = st.commit_index if st.leader_commit is None else st.leader_commit
            self._caught_up = st.applied_index >= target
        caught_up = self._caught_up
        ready = bool(st.leader_id) and caught_up and not self.draining.is_set()
        body = {
            "ready": ready,
            "leader": st.leader_id,
            "caught_up": caught_up,
            "draining": self.draining.is_set(),
        }
        return codec.respond(request, body, 200 if ready else 503)

    async def metrics_handler(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        from raftq.node.stream import stream

        topic, group = self._tg(request)
        return await self._as_stream(stream(self, request, topic, group), self._streams)

    async def _as_stream(
        self, handler: Awaitable[web.StreamResponse], streams: set[asyncio.Task[Any]]
    ) -> web.StreamResponse:
        """Run a WebSocket handler as one of ``streams`` (open streams, for shutdown)."""
        task = asyncio.current_task()
        assert task is not None
        streams.add(task)
        try:
            return await handler
        finally:
            streams.discard(task)

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        from raftq.node.openapi import document

        return web.json_response(document())

    # ------------------------------------------------------------------ routes

    def routes(self) -> list[tuple[str, str, Handler]]:
        tg = "/topics/{topic}/groups/{group}"
        return [
            ("GET", "/topics", self.list_topics),
            ("POST", "/topics", self.create_topic),
            ("GET", "/topics/{topic}", self.get_topic),
            ("PATCH", "/topics/{topic}", self.update_topic),
            ("DELETE", "/topics/{topic}", self.delete_topic),
            ("POST", "/topics/{topic}/purge", self.purge_topic),
            ("GET", "/topics/{topic}/groups", self.list_groups),
            ("POST", "/topics/{topic}/groups", self.create_group),
            ("GET", tg, self.get_group),
            ("PATCH", tg, self.update_group),
            ("DELETE", tg, self.delete_group),
            ("POST", tg + "/purge", self.purge_group),
            ("POST", tg + "/receive", self.receive),
            ("GET", tg + "/stream", self.stream),
            ("POST", "/topics/{topic}/messages", self.publish_one),
            ("GET", "/topics/{topic}/messages", self.peek),
            ("POST", "/topics/{topic}/publish", self.publish_batch),
            ("GET", "/publish/stream", self.publish_stream),
            ("POST", "/topics/{topic}/redrive", self.redrive),
            ("POST", "/ack", self.ack),
            ("POST", "/nack", self.nack),
            ("POST", "/extend", self.extend),
            ("POST", "/term", self.term),
            ("POST", "/consumers/{consumer}/release", self.release_consumer),
            ("GET", "/cluster", self.cluster),
            ("POST", "/cluster/members", self.add_member),
            ("DELETE", "/cluster/members/{node}", self.remove_member),
            ("GET", "/healthz", self.healthz),
            ("GET", "/readyz", self.readyz),
            ("GET", "/metrics", self.metrics_handler),
            ("GET", "/openapi.json", self.openapi),
        ]


def _maybe_ready(b: Broker, topic: str, group: str) -> bool:
    """Cheap over-approximation of "a receive would deliver something" (a false positive only
    costs one empty receive). A missing topic or group says yes, so the receive reports it."""
    t = b.topics.get(topic)
    g = t.groups.get(group) if t is not None else None
    if t is None or g is None:
        return True
    return bool(g.ready) or g.cursor < t.next_seq


_INT_TEXT = re.compile(r"-?[0-9]{1,19}")
_METHODS = frozenset(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])  # (labels)


def _query_int(value: str | None, field: str, default: int | None) -> int | None:
    if value is None:
        return default
    if not _INT_TEXT.fullmatch(value):
        raise ApiError("invalid_argument", f"{field} must be an integer", {"field": field})
    return int(value)


# Query parameters each route takes (by method and route); any other is refused.
_QUERY: dict[tuple[str, str], frozenset[str]] = {
    ("GET", "/topics/{topic}/messages"): frozenset(["from_seq", "limit"]),
    ("GET", "/cluster"): frozenset(["digest"]),
    ("GET", "/topics/{topic}/groups/{group}/stream"): STREAM_QUERY,
    ("GET", "/publish/stream"): PUBLISH_QUERY,
}


def _check_query(request: web.Request, route: str) -> None:
    if route == "unmatched":
        return  # a 404 or 405 follows
    method = "GET" if request.method == "HEAD" else request.method
    allowed = _QUERY.get((method, route), frozenset())
    unknown = sorted(k for k in request.query if k not in allowed)
    if unknown:
        raise ApiError(
            "unknown_field",
            f"unknown query parameter(s) {', '.join(unknown)}"
            + (f"; this route takes {', '.join(sorted(allowed))}" if allowed else ""),
            {"fields": unknown},
        )


# (underscores too: Docker names containers proj_n4_1, and they resolve)
_HOST_NAME = re.compile(r"(?!-)[\w-]{1,63}(?<!-)(\.(?!-)[\w-]{1,63}(?<!-))*\.?", re.ASCII)


def _host_port(value: str) -> bool:
    """``host:port`` with a DNS name, an IPv4 address or a bracketed IPv6 address."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return False
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    return len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None


def _route_name(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def _error_response(err: ApiError) -> web.Response:
    # Errors are always JSON (the body is tiny and every client can read it).
    headers = {"Retry-After": str(int(err.retry_after))} if err.retry_after else None
    return web.json_response(err.body(), status=err.status, headers=headers)


API_KEY: web.AppKey[Api] = web.AppKey("api", Api)


def build_app(raft: Raft, settings: NodeSettings | None = None) -> web.Application:
    settings = settings or NodeSettings()
    api = Api(raft, settings)
    app = web.Application(
        client_max_size=settings.max_body, middlewares=[api.errors_mw, api.leader_mw]
    )
    app[API_KEY] = api
    for method, path, handler in api.routes():
        route = app.router.add_route(method, path, handler)
        if method == "GET" and not path.endswith("/stream"):
            app.router.add_route("HEAD", path, handler)  # (load balancers' health checks)
        if path.endswith("/stream") and route.resource is not None:
            api.stream_resources.add(route.resource)
        if path.endswith("/receive"):
            api.receive_resource = route.resource
    app.cleanup_ctx.append(api.lifecycle)
    app.on_shutdown.append(api.on_shutdown)
    return app
