"""TLS on a real 3-node cluster of ``raftq node`` processes: the clients and the CLI over HTTPS
through a follower (forwarded over HTTPS) and streams redirected to the leader, untrusted
certificates, plain HTTP on the HTTPS port, TLS 1.1, SIGHUP reload, nodes refusing to start on
bad files, and a cluster that requires client certificates."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from raftq.client import AsyncClient, Client, TLSError
from raftq.node.tlsutil import issue_cert, make_dev_ca
from tests.node.cluster_fixture import Cluster, Node, wait_for
from tests.support import ADMIN, free_ports
from tests.tls_support import client_ctx, handshake, raw_request, served_cert, tls11_only

pytestmark = pytest.mark.slow


def https(
    method: str, url: str, ctx: ssl.SSLContext, body: Any = None, timeout: float = 10.0
) -> tuple[int, Any, dict[str, str]]:
    """One JSON request over HTTPS: (status, decoded body, headers)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=ADMIN)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            raw, status, headers = r.read(), r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        raw, status, headers = e.read(), e.code, dict(e.headers)
    try:
        return status, json.loads(raw) if raw else None, headers
    except ValueError:
        return status, raw, headers


class TlsNode(Node):
    @property
    def url(self) -> str:
        return f"https://{self.api}"


class TlsCluster(Cluster):
    """``Cluster`` with every node on HTTPS: its own certificate from one dev CA (``--tls-ca``
    that CA), and with ``mutual`` client certificates required (``--tls-client-ca``)."""

    def __init__(self, root: Path, n: int = 3, mutual: bool = False) -> None:
        super().__init__(root, n)
        self.nodes = {k: TlsNode(v.id, v.api, v.raft, v.data_dir) for k, v in self.nodes.items()}
        self.mutual = mutual
        self.tls_dir = root / "tls"
        self.ca = make_dev_ca(self.tls_dir)
        self.certs = {nid: issue_cert(self.ca, self.tls_dir, nid) for nid in self.nodes}
        self.client_cert = issue_cert(self.ca, self.tls_dir, "client")
        self.ctx = client_ctx(self.ca.ca_cert)
        if mutual:
            self.ctx.load_cert_chain(*self.client_cert)

    def command(self, node: Node) -> list[str]:
        cert, key = self.certs[node.id]
        cafile = str(self.ca.ca_cert)
        tls = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", cafile]
        if self.mutual:
            tls += ["--tls-client-ca", cafile]
        return [*super().command(node), *tls]

    def _healthy(self, node: Node) -> bool:
        if not node.alive:
            raise AssertionError(f"{node.id} exited:\n{self.tail(node.id)}")
        return https("GET", node.url + "/healthz", self.ctx, timeout=1)[0] == 200

    def status(self, nid: str) -> dict[str, Any]:
        code, body, _ = https("GET", self.nodes[nid].url + "/cluster", self.ctx, timeout=2)
        assert code == 200, body
        result: dict[str, Any] = body
        return result


@pytest.fixture(scope="module")
def tls3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    c = TlsCluster(tmp_path_factory.mktemp("tls-cluster"))
    try:
        c.start()
        yield c
    finally:
        c.close()


def name() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftq.node", *argv],
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ),
    )  # fmt: skip


async def test_the_async_client_through_a_follower_over_https(tls3: TlsCluster) -> None:
    lid = tls3.wait_leader()
    fid = tls3.followers()[0]
    leader, follower = tls3.url(lid), tls3.url(fid)
    topic = name()
    async with AsyncClient(follower, ca=tls3.ca.ca_cert, publish_stream=False) as c:
        await c.create_topic(topic)  # forwarded by the follower to the leader over HTTPS
        assert c.endpoints.leader == leader
    # The follower's answer names the leader with https://.
    status, _, headers = https("GET", f"{follower}/topics/{topic}", tls3.ctx)
    assert status == 200 and headers["X-Raftq-Leader"] == leader
    # Seeded with the follower only: publishes over HTTP (forwarded), then over the publish
    # stream, redirected to the leader; a consumer stream likewise.
    async with AsyncClient(follower, ca=tls3.ca.ca_cert) as c:
        c.endpoints.leader = None
        seqs = [await c.publish(topic, f"m{i}".encode()) for i in range(20)]
        assert seqs == list(range(1, 21))
        assert c._publisher is not None and c._publisher.stream is not None
        assert c._publisher.stream.open
    async with AsyncClient(follower, ca=tls3.ca.ca_cert, publish_stream=False) as c:
        got = []
        async for msg in c.consume(topic, stream=True, prefetch=5):
            got.append(msg.payload)
            await msg.ack()
            if len(got) == 20:
                break
        assert got == [f"m{i}".encode() for i in range(20)]


