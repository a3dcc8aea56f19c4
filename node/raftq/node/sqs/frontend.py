"""The SQS endpoint's request handling: decode (either protocol), verify the signature, find
who calls, run the action here if this node leads or forward the request as it came to the
leader, and answer in the request's protocol. Served by the ``--sqs-listen`` listener
(``raftq.node.sqs.listener``) on any path, and by the native API at ``/sqs``, which is where
followers forward to.

A forward carries the client's request unchanged (headers, Host, body, query) plus
``X-Raftq-Forwarded`` and ``X-Raftq-Sqs-Path`` (the path the client signed): the leader checks
the signature again, on what the client signed. A ReceiveMessage holds its consumer
(``BrokerService.handing_out``) until its answer is written: a client that goes away first
gets its messages released at once, on either hop (the leader names the consumer in
``X-Raftq-Sqs-Consumer`` so that a follower whose client left can give them back).
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from raftq.node import commands, httpio
from raftq.node.auth import ANYONE, CONSUME, INTERNAL, Authenticator, Principal, secret_hash
from raftq.node.errors import ApiError
from raftq.node.proxy import CONNECT_TIMEOUT_S, FORWARDED, Forwarder
from raftq.node.service import BrokerService, LeaderLost
from raftq.node.sqs import sigv4, wire
from raftq.node.sqs.actions import ACTIONS, Ctx, sqs_error
from raftq.node.sqs.credentials import secret_access_key
from raftq.node.sqs.wire import Call, SqsError

log = logging.getLogger("raftq.node.sqs")

PATH_HEADER = "X-Raftq-Sqs-Path"
CONSUMER_HEADER = "X-Raftq-Sqs-Consumer"
FORWARD_PATH = "/sqs"  # the native API's route that forwarded requests go to
ADMIN_KEY = "admin"  # the bootstrap admin token's access key id
# Hop-by-hop headers (RFC 9110 7.6.1) and those the forwarding connection sets itself.
_HOP = frozenset(
    ["connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-authorization",
     "proxy-connection", "trailer", "content-length", FORWARDED.lower(), PATH_HEADER.lower()]
)  # fmt: skip
_ANSWER = ("Content-Type", "x-amzn-query-error", "x-amzn-RequestId", "Retry-After")


class _Seen:
    """What ``raftq_sqs_requests`` counts a request as: its action (once known to be one) and
    its outcome (``ok``, the SQS error type, ``forwarded``, ``client_gone``)."""

    def __init__(self) -> None:
        self.action = "unknown"
        self.outcome = "ok"


class Frontend:
    def __init__(
        self, svc: BrokerService, fwd: Forwarder, authn: Authenticator, *, listener: bool = False
    ) -> None:
        self.svc = svc
        # On the ``--sqs-listen`` listener only clients call: forwards go to the API's /sqs, so
        # there a client's X-Raftq-Forwarded / X-Raftq-Sqs-Path / X-Raftq-Sqs-Consumer mean
        # nothing and are ignored (a forged path would pick what the signature is checked on).
        self.listener = listener
        self.fwd = fwd
        self.authn = authn
        settings = svc.settings
        self.key = settings.sqs_key
        self._admin_hash = secret_hash(settings.admin_token) if settings.admin_token else None

    # ------------------------------------------------------------------ credentials

    def secret_for(self, access_key: str) -> str | None:
        """The SQS secret of an access key (a token id), if the token exists and is usable."""
        if self.key is None or access_key == INTERNAL:
            return None
        if access_key == ADMIN_KEY and self._admin_hash is not None:
            return secret_access_key(self.key, ADMIN_KEY, self._admin_hash)
        record = self.svc.raft.read(lambda b: b.token(access_key))
        if record is None:
            return None
        return secret_access_key(self.key, access_key, record["hash"])

    def principal(self, access_key: str) -> Principal:
        if access_key == ADMIN_KEY and self._admin_hash is not None:
            return Principal("admin", everything=True, cluster=True)
        record = self.svc.raft.read(lambda b: b.token(access_key))
        if record is None:
            raise SqsError("InvalidClientTokenId", "The security token included in the request"
                           " is invalid.")  # fmt: skip
        try:
            return self.authn.recheck(Principal(record["name"], access_key, digest=record["hash"]))
        except ApiError as e:
            raise SqsError("InvalidClientTokenId", e.message) from None

    # ------------------------------------------------------------------ requests

    async def handle(self, request: web.Request) -> web.StreamResponse:
        request_id = str(uuid.uuid4())
        protocol = "json" if "X-Amz-Target" in request.headers else "query"
        compat = request.headers.get("x-amzn-query-mode", "").lower() == "true"
        seen = _Seen()
        try:
            return await self._handle(request, request_id, seen)
        except SqsError as e:
            seen.outcome = e.type
            return _error(protocol, compat, e, request_id)
        except ApiError as e:
            err = sqs_error(e)
            seen.outcome = err.type
            return _error(protocol, compat, err, request_id)
        except (asyncio.CancelledError, ConnectionError):  # the client went away
            seen.outcome = "client_gone"
            raise
        except Exception:  # a bug: said in SQS's shape, logged in full
            log.exception("internal error on SQS %s %s", request.method, request.path)
            err = SqsError("InternalFailure", "internal error; see the node log")
            seen.outcome = err.type
            return _error(protocol, compat, err, request_id)
        finally:
            self.svc.metrics.sqs_requests.labels(seen.action, seen.outcome).inc()

    async def _handle(
        self, request: web.Request, request_id: str, seen: _Seen
    ) -> web.StreamResponse:
        if request.method not in ("GET", "POST"):
            raise SqsError("InvalidAction", f"{request.method} is not an SQS request")
        body = await httpio.read_raw(request)
        forwarded = self._forwarded(request)
        path = request.raw_path.partition("?")[0]
        if not self.listener:
            path = request.headers.get(PATH_HEADER, path)
        url_query = urllib.parse.parse_qsl(request.query_string, keep_blank_values=True)
        if "X-Amz-Target" in request.headers:
            call = wire.decode_json(
                request.headers["X-Amz-Target"], body,
                request.headers.get("x-amzn-query-mode", "").lower() == "true",
            )  # fmt: skip
        else:
            form: list[tuple[str, str]] = []
            if request.content_type == "application/x-www-form-urlencoded" and body:
                try:
                    form = urllib.parse.parse_qsl(
                        body.decode(), keep_blank_values=True, strict_parsing=True
                    )
                except (ValueError, UnicodeDecodeError):
                    raise SqsError("MalformedQueryString", "the form body is malformed") from None
            call = wire.decode_query(url_query + form)
        if "QueueUrl" not in call.params and len([x for x in path.split("/") if x]) == 2:
            call.params["QueueUrl"] = path  # (sent to the queue's URL, as kombu does)
        if call.action in ACTIONS:
            seen.action = call.action
        who, access_key, region = ANYONE, "", "us-east-1"
        if self.svc.settings.auth:
            sreq = sigv4.Request(
                request.method, path, url_query, list(request.headers.items()), body
            )
            try:
                signed = sigv4.verify(sreq, self.secret_for, time.time())
            except sigv4.SigError as e:
                if e.code == "InvalidClientTokenId" and not forwarded and not self.svc.leads():
                    # (a token created a moment ago may not be applied here yet)
                    seen.outcome = "forwarded"
                    return await self.forward(request, body, path, None)
                raise SqsError(e.code, e.message) from None
            access_key, region = signed.access_key, signed.region
            who = self.principal(access_key)
        else:
            claimed = sigv4.access_key_of(
                sigv4.Request(request.method, path, url_query, list(request.headers.items()), b"")
            )
            access_key = claimed or ""
        action = ACTIONS.get(call.action)
        if action is None:
            raise SqsError("InvalidAction", f"The action {call.action} is not valid for this"
                           " endpoint.")  # fmt: skip
        if not self.svc.leads():
            if forwarded:
                raise SqsError("ServiceUnavailable", "forwarded to a node that is not the leader",
                               retry_after=1)  # fmt: skip
            seen.outcome = "forwarded"
            if call.action == "ReceiveMessage":
                return await self.forward_receive(request, body, path, who, call, request_id)
            return await self.forward(request, body, path, who)
        host = request.headers.get("Host") or request.host
        scheme = self.svc.settings.scheme
        ctx = Ctx(self.svc, who, region, f"{scheme}://{host}", access_key)
        try:
            if call.action == "ReceiveMessage":
                return await self._receive(request, ctx, call, request_id)
            result = await action(ctx, call.params)
        except LeaderLost:
            if forwarded:
                raise SqsError("ServiceUnavailable", "the leader changed; retry",
                               retry_after=1) from None  # fmt: skip
            seen.outcome = "forwarded"
            if call.action == "ReceiveMessage":
                return await self.forward_receive(request, body, path, who, call, request_id)
            return await self.forward(request, body, path, who)
        return _answer(call, result, request_id)

    def _forwarded(self, request: web.Request) -> bool:
        return not self.listener and bool(request.headers.get(FORWARDED))

    async def _receive(
        self, request: web.Request, ctx: Ctx, call: Call, request_id: str
    ) -> web.StreamResponse:
        """A receive holds its consumer until the answer is written (the dead man's switch)."""
        ctx.consumer = commands.fresh_consumer()
        with self.svc.handing_out(ctx.consumer, ctx.who.patterns(CONSUME)):
            result = await ACTIONS["ReceiveMessage"](ctx, call.params)
            resp = _answer(call, result, request_id)
            if result:
                if self._forwarded(request):  # (for the follower's dead man's switch)
                    resp.headers[CONSUMER_HEADER] = ctx.consumer
                transport = request.transport
                if transport is None or transport.is_closing():
                    raise ConnectionResetError("client went away")
            await resp.prepare(request)
            await resp.write_eof()
            return resp

    # ------------------------------------------------------------------ forwarding

    async def forward_receive(
        self, request: web.Request, body: bytes, path: str, who: Principal | None, call: Call,
        request_id: str,
    ) -> web.StreamResponse:  # fmt: skip
        """A ReceiveMessage forwarded until a leader answers it, within its long poll's time
        (at least a second); if none does, the answer is an empty receive, never a 5xx.

        Why: kombu's async SQS client (what Celery workers poll with) stops polling a queue
        for good after a 5xx answer to a ReceiveMessage (kombu 5.7: ``_on_list_ready`` hands
        ``[]`` to ``_on_messages_ready``, which raises), and a leader's death is only an
        election away from being over. An empty answer is true (this request got nothing);
        messages the dead leader may have handed out come back after their visibility timeout,
        as after any lost answer."""
        try:
            wait = min(20, max(1, int(call.params.get("WaitTimeSeconds") or 0)))
        except (TypeError, ValueError):
            wait = 1
        deadline = time.monotonic() + wait
        while True:
            try:
                resp = await self.forward(request, body, path, who)
                if resp.status != 503:
                    return resp
            except SqsError as e:
                if e.type != "ServiceUnavailable":
                    raise
            if time.monotonic() + 0.2 >= deadline:
                log.info("a ReceiveMessage no leader answered within %d s is answered empty", wait)
                return _answer(call, {}, request_id)
            await asyncio.sleep(0.2)  # (an election takes a second or two)

    async def forward(
        self, request: web.Request, body: bytes, path: str, who: Principal | None
    ) -> web.StreamResponse:
        """The client's request, as it came, to the leader's ``/sqs``; its answer back."""
        try:
            leader = self.svc.leader_elsewhere()
        except ApiError as e:
            raise sqs_error(e) from None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers[FORWARDED] = self.svc.settings.node_id
        headers[PATH_HEADER] = path
        url = self.svc.settings.url(leader.api) + FORWARD_PATH
        if request.query_string:
            url += "?" + request.query_string
        session = self.fwd.session
        assert session is not None
        self.svc.metrics.proxied.inc()
        try:
            async with session.request(
                request.method, url, data=body, headers=headers,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type", "Accept"),
                timeout=aiohttp.ClientTimeout(
                    total=self.svc.settings.proxy_timeout, sock_connect=CONNECT_TIMEOUT_S
                ),
                ssl=self.fwd._ssl(), auto_decompress=False,
            ) as r:  # fmt: skip
                data = await r.read()
                status, upstream = r.status, r.headers
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SqsError(
                "ServiceUnavailable", f"could not reach the leader {leader.id}: {e!r}; retry",
                retry_after=1,
            ) from None  # fmt: skip
        out = {h: upstream[h] for h in _ANSWER if h in upstream}
        resp = web.Response(status=status, body=data, headers=out)
        consumer = upstream.get(CONSUMER_HEADER)
        if consumer:
            transport = request.transport
            patterns = who.patterns(CONSUME) if who is not None else None
            try:
                if transport is None or transport.is_closing():
                    raise ConnectionResetError("client went away")
                await resp.prepare(request)
                await resp.write_eof()
            except (ConnectionError, asyncio.CancelledError):
                self.svc.spawn(self.fwd.give_back(consumer, patterns))
                raise
        return resp


def _answer(call: Call, result: dict[str, Any], request_id: str) -> web.Response:
    body, ctype = wire.encode_result(call, result, request_id)
    return web.Response(body=body, headers={"Content-Type": ctype, "x-amzn-RequestId": request_id})


def _error(protocol: str, compat: bool, err: SqsError, request_id: str) -> web.Response:
    status, body, ctype, headers = wire.encode_error(protocol, compat, err, request_id)
    return web.Response(status=status, body=body, headers={**headers, "Content-Type": ctype})
