"""TLS on the node's API, in process: the files it refuses, the HTTPS listener (TLS 1.2 at
least, a plain-HTTP request answered, client certificates), certificate reload, and forwarding
and stream redirects between two in-process nodes over HTTPS."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import shutil
import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from raftq.node.cli import build_parser, main
from raftq.node.httpsite import HttpsSite
from raftq.node.local import LocalRaft
from raftq.node.server import reload_tls
from raftq.node.tlsutil import (
    MINIMUM_VERSION,
    DevCA,
    NodeTLS,
    TLSConfigError,
    TLSFiles,
    covers,
    issue_cert,
    make_dev_ca,
    server_context,
)
from tests.support import ADMIN
from tests.tls_support import (
    client_ctx,
    handshake,
    https_node,
    node_tls,
    raw_request,
    served_cert,
    tls11_only,
)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> DevCA:
    return make_dev_ca(tmp_path_factory.mktemp("ca"), ["node7.example", "10.1.2.3"])


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> DevCA:
    return make_dev_ca(tmp_path_factory.mktemp("other-ca"))


def serial(cert_file: Path) -> int:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number


# ---------------------------------------------------------------- files


def test_the_dev_certificate_names_loopback_localhost_and_the_given_hosts(ca: DevCA) -> None:
    cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "node7.example", "10.1.2.3"):
        assert covers(cert, host), host
    for host in ("10.1.2.4", "other.example", "example"):
        assert not covers(cert, host), host
    # ... and it verifies against the CA for a name, as clients check it.
    ctx = client_ctx(ca.ca_cert)
    NodeTLS(TLSFiles(str(ca.cert), str(ca.key)))  # (accepted as it is)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert oct(ca.key.stat().st_mode & 0o777) == "0o600"


def _bad_files(tmp: Path, ca: DevCA, other_ca: DevCA) -> dict[str, tuple[TLSFiles, str]]:
    garbage = tmp / "garbage.pem"
    garbage.write_text("not a certificate\n")
    expired, expired_key = issue_cert(ca, tmp, "expired", validity=-datetime.timedelta(days=2))
    server_only, server_only_key = issue_cert(ca, tmp, "server-only", client=False)
    encrypted = tmp / "encrypted.key"
    private = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    encrypted.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    cert, key, cafile, junk = str(ca.cert), str(ca.key), str(ca.ca_cert), str(garbage)
    gone = str(tmp / "missing.pem")
    return {
        "missing cert": (TLSFiles(gone, key), f"--tls-cert: No such file or directory: {gone}"),
        "cert not PEM": (TLSFiles(junk, key), f"--tls-cert: no PEM certificate in {junk}"),
        "missing key": (TLSFiles(cert, gone), f"--tls-key: No such file or directory: {gone}"),
        "key not PEM": (TLSFiles(cert, junk), f"--tls-key: no usable PEM private key in {junk}"),
        "key of another cert": (TLSFiles(cert, str(other_ca.key)), "does not match the cert"),
        "encrypted key": (TLSFiles(cert, str(encrypted)), "is encrypted"),
        "expired cert": (TLSFiles(str(expired), str(expired_key)), "expired on"),
        "client CA not PEM": (TLSFiles(cert, key, client_ca=junk), "--tls-client-ca: no PEM"),
        "client CA missing": (TLSFiles(cert, key, client_ca=gone), "--tls-client-ca: No such"),
        "peer CA not PEM": (TLSFiles(cert, key, ca=junk), "--tls-ca: no PEM certificate"),
        "server-only cert with a client CA": (
            TLSFiles(str(server_only), str(server_only_key), client_ca=cafile), "lacks clientAuth"
        ),
    }  # fmt: skip


BAD_CASES = [
    "missing cert", "cert not PEM", "missing key", "key not PEM", "key of another cert",
    "encrypted key", "expired cert", "client CA not PEM", "client CA missing", "peer CA not PEM",
    "server-only cert with a client CA",
]  # fmt: skip


@pytest.mark.parametrize("case", BAD_CASES)
def test_each_unusable_tls_file_is_refused_in_one_line(
    case: str, ca: DevCA, other_ca: DevCA, tmp_path: Path
) -> None:
    files, says = _bad_files(tmp_path, ca, other_ca)[case]
    with pytest.raises(TLSConfigError) as e:
        NodeTLS(files)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_tls_flags_that_do_not_go_together_are_usage_errors(
    ca: DevCA, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["node", "--id", "n1", "--secret", "s", "--in-memory"]
    for extra, says in (
        (["--tls-cert", str(ca.cert)], "go together"),
        (["--tls-key", str(ca.key)], "go together"),
        (["--tls-ca", str(ca.ca_cert)], "need --tls-cert"),
        (["--tls-client-ca", str(ca.ca_cert)], "need --tls-cert"),
    ):
        with pytest.raises(SystemExit) as e:
            main([*base, *extra])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err, err


def test_tls_flags_have_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in ("CERT", "KEY", "CLIENT_CA", "CA"):
        monkeypatch.setenv(f"RAFTQ_TLS_{flag}", f"/etc/raftq/{flag.lower()}.pem")
    args = build_parser().parse_args(["node", "--tls-ca", "/elsewhere/ca.pem"])
    assert (args.tls_cert, args.tls_key, args.tls_client_ca, args.tls_ca) == (
        "/etc/raftq/cert.pem",
        "/etc/raftq/key.pem",
        "/etc/raftq/client_ca.pem",
        "/elsewhere/ca.pem",  # (a flag wins over the variable)
    )


# ---------------------------------------------------------------- the listener


async def test_the_api_refuses_tls_1_1_and_serves_tls_1_2(ca: DevCA) -> None:
    assert server_context(TLSFiles(str(ca.cert), str(ca.key))).minimum_version == MINIMUM_VERSION
    # The probe really offers TLS 1.1: a server that allows it (and nothing newer) accepts it.
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.load_cert_chain(ca.cert, ca.key)
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    permissive.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    runner = web.AppRunner(web.Application())
    await runner.setup()
    control = HttpsSite(runner, "127.0.0.1", 0, permissive)
    await control.start()
    try:
        got = await asyncio.to_thread(handshake, f"127.0.0.1:{control.port}", tls11_only())
        assert got == "TLSv1.1"
    except ssl.SSLError as e:  # (an OpenSSL built without TLS 1.1 at all)
        pytest.skip(f"this OpenSSL cannot speak TLS 1.1: {e}")
    finally:
        await runner.cleanup()
    async with https_node(LocalRaft(), node_tls(ca)) as addr:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.to_thread(handshake, addr, tls11_only())
        tls12 = client_ctx(ca.ca_cert)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        assert await asyncio.to_thread(handshake, addr, tls12) == "TLSv1.2"
        assert await asyncio.to_thread(handshake, addr, client_ctx(ca.ca_cert)) == "TLSv1.3"


async def test_plain_http_on_the_tls_port_is_answered_400_tls_required(ca: DevCA) -> None:
    async with https_node(LocalRaft(), node_tls(ca)) as addr:
        for request in (
            f"GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n".encode(),
            # a body the node does not read: the answer still arrives (no reset)
            f"POST /topics HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 40000\r\n\r\n".encode()
            + b"x" * 40000,
        ):
            answer = await asyncio.to_thread(raw_request, addr, request)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 "), answer[:200]
            error = json.loads(body)
            assert error["code"] == "tls_required"
            assert f"https://{addr}/" in error["message"]
        # ... and HTTPS is served all along.
        ok = await asyncio.to_thread(
            raw_request, addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            client_ctx(ca.ca_cert),
        )  # fmt: skip
        assert ok.startswith(b"HTTP/1.1 200 ")


async def test_client_certificates_are_required_and_verified_with_a_client_ca(
    ca: DevCA, other_ca: DevCA, tmp_path: Path
) -> None:
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    async with https_node(LocalRaft(), node_tls(ca, client_ca=True)) as addr:
        without = await asyncio.to_thread(raw_request, addr, get, client_ctx(ca.ca_cert))
        head, _, body = without.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401 ")
        assert json.loads(body)["code"] == "client_certificate_required"
        # A certificate from another CA: the handshake fails, nothing is served.
        foreign = client_ctx(ca.ca_cert)
        foreign.load_cert_chain(other_ca.cert, other_ca.key)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            got = await asyncio.to_thread(raw_request, addr, get, foreign)
            assert got == b""  # (TLS 1.3: the client learns it from the close)
            raise ConnectionError("closed without an answer")
        cert, key = issue_cert(ca, tmp_path, "client")
        mine = client_ctx(ca.ca_cert)
        mine.load_cert_chain(cert, key)
        ok = await asyncio.to_thread(raw_request, addr, get, mine)
        assert ok.startswith(b"HTTP/1.1 200 ")


async def test_a_reload_serves_new_connections_the_new_certificate_and_a_failed_one_nothing(
    ca: DevCA, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = tmp_path / "node.pem", tmp_path / "node.key"
    shutil.copy(ca.cert, cert)
    shutil.copy(ca.key, key)
    tls = NodeTLS(TLSFiles(str(cert), str(key)))
    async with https_node(LocalRaft(), tls) as addr:
        first = await asyncio.to_thread(served_cert, addr, ca.ca_cert)
        assert first.serial_number == serial(ca.cert)
        # A connection open before the reload keeps working after it.
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx(ca.ca_cert)))
        async with session:
            r = await session.get(f"https://{addr}/healthz", headers=ADMIN)
            assert r.status == 200
            new_cert, new_key = issue_cert(ca, tmp_path, "second")
            shutil.copy(new_cert, cert)
            shutil.copy(new_key, key)
            with caplog.at_level(logging.INFO, "raftq.node"):
                reload_tls("n1", tls)
            assert "TLS certificate reloaded" in caplog.text
            second = await asyncio.to_thread(served_cert, addr, ca.ca_cert)
            assert second.serial_number == serial(new_cert) != first.serial_number
            r = await session.get(f"https://{addr}/healthz", headers=ADMIN)
            assert r.status == 200
        # A reload that fails (a key of another certificate, then garbage) keeps serving.
        caplog.clear()
        shutil.copy(ca.key, key)
        with caplog.at_level(logging.ERROR, "raftq.node"):
            reload_tls("n1", tls)
        assert "TLS reload failed, still serving the old certificate" in caplog.text
        assert "does not match" in caplog.text
        cert.write_text("garbage")
        with pytest.raises(TLSConfigError):
            tls.reload()
        third = await asyncio.to_thread(served_cert, addr, ca.ca_cert)
        assert third.serial_number == second.serial_number


# ---------------------------------------------------------------- between nodes


@pytest.mark.parametrize("client_ca", [False, True], ids=["tls", "mutual-tls"])
async def test_a_follower_forwards_and_redirects_to_the_leader_over_https(
    ca: DevCA, tmp_path: Path, client_ca: bool
) -> None:
    ctx = client_ctx(ca.ca_cert)
    if client_ca:  # (the client needs one too; the follower presents the node's own)
        ctx.load_cert_chain(*issue_cert(ca, tmp_path, "client"))
    leader = LocalRaft("n1")
    async with https_node(leader, node_tls(ca, client_ca)) as laddr:
        follower = LocalRaft("n2")
        follower.set_follower("n1", laddr)
        async with (
            https_node(follower, node_tls(ca, client_ca), node_id="n2") as faddr,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx), headers=ADMIN) as s,
        ):
            r = await s.post(f"https://{faddr}/topics", json={"topic": "orders"})
            assert r.status == 201, await r.text()
            assert r.headers["X-Raftq-Leader"] == f"https://{laddr}"
            r = await s.get(f"https://{laddr}/topics")
            assert "orders" in (await r.json())["topics"]
            r = await s.get(
                f"https://{faddr}/topics/orders/groups/default/stream",
                headers={"Upgrade": "websocket", "Connection": "Upgrade",
                         "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                         "Sec-WebSocket-Version": "13"},
                allow_redirects=False,
            )  # fmt: skip
            assert r.status == 307
            assert r.headers["Location"].startswith(f"https://{laddr}/topics/orders/")
            assert r.headers["X-Raftq-Leader"] == f"https://{laddr}"
