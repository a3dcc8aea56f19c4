"""The SQS endpoint's routes on the native API: ``/sqs`` (the SQS protocols, signed with SigV4:
where followers forward, and usable as an endpoint itself) and ``GET /sqs/credentials`` (the
calling token's SQS access key; ``raftq sqs credentials``)."""

from __future__ import annotations

from aiohttp import web

from raftq.node import auth, httpio
from raftq.node.auth import AUTHENTICATED, PUBLIC, Permission
from raftq.node.errors import ApiError
from raftq.node.openapi import SQS
from raftq.node.ops import FORWARDER
from raftq.node.routes import AUTHN, LOCAL, Route, principal
from raftq.node.service import BrokerService
from raftq.node.sqs.credentials import secret_access_key
from raftq.node.sqs.frontend import ADMIN_KEY, FORWARD_PATH, Frontend

__all__ = ["FORWARD_PATH", "ROUTES"]


def frontend(svc: BrokerService, app: web.Application) -> Frontend:
    return Frontend(svc, app[FORWARDER], app[AUTHN])


async def sqs(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    return await frontend(svc, request.app).handle(request)


async def credentials(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """The calling token's SQS credentials (this token's only)."""
    who = principal(request)
    key = svc.settings.sqs_key
    if not svc.settings.auth:
        return httpio.respond(request, {
            "access_key_id": "raftq", "secret_access_key": "raftq", "region": "us-east-1",
            "note": "access control is off: any signature (or none) is accepted",
        })  # fmt: skip
    if key is None:
        raise ApiError("invalid_argument", "this node has no cluster secret to derive SQS"
                       " credentials from (start it with RAFTQ_SECRET)")  # fmt: skip
    text = auth.credential(request.headers) or ""
    parsed = auth.parse(text)
    if parsed is None or who.name == "internal":
        raise ApiError("forbidden", "only a token has SQS credentials", {"token": who.name})
    tid, secret = parsed
    if who.name == "admin" and who.token_id is None:
        tid, digest = ADMIN_KEY, auth.secret_hash(text)
    else:
        digest = auth.secret_hash(secret)
    return httpio.respond(request, {
        "access_key_id": tid,
        "secret_access_key": secret_access_key(key, tid, digest),
        "region": "us-east-1",
    })  # fmt: skip


ROUTES = [
    Route("POST", FORWARD_PATH, sqs, "The SQS API (AWS JSON 1.0 or query protocol, SigV4-signed)",
          where=LOCAL, strict_query=False, answer=SQS, op="sqs", perm=Permission(PUBLIC)),
    Route("GET", FORWARD_PATH, sqs, "The SQS API by presigned URL (query protocol)",
          where=LOCAL, strict_query=False, answer=SQS, op="sqsGet", perm=Permission(PUBLIC)),
    Route("GET", FORWARD_PATH + "/credentials", credentials,
          "The calling token's SQS access key id and secret access key", where=LOCAL,
          answer="SqsCredentials", op="getSqsCredentials", perm=Permission(AUTHENTICATED)),
]  # fmt: skip
