"""HTTP routes for messages: publish (one, a batch), peek, redrive, receive (long poll), settle
(ack / nack / extend / term), release a consumer.

A receive is the one route with a dead man's switch: deliveries whose client goes away before
the response is written are released at once (``BrokerService.handing_out``); a follower that
forwards a receive names its consumer and does the same on its hop (``forward_receive``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from raftq.cluster.validate import MAX_INT, MAX_RECEIVE
from raftq.node import codec, commands, httpio
from raftq.node.auth import ADMIN, BODY, CONSUME, PATH, PUBLISH, Permission, Principal
from raftq.node.errors import ApiError
from raftq.node.routes import Query, Route, path_name, principal, query, recheck
from raftq.node.service import BrokerService, Leader
from raftq.node.topics import TG, topic_group

if TYPE_CHECKING:
    from raftq.node.proxy import Forwarder


async def publish_one(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    body = await httpio.read_body(request)
    cmd, size = commands.publish_one(topic, body, httpio.is_msgpack_request(request))
    res = await svc.call(cmd, size)
    return httpio.respond(request, res["messages"][0])


async def publish_batch(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    body = await httpio.read_body(request)
    cmd, size = commands.publish_batch(topic, body, httpio.is_msgpack_request(request))
    res = await svc.call(cmd, size)
    return httpio.respond(request, {"messages": res["messages"]})


async def peek(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    q = query(request)
    msgs = await svc.read_latest(lambda b: b.peek(topic, q["from_seq"], q["limit"]))
    if q["payload_encoding"] == "utf-8":
        msgs = codec.payloads_as_text(msgs)
    return httpio.respond(request, {"topic": topic, "messages": msgs})


async def redrive(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    cmd = commands.redrive(topic, await httpio.read_body(request))
    return httpio.respond(request, await svc.call(cmd))


async def receive(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """Long poll: propose a receive; while it comes back empty, wait for applied entries
    that may have made something deliverable, up to ``wait`` seconds. Deliveries whose
    connection closes before the response is written are released at once."""
    topic, group = topic_group(request)
    cmd, wait = commands.receive(topic, group, await httpio.read_body(request))
    consumer = cmd["consumer"]
    who = principal(request)

    def may_receive() -> None:  # (a long poll outlives a revoke or new grants: ask each time)
        recheck(request, who).require(CONSUME, topic)

    # (a consumer id is the caller's to choose: a drop releases only what it may consume)
    with svc.handing_out(consumer, who.patterns(CONSUME)):
        deliveries = await svc.long_poll(cmd, wait, may_receive)
        answers = [{"topic": topic, "group": group, **d} for d in deliveries]
        if query(request)["payload_encoding"] == "utf-8":
            answers = codec.payloads_as_text(answers)
        out = {"consumer": consumer, "deliveries": answers}
        resp = httpio.respond(request, out)
        transport = request.transport
        if deliveries and (transport is None or transport.is_closing()):
            raise ConnectionResetError("client went away")
        await resp.prepare(request)
        await resp.write_eof()
        return resp


async def forward_receive(
    fwd: Forwarder, request: web.Request, leader: Leader, body: bytes
) -> web.StreamResponse:
    """A receive forwarded to the leader: name its consumer here, so that if our client goes
    away before the deliveries are written to it, we can give them back at once (second hop
    of the dead man's switch; the leader covers the first)."""
    svc = fwd.svc
    mp = httpio.is_msgpack_request(request)
    try:
        obj = codec.decode_body(body, mp)
    except ApiError:
        return await fwd.send(request, leader, body)  # the leader explains the error
    consumer = obj.get("consumer")
    if consumer is None or consumer == "":  # anything else goes as is: the leader checks it
        consumer = obj["consumer"] = commands.fresh_consumer()
        body = codec.encode(obj, mp)[0]
    topics = principal(request).patterns(CONSUME)  # (what the client may consume, no more)

    def give_back() -> None:
        if isinstance(consumer, str):
            svc.spawn(fwd.give_back(consumer, topics))

    sent = asyncio.ensure_future(fwd.send(request, leader, body))
    try:
        drain = asyncio.ensure_future(svc.draining.wait())
        try:
            await asyncio.wait({sent, drain}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drain.cancel()
        if not sent.done():
            # Shutting down: end the long poll now (as if it timed out); closing the
            # upstream connection makes the leader release anything it had just handed out.
            sent.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await sent
            give_back()
            return httpio.respond(request, {"consumer": consumer, "deliveries": []})
        resp = sent.result()
        if resp.status == 200:
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("client went away")
            await resp.prepare(request)
            await resp.write_eof()
        return resp
    except (asyncio.CancelledError, ConnectionError):
        sent.cancel()
        give_back()
        raise
    except ApiError as e:
        # Lost the leader's answer (504): whatever it handed out reaches nobody; give it
        # back, as the leader does when its own client goes away.
        if e.code == "outcome_unknown":
            give_back()
        raise


def may_settle(who: Principal, cmd: dict[str, Any]) -> None:
    """Settling a receipt needs ``consume`` on its topic (a receipt starts ``topic:``; one
    that does not is reported invalid by the state machine)."""
    for topic in sorted({r.partition(":")[0] for r in cmd["receipts"] if ":" in r}):
        who.require(CONSUME, topic)


def _settle(op: str) -> Any:
    async def settle(svc: BrokerService, request: web.Request) -> web.StreamResponse:
        cmd = commands.settle(op, await httpio.read_body(request))
        may_settle(principal(request), cmd)
        return httpio.respond(request, await svc.call(cmd))

    settle.__name__ = settle.__qualname__ = op
    return settle


async def release_consumer(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """Only what the caller may consume is given back (other tokens' deliveries stay); a
    caller may narrow that with ``topics`` (patterns it holds: a node releasing for the
    client of a receive it forwarded passes that client's)."""
    cmd = commands.release(request.match_info["consumer"])
    body = commands.check_fields(await httpio.read_body(request), {"topics": commands.LIST})
    who = principal(request)
    mine = who.patterns(CONSUME)
    given = body.get("topics")
    if mine is not None and not mine:
        who.require(CONSUME, "*")  # (no consume right at all: 403)
    if given is not None:
        if mine is not None and "*" not in mine and not set(given) <= set(mine):
            raise ApiError(
                "forbidden", f"token {who.name!r} may release only on its own patterns",
                {"action": CONSUME, "topic": None, "token": who.name},
            )  # fmt: skip
        cmd["topics"] = given
    elif mine is not None:
        cmd["topics"] = mine
    return httpio.respond(request, await svc.call(cmd))


T = "/topics/{topic}"
PAYLOAD_ENCODING = Query(
    "payload_encoding", choices=codec.PAYLOAD_ENCODINGS, default="base64",
    doc="utf-8: a payload that is valid UTF-8 comes as text (a string) instead of payload",
)  # fmt: skip
SETTLE = Permission(CONSUME, BODY)  # the topic of each receipt
ROUTES = [
    Route("POST", T + "/messages", publish_one, "Publish one message", body="Message",
          answer="Published", op="publishMessage", perm=Permission(PUBLISH, PATH)),
    Route("GET", T + "/messages", peek, "Peek retained messages (e.g. dead letters)",
          query=(Query("from_seq", lo=0, hi=MAX_INT, doc="first sequence number to show"),
                 Query("limit", lo=1, hi=MAX_RECEIVE, default=10,
                       doc=f"at most this many (1-{MAX_RECEIVE})"),
                 PAYLOAD_ENCODING),
          answer="Peek", op="peekMessages", perm=Permission(ADMIN, PATH)),
    Route("POST", T + "/publish", publish_batch, "Publish a batch", body="PublishBatch",
          answer="PublishedBatch", op="publishBatch", perm=Permission(PUBLISH, PATH)),
    Route("POST", T + "/redrive", redrive, "Move dead letters back to their source group",
          body="Redrive", answer="Redriven", op="redriveDeadLetters",
          perm=Permission(ADMIN, PATH)),
    Route("POST", TG + "/receive", receive, "Receive deliveries (long poll up to 20 s)",
          body="Receive", answer="Deliveries", forward=forward_receive, query=(PAYLOAD_ENCODING,),
          op="receiveMessages", perm=Permission(CONSUME, PATH)),
    Route("POST", "/ack", _settle("ack"), "Acknowledge deliveries", body="Receipts",
          answer="SettleResult", op="ackDeliveries", perm=SETTLE),
    Route("POST", "/nack", _settle("nack"), "Fail deliveries (retry after delay or backoff)",
          body="Nack", answer="SettleResult", op="nackDeliveries", perm=SETTLE),
    Route("POST", "/extend", _settle("extend"), "Extend visibility deadlines", body="Extend",
          answer="SettleResult", op="extendDeliveries", perm=SETTLE),
    Route("POST", "/term", _settle("term"), "Dead-letter deliveries now", body="Term",
          answer="SettleResult", op="termDeliveries", perm=SETTLE),
    Route("POST", "/consumers/{consumer}/release", release_consumer,
          "Give back the deliveries of a consumer (on the topics the token may consume)",
          body="Release", answer="Released", params={"consumer": "the consumer's id"},
          op="releaseConsumer", perm=Permission(CONSUME, BODY)),
]  # fmt: skip
