"""The API port's limits on a real node process (raftq.node.httplimits): idle and unfinished
connections are closed, connections past the cap are refused at once while the node keeps
serving, a flood of connections (past the cap, or past ``ulimit -n``) costs a bounded number
of log lines, and requests aiohttp cannot parse get the JSON error envelope and one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from raftq.node.httplimits import ApiProtocols, HttpLimits
from raftq.node.httpsite import HttpsSite
from raftq.node.local import LocalRaft
from raftq.node.tlsutil import make_dev_ca
from tests.node.cluster_fixture import Cluster, Node, http, wait_for
from tests.node.inprocess import app
from tests.support import ADMIN_TOKEN
from tests.tls_support import client_ctx, handshake, node_tls, raw_request

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="loopback and rlimits: Linux")

NOFILE = 256  # the flooded node's ulimit -n
GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
GET_CLOSE = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


class LimitedCluster(Cluster):
    """Its nodes run with ``ulimit -n`` = ``NOFILE`` (set in the child, before the node
    starts)."""

    def command(self, node: Node) -> list[str]:
        argv = super().command(node)
        prelude = (
            "import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE})); "
            "sys.argv[0] = 'raftq'; runpy.run_module('raftq.node', run_name='__main__')"
        )
        return [argv[0], "-c", prelude, *argv[3:]]


@contextlib.contextmanager
def one_node(tmp: Path, *args: str, cls: type[Cluster] = Cluster) -> Iterator[Node]:
    c = cls(tmp, 1, extra_args=list(args))
    try:
        c.start()
        yield c.nodes["n1"]
    finally:
        c.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node with a 1 s idle timeout and a 1 KiB body limit."""
    with one_node(
        tmp_path_factory.mktemp("limits"), "--idle-timeout", "1", "--max-body", "1024"
    ) as n:
        yield n


def addr(node: Node) -> tuple[str, int]:
    host, port = node.api.rsplit(":", 1)
    return host, int(port)


def closed_by_peer(s: socket.socket, within: float, trickle: bytes = b"") -> bool:
    """True once the node closes ``s`` (EOF or reset) within ``within`` seconds, sending
    ``trickle`` every 0.2 s meanwhile; anything else it sends is read and dropped."""
    deadline = time.monotonic() + within
    s.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if not s.recv(65536):
                return True
        except TimeoutError:
            if trickle:
                try:
                    s.sendall(trickle)
                except OSError:
                    return True
        except OSError:  # (reset)
            return True
    return False


def exchange(node: Node, data: bytes, within: float = 5.0) -> bytes:
    """Send ``data`` on a new connection; everything the node answers until it closes (fails
    if it does not close within ``within`` seconds)."""
    with socket.create_connection(addr(node), timeout=within) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + within
        with contextlib.suppress(ConnectionResetError):
            while time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    chunk = s.recv(65536)
                    if not chunk:
                        return out
                    out += chunk
        if not out or time.monotonic() >= deadline:
            raise AssertionError(f"the node did not close the connection; it sent {out[:200]!r}")
        return out


def log_lines(node: Node) -> list[str]:
    return node.log.read_text(errors="replace").splitlines()


def test_an_idle_connection_is_closed_by_the_node(node: Node) -> None:
    with socket.create_connection(addr(node)) as s:
        assert closed_by_peer(s, within=10)  # (before: never, for an hour)


def test_a_request_whose_head_never_ends_is_closed(node: Node) -> None:
    with socket.create_connection(addr(node)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        # A slowloris client: a header line now and then, never the blank line.
        assert closed_by_peer(s, within=10, trickle=b"X-Slow: 1\r\n")


def test_a_request_body_that_never_ends_is_answered_408_and_closed(node: Node) -> None:
    head = (
        b"POST /topics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Authorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{"topic"'
    ) % ADMIN_TOKEN.encode()
    answer = exchange(node, head, within=10)  # (before: held open for good)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["code"] == "request_timeout"


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n",
    ],
    ids=["huge-header", "nul-in-header"],
)
def test_a_malformed_request_gets_the_json_envelope_and_one_log_line(
    node: Node, head: bytes
) -> None:
    before = len(log_lines(node))
    answer = exchange(node, head)
    status, _, rest = answer.partition(b"\r\n")
    assert status.split(b" ")[1] == b"400", answer[:200]
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"application/json" in headers.lower()
    err = json.loads(body)
    assert err["code"] == "malformed_request" and err["message"] and err["details"] == {}
    # (a traceback is written with its record's first line, in one write)
    new = wait_for("the log line", lambda: log_lines(node)[before:], 5)
    assert len(new) == 1 and "malformed HTTP request" in new[0], new
    assert not any("Traceback" in line for line in new)


def test_after_a_413_the_connection_is_closed_without_a_second_answer(node: Node) -> None:
    body = b'{"payload": "' + b"a" * 4000 + b'"}'
    head = (
        b"POST /topics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n"
    ) % (ADMIN_TOKEN.encode(), len(body))
    answer = exchange(node, head + body)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    # It says it closes (before: kept alive, for what followed the part of the body read),
    # and nothing else is answered.
    assert b"\r\nconnection: close\r\n" in answer.lower(), answer[:300]
    assert answer.count(b"HTTP/1.") == 1, answer


