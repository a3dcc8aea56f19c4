"""Arbitrary request bodies on every route: a 4xx (or success), never a 500, never a crash; and
schemathesis against the served OpenAPI document: every answer is a status, content type and
body that the document declares."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from raftq.node.app import all_routes
from raftq.node.local import LocalRaft
from tests.node.cluster_fixture import free_ports
from tests.node.inprocess import app
from tests.support import ADMIN

FIELDS = [
    "topic",
    "group",
    "config",
    "groups",
    "payload",
    "headers",
    "key",
    "delay",
    "messages",
    "consumer",
    "max",
    "wait",
    "visibility",
    "receipts",
    "seconds",
    "reason",
    "start",
    "max_messages",
    "max_attempts",
    "visibility_timeout",
    "backoff",
    "if_not_exists",
]
PATHS = [
    ("POST", "/topics"),
    ("PATCH", "/topics/fz"),
    ("POST", "/topics/fz/groups"),
    ("PATCH", "/topics/fz/groups/default"),
    ("POST", "/topics/fz/messages"),
    ("POST", "/topics/fz/publish"),
    ("POST", "/topics/fz/groups/default/receive"),
    ("POST", "/ack"),
    ("POST", "/nack"),
    ("POST", "/extend"),
    ("POST", "/term"),
    ("POST", "/topics/fz/redrive"),
    ("POST", "/topics/fz/purge"),
    ("POST", "/consumers/c1/release"),
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["fz", "default", "aGk=", "fz:default:1:1:00", "earliest"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=5)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, LocalRaft]]:
    raft = LocalRaft()
    port = free_ports(1)[0]
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = web.AppRunner(app(raft, max_body=64 * 1024), handler_cancellation=True)

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    def run() -> None:
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        url = f"http://127.0.0.1:{port}"
        assert _send(url + "/topics", "POST", b'{"topic": "fz"}', "application/json") == 201
        yield url, raft
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _send(url: str, method: str, data: bytes, ctype: str) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": ctype, **ADMIN}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        assert set(body) == {"code", "message", "details"}, body
        return int(e.code)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(route=st.sampled_from(PATHS), body=bodies, use_msgpack=st.booleans())
def test_arbitrary_bodies_never_cause_a_server_error(
    server: tuple[str, LocalRaft], route: tuple[str, str], body: dict[str, Any], use_msgpack: bool
) -> None:
    url, _ = server
    method, path = route
    if "wait" in body:
        body["wait"] = 0  # keep long polls short
    try:
        data = msgpack.packb(body) if use_msgpack else json.dumps(body).encode()
    except OverflowError:
        data = json.dumps(body).encode()
        use_msgpack = False
    ctype = "application/msgpack" if use_msgpack else "application/json"
    status = _send(url + path, method, data, ctype)
    assert status < 500, (method, path, body)


# Budget: examples per operation and generation mode (positive: valid by the document;
# negative: not); ~45 operations x 2 modes.
SCHEMATHESIS_EXAMPLES = 10
# The node would call whatever address it is given (raftq.node.ops.add_member); the
# membership rules have tests of their own.
NOT_FUZZED = {("POST", "/cluster/members")}
# (negative: where there is something to get wrong, a parameter or a body)
OPERATIONS = sorted(
    (r.method, r.path, mode)
    for r in all_routes()
    if (r.method, r.path) not in NOT_FUZZED
    for mode in GenerationMode
    if mode is GenerationMode.POSITIVE or r.query or r.body or "{" in r.path
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def served_document(server: tuple[str, LocalRaft]) -> Any:
    url, _ = server
    return schemathesis.openapi.from_url(url + "/openapi.json")


@pytest.mark.parametrize(("method", "path", "mode"), OPERATIONS)
def test_the_served_document_holds_for_generated_requests(
    served_document: Any, method: str, path: str, mode: GenerationMode
) -> None:
    """Requests made from the document (valid, or not) with the admin token: never a 5xx, and
    every answer's status, content type, headers and body are ones the document declares."""
    operation = served_document[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=SCHEMATHESIS_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def holds(case: Case[Any]) -> None:
        if isinstance(case.body, dict) and "wait" in case.body:
            case.body["wait"] = 0  # (a long poll would spend the budget waiting)
        case.call_and_validate(headers=ADMIN, timeout=10, checks=CHECKS)

    holds()
