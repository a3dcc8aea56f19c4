"""The node's seams: layers that import only downwards, route tables that everything derives
from, one settle rule for every transport, and the proxy's header allowlist."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from raftq.node import app as app_module
from raftq.node.app import all_routes, build_app
from raftq.node.local import LocalRaft
from raftq.node.openapi import document
from raftq.node.proxy import ANSWER_HEADERS, FORWARD_HEADERS, FORWARDED, LEADER_HEADER
from raftq.node.routes import LEADER, LOCAL
from tests.node.inprocess import admin_client, app
from tests.support import ADMIN

Client = TestClient[web.Request, web.Application]
NODE = Path(app_module.__file__).parent
# What a module of each kind may not import: the pure layers never reach HTTP.
HTTP_MODULES = {"app", "httpio", "routes", "proxy", "topics", "messages", "ops", "stream"}
PURE = ("commands", "service")


def _imports(path: Path) -> set[str]:
    """The raftq.node modules a module imports, at any depth (function-level imports count;
    imports under ``if TYPE_CHECKING:`` do not: they never run)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "raftq.node":
                out.update(a.name for a in node.names)
            elif node.module.startswith("raftq.node."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("raftq.node."))
    return out


def test_raftq_node_has_no_import_cycle() -> None:
    graph = {p.stem: _imports(p) for p in NODE.glob("*.py")}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, f"import cycle: {' -> '.join([*path, m])}"
        state[m] = 1
        for dep in sorted(graph.get(m, ())):
            visit(dep, [*path, m])
        state[m] = 2

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize("module", PURE)
def test_pure_layers_import_no_http_module(module: str) -> None:
    assert not _imports(NODE / f"{module}.py") & HTTP_MODULES
    # ... nor aiohttp's server, even indirectly (checked in a fresh interpreter).
    code = (
        f"import sys, raftq.node.{module}; "
        "bad = sorted(m for m in sys.modules if m == 'aiohttp.web' or m.startswith('aiohttp.web_')"
        f" or m in {sorted('raftq.node.' + h for h in HTTP_MODULES)!r}); "
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "", f"raftq.node.{module} pulls in {out.stdout.strip()}"


def test_the_app_serves_exactly_the_route_tables() -> None:
    application = build_app(LocalRaft())
    served = {
        (r.method, r.resource.canonical)
        for r in application.router.routes()
        if r.resource is not None
    }
    declared = {(r.method, r.path) for r in all_routes()}
    heads = {("HEAD", p) for m, p in declared if m == "GET" and not p.endswith("/stream")}
    assert served == declared | heads
    assert len(declared) == len(all_routes())  # each route declared once
    for r in all_routes():
        assert r.where in (LEADER, LOCAL)
        assert not r.stream or (r.method == "GET" and r.where == LEADER)
        assert r.summary


def test_openapi_document_is_valid_and_derived_from_the_routes() -> None:
    doc = document(all_routes())
    validate(doc)  # openapi-spec-validator: the document is well-formed OpenAPI 3.0
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == {(r.method, r.path) for r in all_routes()}
    stream = doc["paths"]["/topics/{topic}/groups/{group}/stream"]["get"]
    query = {p["name"]: p["schema"] for p in stream["parameters"] if p["in"] == "query"}
    assert query["prefetch"] == {"type": "number", "minimum": 1, "maximum": 1000, "default": 10}
    assert [p["name"] for p in doc["paths"]["/cluster/members/{node}"]["delete"]["parameters"]]
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    json.dumps(doc)


def test_openapi_document_gives_patterns_ranges_answers_and_statuses() -> None:
    """What generated clients and fuzzers need (issue 20): every parameter with its pattern or
    range, bodies' patterns, ranges and minItems, each answer's schema and every status."""
    doc = document(all_routes())
    schemas = doc["components"]["schemas"]

    def params(path: str, method: str) -> dict[str, Any]:
        op = doc["paths"][path][method]
        return {p["name"]: p["schema"] for p in op["parameters"]}

    assert "pattern" in params("/cluster/members/{node}", "delete")["node"]
    assert "pattern" in params("/tokens/{token}", "get")["token"]
    assert params("/consumers/{consumer}/release", "post")["consumer"]["maxLength"] == 256
    listing = params("/topics", "get")
    assert listing["limit"]["maximum"] == 10_000 and "pattern" in listing["after"]
    assert params("/topics/{topic}/messages", "get")["limit"]["maximum"] == 1000
    assert set(params("/topics/{topic}/groups/{group}/stream", "get")) >= {
        "topic", "group", "prefetch", "visibility", "format", "batch"}  # fmt: skip
    assert "digest" in params("/cluster", "get")
    assert set(doc["paths"]["/topics"]["post"]["responses"]) >= {"200", "201", "4XX", "504"}
    assert "307" in doc["paths"]["/publish/stream"]["get"]["responses"]
    assert list(doc["paths"]["/openapi.json"]["get"]["responses"]["200"]["content"]) == [
        "application/json"
    ]
    assert "pattern" in schemas["CreateTopic"]["properties"]["topic"]
    assert schemas["PublishBatch"]["properties"]["messages"]["minItems"] == 1
    assert schemas["Receipts"]["properties"]["receipts"]["minItems"] == 1
    assert schemas["GroupConfig"]["properties"]["max_attempts"]["maximum"] == 1_000_000
    assert schemas["Message"]["properties"]["key"]["minLength"] == 1
    release = doc["paths"]["/consumers/{consumer}/release"]["post"]["requestBody"]
    assert release["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Release"
    }
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            ok = [s for s in op["responses"] if s.startswith("2")]
            for status in ok:
                for media in op["responses"][status].get("content", {}).values():
                    assert media["schema"] != {"$ref": "#/components/schemas/Any"}, (
                        method, path)  # fmt: skip


async def test_a_body_whose_fields_are_all_optional_is_not_required_in_the_document(
    node: tuple[LocalRaft, Client],
) -> None:
    """(An empty body is read as {}: the release handler, for one, takes none.)"""
    _, client = node
    paths = document(all_routes())["paths"]
    assert paths["/consumers/{consumer}/release"]["post"]["requestBody"]["required"] is False
    assert paths["/topics/{topic}/redrive"]["post"]["requestBody"]["required"] is False
    assert paths["/topics"]["post"]["requestBody"]["required"] is True
    r = await client.post("/consumers/c1/release")
    assert r.status == 200 and (await r.json())["released"] == 0


def test_openapi_operations_have_stable_ids_tags_and_a_user_description() -> None:
    """Generated clients name methods after operationIds and group them by tag: each route
    names its own (camelCase, unique), tagged by its module; info tells a user how to start."""
    doc = document(all_routes())
    ops = [(m, p, op) for p, by in doc["paths"].items() for m, op in by.items()]
    ids = [op["operationId"] for _, _, op in ops]
    assert all(r.op for r in all_routes()), [r.path for r in all_routes() if not r.op]
    assert len(set(ids)) == len(ids) and all(
        re.fullmatch(r"[a-z]+(?:[A-Z][a-z]*)*", i) for i in ids
    )
    by_id = {op["operationId"]: (m, p, op["tags"]) for m, p, op in ops}
    assert by_id["publishMessage"] == ("post", "/topics/{topic}/messages", ["messages"])
    assert by_id["receiveMessages"][2] == ["messages"] and by_id["ackDeliveries"][1] == "/ack"
    assert by_id["createTopic"][2] == by_id["getGroup"][2] == ["topics"]
    assert by_id["consumeStream"][2] == ["streams"] and by_id["revokeToken"][2] == ["tokens"]
    assert by_id["getCluster"][2] == by_id["getReadiness"][2] == ["cluster"]
    assert {t["name"] for t in doc["tags"]} == {"topics", "messages", "streams", "tokens", "sqs",
                                                "cluster", "console"}  # fmt: skip
    assert all(t["description"] for t in doc["tags"])
    description = doc["info"]["description"]
    for what in ("Authorization: Bearer", '"text"', "payload_encoding=utf-8", "Retry-After"):
        assert what in description, what
    assert "``" not in description  # (for users: Markdown, not this module's docstring)
    message = doc["components"]["schemas"]["Message"]
    assert message["oneOf"] == [{"required": ["payload"]}, {"required": ["text"]}]
    receive = doc["paths"]["/topics/{topic}/groups/{group}/receive"]["post"]["parameters"]
    [encoding] = [p for p in receive if p["name"] == "payload_encoding"]
    assert encoding["schema"]["enum"] == ["base64", "utf-8"]


async def test_served_openapi_is_the_derived_document(node: tuple[LocalRaft, Client]) -> None:
    _, client = node
    r = await client.get("/openapi.json")
    assert await r.json() == json.loads(json.dumps(document(all_routes())))


# ---------------------------------------------------------------- one settle rule


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ({"op": "ack", "receipts": []}, "receipts"),
        ({"op": "ack", "receipts": [7]}, "receipts"),
        ({"op": "ack", "receipts": "r"}, "receipts"),
        ({"op": "extend", "receipts": ["a:b:1:1:x"]}, "seconds"),
        ({"op": "nack", "receipts": ["a:b:1:1:x"], "seconds": 1}, None),
        ({"op": "term", "receipts": ["a:b:1:1:x"], "reason": 5}, "reason"),
    ],
)
async def test_a_settle_is_refused_alike_over_http_and_websocket(
    node: tuple[LocalRaft, Client], frame: dict[str, Any], field: str | None
) -> None:
    _, client = node
    await client.post("/topics", json={"topic": "settles", "if_not_exists": True})
    body = {k: v for k, v in frame.items() if k != "op"}
    r = await client.post(f"/{frame['op']}", json=body)
    http = await r.json()
    assert r.status == 400
    async with client.ws_connect("/topics/settles/groups/default/stream?format=json") as ws:
        await ws.send_str(json.dumps({"id": 1, **frame}))
        ws_err = await asyncio.wait_for(ws.receive_json(), 5)
    assert ws_err["type"] == "error" and ws_err["id"] == 1
    assert (ws_err["code"], ws_err["message"]) == (http["code"], http["message"])
    assert http["code"] in ("invalid_argument", "unknown_field")
    if field is not None:
        assert http["details"]["field"] == field


