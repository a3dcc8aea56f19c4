"""AWS Signature Version 4 verification (pure: no I/O, no aiohttp).

Both forms SDKs use: the ``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=...,
Signature=...`` header, and a presigned URL (``X-Amz-Algorithm``, ``X-Amz-Credential``,
``X-Amz-Date``, ``X-Amz-Expires``, ``X-Amz-SignedHeaders``, ``X-Amz-Signature`` in the query;
no body: its payload hash is the empty body's, or ``UNSIGNED-PAYLOAD``). A request is refused
as SQS refuses it: a malformed or incomplete signature (``IncompleteSignature``), none at all
(``MissingAuthenticationToken``), an unknown access key (``InvalidClientTokenId``), a
signature that does not match (``SignatureDoesNotMatch``), a date more than 15 minutes from
now or a presigned URL past its expiry (``RequestExpired``).

Hand-written: PyPI has SigV4 *signers* (botocore, requests-aws4auth) but no maintained
verifier; the canonical request follows AWS's documented algorithm, and the tests check it
against botocore's own signer.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
MAX_SKEW_S = 15 * 60
MAX_PRESIGN_EXPIRES_S = 7 * 86400
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_AUTH_PART = re.compile(r"\s*([A-Za-z]+)=([^,]*)")
_AMZ_DATE = "%Y%m%dT%H%M%SZ"


class SigError(Exception):
    """A request refused for its signature: ``code`` is the AWS error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Signed:
    """What a verified request was signed with."""

    access_key: str
    region: str
    presigned: bool


@dataclass(frozen=True)
class Request:
    """The parts of an HTTP request SigV4 covers. ``path`` is as sent (percent-encoded);
    ``query`` the decoded pairs in order; ``headers`` (name, value) pairs."""

    method: str
    path: str
    query: Sequence[tuple[str, str]]
    headers: Sequence[tuple[str, str]]
    body: bytes


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str = SERVICE) -> bytes:
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _quote(s: str) -> str:
    return urllib.parse.quote(s, safe="-_.~")


def canonical_uri(path: str) -> str:
    """The path, each segment decoded and encoded again (AWS's rule for services other than
    S3: what botocore does on its side, so an encoded path compares equal)."""
    raw = urllib.parse.unquote(path or "/")
    return urllib.parse.quote(raw, safe="/~") or "/"


def canonical_query(pairs: Sequence[tuple[str, str]], drop: str | None = None) -> str:
    items = sorted((_quote(k), _quote(v)) for k, v in pairs if k != drop)
    return "&".join(f"{k}={v}" for k, v in items)


