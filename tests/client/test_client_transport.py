"""Both clients' request loops against a scripted ``transport`` (no server, no socket): which
node each try goes to, what a redirect or ``X-Raftq-Leader`` teaches, and which failures are
retried, as ``raftq.client.transport`` and client/raftq/client/DESIGN.md describe them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from raftq.client import (
    AsyncClient,
    Client,
    ProtocolError,
    TopicExists,
    TopicFull,
    Unavailable,
    UnknownOutcome,
)
from raftq.client.transport import (
    AsyncTransport,
    ConnectFailed,
    ConnectionDropped,
    Response,
    Transport,
)

N1, N2, N3 = "http://n1:8001", "http://n2:8002", "http://n3:8003"


@dataclass(frozen=True)
class Call:
    method: str
    url: str
    headers: dict[str, str]
    body: Any  # decoded msgpack, or None
    timeout: float


# script(call, number of the call from 1) -> the response, or an exception to raise
Script = Callable[[Call, int], Response | Exception]


class Scripted:
    """Answers every request from ``script`` and records it."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls: list[Call] = []
        self.closed = False

    def answer(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response:
        decoded = None if body is None else msgpack.unpackb(body, raw=False)
        call = Call(method, url, dict(headers), decoded, timeout)
        self.calls.append(call)
        out = self.script(call, len(self.calls))
        if isinstance(out, Exception):
            raise out
        return out

    def close(self) -> None:
        self.closed = True

    @property
    def urls(self) -> list[str]:
        return [c.url for c in self.calls]


class SyncScripted(Scripted):
    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response:
        return self.answer(method, url, headers, body, timeout)


class AsyncScripted(Scripted):
    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response:
        await asyncio.sleep(0)  # (a real one yields to the loop at least once)
        return self.answer(method, url, headers, body, timeout)


def _types_fit(a: AsyncScripted, s: SyncScripted) -> tuple[AsyncTransport, Transport]:
    return a, s  # (mypy checks that the scripted transports follow the Protocols)


def reply(status: int = 200, obj: Any = None, **headers: str) -> Response:
    hs = {k.replace("_", "-").lower(): v for k, v in headers.items()}
    body = b""
    if obj is not None:
        body = msgpack.packb(obj, use_bin_type=True)
        hs["content-type"] = "application/msgpack"
    return Response(status, hs, body)


def error(status: int, code: str) -> Response:
    return reply(status, {"code": code, "message": code, "details": {}})


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the headers a client sends: no RAFTQ_TOKEN from the suite."""
    monkeypatch.delenv("RAFTQ_TOKEN", raising=False)


TOPICS = {"topics": ["a"]}
CREATED = {"topic": "t"}
NO_LEADER = error(503, "no_leader")


def run_both(
    fn: Callable[[Any], Any], script: Script, urls: list[str] | None = None, **kw: Any
) -> list[tuple[Any, Scripted, Any]]:
    """``fn(client)`` with the async client, then with the sync one, each over a transport of
    its own playing ``script``: (what it returned or raised, the transport, the client)."""
    out: list[tuple[Any, Scripted, Any]] = []
    seeds = urls or [N1]

    async def with_async() -> None:
        t = AsyncScripted(script)
        async with AsyncClient(seeds, transport=t, publish_stream=False, **kw) as c:
            try:
                got = fn(c)
                if asyncio.iscoroutine(got):
                    got = await got
            except Exception as e:
                got = e
            out.append((got, t, c))

    asyncio.run(with_async())
    s = SyncScripted(script)
    with Client(seeds, transport=s, **kw) as c:
        try:
            got = fn(c)
        except Exception as e:
            got = e
        out.append((got, s, c))
    return out


def test_a_redirect_is_followed_and_its_target_taken_for_the_leader() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        if call.url.startswith(N1):
            return reply(307, location=f"{N2}/topics")
        return reply(200, TOPICS)

    async def twice_async(c: AsyncClient) -> list[list[str]]:
        return [await c.list_topics(), await c.list_topics()]

    def twice(c: Any) -> Any:
        return twice_async(c) if isinstance(c, AsyncClient) else [c.list_topics(), c.list_topics()]

    for got, t, c in run_both(twice, script):
        assert got == [["a"], ["a"]]
        assert t.urls == [f"{N1}/topics", f"{N2}/topics", f"{N2}/topics"]
        assert c.endpoints.leader == N2
        assert {call.method for call in t.calls} == {"GET"}


def test_the_leader_is_learned_from_x_raftq_leader() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        # n1 forwarded the request and names the leader
        return reply(200, TOPICS, x_raftq_leader=N3) if n == 1 else reply(200, TOPICS)

    async def twice_async(c: AsyncClient) -> None:
        await c.list_topics()
        await c.create_topic("t")

    def twice(c: Any) -> Any:
        if isinstance(c, AsyncClient):
            return twice_async(c)
        c.list_topics()
        c.create_topic("t")

    for got, t, c in run_both(twice, script, urls=[N1, N2]):
        assert got is None
        assert t.urls == [f"{N1}/topics", f"{N3}/topics"]
        assert c.endpoints.leader == N3


def test_too_many_redirects_end_the_try() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        return reply(307, location=f"{N2}/topics" if n % 2 else f"{N1}/topics")

    for got, t, _ in run_both(lambda c: c.list_topics(), script, timeout=0.3):
        assert isinstance(got, Unavailable), got
        assert "too many redirects" in str(got)
        assert len(t.calls) % 4 == 0  # each try: the first request and three redirects


def test_no_leader_is_retried_on_the_same_node_even_for_a_create() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        return NO_LEADER if n <= 2 else reply(201, CREATED)

    for got, t, c in run_both(lambda c: c.create_topic("t"), script):
        assert got == CREATED
        assert t.urls == [f"{N1}/topics"] * 3
        assert [call.body for call in t.calls] == [{"topic": "t"}] * 3
        assert c.retries == 2


def test_an_unknown_outcome_of_a_create_is_not_retried() -> None:
    for failure in (ConnectionDropped("reset after sending"), error(504, "outcome_unknown")):

        def script(call: Call, n: int, failure: Any = failure) -> Response | Exception:
            return failure if n == 1 else reply(201, CREATED)

        for got, t, c in run_both(lambda c: c.create_topic("t"), script):
            assert isinstance(got, UnknownOutcome), got
            assert len(t.calls) == 1
            assert c.retries == 0


def test_an_unknown_outcome_of_a_read_or_a_publish_is_retried_with_the_same_keys() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        if n == 1:
            return ConnectionDropped("reset after sending")
        if call.url.endswith("/topics"):
            return reply(200, TOPICS)
        return reply(200, {"messages": [{"seq": 5, "duplicate": True}]})

    for got, t, c in run_both(lambda c: c.list_topics(), script):
        assert got == ["a"]
        assert len(t.calls) == 2 and c.retries == 1
    for got, t, _ in run_both(lambda c: c.publish_batch("t", [b"x", b"y"]), script):
        assert got == [5]
        first, second = t.calls
        assert first.body == second.body  # the same idempotency keys: stored once
        assert [m["key"] for m in first.body["messages"]] != [None, None]


def test_a_request_that_was_not_sent_is_retried_on_another_node() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        return ConnectFailed("refused") if call.url.startswith(N1) else reply(201, CREATED)

    for got, t, c in run_both(lambda c: c.create_topic("t"), script, urls=[N1, N2]):
        assert got == CREATED
        assert t.urls == [f"{N1}/topics", f"{N2}/topics"]
        assert c.endpoints.pick() == N2  # n1 is passed over for a while


def test_a_stale_connection_resends_at_once_only_what_is_safe_to_repeat() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        if n == 1:
            return ConnectionDropped("closed while idle", stale=True)
        return reply(200, TOPICS) if call.method == "GET" else reply(201, CREATED)

    for got, t, c in run_both(lambda c: c.list_topics(), script):
        assert got == ["a"]
        assert len(t.calls) == 2
        assert c.retries == 0  # within the same try, no backoff
    for got, t, _ in run_both(lambda c: c.create_topic("t"), script):
        assert isinstance(got, UnknownOutcome), got
        assert len(t.calls) == 1


def test_a_definite_error_is_raised_at_once() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        return error(409, "topic_exists")

    for got, t, _ in run_both(lambda c: c.create_topic("t"), script):
        assert isinstance(got, TopicExists), got
        assert len(t.calls) == 1


def refused(status: int, code: str, retry_after: str | None) -> Response:
    body = {"code": code, "message": code, "details": {}}
    return (
        reply(status, body) if retry_after is None else reply(status, body, retry_after=retry_after)
    )


def test_overloaded_and_topic_full_are_retried_after_the_servers_retry_after() -> None:
    at: list[float] = []

    def script(call: Call, n: int) -> Response | Exception:
        at.append(time.monotonic())
        if n % 3 == 1:
            return refused(503, "overloaded", "1")
        if n % 3 == 2:
            return refused(429, "topic_full", "1")
        return reply(200, TOPICS)

    for got, t, c in run_both(lambda c: c.list_topics(), script, timeout=10):
        assert got == ["a"]
        assert len(t.calls) == 3 and c.retries == 2
        first, second, third = at[-3:]
        assert second - first >= 1.0 and third - second >= 1.0  # (not the 50 ms backoff)


def test_a_retry_after_past_the_callers_deadline_is_the_error_at_once() -> None:
    for status, code, kind in ((503, "overloaded", Unavailable), (429, "topic_full", TopicFull)):

        def script(call: Call, n: int, status: int = status, code: str = code) -> Response:
            return refused(status, code, "3600")

        for got, t, _ in run_both(lambda c: c.list_topics(), script, timeout=5):
            assert isinstance(got, kind) and got.server_code == code, got
            assert got.retry_after == 30.0  # (capped)
            assert len(t.calls) == 1  # no try could be made in time: not waited for


def test_a_429_without_retry_after_is_not_retried() -> None:
    for got, t, _ in run_both(
        lambda c: c.list_topics(), lambda call, n: refused(429, "topic_full", None)
    ):
        assert isinstance(got, TopicFull) and got.retry_after is None
        assert len(t.calls) == 1


def test_each_try_is_bounded_by_the_attempt_timeout() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        return reply(200, TOPICS)

    for _, t, _ in run_both(lambda c: c.list_topics(), script, attempt_timeout=1.5):
        assert 0 < t.calls[0].timeout <= 1.5


def test_the_client_closes_the_transport_it_was_given() -> None:
    s = SyncScripted(lambda call, n: reply(200, TOPICS))
    Client(N1, transport=s).close()
    assert s.closed

    async def main() -> None:
        a = AsyncScripted(lambda call, n: reply(200, TOPICS))
        async with AsyncClient(N1, transport=a, publish_stream=False) as c:
            await c.list_topics()
        assert a.closed

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_transport_exception_of_another_kind_reaches_the_caller(kind: str) -> None:
    def script(call: Call, n: int) -> Response | Exception:
        return RuntimeError("a bug in the transport")

    got = run_both(lambda c: c.list_topics(), script)[0 if kind == "async" else 1][0]
    assert isinstance(got, RuntimeError)


# ---------------------------------------------------------------- the http_headers hook


def api(call: Call, n: int) -> Response | Exception:
    """A plausible answer to every request either client makes."""
    path = call.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
    parts = path.split("/")
    if path == "cluster" and call.method == "GET":
        return reply(200, {"leader": None, "members": []})
    if path == "topics" and call.method == "GET":
        return reply(200, {"topics": ["t"]})
    if parts[-1] == "publish":
        return reply(200, {"messages": [{"seq": i + 1} for i in range(len(call.body["messages"]))]})
    if parts[-1] == "messages" and call.method == "POST":
        return reply(200, {"seq": 1})
    if parts[-1] == "messages":
        return reply(200, {"messages": []})
    if parts[-1] == "receive":
        delivery = {"seq": 1, "attempt": 1, "receipt": "r1", "payload": b"x"}
        return reply(200, {"deliveries": [delivery]})
    if path in ("ack", "nack", "extend", "term"):
        return reply(200, {"errors": []})
    return reply(200, {})


def every_call(c: Any) -> list[Any]:
    """Every request-making method of the client, once (as coroutines for the async one)."""
    return [
        c.cluster(),
        c.add_member("n4", "h:9004", "h:8004"),
        c.remove_member("n4"),
        c.create_topic("t"),
        c.list_topics(),
        c.topic("t"),
        c.update_topic("t", {"max_messages": 5}),
        c.purge("t"),
        c.create_group("t", "g"),
        c.group("t", "g"),
        c.update_group("t", "g", {"max_deliveries": 3}),
        c.publish("t", b"x"),
        c.publish_batch("t", [b"a", b"b"]),
        c.receive("t", "g"),
        c.ack(["r1"]),
        c.nack(["r1"]),
        c.extend(["r1"], 5.0),
        c.term(["r1"]),
        c.release("c1"),
        c.peek("t"),
        c.redrive("t"),
        c.delete_group("t", "g"),
        c.delete_topic("t"),
    ]


class Tokens:
    """An ``http_headers`` callable handing out a new token at each call."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> dict[str, str]:
        self.n += 1
        return {"Authorization": f"Bearer t{self.n}", "X-Tenant": "blue"}


def test_the_hooks_headers_are_on_every_request_kind() -> None:
    async def all_async(c: AsyncClient) -> None:
        for coro in every_call(c):
            await coro
        async for msg in c.consume("t", "g"):  # (a receive, then a release at the break)
            await msg.ack()
            break

    def all_calls(c: Any) -> Any:
        if isinstance(c, AsyncClient):
            return all_async(c)
        every_call(c)
        for msg in c.consume("t", "g", max_messages=1):
            msg.ack()
        return None

    hook = Tokens()
    for got, t, _ in run_both(all_calls, api, http_headers=hook):
        assert got is None, got
        assert {c.method for c in t.calls} == {"GET", "POST", "PATCH", "DELETE"}
        assert len(t.calls) == 26  # 23 calls, then a receive, an ack and a release
        tokens = []
        for call in t.calls:
            assert call.headers["Authorization"].startswith("Bearer t"), call
            tokens.append(int(call.headers["Authorization"].removeprefix("Bearer t")))
            assert call.headers["X-Tenant"] == "blue"
            assert call.headers["Accept"] == "application/msgpack"  # the client's own, kept
            if call.body is not None:
                assert call.headers["Content-Type"] == "application/msgpack"
            else:
                assert "Content-Type" not in call.headers
        assert tokens == list(range(tokens[0], tokens[0] + len(tokens)))  # one call each


def test_the_hook_is_asked_again_for_every_redirect_hop_and_retry() -> None:
    def script(call: Call, n: int) -> Response | Exception:
        if n == 1:
            return reply(307, location=f"{N2}/topics")
        if n == 2:
            return NO_LEADER
        if n == 3:
            return ConnectionDropped("closed while idle", stale=True)
        return reply(201, CREATED) if call.method == "POST" else reply(200, TOPICS)

    hook = Tokens()
    for k, (got, t, _) in enumerate(run_both(lambda c: c.list_topics(), script, http_headers=hook)):
        assert got == ["a"]
        assert [c.headers["Authorization"] for c in t.calls] == [
            f"Bearer t{4 * k + i}" for i in (1, 2, 3, 4)
        ]
    fixed = {"Authorization": "Bearer same"}
    for got, t, _ in run_both(lambda c: c.list_topics(), script, http_headers=fixed):
        assert got == ["a"]
        assert [c.headers for c in t.calls] == [
            {"Accept": "application/msgpack", "Authorization": "Bearer same"}
        ] * 4


@pytest.mark.parametrize(
    "bad",
    [
        {"Content-Type": "text/plain"},
        {"accept": "application/json"},
        {"Content-Length": "0"},
        {"Host": "elsewhere"},
        {"Sec-WebSocket-Protocol": "x"},
        {"X-Injected": "a\r\nAuthorization: Bearer stolen"},
        {"Bad Name": "x"},
        {"Authorization": "Bearer a", "authorization": "Bearer b"},
    ],
)
def test_the_hook_cannot_replace_or_smuggle_headers(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="http_headers"):
        Client(N1, transport=SyncScripted(api), http_headers=bad)
    with pytest.raises(ValueError, match="http_headers"):
        AsyncClient(N1, transport=AsyncScripted(api), http_headers=bad)
    # A callable's answer is checked at each request, before anything is sent.
    for got, t, _ in run_both(lambda c: c.list_topics(), api, http_headers=lambda: bad):
        assert isinstance(got, ValueError), got
        assert t.calls == []


def test_without_a_hook_the_requests_carry_only_the_clients_headers() -> None:
    for got, t, _ in run_both(lambda c: c.create_topic("t"), api):
        assert got == {}
        assert t.calls[0].headers == {
            "Accept": "application/msgpack",
            "Content-Type": "application/msgpack",
        }


def test_token_is_sent_as_a_bearer_header_on_every_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for got, t, _ in run_both(
        lambda c: c.list_topics(), api, token="rq_ab.s3cret-0123456789abcdef"
    ):
        assert got == ["t"]
        assert t.calls[0].headers["Authorization"] == "Bearer rq_ab.s3cret-0123456789abcdef"
    monkeypatch.setenv("RAFTQ_TOKEN", "rq_env.from-the-environment-000")
    for _, t, _ in run_both(lambda c: c.list_topics(), api):
        assert t.calls[0].headers["Authorization"] == "Bearer rq_env.from-the-environment-000"
    for _, t, _ in run_both(lambda c: c.list_topics(), api, token=""):
        assert "Authorization" not in t.calls[0].headers  # "": none, whatever the environment
    # An explicit hook's Authorization wins over the environment's; with token= it clashes.
    hook = {"Authorization": "Bearer rq_hook.from-the-hook-0000000"}
    for _, t, _ in run_both(lambda c: c.list_topics(), api, http_headers=hook):
        assert t.calls[0].headers["Authorization"] == hook["Authorization"]
    with pytest.raises(ValueError, match="token="):
        Client(N1, token="rq_ab.s3cret-0123456789abcdef", http_headers=hook)
    with pytest.raises(ValueError, match="not a header value"):
        Client(N1, token="rq_ab.x\r\nX-Evil: 1")


def test_https_seeds_never_learn_or_follow_a_plain_http_address() -> None:
    """A node (misconfigured, or an attacker's) naming an http:// leader or redirecting there
    must not get the next requests, and their token, in the clear."""
    secure = "https://n1:8443"

    def names_http(call: Call, n: int) -> Response | Exception:
        return reply(200, TOPICS, x_raftq_leader="http://evil:80")

    for _, t, c in run_both(lambda c: c.list_topics(), names_http, [secure], token="rq_a.b" * 4):
        assert c.endpoints.leader is None and c.endpoints.seeds == [secure]
        assert all(u.startswith("https://") for u in t.urls)

    def redirects_http(call: Call, n: int) -> Response | Exception:
        return reply(307, location="http://evil:80/topics")

    for got, t, _ in run_both(lambda c: c.list_topics(), redirects_http, [secure]):
        assert isinstance(got, ProtocolError) and "not https" in str(got)
        assert all(u.startswith("https://") for u in t.urls)