# ---------------------------------------------------------------- forwarding


@pytest.fixture
async def echo_leader_and_follower() -> AsyncIterator[tuple[list[dict[str, str]], Client]]:
    """A stand-in leader that records the headers of what reaches it, and a follower of it."""
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        headers = {"Retry-After": "3", "WWW-Authenticate": "Bearer", "X-Internal": "leak"}
        return web.json_response({"ok": True}, status=201, headers=headers)

    leader = web.Application()
    leader.router.add_route("*", "/{tail:.*}", echo)
    async with TestClient(TestServer(leader)) as lc:
        follower = LocalRaft("n2")
        follower.set_follower("n1", f"{lc.host}:{lc.port}")
        async with admin_client(app(follower, node_id="n2")) as fc:
            yield seen, fc


async def test_the_proxy_forwards_only_the_allowlisted_headers(
    echo_leader_and_follower: tuple[list[dict[str, str]], Client],
) -> None:
    seen, fc = echo_leader_and_follower
    sent = {
        **ADMIN,  # (checked here first, then forwarded for the leader to check)
        "Accept": "application/json",
        "Content-Type": "application/json",
        "User-Agent": "test",
        "Cookie": "session=1",
        "X-Custom": "1",
    }
    r = await fc.post("/topics", data=b'{"topic": "t"}', headers=sent)
    assert r.status == 201
    [got] = seen
    assert got[FORWARDED] == "n2"
    assert set(FORWARD_HEADERS) >= {"Authorization", "Accept", "Content-Type"}
    for h in FORWARD_HEADERS:
        assert got[h] == sent[h]
    assert "Cookie" not in got and "X-Custom" not in got
    for h in ANSWER_HEADERS:
        assert h in r.headers
    assert "X-Internal" not in r.headers
    assert r.headers[LEADER_HEADER].startswith("http://127.0.0.1:")
    # A local route is answered here, whatever the leader would say.
    r = await fc.get("/healthz")
    assert (await r.json())["node"] == "n2" and len(seen) == 1


def test_one_host_port_rule_for_flags_and_members() -> None:
    from raftq.node.commands import host_port
    from raftq.node.server import split_hostport

    for bad in ("h:0", "h:65536", ":80", "[nope]:80", "-h:80", "a b:1", "h:²", "h"):
        assert host_port(bad) is None
        with pytest.raises(ValueError, match="must be host:port"):
            split_hostport(bad, "--listen")
    assert host_port("[::1]:7001") == ("::1", 7001)
    assert host_port("::1:7001") is None  # a member's address: brackets required
    assert split_hostport(":::8001", "--listen") == ("::", 8001)  # a listen address: not
    assert split_hostport("proj_n4_1:8001", "--listen") == ("proj_n4_1", 8001)


async def test_an_empty_choice_in_the_query_means_its_default(
    node: tuple[LocalRaft, Client],
) -> None:
    """As before the route tables: ``?format=`` and ``?batch=`` fall back to the default."""
    _, client = node
    await client.post("/topics", json={"topic": "q"})
    async with client.ws_connect("/topics/q/groups/default/stream?format=&batch=") as ws:
        await client.post("/topics/q/messages", json={"payload": "bQ=="})
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert msg.type.name == "BINARY"  # msgpack, the default format