def test_connections_past_the_cap_are_refused_at_once_and_the_node_keeps_serving(
    tmp_path: Path,
) -> None:
    with one_node(tmp_path, "--max-connections", "50", "--idle-timeout", "30") as n:
        held: list[socket.socket] = []
        try:
            for _ in range(50):  # each one served once: all 50 are open at the node
                held.append(wait_for("a connection served", lambda: served(n), 5))
            answer = exchange(n, GET_CLOSE)  # the 51st: answered at once, and closed
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert b"Retry-After: 1" in answer and b'"overloaded"' in answer, answer
            # The held ones are still served.
            held[0].sendall(GET)
            assert held[0].recv(65536).startswith(b"HTTP/1.1 200 ")
        finally:
            for s in held:
                s.close()
        wait_for(
            "the node to serve new connections",
            lambda: http("GET", n.url + "/healthz")[0] == 200,
            10,
        )


def served(node: Node) -> socket.socket | None:
    """A new connection, once served (None if refused: the setup's own may still be open)."""
    s = socket.create_connection(addr(node), timeout=5)
    s.sendall(GET)
    if s.recv(65536).startswith(b"HTTP/1.1 200 "):
        return s
    s.close()
    return None


def answered(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the node answered or closed (readable, or failed)."""
    poller = select.poll()
    for s in socks:
        poller.register(s, select.POLLIN)
    return len(poller.poll(0))


@pytest.mark.parametrize("cap", [None, 1000], ids=["default-cap", "cap-past-ulimit"])
def test_a_flood_of_connections_costs_a_bounded_number_of_log_lines(
    tmp_path: Path, cap: int | None
) -> None:
    args = [] if cap is None else ["--max-connections", str(cap)]
    with one_node(tmp_path, *args, cls=LimitedCluster) as n:
        before = len(log_lines(n))
        flood: list[socket.socket] = []
        try:
            for _ in range(3000):  # far past the cap (3/4 of ulimit -n), and past ulimit -n
                if cap is None:  # (one at a time: connected once the kernel queued it)
                    flood.append(socket.create_connection(addr(n), timeout=10))
                else:  # (a node out of descriptors accepts nothing: connect without waiting)
                    s = socket.socket()
                    s.setblocking(False)
                    s.connect_ex(addr(n))
                    flood.append(s)
            if cap is None:
                # Those past the cap are answered (503) and closed at once; those under it
                # are held, idle. (Before: the node ran out of descriptors, left the rest
                # unanswered.)
                wait_for("the node to answer the flood", lambda: answered(flood) >= 2700, 30)
            else:  # a cap the node cannot reach: it runs out of descriptors, and says so
                wait_for("a failed accept", lambda: "accepting API" in "".join(log_lines(n)), 30)
        finally:
            for s in flood:
                s.close()
        wait_for("the node to serve again", lambda: http("GET", n.url + "/healthz")[0] == 200, 10)
        new = log_lines(n)[before:]
    assert len(new) <= 20, "\n".join(new[:40])
    assert not any("Traceback" in line for line in new), "\n".join(new[:40])


async def test_the_https_listener_counts_every_connection_against_the_cap(
    tmp_path: Path,
) -> None:
    ca = make_dev_ca(tmp_path)
    tls = node_tls(ca)
    runner = web.AppRunner(app(LocalRaft()), access_log=None)
    await runner.setup()
    assert runner.server is not None
    protocols = ApiProtocols(runner.server, HttpLimits(max_connections=2), access_log=None)
    site = HttpsSite(runner, "127.0.0.1", 0, tls.server, protocols=protocols)
    await site.start()
    addr = f"127.0.0.1:{site.port}"
    host, port = "127.0.0.1", site.port
    try:
        # Connections that never reach the handler give their slot back: plain HTTP on the
        # TLS port, a handshake the client gives up on.
        answer = await asyncio.to_thread(raw_request, addr, GET_CLOSE)
        assert b"tls_required" in answer
        with pytest.raises(ssl.SSLError):
            await asyncio.to_thread(handshake, addr, client_ctx())  # (trusts nothing here)
        await wait_async("their slots to be given back", lambda: protocols.count.open == 0)
        held = [
            await asyncio.open_connection(host, port, ssl=client_ctx(ca.ca_cert)) for _ in range(2)
        ]
        await wait_async("both to be counted", lambda: protocols.count.open == 2)
        reader, writer = await asyncio.open_connection(host, port)  # the third: closed at once
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        for _, w in held:
            w.close()
        await wait_async("the held ones to close", lambda: protocols.count.open == 0)
        answer = await asyncio.to_thread(raw_request, addr, GET_CLOSE, client_ctx(ca.ca_cert))
        assert answer.startswith(b"HTTP/1.1 200 ")
    finally:
        await runner.cleanup()


async def wait_async(what: str, cond: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
