"""Signature Version 4: the verifier against botocore's own signer (header and presigned
forms), then refusals end to end: a tampered body, a wrong secret, an unknown or revoked key,
a skewed clock, an expired presigned URL -> refused with SQS's codes."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from botocore import auth as bauth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from raftq.node.sqs import sigv4
from tests.node.cluster_fixture import http
from tests.sqs.conftest import SqsCluster

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
KEY = "AKIDEXAMPLE"


def secrets(access_key: str) -> str | None:
    return SECRET if access_key == KEY else None


def sign(
    url: str, body: bytes, secret: str = SECRET, when: dt.datetime | None = None,
    presign: int | None = None, method: str = "POST", headers: dict[str, str] | None = None,
) -> AWSRequest:  # fmt: skip
    req = AWSRequest(
        method=method,
        url=url,
        data=body,
        headers=headers
        if headers is not None
        else {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"},
    )
    creds = Credentials(KEY, secret)
    signer: bauth.SigV4Auth = (
        bauth.SigV4QueryAuth(creds, "sqs", "eu-west-1", expires=presign)
        if presign is not None
        else bauth.SigV4Auth(creds, "sqs", "eu-west-1")
    )
    with mock.patch.object(
        bauth, "get_current_datetime", lambda: when or dt.datetime.now(dt.UTC).replace(tzinfo=None)
    ):
        signer.add_auth(req)
    return req


def as_request(req: AWSRequest) -> sigv4.Request:
    """What the node sees of a signed request."""
    parts = urllib.parse.urlsplit(req.url)
    headers = [(k, v) for k, v in req.headers.items()]
    if not any(k.lower() == "host" for k, _ in headers):
        headers.append(("Host", parts.netloc))
    body = req.body if isinstance(req.body, bytes) else (req.body or "").encode()
    return sigv4.Request(
        req.method, parts.path or "/", urllib.parse.parse_qsl(parts.query, keep_blank_values=True),
        headers, body,
    )  # fmt: skip


def refused(req: sigv4.Request, now: float | None = None) -> str:
    with pytest.raises(sigv4.SigError) as e:
        sigv4.verify(req, secrets, now or dt.datetime.now(dt.UTC).timestamp())
    return e.value.code


URL = "http://127.0.0.1:9324/000000000000/orders?Extra=a%20b&Z=1"


def test_a_botocore_signed_request_verifies_with_its_region() -> None:
    req = as_request(sign(URL, b'{"QueueNamePrefix": "x"}'))
    signed = sigv4.verify(req, secrets, dt.datetime.now(dt.UTC).timestamp())
    assert signed == sigv4.Signed(KEY, "eu-west-1", False)


def test_a_tampered_body_header_or_path_is_refused() -> None:
    good = as_request(sign(URL, b'{"QueueNamePrefix": "x"}'))
    tampered = [
        sigv4.Request(good.method, good.path, good.query, good.headers, b'{"QueueNamePrefix":"y"}'),
        sigv4.Request(good.method, "/000000000000/other", good.query, good.headers, good.body),
        sigv4.Request(good.method, good.path, [("Z", "2")], good.headers, good.body),
        sigv4.Request(
            good.method, good.path, good.query,
            [(k, "AmazonSQS.DeleteQueue" if k == "X-Amz-Target" else v) for k, v in good.headers],
            good.body,
        ),
        sigv4.Request("PUT", good.path, good.query, good.headers, good.body),
    ]  # fmt: skip
    for req in tampered:
        assert refused(req) == "SignatureDoesNotMatch"


def test_a_wrong_secret_an_unknown_key_or_a_wrong_service_is_refused() -> None:
    assert refused(as_request(sign(URL, b"{}", secret="not-the-secret"))) == "SignatureDoesNotMatch"
    req = as_request(sign(URL, b"{}"))
    other_key = [(k, v.replace(KEY, "AKIDOTHER")) for k, v in req.headers]
    assert refused(sigv4.Request(req.method, req.path, req.query, other_key, req.body)) == (
        "InvalidClientTokenId"
    )
    s3 = [(k, v.replace("/sqs/", "/s3/")) for k, v in req.headers]
    assert refused(sigv4.Request(req.method, req.path, req.query, s3, req.body)) == (
        "SignatureDoesNotMatch"
    )
    unsigned = [(k, v) for k, v in req.headers if k.lower() != "authorization"]
    assert refused(sigv4.Request(req.method, req.path, req.query, unsigned, req.body)) == (
        "MissingAuthenticationToken"
    )
    broken = [(k, "AWS4-HMAC-SHA256 Credential=x" if k == "Authorization" else v)
              for k, v in req.headers]  # fmt: skip
    assert refused(sigv4.Request(req.method, req.path, req.query, broken, req.body)) == (
        "IncompleteSignature"
    )


def test_more_than_15_minutes_of_clock_skew_is_refused() -> None:
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    for skew in (dt.timedelta(minutes=16), dt.timedelta(minutes=-16)):
        assert refused(as_request(sign(URL, b"{}", when=now - skew))) == "RequestExpired"
    for skew in (dt.timedelta(minutes=14), dt.timedelta(minutes=-14)):
        req = as_request(sign(URL, b"{}", when=now - skew))
        sigv4.verify(req, secrets, dt.datetime.now(dt.UTC).timestamp())


def test_presigned_urls_verify_until_they_expire() -> None:
    url = "http://127.0.0.1:9324/?Action=ListQueues&Version=2012-11-05"
    req = as_request(sign(url, b"", presign=60, method="GET", headers={}))
    assert any(k == "X-Amz-Signature" for k, _ in req.query)
    now = dt.datetime.now(dt.UTC).timestamp()
    assert sigv4.verify(req, secrets, now).presigned
    assert refused(req, now + 61) == "RequestExpired"
    tampered = [(k, "DeleteQueue" if k == "Action" else v) for k, v in req.query]
    assert refused(sigv4.Request("GET", req.path, tampered, req.headers, b"")) == (
        "SignatureDoesNotMatch"
    )


# ---------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def cluster(sqs_cluster: SqsCluster) -> Iterator[SqsCluster]:
    yield sqs_cluster


def raw(url: str, req: AWSRequest) -> tuple[int, dict[str, str], bytes]:
    r = urllib.request.Request(url, data=req.body or None, method=req.method,
                               headers=dict(req.headers.items()))  # fmt: skip
    try:
        with urllib.request.urlopen(r, timeout=10) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()


@pytest.mark.slow
def test_refusals_end_to_end(cluster: SqsCluster) -> None:
    creds = cluster.credentials()
    ok = cluster.client(creds=creds)
    ok.list_queues()
    bad = cluster.client(creds={**creds, "secret_access_key": "x" * 40}, max_attempts=1)
    with pytest.raises(ClientError) as e:
        bad.list_queues()
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    unknown = cluster.client(creds={**creds, "access_key_id": "nosuchkey"}, max_attempts=1)
    with pytest.raises(ClientError) as e:
        unknown.list_queues()
    assert e.value.response["Error"]["Code"] == "InvalidClientTokenId"
    # A revoked token's key stops working at once, on every node.
    _, tcreds = cluster.new_token([{"topics": "*", "actions": ["consume"]}])
    for nid in cluster.nodes:
        cluster.client(nid, tcreds).list_queues()
    code, _ = http("DELETE", cluster.url(cluster.leader() or "n1") + "/tokens/"
                   + tcreds["access_key_id"], token=cluster.token)  # fmt: skip
    assert code == 200
    for nid in cluster.nodes:
        with pytest.raises(ClientError) as e:
            cluster.client(nid, tcreds, max_attempts=1).list_queues()
        assert e.value.response["Error"]["Code"] == "InvalidClientTokenId"
    # A token's credentials are its own: the admin's are not handed to it.
    assert creds["access_key_id"] == "admin"
    code, _ = http("GET", cluster.url("n1") + "/sqs/credentials", token=None)
    assert code == 401


@pytest.mark.slow
def test_tampered_body_skew_and_expired_presigned_url_end_to_end(cluster: SqsCluster) -> None:
    creds = cluster.credentials()
    secret = creds["secret_access_key"]
    base = cluster.sqs_url(cluster.followers()[0])

    def signed(**kw: Any) -> AWSRequest:
        with mock.patch(f"{__name__}.KEY", "admin"):
            return sign(base + "/", b'{"QueueNamePrefix": "a"}', secret=secret, **kw)

    status, _, body = raw(base + "/", signed())
    assert status == 200, body
    req = signed()
    req.data = b'{"QueueNamePrefix": "b"}'
    status, _, body = raw(base + "/", req)
    assert status == 403 and json.loads(body)["__type"].endswith("#SignatureDoesNotMatch")
    old = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=20)
    status, _, body = raw(base + "/", signed(when=old))
    assert status == 400 and json.loads(body)["__type"].endswith("#RequestExpired")
    # A presigned query-protocol URL: fine now, refused (XML) once expired.
    url = base + "/?Action=ListQueues&Version=2012-11-05"
    with mock.patch(f"{__name__}.KEY", "admin"):
        fresh = sign(url, b"", secret=secret, presign=60, method="GET", headers={})
        stale = sign(url, b"", secret=secret, presign=60, method="GET", headers={}, when=old)
    status, _, body = raw(fresh.url, fresh)
    assert status == 200 and b"<ListQueuesResponse" in body, body
    status, _, body = raw(stale.url, stale)
    assert status == 400 and b"<Code>RequestExpired</Code>" in body, body


@pytest.mark.slow
def test_a_signed_form_request_with_its_own_accept_goes_through_a_follower(
    cluster: SqsCluster,
) -> None:
    """A query-protocol client's request, signed with headers the API itself would refuse
    (Accept: text/xml), is forwarded unchanged and answered in XML."""
    creds = cluster.credentials()
    base = cluster.sqs_url(cluster.followers()[0])
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
               "Accept": "text/xml"}  # fmt: skip
    with mock.patch(f"{__name__}.KEY", "admin"):
        req = sign(base + "/", b"Action=ListQueues&Version=2012-11-05",
                   secret=creds["secret_access_key"], headers=headers)  # fmt: skip
    assert "accept" in req.headers["Authorization"]
    status, hdrs, body = raw(base + "/", req)
    assert status == 200 and body.startswith(b'<?xml version="1.0"?><ListQueuesResponse'), body
    assert hdrs["Content-Type"].startswith("text/xml")
