"""TLS for the node's HTTP API: the contexts it serves and calls other nodes with, reloaded on
SIGHUP, and a throwaway development CA (``make_dev_ca``).

``NodeTLS(TLSFiles(...))`` checks the files up front and raises ``TLSConfigError`` (one line,
naming the flag and the file) for a missing or unreadable file, a certificate or key that is
not PEM, an encrypted key, a key that does not match the certificate, an expired certificate, a
client CA that does not load, or a certificate whose extended key usage forbids what it is used
for (serving; with ``--tls-client-ca`` also presenting it to other nodes as a client).

The server context is TLS 1.2 at least. ``reload()`` builds new contexts from the same paths and
only then swaps them in: the served context's SNI callback (which OpenSSL calls for every
handshake, with or without a server name) moves each new connection onto the current one, so
connections already open keep theirs and a reload that fails changes nothing.

The peer context verifies other nodes against ``--tls-ca`` (else the system's store), host names
included: a node's certificate must name the address it advertises. With ``--tls-client-ca`` it
also presents the node's own certificate, so that certificate must allow client use (no extended
key usage, or one listing clientAuth) and be signed by a CA the other nodes' client CA accepts.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("raftq.node")

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


class TLSConfigError(ValueError):
    """A TLS file that cannot be used; the message is one line naming the flag and the file."""


@dataclass(frozen=True)
class TLSFiles:
    cert: str  # --tls-cert: PEM, the node's certificate first, then any intermediates
    key: str  # --tls-key: PEM, unencrypted
    client_ca: str | None = None  # --tls-client-ca: require client certificates signed by it
    ca: str | None = None  # --tls-ca: verify other nodes with it (default: the system's store)


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TLSConfigError(f"{flag}: {e.strerror or e}: {path}") from None


def _certs(flag: str, path: str) -> list[x509.Certificate]:
    data = _read(flag, path)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise TLSConfigError(f"{flag}: no PEM certificate in {path}")
    return certs


def _spki(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _check_usage(cert: x509.Certificate, path: str, client: bool) -> None:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return  # no restriction
    if ExtendedKeyUsageOID.SERVER_AUTH not in eku:
        raise TLSConfigError(
            f"--tls-cert: {path} may not be used by a server (extended key usage lacks serverAuth)"
        )
    if client and ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        raise TLSConfigError(
            f"--tls-cert: {path} may not be used as a client certificate (extended key usage"
            " lacks clientAuth), which --tls-client-ca needs: nodes present it to each other"
        )


def check_files(files: TLSFiles) -> x509.Certificate:
    """Every file of ``files`` readable and consistent, else ``TLSConfigError``; returns the
    node's certificate."""
    leaf = _certs("--tls-cert", files.cert)[0]
    data = _read("--tls-key", files.key)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TLSConfigError(
            f"--tls-key: {files.key} is encrypted; give an unencrypted key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise TLSConfigError(f"--tls-key: no usable PEM private key in {files.key}") from None
    if _spki(key.public_key()) != _spki(leaf.public_key()):
        raise TLSConfigError(f"--tls-key: {files.key} does not match the certificate {files.cert}")
    now = datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc < now:
        raise TLSConfigError(
            f"--tls-cert: {files.cert} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    _check_usage(leaf, files.cert, client=files.client_ca is not None)
    if files.client_ca is not None:
        _certs("--tls-client-ca", files.client_ca)
    if files.ca is not None:
        _certs("--tls-ca", files.ca)
    return leaf


def _load(ctx: ssl.SSLContext, flag: str, path: str, what: str, *args: str) -> None:
    try:
        if what == "chain":
            ctx.load_cert_chain(path, *args)
        else:
            ctx.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as e:
        raise TLSConfigError(f"{flag}: {path} does not load: {e}") from None


def server_context(files: TLSFiles) -> ssl.SSLContext:
    """What the API serves: the node's certificate, TLS 1.2 at least, and with ``client_ca``
    client certificates verified against it (``CERT_OPTIONAL``: ``HttpsSite`` with
    ``require_client_cert`` refuses connections that presented none)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MINIMUM_VERSION
    _load(ctx, "--tls-cert", files.cert, "chain", files.key)
    if files.client_ca is not None:
        # Asked for and verified when presented; a connection without one is refused by the
        # listener (raftq.node.httpsite), with an HTTP answer a client can read.
        ctx.verify_mode = ssl.CERT_OPTIONAL
        _load(ctx, "--tls-client-ca", files.client_ca, "verify")
    return ctx


def peer_context(files: TLSFiles) -> ssl.SSLContext:
    """What the node verifies other nodes with when it calls them (forward, release, probe);
    with ``client_ca`` it presents its own certificate too."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # (verifies certificates and host names)
    ctx.minimum_version = MINIMUM_VERSION
    if files.ca is None:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:  # only that CA, not the system's too
        _load(ctx, "--tls-ca", files.ca, "verify")
    if files.client_ca is not None:
        _load(ctx, "--tls-cert", files.cert, "chain", files.key)
    return ctx


def names(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses a certificate is valid for."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [
        *san.get_values_for_type(x509.DNSName),
        *map(str, san.get_values_for_type(x509.IPAddress)),
    ]


def covers(cert: x509.Certificate, host: str) -> bool:
    """Would a client checking host names accept ``cert`` for ``host``? (Subject alternative
    names only, as OpenSSL's check; a wildcard matches one leftmost label.)"""
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    if ip is not None:
        return ip in san.get_values_for_type(x509.IPAddress)
    host = host.lower().rstrip(".")
    for name in san.get_values_for_type(x509.DNSName):
        name = name.lower().rstrip(".")
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


class NodeTLS:
    """The node's TLS state: ``server`` (give it to the listener once: it stays the served
    context, and moves every new handshake onto the current certificate), ``peer()`` (the
    current context for calls to other nodes) and ``reload()``."""

    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self.require_client_cert = files.client_ca is not None  # (see server_context)
        self.cert = check_files(files)
        self.server = server_context(files)
        self._current = self.server
        self._peer = peer_context(files)
        self.server.sni_callback = self._pick

    def _pick(self, conn: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object) -> None:
        current = self._current
        if conn.context is not current:
            conn.context = current

    def peer(self) -> ssl.SSLContext:
        return self._peer

    def reload(self) -> x509.Certificate:
        """Load the files again; the new certificate serves new connections (and new calls to
        other nodes present it). On ``TLSConfigError`` nothing changed."""
        cert = check_files(self.files)
        server, peer = server_context(self.files), peer_context(self.files)
        self._current, self._peer, self.cert = server, peer, cert
        return cert


def describe(cert: x509.Certificate) -> str:
    """A certificate in one line for the log: subject, names, expiry, fingerprint."""
    subject = cert.subject.rfc4514_string() or "(no subject)"
    sha = cert.fingerprint(hashes.SHA256()).hex()[:16]
    return (
        f"{subject} for {', '.join(names(cert)) or '(no names)'}, valid until"
        f" {cert.not_valid_after_utc:%Y-%m-%d} UTC, sha256 {sha}..."
    )


# ---------------------------------------------------------------------- development CA


@dataclass(frozen=True)
class DevCA:
    """Paths of what ``make_dev_ca`` wrote: the CA (give ``ca_cert`` to clients as ``ca=`` /
    ``--ca`` and to nodes as ``--tls-ca``) and one node certificate for every dev node."""

    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path


DEV_VALIDITY = datetime.timedelta(days=365)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for h in ("127.0.0.1", "::1", "localhost", *hosts):
        h = h.strip("[]")
        if not h or h in seen:
            continue
        seen.add(h)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            entries.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(entries)


def issue_cert(
    ca: DevCA,
    directory: str | os.PathLike[str],
    name: str,
    hosts: Sequence[str] = (),
    *,
    validity: datetime.timedelta = DEV_VALIDITY,
    client: bool = True,
) -> tuple[Path, Path]:
    """Another certificate signed by ``ca`` (``<name>.pem``, ``<name>.key`` in ``directory``),
    valid for loopback, ``localhost`` and ``hosts``, for server and (unless ``client`` is
    False) client use; a negative ``validity`` gives one that has expired."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = sorted((now - datetime.timedelta(hours=1), now + validity))
    if validity < datetime.timedelta(0):
        start = end - datetime.timedelta(days=1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH]
                + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
            ),
            critical=False,
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = out / f"{name}.pem", out / f"{name}.key"
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def make_dev_ca(directory: str | os.PathLike[str], hosts: Sequence[str] = ()) -> DevCA:
    """Write a fresh CA (``ca.pem``, ``ca.key``) and one node certificate signed by it
    (``node.pem``, ``node.key``) into ``directory``, valid for 127.0.0.1, ::1, localhost and
    ``hosts`` (names or addresses), usable by servers and clients. Development and tests only:
    the CA's key sits next to its certificate."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raftq development CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + DEV_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca = DevCA(out / "ca.pem", out / "ca.key", out / "node.pem", out / "node.key")
    _write_key(ca.ca_key, key)
    ca.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    issue_cert(ca, out, "node", hosts)
    return ca