def _header_map(headers: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in headers:
        out.setdefault(k.lower().strip(), []).append(" ".join(v.split()))
    return out


def canonical_request(
    req: Request, signed_headers: list[str], payload_hash: str, drop_query: str | None
) -> str:
    hmap = _header_map(req.headers)
    lines = []
    for h in signed_headers:
        if h not in hmap:
            raise SigError(
                "SignatureDoesNotMatch", f"the signed header {h!r} is not in the request"
            )
        lines.append(f"{h}:{','.join(hmap[h])}\n")
    return "\n".join(
        [
            req.method.upper(),
            canonical_uri(req.path),
            canonical_query(req.query, drop_query),
            "".join(lines),
            ";".join(signed_headers),
            payload_hash,
        ]
    )


def string_to_sign(amz_date: str, scope: str, creq: str) -> str:
    return "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])


def is_signed(req: Request) -> bool:
    """Whether the request carries a SigV4 signature (header or presigned) at all."""
    if any(k.lower() == "authorization" for k, _ in req.headers):
        return True
    return any(k == "X-Amz-Signature" for k, _ in req.query)


def verify(
    req: Request,
    secret_for: Callable[[str], str | None],
    now: float,
) -> Signed:
    """Check ``req``'s signature; ``secret_for(access_key)`` is the secret access key (None:
    unknown key). Returns who signed, or raises ``SigError``."""
    query = dict(req.query)
    auth = next((v for k, v in req.headers if k.lower() == "authorization"), None)
    if auth is not None:
        return _verify_header(req, auth, secret_for, now)
    if "X-Amz-Signature" in query or "X-Amz-Credential" in query:
        return _verify_presigned(req, query, secret_for, now)
    raise SigError(
        "MissingAuthenticationToken",
        "Request is missing Authentication Token (sign it with AWS Signature Version 4)",
    )


def _parse_scope(credential: str) -> tuple[str, str, str, str]:
    """``AKID/YYYYMMDD/region/sqs/aws4_request`` as (access key, date, region, scope)."""
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not parts[0]:
        raise SigError(
            "IncompleteSignature",
            f"Credential must be <access key>/<date>/<region>/{SERVICE}/aws4_request",
        )
    if parts[3] != SERVICE:
        raise SigError(
            "SignatureDoesNotMatch",
            f"Credential should be scoped to correct service: '{SERVICE}'",
        )
    return parts[0], parts[1], parts[2], "/".join(parts[1:])


def _parse_date(amz_date: str) -> float:
    try:
        return dt.datetime.strptime(amz_date, _AMZ_DATE).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        raise SigError(
            "IncompleteSignature", f"X-Amz-Date {amz_date!r} is not ISO 8601 basic"
        ) from None


def _check(
    req: Request,
    access_key: str,
    date: str,
    region: str,
    scope: str,
    amz_date: str,
    signed_headers: list[str],
    signature: str,
    payload_hashes: tuple[str, ...],
    drop_query: str | None,
    secret_for: Callable[[str], str | None],
) -> None:
    if not amz_date.startswith(date):
        raise SigError(
            "SignatureDoesNotMatch",
            f"Credential should be scoped to a valid date: {amz_date[:8]}, not {date}",
        )
    if "host" not in signed_headers:
        raise SigError("SignatureDoesNotMatch", "the host header must be signed")
    if not signature.isascii():  # (compare_digest refuses non-ASCII text with a TypeError)
        raise SigError("SignatureDoesNotMatch", "the signature is not hexadecimal")
    secret = secret_for(access_key)
    if secret is None:
        raise SigError(
            "InvalidClientTokenId", "The security token included in the request is invalid."
        )
    key = signing_key(secret, date, region)
    for payload_hash in payload_hashes:
        creq = canonical_request(req, signed_headers, payload_hash, drop_query)
        sts = string_to_sign(amz_date, scope, creq)
        expected = hmac.new(key, sts.encode(), hashlib.sha256)
        if hmac.compare_digest(expected.hexdigest(), signature.lower()):
            return
    raise SigError(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided."
        " Check your AWS Secret Access Key and signing method.",
    )


def _verify_header(
    req: Request, auth: str, secret_for: Callable[[str], str | None], now: float
) -> Signed:
    algorithm, _, rest = auth.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SigError("IncompleteSignature", f"Authorization must use {ALGORITHM}")
    fields = {m.group(1): m.group(2).strip() for m in _AUTH_PART.finditer(rest)}
    missing = [f for f in ("Credential", "SignedHeaders", "Signature") if not fields.get(f)]
    if missing:
        raise SigError(
            "IncompleteSignature",
            f"Authorization header requires {', '.join(missing)} (key=value, comma-separated)",
        )
    access_key, date, region, scope = _parse_scope(fields["Credential"])
    hmap = _header_map(req.headers)
    amz_date = (hmap.get("x-amz-date") or [""])[0]
    if not amz_date:
        raise SigError("IncompleteSignature", "the X-Amz-Date header is required")
    when = _parse_date(amz_date)
    if abs(now - when) > MAX_SKEW_S:
        raise SigError(
            "RequestExpired",
            f"Request has expired: its X-Amz-Date {amz_date} is more than"
            f" {MAX_SKEW_S // 60} minutes from the server's time",
        )
    # The body is always covered: an x-amz-content-sha256 header (UNSIGNED-PAYLOAD included)
    # must be the body's hash, so a body changed on the way never passes.
    payload = hashlib.sha256(req.body).hexdigest()
    given = (hmap.get("x-amz-content-sha256") or [payload])[0]
    if given != payload:
        raise SigError("SignatureDoesNotMatch", "x-amz-content-sha256 does not match the body")
    signed = fields["SignedHeaders"].split(";")
    if "x-amz-date" not in signed:  # (as AWS: the date the signature is good for is signed)
        raise SigError("SignatureDoesNotMatch", "the x-amz-date header must be signed")
    _check(
        req, access_key, date, region, scope, amz_date, signed, fields["Signature"], (payload,),
        None, secret_for,
    )  # fmt: skip
    return Signed(access_key, region, False)


def _verify_presigned(
    req: Request, query: Mapping[str, str], secret_for: Callable[[str], str | None], now: float
) -> Signed:
    need = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders")
    missing = [k for k in (*need, "X-Amz-Signature") if not query.get(k)]
    if missing:
        raise SigError(
            "IncompleteSignature", f"a presigned URL needs the parameters {', '.join(missing)}"
        )
    if query["X-Amz-Algorithm"] != ALGORITHM:
        raise SigError("IncompleteSignature", f"X-Amz-Algorithm must be {ALGORITHM}")
    access_key, date, region, scope = _parse_scope(query["X-Amz-Credential"])
    amz_date = query["X-Amz-Date"]
    when = _parse_date(amz_date)
    expires_text = query.get("X-Amz-Expires", str(MAX_PRESIGN_EXPIRES_S))
    if (
        not (expires_text.isascii() and expires_text.isdigit())
        or not 0 < int(expires_text) <= MAX_PRESIGN_EXPIRES_S
    ):
        raise SigError(
            "AuthorizationQueryParametersError",
            f"X-Amz-Expires must be 1 to {MAX_PRESIGN_EXPIRES_S} seconds",
        )
    if when - now > MAX_SKEW_S:
        raise SigError("RequestExpired", f"Request is not valid yet: X-Amz-Date {amz_date}")
    if now > when + int(expires_text):
        raise SigError(
            "RequestExpired", f"Request has expired: the presigned URL expired at {amz_date}"
            f" + {expires_text} s",
        )  # fmt: skip
    if req.body:  # (nothing of a presigned request may be outside what it signed)
        raise SigError("SignatureDoesNotMatch", "a presigned request has no body")
    signed = query["X-Amz-SignedHeaders"].split(";")
    # botocore signs an empty body's hash; AWS's documentation names UNSIGNED-PAYLOAD.
    payloads = (hashlib.sha256(b"").hexdigest(), UNSIGNED_PAYLOAD)
    _check(
        req, access_key, date, region, scope, amz_date, signed, query["X-Amz-Signature"],
        payloads, "X-Amz-Signature", secret_for,
    )  # fmt: skip
    return Signed(access_key, region, True)


def access_key_of(req: Request) -> str | None:
    """The access key a request claims (before verification), if any can be read."""
    auth = next((v for k, v in req.headers if k.lower() == "authorization"), None)
    cred: str | None = None
    if auth is not None:
        m = re.search(r"Credential=([^/,\s]+)/", auth)
        cred = m.group(1) if m else None
    else:
        cred = dict(req.query).get("X-Amz-Credential", "").split("/")[0] or None
    return cred
