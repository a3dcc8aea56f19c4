"""Access control on one in-process node (and a follower of it): a permission matrix generated
from the route tables, credentials that must fail, forwarding, audit lines, subprotocols."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from aiohttp import WSServerHandshakeError, web
from aiohttp.test_utils import TestClient, TestServer

from raftq.node import auth
from raftq.node.app import all_routes, build_app
from raftq.node.local import LocalRaft
from raftq.node.routes import Route
from tests.node.inprocess import INTERNAL, admin_client, app, settings
from tests.support import ADMIN, ADMIN_TOKEN

Client = TestClient[web.Request, web.Application]
TOPICS = ("orders.eu", "orders", "billing")  # inside orders.*, the bare prefix, elsewhere


@dataclass(frozen=True)
class Tok:
    name: str
    grants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cluster: bool = False


TOKENS = (
    Tok("publisher", (("orders.*", ("publish",)),)),
    Tok("consumer", (("orders.eu", ("consume",)),)),
    Tok("prefix-admin", (("orders.*", ("admin",)),)),
    Tok("everything", (("*", ("admin", "consume", "publish")),)),
    Tok("operator", cluster=True),
)


def matches(pattern: str, topic: str) -> bool:
    """The pattern rule, written out again here (the oracle must not be the code under test)."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return topic.startswith(pattern[:-1]) and len(topic) > len(pattern) - 1
    return pattern == topic


def has(tok: Tok, action: str, topic: str) -> bool:
    return any(matches(p, topic) and action in acts for p, acts in tok.grants)


def expected(tok: Tok, route: Route, topic: str) -> bool:
    assert route.perm is not None
    action = route.perm.action
    if action in (auth.PUBLIC, auth.OBSERVE, auth.AUTHENTICATED):
        return True
    if action == auth.CLUSTER:
        return tok.cluster
    if route.path == "/consumers/{consumer}/release":  # gives back only what it may consume
        return any("consume" in acts for _, acts in tok.grants)
    if action == auth.TOPIC:
        return any(has(tok, a, topic) for a in ("publish", "consume", "admin"))
    if (route.method, route.path) in (("POST", "/topics"), ("POST", "/topics/{topic}/groups")):
        return has(tok, "admin", topic) and has(tok, "admin", topic + ".dlq")  # its default DLQ
    return has(tok, action, topic)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# What each route is sent in the matrix: a body valid enough to reach the permission check
# (a body route checks after parsing it). A route missing here fails the test.
def bodies(topic: str) -> dict[tuple[str, str], Any]:
    receipt = [f"{topic}:default:1:1:abcd"]
    return {
        ("POST", "/topics"): {"topic": topic, "if_not_exists": True},
        ("PATCH", "/topics/{topic}"): {"config": {}},
        ("POST", "/topics/{topic}/purge"): {},
        ("POST", "/topics/{topic}/groups"): {"group": "g2", "if_not_exists": True},
        ("PATCH", "/topics/{topic}/groups/{group}"): {"config": {}},
        ("POST", "/topics/{topic}/groups/{group}/purge"): {},
        ("POST", "/topics/{topic}/messages"): {"payload": b64(b"m")},
        ("POST", "/topics/{topic}/publish"): {"messages": [{"payload": b64(b"m")}]},
        ("POST", "/topics/{topic}/redrive"): {},
        ("POST", "/topics/{topic}/groups/{group}/receive"): {"wait": 0},
        ("POST", "/ack"): {"receipts": receipt},
        ("POST", "/nack"): {"receipts": receipt},
        ("POST", "/extend"): {"receipts": receipt, "seconds": 5},
        ("POST", "/term"): {"receipts": receipt},
        ("POST", "/consumers/{consumer}/release"): {},
        ("POST", "/tokens"): {"name": f"m-{uuid.uuid4().hex[:8]}"},
        ("PATCH", "/tokens/{token}"): {"disabled": False},
        ("POST", "/cluster/members"): {"id": "n9", "raft": "127.0.0.1:1", "api": "127.0.0.1:1"},
        ("DELETE", "/cluster/members/{node}"): {},
        ("POST", "/sqs"): {},  # (SigV4, checked by the SQS endpoint itself: tests/sqs)
        ("PATCH", "/cluster/settings"): {"max_retained_bytes": None},
    }


def concrete(path: str, topic: str) -> str:
    return (
        path.replace("{topic}", topic)
        .replace("{group}", "default")
        .replace("{consumer}", "c-1")
        .replace("{token}", "nosuchtoken")
        .replace("{node}", "n9")
    )