def test_the_sync_client_and_the_cli_through_a_follower_over_https(tls3: TlsCluster) -> None:
    fid = tls3.followers()[0]
    follower = tls3.url(fid)
    topic = name()
    with Client(follower, ca=str(tls3.ca.ca_cert)) as c:
        c.create_topic(topic)
        assert c.publish(topic, b"one") == 1
        assert c.endpoints.leader == tls3.url(tls3.wait_leader())
    ca = ["--url", follower, "--ca", str(tls3.ca.ca_cert)]
    r = cli("publish", topic, "two", *ca)
    assert r.returncode == 0, r.stderr
    r = cli("consume", topic, "--count", "2", "--json", *ca)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["payload"] for line in r.stdout.splitlines()] == ["one", "two"]
    r = cli("status", *ca)
    assert r.returncode == 0 and fid in r.stdout, r.stderr
    # Without the CA: one clear line, at once, exit 3.
    start = time.monotonic()
    r = cli("status", "--url", follower, "--timeout", "30")
    assert time.monotonic() - start < 15
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.startswith(f"raftq: TLS: {follower}: the server's certificate could not be")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


async def test_a_client_that_does_not_trust_the_ca_fails_at_once(tls3: TlsCluster) -> None:
    other = make_dev_ca(tls3.root / "other-ca")
    urls = [tls3.url(n) for n in tls3.nodes]
    start = time.monotonic()
    async with AsyncClient(urls, ca=other.ca_cert, timeout=30) as c:
        with pytest.raises(TLSError) as e:
            await c.publish("t", b"x")
    assert time.monotonic() - start < 5
    assert "certificate could not be verified" in e.value.message
    assert any(u in e.value.message for u in urls)
    with Client(urls, timeout=30) as sc, pytest.raises(TLSError, match="could not be verified"):
        sc.list_topics()  # (the system's store does not know the dev CA)


