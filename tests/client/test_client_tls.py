"""Both clients and the CLI over HTTPS against in-process nodes (``HttpsSite``, as ``raftq node
--tls-cert`` serves): ``ca=`` (a file or an ``SSLContext``), client certificates, WebSockets,
redirects to an ``https://`` leader, and the one clear, unretried ``TLSError`` for an untrusted
certificate or a scheme that is not the node's."""

from __future__ import annotations

import asyncio
import contextlib
import io
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from tests.client.conftest import name
from tests.node.inprocess import app as inprocess_app
from tests.tls_support import client_ctx, https_node, node_tls

from raftq.client import AsyncClient, Client, TLSError, Unavailable
from raftq.client._core import Endpoints
from raftq.client.cli import EXIT_OK, EXIT_UNAVAILABLE
from raftq.node.cli import main as cli_main
from raftq.node.local import LocalRaft
from raftq.node.tlsutil import DevCA, issue_cert, make_dev_ca


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> DevCA:
    return make_dev_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> DevCA:
    return make_dev_ca(tmp_path_factory.mktemp("other-ca"))


@pytest.fixture(scope="module")
def client_cert(ca: DevCA, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return issue_cert(ca, tmp_path_factory.mktemp("client"), "client")


@pytest.fixture
async def node(ca: DevCA) -> AsyncIterator[str]:
    async with https_node(LocalRaft(), node_tls(ca)) as addr:
        yield f"https://{addr}"


@pytest.fixture
async def mtls_node(ca: DevCA) -> AsyncIterator[str]:
    async with https_node(LocalRaft(), node_tls(ca, client_ca=True)) as addr:
        yield f"https://{addr}"


@pytest.fixture
async def leader_and_follower(ca: DevCA) -> AsyncIterator[tuple[str, str]]:
    """Two HTTPS nodes: the follower forwards to the leader and redirects streams to it."""
    async with https_node(LocalRaft("n1"), node_tls(ca)) as laddr:
        follower = LocalRaft("n2")
        follower.set_follower("n1", laddr)
        async with https_node(follower, node_tls(ca), node_id="n2") as faddr:
            yield f"https://{laddr}", f"https://{faddr}"


async def _round_trip(c: AsyncClient, stream: bool) -> None:
    topic = name()
    await c.create_topic(topic)
    seqs = [await c.publish(topic, f"m{i}".encode()) for i in range(3)]
    got = []
    async for msg in c.consume(topic, stream=stream, wait=1):
        got.append(msg.payload)
        await msg.ack()
        if len(got) == 3:
            break
    assert seqs == [1, 2, 3] and got == [b"m0", b"m1", b"m2"]


@pytest.mark.parametrize("stream", [False, True], ids=["long-poll", "websocket"])
async def test_the_async_client_over_https_with_a_ca_file_or_context(
    node: str, ca: DevCA, stream: bool
) -> None:
    async with AsyncClient(node, ca=ca.ca_cert) as c:
        await _round_trip(c, stream)
        assert c._publisher is not None and c._publisher.stream is not None  # (wss:// too)
    async with AsyncClient(node, ca=client_ctx(ca.ca_cert)) as c:
        await _round_trip(c, stream)


async def test_the_sync_client_over_https(node: str, ca: DevCA) -> None:
    def work() -> bytes:
        with Client(node, ca=str(ca.ca_cert)) as c:
            topic = name()
            c.create_topic(topic)
            assert c.publish(topic, b"hello") == 1
            for msg in c.consume(topic, max_messages=1):
                msg.ack()
                return msg.payload
            raise AssertionError("nothing consumed")

    assert await asyncio.to_thread(work) == b"hello"


async def test_a_follower_redirects_both_clients_to_its_https_leader(
    leader_and_follower: tuple[str, str], ca: DevCA
) -> None:
    leader, follower = leader_and_follower
    topic = name()
    async with AsyncClient(follower, ca=ca.ca_cert, publish_stream=False) as c:
        await c.create_topic(topic)  # (forwarded by the follower, over HTTPS)
        assert c.endpoints.leader == leader  # (learned from X-Raftq-Leader: https://)
        await c.publish(topic, b"x")
    # A stream opened at the follower (which serves none): 307 to https://leader, followed
    # (by aiohttp; an http:// Location would meet the leader's 400 tls_required).
    async with AsyncClient(follower, ca=ca.ca_cert, publish_stream=False) as c:
        async for msg in c.consume(topic, stream=True):
            assert msg.payload == b"x" and msg._stream is not None
            await msg.ack()
            break

    def sync() -> None:
        with Client(follower, ca=ca.ca_cert) as sc:
            assert sc.publish(topic, b"y") == 2
            assert sc.endpoints.leader == leader

    await asyncio.to_thread(sync)


def test_a_leader_named_without_a_scheme_is_reached_with_the_seeds_scheme() -> None:
    e = Endpoints(["https://10.0.0.1:8001"])
    e.learn("10.0.0.2:8002")
    assert e.leader == "https://10.0.0.2:8002"
    e = Endpoints(["http://10.0.0.1:8001"])
    e.learn("10.0.0.2:8002")
    assert e.leader == "http://10.0.0.2:8002"


# ---------------------------------------------------------------- failures


async def test_an_untrusted_certificate_fails_at_once_with_a_clear_error(
    node: str, other_ca: DevCA
) -> None:
    cas: list[Path | None] = [other_ca.ca_cert, None]  # another CA; the system's store
    for ca in cas:
        start = time.monotonic()
        async with AsyncClient(node, timeout=30, ca=ca) as c:
            with pytest.raises(TLSError) as e:
                await c.list_topics()
        assert time.monotonic() - start < 5  # not retried until the timeout
        assert isinstance(e.value, Unavailable) and not isinstance(e.value, TimeoutError)
        assert node in e.value.message and "could not be verified" in e.value.message
        assert c.retries == 0
        async with AsyncClient(node, timeout=30, publish_stream=False, ca=ca) as c:
            with pytest.raises(TLSError, match="could not be verified"):
                async for _ in c.consume("t", stream=True):
                    pass
        start = time.monotonic()
        with Client(node, timeout=30, ca=ca) as sc, pytest.raises(TLSError) as e:
            await asyncio.to_thread(sc.list_topics)
        assert time.monotonic() - start < 5 and sc.retries == 0
        assert node in e.value.message and "could not be verified" in e.value.message


async def test_a_scheme_that_is_not_the_nodes_fails_at_once_with_a_clear_error(
    node: str, ca: DevCA
) -> None:
    plain = node.replace("https://", "http://")
    async with AsyncClient(plain, timeout=30) as c:
        with pytest.raises(TLSError, match="serves HTTPS only: use an https:// URL"):
            await c.publish("t", b"x")
    with Client(plain, timeout=30) as sc, pytest.raises(TLSError, match=r"https://127\.0\.0\.1"):
        await asyncio.to_thread(sc.list_topics)
    srv = TestServer(inprocess_app(LocalRaft()), host="127.0.0.1")
    await srv.start_server()
    try:
        wrong = f"https://127.0.0.1:{srv.port}"
        async with AsyncClient(wrong, timeout=30, ca=ca.ca_cert) as c:
            with pytest.raises(TLSError, match="does not seem to speak TLS"):
                await c.list_topics()
        with (
            Client(wrong, timeout=30, ca=ca.ca_cert) as sc,
            pytest.raises(TLSError, match=f"{wrong}: .*does not seem to speak TLS"),
        ):
            await asyncio.to_thread(sc.list_topics)
    finally:
        await srv.close()


async def test_a_node_requiring_client_certificates(
    mtls_node: str, ca: DevCA, client_cert: tuple[Path, Path]
) -> None:
    cert, key = client_cert
    async with AsyncClient(mtls_node, ca=ca.ca_cert, cert=cert, key=key) as c:
        await _round_trip(c, stream=True)
    ctx = client_ctx(ca.ca_cert)
    ctx.load_cert_chain(cert, key)
    with Client(mtls_node, ca=ctx) as sc:
        assert "t" not in await asyncio.to_thread(sc.list_topics)
    async with AsyncClient(mtls_node, ca=ca.ca_cert, timeout=30) as c:
        with pytest.raises(TLSError, match="requires a client certificate"):
            await c.publish("t", b"x")
        with pytest.raises(TLSError, match="requires a client certificate"):
            async for _ in c.consume("t", stream=True):
                pass
    with (
        Client(mtls_node, ca=ca.ca_cert, timeout=30) as sc,
        pytest.raises(TLSError, match="requires a client certificate"),
    ):
        await asyncio.to_thread(sc.list_topics)


def test_tls_options_that_cannot_be_used_are_value_errors(ca: DevCA, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ca: cannot load .*missing\.pem"):
        Client("https://127.0.0.1:1", ca=tmp_path / "missing.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("junk")
    with pytest.raises(ValueError, match="ca: cannot load"):
        AsyncClient("https://127.0.0.1:1", ca=garbage)
    with pytest.raises(ValueError, match="cert/key: cannot load"):
        Client("https://127.0.0.1:1", cert=garbage)
    with pytest.raises(ValueError, match="not an SSLContext"):
        Client("https://127.0.0.1:1", ca=ssl.create_default_context(), cert=ca.cert)
    with pytest.raises(ValueError, match="key= needs cert="):
        Client("https://127.0.0.1:1", key=ca.key)


# ---------------------------------------------------------------- CLI


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


async def test_the_cli_over_https_with_ca_and_without(
    node: str, ca: DevCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(*argv: str) -> tuple[int, str, str]:
        with captured() as (out, err):
            code = cli_main(list(argv))
        return code, out.getvalue(), err.getvalue()

    code, out, err = await asyncio.to_thread(run, "topic", "create", "tls-cli", "--url", node,
                                             "--ca", str(ca.ca_cert))  # fmt: skip
    assert code == EXIT_OK, err
    monkeypatch.setenv("RAFTQ_CA", str(ca.ca_cert))
    code, out, err = await asyncio.to_thread(run, "topic", "list", "--url", node, "--json")
    assert code == EXIT_OK and "tls-cli" in out, err
    monkeypatch.delenv("RAFTQ_CA")
    code, out, err = await asyncio.to_thread(run, "topic", "list", "--url", node, "--timeout", "30")
    assert code == EXIT_UNAVAILABLE and out == ""
    assert err.startswith(f"raftq: TLS: {node}: the server's certificate could not be verified")
    assert err.count("\n") == 1
