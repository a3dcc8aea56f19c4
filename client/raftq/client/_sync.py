"""``Client``: the blocking twin of ``AsyncClient`` (same core, standard-library HTTP).

    with Client("http://127.0.0.1:8001") as c:
        c.publish("orders", b"hello")
        for msg in c.consume("orders", max_messages=1):
            print(msg.payload)
            msg.ack()

A ``Client`` is not thread-safe; give each thread its own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

from raftq.client import _core as core
from raftq.client import _requests as rq
from raftq.client import _tls
from raftq.client._events import DisconnectHook, Events, LeaderHook
from raftq.client._http_sync import SyncHttpPool
from raftq.client._message import Delivery
from raftq.client.errors import RaftqError, Unavailable, UnknownOutcome
from raftq.client.transport import ConnectFailed, HttpError, TLSFailed, Transport
from raftq.client.types import (
    ClusterInfo,
    ClusterSettings,
    Created,
    Deleted,
    GroupConfigured,
    GroupInfo,
    Membership,
    PeekedMessage,
    Purged,
    Redriven,
    Released,
    SettleResult,
    TokenInfo,
    TopicConfigured,
    TopicInfo,
    TopicsPage,
)

CONNECT_TIMEOUT = 2.0  # as in the async client: a node that does not accept is taken for down


class Message(Delivery):
    """A delivery from ``Client.consume`` / ``receive``; settle it exactly once."""

    def __init__(self, client: Client, data: Mapping[str, Any], topic: str, group: str):
        super().__init__(data, topic, group)
        self._client = client

    def ack(self) -> None:
        self._client.ack([self.receipt])
        self.settled = True

    def nack(self, delay: float | None = None) -> None:
        self._client.nack([self.receipt], delay=delay)
        self.settled = True

    def extend(self, seconds: float) -> None:
        self._client.extend([self.receipt], seconds)

    def term(self, reason: str = "terminated") -> None:
        self._client.term([self.receipt], reason=reason)
        self.settled = True

    @contextlib.contextmanager
    def process(self, nack_delay: float | None = None) -> Iterator[Message]:
        """``with msg.process():`` acks the message when the block ends normally and nacks it
        (redelivered after ``nack_delay``, default the group's backoff) when it raises, then
        lets the exception through. A message the block settled itself is left alone; after a
        ``BaseException`` (KeyboardInterrupt) it is not settled."""
        try:
            yield self
        except Exception:
            if not self.settled:
                self.nack(nack_delay)
            raise
        if not self.settled:
            self.ack()


class Client:
    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = 30.0,
        attempt_timeout: float = 10.0,
        producer_id: str | None = None,
        fmt: str = core.MSGPACK,
        transport: Transport | None = None,
        http_headers: core.HeadersHook | None = None,
        token: str | None = None,
        ca: _tls.CA | None = None,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        on_leader_change: LeaderHook | None = None,
        on_disconnect: DisconnectHook | None = None,
    ) -> None:
        """``transport``: what sends the HTTP requests (``raftq.client.transport.Transport``;
        by default kept-alive ``http.client`` connections). The client closes it at ``close``.

        ``ca``: for ``https://`` URLs, the CA file (PEM) to verify nodes with, or an
        ``ssl.SSLContext`` (default: the system's store); ``cert``, ``key``: a client
        certificate for nodes that require one. They configure the default transport (with
        ``transport=`` they are an error). A certificate that cannot be verified raises
        ``TLSError`` at once.

        ``http_headers``: extra headers (e.g. ``Authorization``) for every HTTP request the
        client sends: a mapping, or a callable returning one, called anew for each request
        (every try, every redirect hop). They cannot replace the client's own: a name among
        Accept, Accept-Encoding, Connection, Content-Encoding, Content-Length, Content-Type,
        Host, TE, Transfer-Encoding, Upgrade and Sec-WebSocket-* (in any case), a name given
        twice, or a name or value not valid in HTTP raises ``ValueError``: at construction for
        a mapping, from the client call for a callable's answer.

        ``token``: the API token (``rq_<id>.<secret>``) sent as ``Authorization: Bearer``;
        by default ``RAFTQ_TOKEN`` from the environment, if set (an ``Authorization`` from
        ``http_headers`` then wins; with ``token=`` it is an error); ``""``: none.

        ``on_leader_change(old, new)``: called when the client learns of a leader other than
        the last one it knew (``old`` None for the first), with their URLs.
        ``on_disconnect(url, error)``: called when a node cannot be reached or drops a
        connection. Both run in the calling thread and must not block; what they raise is
        logged and ignored. The client logs to ``logging.getLogger("raftq.client")``: retries
        at DEBUG, leader changes and lost nodes at INFO."""
        self._events = Events(on_leader_change, on_disconnect)
        self.endpoints = core.Endpoints(
            [urls] if isinstance(urls, str) else list(urls),
            on_leader_change=self._events.leader_changed,
        )
        self.timeout = timeout
        # One try may take this long (plus a long poll's wait) before another node is tried.
        self.attempt_timeout = attempt_timeout
        self.retries = 0  # tries beyond the first, over this client's life
        self.producer = core.Producer(producer_id)
        self.fmt = fmt
        if transport is None:
            ssl_context = _tls.client_context(ca, cert, key)
            transport = SyncHttpPool(connect_timeout=CONNECT_TIMEOUT, ssl_context=ssl_context)
        elif ca is not None or cert is not None or key is not None:
            raise ValueError("ca=, cert= and key= configure the default transport, not transport=")
        self._transport: Transport = transport
        from_env = token is None
        if from_env:
            token = os.environ.get(core.TOKEN_ENV) or None
        self._extra_headers = core.header_source(core.with_token(token, http_headers, from_env))

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    # ------------------------------------------------------------------ the I/O loop

    def request(self, req: core.Request, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        end = time.monotonic() + timeout + req.hold
        wire = core.prepare(req, self.fmt)
        last: RaftqError | None = None
        unknown: UnknownOutcome | None = None  # a try whose outcome is unknown: it sticks
        attempt = 0
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise core.deadline_error(last, req, timeout, unknown)
            url = self.endpoints.pick()
            try:
                result = self._send(
                    url, wire, min(remaining, self.attempt_timeout + req.hold), req.idempotent
                )
                return core.after_retry(req, result, unknown)
            except RaftqError as err:
                last = err
                if isinstance(err, UnknownOutcome):
                    unknown = err
                if core.node_failed(err):
                    self.endpoints.failed(url)
                    self._events.disconnected(url, err)
                elif err.server_code == "no_leader":
                    self.endpoints.no_leader(url)
                delay = core.retry_delay(err, req, attempt, end - time.monotonic())
                if delay is None:
                    final = core.final_error(err, unknown)
                    if final is err:
                        raise
                    raise final from err
                self._events.retrying(req, url, err, delay, attempt)
                attempt += 1
                self.retries += 1
                time.sleep(delay)

    def _send(self, url: str, wire: core.Wire, remaining: float, idempotent: bool) -> Any:
        target = url + wire.path
        redirects = 0
        fresh_retry = idempotent
        deadline = time.monotonic() + remaining  # for every redirect hop together
        while True:
            left = deadline - time.monotonic()
            if left <= 0:  # (only after a redirect, which applied nothing)
                raise Unavailable(f"{url}: redirected until the time ran out")
            headers = core.with_headers(wire.headers, self._extra_headers)
            try:
                resp = self._transport.request(wire.method, target, headers, wire.body, left)
            except HttpError as e:
                if isinstance(e, TLSFailed):
                    raise core.tls_error(target, e) from e
                if e.stale and fresh_retry:
                    # The server closed an idle kept-alive socket, probably before reading this
                    # request; only a request that is safe to repeat is sent again (else the
                    # caller learns that its outcome is unknown).
                    fresh_retry = False
                    continue
                sent = not isinstance(e, ConnectFailed)
                raise core.unavailable(url, _cause(e), sent=sent) from e
            leader = resp.headers.get("x-raftq-leader")
            location = resp.headers.get("location")
            if core.is_redirect(resp.status) and location:
                redirects += 1
                if redirects > core.MAX_REDIRECTS:
                    raise Unavailable(f"too many redirects from {url}")
                parts = urlsplit(core.redirected(target, location))  # (may be relative)
                base = core.normalize_url(f"{parts.scheme}://{parts.netloc}")
                self.endpoints.learn(base)
                target = base + (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                continue
            if leader:
                self.endpoints.learn(leader)
            return core.decode(
                resp.status,
                resp.headers.get("content-type"),
                resp.body,
                resp.headers.get("retry-after"),
            )

    # ------------------------------------------------------------------ cluster

    def cluster(self) -> ClusterInfo:
        body: ClusterInfo = self.request(rq.cluster())
        self.endpoints.learn(core.leader_from_cluster(body))
        return body

    def cluster_settings(self) -> ClusterSettings:
        """The cluster settings (``max_retained_bytes``: None when unlimited) and the payload
        bytes retained over every topic."""
        return cast(ClusterSettings, self.request(rq.cluster_settings()))

    def update_cluster_settings(self, **changes: Any) -> ClusterSettings:
        """Change cluster settings (a ``cluster`` token): ``max_retained_bytes=N`` (None: no
        limit). A publish that would retain more payload bytes over every topic raises
        ``StorageFull``; dead letters and redrives pass; lowering it deletes nothing."""
        return cast(ClusterSettings, self.request(rq.update_cluster_settings(changes)))

    def add_member(self, node_id: str, raft: str, api: str) -> Membership:
        """Add a node to the cluster (start it first, with every member as a peer)."""
        return cast(Membership, self.request(rq.add_member(node_id, raft, api)))

    def remove_member(self, node_id: str) -> Membership:
        return cast(Membership, self.request(rq.remove_member(node_id)))

    # ------------------------------------------------------------------ tokens (cluster flag)

    def create_token(
        self,
        name: str,
        grants: Sequence[Mapping[str, Any]] = (),
        *,
        cluster: bool = False,
        expires_in: float | None = None,
    ) -> TokenInfo:
        """A new API token: the answer's ``token`` is its secret, shown only this once.
        ``grants``: ``[{"topics": "orders.*", "actions": ["publish", "consume"]}]``."""
        return cast(TokenInfo, self.request(rq.create_token(name, grants, cluster, expires_in)))

    def sqs_credentials(self) -> dict[str, str]:
        """This token's SQS access key id and secret access key (for the SQS endpoint)."""
        return dict(self.request(rq.sqs_credentials()))

    def list_tokens(self) -> list[TokenInfo]:
        return list((self.request(rq.list_tokens()))["tokens"])

    def token(self, token_id: str) -> TokenInfo:
        return cast(TokenInfo, self.request(rq.token(token_id)))

    def update_token(self, token_id: str, **changes: Any) -> TokenInfo:
        """Change ``disabled``, ``name``, ``grants``, ``cluster`` or ``expires_in``."""
        return cast(TokenInfo, self.request(rq.update_token(token_id, changes)))

    def revoke_token(self, token_id: str) -> Any:
        """Revoke a token: every node refuses it once the revoke is applied there."""
        return self.request(rq.revoke_token(token_id))

    # ------------------------------------------------------------------ topics and groups

    def create_topic(
        self,
        topic: str,
        config: Mapping[str, Any] | None = None,
        groups: Sequence[Mapping[str, Any]] | None = None,
        if_not_exists: bool = False,
    ) -> Created:
        return cast(Created, self.request(rq.create_topic(topic, config, groups, if_not_exists)))

    def list_topics(self) -> list[str]:
        """Every topic name the token has a right on, in name order (page after page)."""
        names: list[str] = []
        after: str | None = None
        while True:
            page = self.request(rq.list_topics(after))
            names += page["topics"]
            after = core.next_topics_page(page, after)
            if after is None:
                return names

    def list_topics_page(self, after: str | None = None, limit: int | None = None) -> TopicsPage:
        """One page of topic names: ``{"topics": [...], "next": <the after of the next page,
        or None on the last>}`` (the server's page size when ``limit`` is None)."""
        return cast(TopicsPage, self.request(rq.list_topics(after, limit)))

    def topic(self, topic: str) -> TopicInfo:
        return cast(TopicInfo, self.request(rq.topic(topic)))

    def update_topic(self, topic: str, config: Mapping[str, Any]) -> TopicConfigured:
        return cast(TopicConfigured, self.request(rq.update_topic(topic, config)))

    def delete_topic(self, topic: str) -> Deleted:
        return cast(Deleted, self.request(rq.delete_topic(topic)))

    def purge(self, topic: str) -> Purged:
        return cast(Purged, self.request(rq.purge(topic)))

    def create_group(
        self,
        topic: str,
        group: str,
        config: Mapping[str, Any] | None = None,
        start: str = "latest",
        if_not_exists: bool = False,
    ) -> Created:
        return cast(
            Created, self.request(rq.create_group(topic, group, config, start, if_not_exists))
        )

    def group(self, topic: str, group: str) -> GroupInfo:
        return cast(GroupInfo, self.request(rq.group(topic, group)))

    def update_group(self, topic: str, group: str, config: Mapping[str, Any]) -> GroupConfigured:
        return cast(GroupConfigured, self.request(rq.update_group(topic, group, config)))

    def delete_group(self, topic: str, group: str) -> Deleted:
        return cast(Deleted, self.request(rq.delete_group(topic, group)))

    # ------------------------------------------------------------------ publish

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        headers: Mapping[str, str] | None = None,
        key: str | None = None,
        delay: float | None = None,
        ordering_key: str | None = None,
    ) -> int:
        body = core.message_body(self.producer, payload, headers, key, delay, ordering_key)
        res = self.request(rq.publish(topic, body))
        return int(res["seq"])

    def publish_batch(self, topic: str, messages: Sequence[Any]) -> list[int]:
        body = core.batch_body(self.producer, messages)
        res = self.request(rq.publish_batch(topic, body["messages"]))
        return [int(m["seq"]) for m in res["messages"]]

    # ------------------------------------------------------------------ consume

    def receive(
        self,
        topic: str,
        group: str = "default",
        *,
        max: int = 1,
        wait: float = 0.0,
        visibility: float | None = None,
        consumer: str | None = None,
    ) -> list[Message]:
        res = self.request(rq.receive(topic, group, max, wait, visibility, consumer))
        return [Message(self, d, topic, group) for d in res["deliveries"]]

    def consume(
        self,
        topic: str,
        group: str = "default",
        *,
        prefetch: int = 10,
        wait: float = 20.0,
        visibility: float | None = None,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
    ) -> Iterator[Message]:
        """Yield messages until ``max_messages`` were yielded or nothing came for
        ``idle_timeout`` seconds (forever by default). Leaving the loop releases this consumer's
        unsettled deliveries at once."""
        consumer = f"{self.producer.id}-{secrets.token_hex(4)}"
        yielded = 0
        idle_since = time.monotonic()
        try:
            while max_messages is None or yielded < max_messages:
                want = prefetch if max_messages is None else min(prefetch, max_messages - yielded)
                poll = wait
                if idle_timeout is not None:
                    left = idle_timeout - (time.monotonic() - idle_since)
                    if left <= 0:
                        return
                    poll = min(wait, left)
                try:
                    batch = self.receive(
                        topic, group, max=want, wait=poll, visibility=visibility,
                        consumer=consumer,
                    )  # fmt: skip
                except UnknownOutcome:
                    continue  # what it may have delivered comes back after its deadline
                if batch:
                    idle_since = time.monotonic()
                for msg in batch:
                    yielded += 1
                    yield msg
        finally:
            with contextlib.suppress(RaftqError):
                self.release(consumer)

    def ack(self, receipts: Sequence[str]) -> SettleResult:
        return cast(SettleResult, self._settle(rq.settle("ack", receipts)))

    def nack(self, receipts: Sequence[str], delay: float | None = None) -> SettleResult:
        return cast(SettleResult, self._settle(rq.settle("nack", receipts, delay=delay)))

    def extend(self, receipts: Sequence[str], seconds: float) -> SettleResult:
        return cast(SettleResult, self._settle(rq.settle("extend", receipts, seconds=seconds)))

    def term(self, receipts: Sequence[str], reason: str = "terminated") -> SettleResult:
        return cast(SettleResult, self._settle(rq.settle("term", receipts, reason=reason)))

    def _settle(self, req: core.Request) -> Any:
        res = self.request(req)
        core.raise_receipt_errors(res, len(req.body["receipts"]))
        return res

    def release(self, consumer: str) -> Released:
        return cast(Released, self.request(rq.release(consumer)))

    # ------------------------------------------------------------------ dead letters

    def peek(self, topic: str, from_seq: int | None = None, limit: int = 10) -> list[PeekedMessage]:
        return list(self.request(rq.peek(topic, from_seq, limit))["messages"])

    def redrive(self, topic: str, max: int = 100) -> Redriven:
        return cast(Redriven, self.request(rq.redrive(topic, max)))


def _cause(e: HttpError) -> BaseException:
    """What the default transport caught (its message is the one callers have always seen)."""
    return e.__cause__ if isinstance(e.__cause__, Exception) else e
