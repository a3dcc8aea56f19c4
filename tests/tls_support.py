"""TLS helpers for tests: throwaway CAs (``raftq.node.tlsutil.make_dev_ca``), in-process HTTPS
nodes (``HttpsSite`` in front of a ``LocalRaft`` app, as ``raftq node --tls-cert`` serves), and
what a TLS client sees of a server (its certificate, whether a handshake works)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509

from raftq.node.httpsite import HttpsSite
from raftq.node.raftapi import Raft
from raftq.node.tlsutil import DevCA, NodeTLS, TLSFiles
from tests.node.inprocess import app


def node_tls(ca: DevCA, client_ca: bool = False) -> NodeTLS:
    """The TLS state of a node with ``ca``'s node certificate, verifying peers with ``ca``."""
    cafile = str(ca.ca_cert)
    return NodeTLS(
        TLSFiles(str(ca.cert), str(ca.key), client_ca=cafile if client_ca else None, ca=cafile)
    )


@contextlib.asynccontextmanager
async def https_node(raft: Raft, tls: NodeTLS, **settings: Any) -> AsyncIterator[str]:
    """Serve an in-process node over HTTPS on a free loopback port; yields its host:port."""
    application = app(raft, scheme="https", peer_ssl=tls.peer, **settings)
    runner = web.AppRunner(application, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = HttpsSite(
        runner, "127.0.0.1", 0, tls.server, require_client_cert=tls.require_client_cert
    )
    await site.start()
    try:
        yield f"127.0.0.1:{site.port}"
    finally:
        await runner.cleanup()


def client_ctx(cafile: Path | str | None = None) -> ssl.SSLContext:
    """A verifying client context (``cafile``, else trusting nothing the system does not)."""
    return ssl.create_default_context(cafile=None if cafile is None else str(cafile))


def served_cert(addr: str, cafile: Path | str) -> x509.Certificate:
    """The certificate the server at ``addr`` (host:port) presents to a new connection."""
    host, port = addr.rsplit(":", 1)
    ctx = client_ctx(cafile)
    with (
        socket.create_connection((host, int(port)), timeout=5) as s,
        ctx.wrap_socket(s, server_hostname=host) as t,
    ):
        der = t.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def handshake(addr: str, ctx: ssl.SSLContext) -> str:
    """The TLS version a handshake with ``ctx`` got (``ssl.SSLError`` / ``OSError`` if none)."""
    host, port = addr.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as s,
        ctx.wrap_socket(s, server_hostname=host) as t,
    ):
        version = t.version()
    assert version is not None
    return version


def tls11_only() -> ssl.SSLContext:
    """A client that offers TLS 1.1 and nothing newer (security level 0, so that this end
    does not refuse it itself), trusting any certificate: it probes the server's minimum."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():  # (ssl deprecates TLS 1.1: that is the point)
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    return ctx


def raw_request(addr: str, data: bytes, ctx: ssl.SSLContext | None = None) -> bytes:
    """Send ``data`` (plain, or over TLS with ``ctx``) and read until the server closes."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        conn: socket.socket = ctx.wrap_socket(s, server_hostname=host) if ctx else s
        with conn:
            conn.sendall(data)
            out = b""
            while chunk := conn.recv(65536):
                out += chunk
            return out
