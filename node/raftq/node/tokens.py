"""HTTP routes for API tokens: create (the secret is answered once, never stored), list, show,
change (disable, rename, grants, expiry) and revoke. All need a token with the ``cluster`` flag.

The leader makes the id and the secret; the command carries only the secret's SHA-256, so the
secret is in no log, journal or snapshot. A change takes effect on each node as soon as the
command is applied there.
"""

from __future__ import annotations

import re
import time
from typing import Any

from aiohttp import web

from raftq.node import auth, commands, httpio
from raftq.node.auth import CLUSTER, Permission
from raftq.node.commands import BOOL, LIST, MAX_EXPIRES_IN_S, NUM, STR
from raftq.node.errors import ApiError
from raftq.node.routes import Route
from raftq.node.service import BrokerService

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FIELDS = {"name": STR, "grants": LIST, "cluster": BOOL, "expires_in": NUM}


def _token_id(request: web.Request) -> str:
    tid = request.match_info["token"]
    if not _ID.fullmatch(tid):
        raise ApiError(
            "invalid_argument", "a token id is 1-64 of A-Z a-z 0-9 _ -", {"field": "token"}
        )
    return tid


def _expiry(body: dict[str, Any], cmd: dict[str, Any]) -> None:
    """``expires_in`` (seconds from now, by this node's clock) as the command's ``expires_at``."""
    secs = body.get("expires_in")
    if secs is None:
        return
    if not 0 < secs <= MAX_EXPIRES_IN_S:
        raise ApiError(
            "invalid_argument", f"expires_in must be 0 to {MAX_EXPIRES_IN_S} seconds",
            {"field": "expires_in"},
        )  # fmt: skip
    cmd["expires_at"] = int(time.time() * 1000 + secs * 1000)


def _name_free(body: dict[str, Any]) -> None:
    if body.get("name") in auth.RESERVED_NAMES:  # (the audit log's names for the others)
        raise ApiError(
            "invalid_argument", f"{body['name']!r} is a reserved name", {"field": "name"}
        )


async def create_token(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    body = commands.check_fields(await httpio.read_body(request), _FIELDS, ("name",))
    _name_free(body)
    tid, secret, text = auth.new_token()
    cmd: dict[str, Any] = {
        "op": "token_create",
        "id": tid,
        "name": body["name"],
        "hash": auth.secret_hash(secret),
        "grants": body.get("grants") or [],
        "cluster": bool(body.get("cluster")),
    }
    _expiry(body, cmd)
    res = await svc.call(cmd)
    view = await svc.read_latest(lambda b: _public(b.token(tid)))
    return httpio.respond(request, {**view, **res, "token": text}, 201)


def _public(record: dict[str, Any] | None) -> dict[str, Any]:
    if record is None:
        raise ApiError("token_not_found", "no such token", {})
    return {k: v for k, v in record.items() if k != "hash"}


async def list_tokens(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    return httpio.respond(request, {"tokens": await svc.read_latest(lambda b: b.tokens())})


async def show_token(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    tid = _token_id(request)
    return httpio.respond(request, await svc.read_latest(lambda b: _public(b.token(tid))))


async def update_token(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    tid = _token_id(request)
    body = commands.check_fields(await httpio.read_body(request), {**_FIELDS, "disabled": BOOL})
    _name_free(body)
    cmd: dict[str, Any] = {"op": "token_update", "id": tid}
    cmd.update({k: v for k, v in body.items() if v is not None and k != "expires_in"})
    _expiry(body, cmd)
    return httpio.respond(request, await svc.call(cmd))


async def revoke_token(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    tid = _token_id(request)
    return httpio.respond(request, await svc.call({"op": "token_revoke", "id": tid}))


MANAGE = Permission(CLUSTER)
TOKEN = {"token": "the token's id (the part between rq_ and the dot)"}
ROUTES = [
    Route("POST", "/tokens", create_token,
          "Create a token; the answer's token field is its secret, shown this once",
          body="CreateToken", ok=(201,), answer="Token", op="createToken", perm=MANAGE),
    Route("GET", "/tokens", list_tokens, "List tokens (never their secrets)",
          answer="TokenList", op="listTokens", perm=MANAGE),
    Route("GET", "/tokens/{token}", show_token, "One token", answer="Token", params=TOKEN,
          op="getToken", perm=MANAGE),
    Route("PATCH", "/tokens/{token}", update_token,
          "Change a token: disabled, name, grants, cluster, expires_in", body="UpdateToken",
          answer="Token", params=TOKEN, op="updateToken", perm=MANAGE),
    Route("DELETE", "/tokens/{token}", revoke_token, "Revoke a token (at once, on every node)",
          answer="Revoked", params=TOKEN, op="revokeToken", perm=MANAGE),
]  # fmt: skip