async def make_token(client: Client, tok: Tok) -> str:
    grants = [{"topics": p, "actions": list(a)} for p, a in tok.grants]
    r = await client.post("/tokens", json={"name": tok.name, "grants": grants,
                                            "cluster": tok.cluster})  # fmt: skip
    assert r.status == 201, await r.text()
    text: str = (await r.json())["token"]
    return text


@pytest.fixture
async def authed() -> AsyncIterator[tuple[LocalRaft, Client, dict[str, str]]]:
    """A node with every matrix topic, and a token of each kind (name -> its secret text)."""
    raft = LocalRaft()
    async with admin_client(app(raft)) as client:
        for topic in TOPICS:
            r = await client.post("/topics", json={"topic": topic})
            assert r.status == 201
        texts = {tok.name: await make_token(client, tok) for tok in TOKENS}
        yield raft, client, texts


async def attempt(
    client: Client, route: Route, topic: str, headers: dict[str, str]
) -> tuple[int, str]:
    """One request of ``route`` on ``topic``: (status, error code or '')."""
    path = concrete(route.path, topic)
    if route.stream:
        try:
            async with client.ws_connect(path, headers=headers) as ws:
                if route.path != "/publish/stream":
                    return 101, ""
                frame = {"id": 1, "op": "publish", "topic": topic, "messages": [{"payload": b"m"}]}
                await ws.send_bytes(msgpack.packb(frame))
                got = msgpack.unpackb((await asyncio.wait_for(ws.receive(), 5)).data)
                return (403 if got.get("code") == "forbidden" else 101), got.get("code", "")
        except WSServerHandshakeError as e:
            return e.status, ""
    body = bodies(topic).get((route.method, route.path))
    data = None if body is None else json.dumps(body).encode()
    hs = {**headers, "Content-Type": "application/json"}
    r = await client.request(route.method, path, data=data, headers=hs)
    code = ""
    if r.status >= 400 and r.content_type == "application/json":
        code = (await r.json())["code"]
    return r.status, code


def test_every_route_of_the_matrix_has_a_request() -> None:
    covered = set(bodies("t"))
    for route in all_routes():
        if (route.body is not None and route.body != "Empty") or route.method in ("POST", "PATCH"):
            assert (route.method, route.path) in covered, f"add {route.method} {route.path}"