def test_http_to_an_https_port_fails_cleanly(tls3: TlsCluster) -> None:
    nid = next(iter(tls3.nodes))
    api = tls3.nodes[nid].api
    answer = raw_request(api, f"GET /cluster HTTP/1.1\r\nHost: {api}\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and json.loads(body)["code"] == "tls_required"
    start = time.monotonic()
    with (
        Client(f"http://{api}", timeout=30) as c,
        pytest.raises(TLSError, match=f"use an https:// URL \\(https://{api}/topics\\)"),
    ):
        c.list_topics()
    assert time.monotonic() - start < 5
    # The node did not mind: it serves HTTPS, and logged no error about it.
    assert https("GET", f"https://{api}/healthz", tls3.ctx)[0] == 200
    log = tls3.tail(nid, 200)
    assert "Traceback" not in log and " ERROR " not in log, log


def test_a_node_refuses_tls_1_1(tls3: TlsCluster) -> None:
    api = tls3.nodes[next(iter(tls3.nodes))].api
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(api, tls11_only())
    assert handshake(api, tls3.ctx) in ("TLSv1.2", "TLSv1.3")


def test_sighup_reloads_the_certificate_and_a_bad_reload_keeps_it(tls3: TlsCluster) -> None:
    nid = tls3.followers()[0]
    api = tls3.nodes[nid].api
    cert, key = tls3.certs[nid]
    original = x509.load_pem_x509_certificate(cert.read_bytes())
    assert served_cert(api, tls3.ca.ca_cert).serial_number == original.serial_number
    new_cert, new_key = issue_cert(tls3.ca, tls3.tls_dir / "next", nid)
    shutil.copy(new_key, key)
    shutil.copy(new_cert, cert)
    tls3.signal(nid, signal.SIGHUP)
    renewed = x509.load_pem_x509_certificate(new_cert.read_bytes()).serial_number
    wait_for(
        "the renewed certificate to be served",
        lambda: served_cert(api, tls3.ca.ca_cert).serial_number == renewed,
        10,
    )
    assert "TLS certificate reloaded" in tls3.tail(nid)
    # A reload of a file that is not a certificate: logged, and the node keeps serving.
    cert.write_text("not a certificate\n")
    try:
        tls3.signal(nid, signal.SIGHUP)
        wait_for("the failed reload in the log", lambda: "TLS reload failed" in tls3.tail(nid), 10)
        assert tls3.nodes[nid].alive
        assert served_cert(api, tls3.ca.ca_cert).serial_number == renewed
        # ... and it still takes part: a publish through it is forwarded to the leader.
        with Client(tls3.url(nid), ca=tls3.ctx) as c:
            topic = name()
            c.create_topic(topic)
            assert c.publish(topic, b"after") == 1
    finally:
        shutil.copy(new_cert, cert)


@pytest.mark.parametrize(
    "case", ["cert not PEM", "missing key", "key of another cert", "client CA not PEM"]
)
def test_a_node_with_a_bad_certificate_or_key_refuses_to_start(case: str, tmp_path: Path) -> None:
    ca = make_dev_ca(tmp_path / "ca")
    other = make_dev_ca(tmp_path / "other")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    cert, key, extra = str(ca.cert), str(ca.key), []
    if case == "cert not PEM":
        cert = str(garbage)
    elif case == "missing key":
        key = str(tmp_path / "missing.key")
    elif case == "key of another cert":
        key = str(other.key)
    else:
        extra = ["--tls-client-ca", str(garbage)]
    api, raft = free_ports(2)
    r = cli(
        "node", "--id", "n1", "--listen", f"127.0.0.1:{api}", "--raft", f"127.0.0.1:{raft}",
        "--secret", "s" * 16, "--in-memory", "--tls-cert", cert, "--tls-key", key, *extra,
        timeout=30,
    )  # fmt: skip
    assert r.returncode != 0
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "ERROR raftq.node: node n1: TLS: --tls-" in lines[0]
    assert {
        "cert not PEM": f"--tls-cert: no PEM certificate in {garbage}",
        "missing key": "--tls-key: No such file or directory",
        "key of another cert": "does not match the certificate",
        "client CA not PEM": "--tls-client-ca: no PEM certificate",
    }[case] in lines[0]


# ---------------------------------------------------------------- mutual TLS


@pytest.fixture
def mtls3(tmp_path: Path) -> Iterator[TlsCluster]:
    c = TlsCluster(tmp_path, mutual=True)
    try:
        c.start()
        yield c
    finally:
        c.close()


async def test_a_cluster_that_requires_client_certificates(mtls3: TlsCluster) -> None:
    fid = mtls3.followers()[0]
    follower = mtls3.url(fid)
    cert, key = mtls3.client_cert
    topic = name()
    # Through a follower: it presents its node certificate to the leader when it forwards.
    async with AsyncClient(follower, ca=mtls3.ca.ca_cert, cert=cert, key=key) as c:
        c.endpoints.leader = None
        await c.create_topic(topic)
        c.endpoints.leader = None
        assert await c.publish(topic, b"x") == 1
        async for msg in c.consume(topic, stream=True):
            assert msg.payload == b"x"
            await msg.ack()
            break
    status, body, _ = https("GET", f"{follower}/cluster", mtls3.ctx)
    assert status == 200 and all(m["answers"] for m in body["members"].values()), body
    # Without a client certificate: refused, clearly, at once.
    start = time.monotonic()
    async with AsyncClient(follower, ca=mtls3.ca.ca_cert, timeout=30) as c:
        with pytest.raises(TLSError, match="requires a client certificate"):
            await c.publish(topic, b"y")
    with (
        Client(follower, ca=mtls3.ca.ca_cert, timeout=30) as sc,
        pytest.raises(TLSError, match="requires a client certificate"),
    ):
        sc.list_topics()
    assert time.monotonic() - start < 5
    r = cli("status", "--url", follower, "--ca", str(mtls3.ca.ca_cert))
    assert r.returncode == 3 and "requires a client certificate" in r.stderr, r.stderr
    r = cli("status", "--url", follower, "--ca", str(mtls3.ca.ca_cert),
            "--client-cert", str(cert), "--client-key", str(key))  # fmt: skip
    assert r.returncode == 0, r.stderr
    answer = raw_request(
        mtls3.nodes[fid].api,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        client_ctx(mtls3.ca.ca_cert),
    )
    assert answer.startswith(b"HTTP/1.1 401 ")
    # A TLS node still stops gracefully (its listener included).
    assert mtls3.stop_node(fid) == 0
