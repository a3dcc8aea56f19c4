"""Edge cases found in review (issue 24), each a 500 or an acceptance before its fix: SigV4
(non-ASCII signature or expiry, unsigned x-amz-date), the query protocol's flattened names,
and forwarding headers a client sends to the SQS listener."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import urllib.request
from unittest import mock

import pytest

from raftq.node.sqs import sigv4, wire
from tests.sqs.conftest import SqsCluster
from tests.sqs.test_sqs_sigv4 import KEY, SECRET, URL, as_request, raw, refused, secrets, sign


def now() -> float:
    return dt.datetime.now(dt.UTC).timestamp()


def test_a_non_ascii_signature_is_refused_not_a_crash() -> None:
    good = as_request(sign(URL, b"{}"))
    headers = [
        (k, v.rsplit("Signature=", 1)[0] + "Signature=\u00e9" if k == "Authorization" else v)
        for k, v in good.headers
    ]
    req = sigv4.Request(good.method, good.path, good.query, headers, good.body)
    assert refused(req) == "SignatureDoesNotMatch"
    url = "http://127.0.0.1:9324/?Action=ListQueues"
    pre = as_request(sign(url, b"", presign=60, method="GET", headers={}))
    query = [(k, "\u00e9" * 64 if k == "X-Amz-Signature" else v) for k, v in pre.query]
    assert refused(sigv4.Request("GET", pre.path, query, pre.headers, b"")) == (
        "SignatureDoesNotMatch"
    )


@pytest.mark.parametrize("expires", ["\u00b2", "\u0663", "-1", "0", str(7 * 86400 + 1), ""])
def test_a_presigned_expiry_that_is_not_1_to_7_days_in_ascii_digits_is_refused(
    expires: str,
) -> None:
    url = "http://127.0.0.1:9324/?Action=ListQueues"
    pre = as_request(sign(url, b"", presign=60, method="GET", headers={}))
    query = [(k, expires if k == "X-Amz-Expires" else v) for k, v in pre.query]
    with pytest.raises(sigv4.SigError) as e:
        sigv4.verify(sigv4.Request("GET", pre.path, query, pre.headers, b""), secrets, now())
    assert e.value.code == "AuthorizationQueryParametersError"


def test_the_header_form_must_sign_x_amz_date() -> None:
    """A signature over ``host`` alone (valid otherwise) is refused, as AWS refuses it."""
    amz_date = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    body = b"{}"
    headers = [("Host", "127.0.0.1:9324"), ("X-Amz-Date", amz_date)]
    scope = f"{amz_date[:8]}/eu-west-1/sqs/aws4_request"
    req = sigv4.Request("POST", "/", [], headers, body)
    creq = sigv4.canonical_request(req, ["host"], hashlib.sha256(body).hexdigest(), None)
    sts = sigv4.string_to_sign(amz_date, scope, creq)
    key = sigv4.signing_key(SECRET, amz_date[:8], "eu-west-1")
    sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    auth = f"{sigv4.ALGORITHM} Credential={KEY}/{scope}, SignedHeaders=host, Signature={sig}"
    signed = sigv4.Request("POST", "/", [], [*headers, ("Authorization", auth)], body)
    with pytest.raises(sigv4.SigError) as e:
        sigv4.verify(signed, secrets, now())
    assert e.value.code == "SignatureDoesNotMatch"
    assert "x-amz-date" in e.value.message


@pytest.mark.parametrize(
    "pair", [("Attribute.\u00b2.Name", "x"), ("Attribute.1.Name.x", "y"), ("Tag.1.Key.z", "k")]
)
def test_odd_flattened_query_names_are_malformed_not_a_crash(pair: tuple[str, str]) -> None:
    with pytest.raises(wire.SqsError) as e:
        wire.decode_query([("Action", "SetQueueAttributes"), pair])
    assert e.value.type == "MalformedQueryString"


@pytest.mark.slow
def test_the_sqs_listener_ignores_forwarding_headers_from_clients(sqs_cluster: SqsCluster) -> None:
    """Only the API's /sqs takes forwards: on the listener, a client's X-Raftq-Sqs-Path does not
    choose the path its signature is checked on, nor X-Raftq-Forwarded stop a follower from
    forwarding it."""
    creds = sqs_cluster.credentials()
    base = sqs_cluster.sqs_url(sqs_cluster.followers()[0])
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
    with mock.patch("tests.sqs.test_sqs_sigv4.KEY", "admin"):
        req = sign(base + "/", b"{}", secret=creds["secret_access_key"], headers=headers)
    for forged in ({"X-Raftq-Sqs-Path": "/000000000000/elsewhere"}, {"X-Raftq-Forwarded": "n9"}):
        for k, v in forged.items():
            req.headers[k] = v
        status, _, body = raw(base + "/", req)
        assert status == 200, (forged, body)
    # Counted on the follower as forwarded, on the leader as answered (raftq_sqs_requests).
    leader = sqs_cluster.leader()
    assert leader is not None
    for nid, outcome in ((sqs_cluster.followers()[0], "forwarded"), (leader, "ok")):
        with urllib.request.urlopen(sqs_cluster.url(nid) + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert f'raftq_sqs_requests_total{{action="ListQueues",outcome="{outcome}"}}' in text