async def test_the_permission_matrix_has_no_wrong_allow_and_no_wrong_deny(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    wrong = []
    checked = 0
    for tok in TOKENS:
        # (the client's own Authorization header is replaced by this token's)
        headers = {"Authorization": f"Bearer {texts[tok.name]}"}
        for route in all_routes():
            for topic in TOPICS if "{topic}" in route.path or route.perm.topic else TOPICS[:1]:  # type: ignore[union-attr]
                status, code = await attempt(client, route, topic, headers)
                allowed = status not in (401, 403)
                if status == 403:
                    assert code in ("forbidden", ""), (route.path, code)
                if allowed != expected(tok, route, topic):
                    wrong.append((tok.name, route.method, route.path, topic, status, code))
                checked += 1
    assert checked > 300
    assert wrong == []


async def test_without_a_valid_token_every_non_public_route_is_401(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    raft, client, texts = authed
    good = texts["everything"]
    tid, secret = auth.parse(good) or ("", "")
    r = await client.patch(f"/tokens/{tid}", json={})  # (a no-op change answers the view)
    assert r.status == 200
    # expired and disabled tokens, made straight in the state
    for name in ("expired", "off"):
        raft.broker.apply({"op": "token_create", "now": 2, "id": name, "name": name,
                           "hash": auth.secret_hash("x" * 32), "grants": []})  # fmt: skip
    raft.broker.apply({"op": "token_update", "now": 3, "id": "expired", "expires_at": 1})
    raft.broker.apply({"op": "token_update", "now": 3, "id": "off", "disabled": True})
    bad = {
        "none": {"Authorization": ""},
        "not bearer": {"Authorization": f"Basic {good}"},
        "forged secret": {"Authorization": f"Bearer rq_{tid}.{'A' * len(secret)}"},
        "truncated": {"Authorization": f"Bearer {good[:-5]}"},
        "unknown id": {"Authorization": f"Bearer rq_nosuch.{secret}"},
        "garbage": {"Authorization": "Bearer hello"},
        "forged internal": {"Authorization": f"Bearer rq_internal.{'0' * 64}"},
        "expired": {"Authorization": f"Bearer rq_expired.{'x' * 32}"},
        "disabled": {"Authorization": f"Bearer rq_off.{'x' * 32}"},
    }
    for why, headers in bad.items():
        for route in all_routes():
            status, _ = await attempt(client, route, "orders.eu", headers)
            public = route.perm is not None and route.perm.action in (auth.PUBLIC, auth.OBSERVE)
            assert (status == 401) != public, (why, route.method, route.path, status)
    r = await client.get("/topics", headers={"Authorization": "Bearer rq_off." + "x" * 32})
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert "disabled" in (await r.json())["message"]


async def test_a_revoked_token_is_refused_at_once(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {texts['publisher']}"}
    assert (await client.post("/topics/orders.eu/messages", json={"payload": b64(b"1")},
                              headers=headers)).status == 200  # fmt: skip
    tid = (auth.parse(texts["publisher"]) or ("", ""))[0]
    assert (await client.delete(f"/tokens/{tid}")).status == 200
    r = await client.post("/topics/orders.eu/messages", json={"payload": b64(b"2")},
                          headers=headers)  # fmt: skip
    assert r.status == 401


async def test_a_token_sees_only_its_topics_and_cannot_learn_of_others(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {texts['consumer']}"}
    r = await client.get("/topics", headers=headers)
    assert (await r.json())["topics"] == ["orders.eu"]
    # A topic it has no right on answers 403 whether it exists or not.
    for topic in ("billing", "no-such-topic"):
        r = await client.get(f"/topics/{topic}", headers=headers)
        body = await r.json()
        assert r.status == 403 and body["details"] == {
            "action": "topic", "topic": topic, "token": "consumer"}  # fmt: skip


async def test_a_dead_letter_topic_named_in_a_config_needs_admin_on_it_too(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {texts['prefix-admin']}"}
    spec = {"group": "g", "config": {"dead_letter_topic": "billing"}}
    r = await client.post("/topics/orders.eu/groups", json=spec, headers=headers)
    assert r.status == 403 and (await r.json())["details"]["topic"] == "billing"
    spec["config"] = {"dead_letter_topic": "orders.eu.dlq"}
    r = await client.post("/topics/orders.eu/groups", json=spec, headers=headers)
    assert r.status == 201


async def test_release_gives_back_only_what_the_token_may_consume(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    for topic in ("orders.eu", "billing"):
        await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"x")})
        r = await client.post(f"/topics/{topic}/groups/default/receive",
                              json={"consumer": "shared", "visibility": 600})  # fmt: skip
        assert len((await r.json())["deliveries"]) == 1
    headers = {"Authorization": f"Bearer {texts['consumer']}"}
    r = await client.post("/consumers/shared/release", headers=headers)
    assert (await r.json())["released"] == 1  # orders.eu's; billing's stays in flight
    stats = await (await client.get("/topics/billing/groups/default")).json()
    assert stats["in_flight"] == 1


async def test_a_websocket_may_authenticate_with_a_subprotocol(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    raft, _, texts = authed
    # A client without the default Authorization header (as a browser is).
    async with TestClient(TestServer(app(raft))) as bare:
        protocols = (auth.SUBPROTOCOL, auth.BEARER_SUBPROTOCOL + texts["consumer"])
        async with bare.ws_connect("/topics/orders.eu/groups/default/stream",
                                   protocols=protocols) as ws:  # fmt: skip
            assert ws.protocol == auth.SUBPROTOCOL
        with pytest.raises(WSServerHandshakeError) as e:
            async with bare.ws_connect("/topics/billing/groups/default/stream",
                                       protocols=protocols):  # fmt: skip
                pass
        assert e.value.status == 403
        with pytest.raises(WSServerHandshakeError) as e:
            async with bare.ws_connect("/topics/orders.eu/groups/default/stream"):
                pass
        assert e.value.status == 401


async def test_admin_actions_are_audited_and_no_secret_is_logged(
    authed: tuple[LocalRaft, Client, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    _, client, texts = authed
    caplog.set_level(logging.INFO)
    r = await client.post("/tokens", json={"name": "audited"})
    secret = (await r.json())["token"]
    headers = {"Authorization": f"Bearer {texts['prefix-admin']}"}
    assert (await client.post("/topics/orders.eu/purge", headers=headers)).status == 200
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "raftq.node.audit"]
    assert "audit: token admin: POST /tokens /tokens" in lines
    tid = (auth.parse(texts["prefix-admin"]) or ("", ""))[0]
    assert (
        f"audit: token prefix-admin ({tid}): POST /topics/{{topic}}/purge /topics/orders.eu/purge"
        in lines
    )
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    for text in (secret, ADMIN_TOKEN, *texts.values()):
        assert text not in logged and text.split(".")[1] not in logged


async def test_a_forwarded_request_is_checked_on_both_hops(
    leader_and_follower: tuple[LocalRaft, Client, LocalRaft, Client],
) -> None:
    """LocalRafts share no state, so each node's own view decides on its hop."""
    leader, lc, follower, fc = leader_and_follower
    assert (await lc.post("/topics", json={"topic": "t"})).status == 201
    tid, secret, text = auth.new_token()
    headers = {"Authorization": f"Bearer {text}"}
    record = {"op": "token_create", "now": 1, "id": tid, "name": "t-pub",
              "hash": auth.secret_hash(secret),
              "grants": [{"topics": "t", "actions": ["publish"]}]}  # fmt: skip
    publish: Callable[[], Any] = lambda: fc.post(  # noqa: E731
        "/topics/t/messages", json={"payload": b64(b"x")}, headers=headers
    )
    # Known only to the leader: the follower refuses it before forwarding.
    leader.broker.apply(record)
    assert (await publish()).status == 401
    # Known to both: forwarded, and the leader accepts it.
    follower.broker.apply(record)
    assert (await publish()).status == 200
    # Revoked at the leader only: the follower lets it through, the leader refuses it.
    leader.broker.apply({"op": "token_revoke", "now": 2, "id": tid})
    r = await publish()
    assert r.status == 401 and r.headers.get("X-Raftq-Leader")
    # X-Raftq-Forwarded is no credential.
    r = await lc.post("/topics/t/messages", json={"payload": b64(b"y")},
                      headers={"Authorization": "", "X-Raftq-Forwarded": "n2"})  # fmt: skip
    assert r.status == 401


def test_a_route_without_a_permission_does_not_start() -> None:
    async def h(svc: Any, request: web.Request) -> web.StreamResponse:
        return web.Response()

    with pytest.raises(ValueError, match="declares no permission"):
        build_app(LocalRaft(), settings(), [*all_routes(), Route("GET", "/x", h, "x")])


async def test_access_control_off_lets_anyone_do_anything() -> None:
    async with TestClient(TestServer(build_app(LocalRaft(), settings(auth=False)))) as c:
        assert (await c.post("/topics", json={"topic": "t"})).status == 201
        assert (await c.post("/tokens", json={"name": "x"})).status == 201


async def test_metrics_and_the_api_document_can_require_a_token() -> None:
    async with TestClient(TestServer(app(LocalRaft(), auth_observe=True))) as c:
        assert (await c.get("/metrics")).status == 401
        assert (await c.get("/openapi.json")).status == 401
        assert (await c.get("/healthz")).status == 200
        assert (await c.get("/metrics", headers=ADMIN)).status == 200


async def test_open_streams_end_when_their_token_is_revoked(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {texts['everything']}"}
    tid = (auth.parse(texts["everything"]) or ("", ""))[0]
    async with (
        client.ws_connect("/publish/stream", headers=headers) as pub,
        client.ws_connect(
            "/topics/orders.eu/groups/default/stream?format=json", headers=headers
        ) as sub,
    ):
        frame = {"id": 1, "op": "publish", "topic": "orders.eu", "messages": [{"payload": b"a"}]}
        await pub.send_bytes(msgpack.packb(frame))
        got = msgpack.unpackb((await asyncio.wait_for(pub.receive(), 5)).data)
        assert got["type"] == "result"
        assert (await asyncio.wait_for(sub.receive_json(), 5))["type"] == "delivery"
        assert (await client.delete(f"/tokens/{tid}")).status == 200
        await pub.send_bytes(msgpack.packb({**frame, "id": 2}))
        got = msgpack.unpackb((await asyncio.wait_for(pub.receive(), 5)).data)
        assert (got["id"], got["code"]) == (2, "unauthenticated")
        assert (await asyncio.wait_for(pub.receive(), 5)).type.name in ("CLOSE", "CLOSED")
        assert pub.close_code == 1008
        # The consumer stream notices at its next turn (within a second when idle).
        while not sub.closed:
            await asyncio.wait_for(sub.receive(), 5)
        assert sub.close_code == 1008


async def test_a_follower_waits_a_moment_for_a_token_it_does_not_know_yet(
    leader_and_follower: tuple[LocalRaft, Client, LocalRaft, Client],
) -> None:
    """A token used through a follower the moment it was created: the follower asks its state
    again as entries apply, instead of refusing it at once; an unknown one is refused."""
    leader, lc, follower, fc = leader_and_follower
    assert (await lc.post("/topics", json={"topic": "t"})).status == 201
    tid, secret, text = auth.new_token()
    record = {"op": "token_create", "now": 1, "id": tid, "name": "late",
              "hash": auth.secret_hash(secret),
              "grants": [{"topics": "t", "actions": ["publish"]}]}  # fmt: skip
    leader.broker.apply(record)
    headers = {"Authorization": f"Bearer {text}"}
    # The follower has heard the leader commit more than it has applied (it trails).
    own = follower.status
    follower.status = lambda: dataclasses.replace(  # type: ignore[method-assign]
        own(), leader_commit=own().applied_index + 1
    )
    publish = asyncio.ensure_future(
        fc.post("/topics/t/messages", json={"payload": b64(b"x")}, headers=headers)
    )
    await asyncio.sleep(0.2)
    assert not publish.done()
    follower.broker.apply(record)  # replication reaches the follower
    assert (await asyncio.wait_for(publish, 5)).status == 200
    follower.status = own  # type: ignore[method-assign]  # caught up: unknown is refused soon
    t0 = asyncio.get_running_loop().time()
    r = await fc.get("/cluster", headers={"Authorization": f"Bearer rq_nosuch.{secret}"})
    assert r.status == 401 and asyncio.get_running_loop().time() - t0 < 0.9


async def test_the_brokers_own_headers_cannot_be_set_so_redrive_cannot_be_aimed(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    """Dead-letter history headers steer a redrive: a client may not forge them (else a token
    with rights on its own topic could redrive into any other topic's group)."""
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {texts['everything']}"}
    forged = {"x-raftq-dlq-topic": "billing", "x-raftq-dlq-group": "default"}
    for body, path in (
        ({"payload": b64(b"x"), "headers": forged}, "/topics/orders.eu/messages"),
        ({"messages": [{"payload": b64(b"x"), "headers": {"X-Raftq-Redrives": "9"}}]},
         "/topics/orders.eu/publish"),
    ):  # fmt: skip
        r = await client.post(path, json=body, headers=headers)
        assert r.status == 400 and "broker's own" in (await r.json())["message"]
    async with client.ws_connect("/publish/stream", headers=headers) as ws:
        frame = {"id": 1, "op": "publish", "topic": "orders.eu",
                 "messages": [{"payload": b"x", "headers": forged}]}  # fmt: skip
        await ws.send_bytes(msgpack.packb(frame))
        got = msgpack.unpackb((await asyncio.wait_for(ws.receive(), 5)).data)
        assert got["code"] == "invalid_argument"


async def test_a_long_poll_stops_receiving_once_its_token_is_revoked(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {texts['consumer']}"}
    poll = asyncio.ensure_future(
        client.post("/topics/orders.eu/groups/default/receive", json={"wait": 10}, headers=headers)
    )
    await asyncio.sleep(0.1)
    tid = (auth.parse(texts["consumer"]) or ("", ""))[0]
    assert (await client.delete(f"/tokens/{tid}")).status == 200
    await client.post("/topics/orders.eu/messages", json={"payload": b64(b"secret")})
    r = await asyncio.wait_for(poll, 5)
    assert r.status == 401  # not the message: the poll asked again before receiving it
    stats = await (await client.get("/topics/orders.eu/groups/default")).json()
    assert stats["in_flight"] == 0


async def test_a_consumer_stream_whose_grants_shrink_ends(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {texts['consumer']}"}
    tid = (auth.parse(texts["consumer"]) or ("", ""))[0]
    async with client.ws_connect(
        "/topics/orders.eu/groups/default/stream?format=json", headers=headers
    ) as sub:
        assert (await client.patch(f"/tokens/{tid}", json={"grants": []})).status == 200
        await client.post("/topics/orders.eu/messages", json={"payload": b64(b"late")})
        got = []
        while not sub.closed:
            msg = await asyncio.wait_for(sub.receive(), 5)
            if msg.type.name == "TEXT":
                got.append(msg.data)
        assert got == [] and sub.close_code == 1008


async def test_the_internal_credential_may_only_give_back_deliveries(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    headers = {"Authorization": f"Bearer {INTERNAL}"}
    r = await client.post("/consumers/c-9/release", json={"topics": ["orders.eu"]},
                          headers=headers)  # fmt: skip
    assert r.status == 200
    for method, path in (("GET", "/topics"), ("POST", "/tokens"), ("GET", "/cluster")):
        r = await client.request(method, path, json={"name": "x"}, headers=headers)
        assert r.status == 403, (method, path)
    # A token may narrow a release to its own patterns, never widen it.
    mine = {"Authorization": f"Bearer {texts['consumer']}"}
    r = await client.post("/consumers/c-9/release", json={"topics": ["billing"]}, headers=mine)
    assert r.status == 403
    r = await client.post("/consumers/c-9/release", json={"topics": ["orders.eu"]}, headers=mine)
    assert r.status == 200


async def test_odd_credentials_are_401_never_500(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    for value in (b"Bearer rq_abc.\xff\xfe" + b"a" * 20, b"Bearer \xe9t\xe9-token-0123456789"):
        r = await client.get("/topics", headers={"Authorization": value.decode("latin-1")})
        assert r.status == 401
    # A subprotocol is a credential only on a WebSocket handshake.
    r = await client.get(
        "/topics",
        headers={
            "Authorization": "",
            "Sec-WebSocket-Protocol": f"raftq, bearer.{texts['everything']}",
        },
    )
    assert r.status == 401  # (an empty Authorization: no token)


async def test_a_bearer_subprotocol_without_raftq_is_refused_and_never_logged(
    authed: tuple[LocalRaft, Client, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    raft, _, texts = authed
    caplog.set_level(logging.DEBUG)
    async with TestClient(TestServer(app(raft))) as bare:
        with pytest.raises(WSServerHandshakeError) as e:
            async with bare.ws_connect(
                "/topics/orders.eu/groups/default/stream",
                protocols=("bearer." + texts["everything"],),
            ):
                pass  # fmt: skip
        assert e.value.status == 400
        async with bare.ws_connect(
            "/topics/orders.eu/groups/default/stream",
            protocols=("other", "raftq", "bearer." + texts["everything"]),
        ):
            pass  # fmt: skip
    secret = texts["everything"].split(".")[1]
    assert not [r for r in caplog.records if secret in r.getMessage()]


async def test_a_state_digest_needs_a_cluster_token(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, texts = authed
    r = await client.get("/cluster?digest=1", headers={"Authorization":
                         f"Bearer {texts['everything']}"})  # fmt: skip
    assert r.status == 403
    r = await client.get("/cluster?digest=1", headers={"Authorization":
                         f"Bearer {texts['operator']}"})  # fmt: skip
    assert r.status == 200 and "digest" in await r.json()


async def test_reserved_token_names_are_refused(
    authed: tuple[LocalRaft, Client, dict[str, str]],
) -> None:
    _, client, _ = authed
    for name in ("admin", "internal", "anonymous"):
        r = await client.post("/tokens", json={"name": name})
        assert r.status == 400 and (await r.json())["details"]["field"] == "name"


async def test_a_dropped_receive_through_a_follower_gives_back_only_what_its_token_may_consume(
    leader_and_follower: tuple[LocalRaft, Client, LocalRaft, Client],
) -> None:
    leader, lc, follower, fc = leader_and_follower
    for topic in ("a", "b"):
        assert (await lc.post("/topics", json={"topic": topic})).status == 201
        await lc.post(f"/topics/{topic}/messages", json={"payload": b64(b"m")})
        r = await lc.post(f"/topics/{topic}/groups/default/receive",
                          json={"consumer": "worker-1", "visibility": 600})  # fmt: skip
        assert len((await r.json())["deliveries"]) == 1
    tid, secret, text = auth.new_token()
    record = {"op": "token_create", "now": 1, "id": tid, "name": "a-reader",
              "hash": auth.secret_hash(secret),
              "grants": [{"topics": "a", "actions": ["consume"]}]}  # fmt: skip
    leader.broker.apply(record)
    follower.broker.apply(record)
    poll = asyncio.ensure_future(
        fc.post(
            "/topics/a/groups/default/receive",
            json={"consumer": "worker-1", "wait": 10},
            headers={"Authorization": f"Bearer {text}"},
        )
    )
    await asyncio.sleep(0.3)
    poll.cancel()  # the client goes away: the follower gives back what it may consume

    def in_flight(topic: str) -> int:
        return int(leader.read(lambda b: b.group_stats(topic, "default"))["in_flight"])

    for _ in range(200):  # bounded wait for the follower's release at the leader
        if in_flight("a") == 0:
            break
        await asyncio.sleep(0.02)
    assert (in_flight("a"), in_flight("b")) == (0, 1)
