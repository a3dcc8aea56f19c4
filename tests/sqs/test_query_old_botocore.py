"""The query protocol as a real old SDK speaks it: boto3 + botocore 1.33 (form bodies, XML
answers) in a venv of its own (tests/sqs/old_botocore.py), against the 3-node cluster through a
follower's SQS listener: queue lifecycle, send / receive / delete, batches, attributes, and
errors in the XML ``ErrorResponse`` shape. ``RAFTQ_SQS_TARGET=moto`` runs them against
moto_server instead, for reference (moto answers a non-numeric VisibilityTimeout with a 500)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from tests.sqs.conftest import SqsCluster
from tests.sqs.old_botocore import old_botocore_python, run_calls

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]  # the first run builds the venv


@pytest.fixture(scope="module")
def old_python() -> Path:
    python, why = old_botocore_python()
    if python is None:
        pytest.skip(why)
    return python


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    if os.environ.get("RAFTQ_SQS_TARGET") == "moto":  # the harness's reference run
        from tests.sqs.moto_server import KEY, SECRET, MotoServer

        moto = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
        try:
            yield moto.url, KEY, SECRET
        finally:
            moto.stop()
        return
    cluster = SqsCluster(tmp_path_factory.mktemp("cluster"), 3)
    try:
        cluster.start()
        creds = cluster.credentials()
        url = cluster.sqs_url(cluster.followers()[0])
        yield url, creds["access_key_id"], creds["secret_access_key"]
    finally:
        cluster.close()


def ok(outcome: dict[str, Any]) -> dict[str, Any]:
    assert "ok" in outcome, outcome
    assert outcome["protocol"] == "query", outcome
    result: dict[str, Any] = outcome["ok"]
    return result


def error_response(outcome: dict[str, Any]) -> dict[str, str]:
    """The fields of an XML ErrorResponse answer, checking its shape on the way."""
    assert "error" in outcome, outcome
    assert outcome["protocol"] == "query", outcome
    body = outcome["error"]["body"]
    root = ElementTree.fromstring(body)
    assert root.tag.split("}")[-1] == "ErrorResponse", body
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    err = root.find(f"{ns}Error")
    assert err is not None, body
    fields = {child.tag.split("}")[-1]: (child.text or "") for child in err}
    assert {"Type", "Code", "Message"} <= set(fields), body
    assert root.find(f"{ns}RequestId") is not None, body
    assert outcome["error"]["code"] == fields["Code"]
    return fields


def test_old_botocore_speaks_query_for_the_queue_lifecycle_and_messages(
    old_python: Path, endpoint: tuple[str, str, str]
) -> None:
    url, key, secret = endpoint
    name = f"q-{uuid.uuid4().hex[:10]}"
    calls: list[dict[str, Any]] = [
        {"op": "create_queue", "params": {"QueueName": name,
                                          "Attributes": {"VisibilityTimeout": "30"}}},
        {"op": "get_queue_url", "params": {"QueueName": name}},
        {"op": "list_queues", "params": {"QueueNamePrefix": name}},
    ]  # fmt: skip
    created, got_url, listed = run_calls(old_python, url, key, secret, calls)
    qurl = ok(created)["QueueUrl"]
    assert qurl.endswith("/" + name)
    assert ok(got_url)["QueueUrl"] == qurl
    assert ok(listed)["QueueUrls"] == [qurl]

    body = "hello <&> ünïcode"
    batch = [{"Id": f"e{i}", "MessageBody": f"batch-{i}"} for i in range(3)]
    calls = [
        {"op": "set_queue_attributes",
         "params": {"QueueUrl": qurl, "Attributes": {"VisibilityTimeout": "45",
                                                      "MaximumMessageSize": "2048"}}},
        {"op": "get_queue_attributes",
         "params": {"QueueUrl": qurl, "AttributeNames": ["VisibilityTimeout",
                                                          "MaximumMessageSize", "QueueArn"]}},
        {"op": "send_message",
         "params": {"QueueUrl": qurl, "MessageBody": body,
                    "MessageAttributes": {"kind": {"DataType": "String", "StringValue": "x"},
                                          "n": {"DataType": "Number", "StringValue": "7"}}}},
        {"op": "send_message_batch", "params": {"QueueUrl": qurl, "Entries": batch}},
    ]  # fmt: skip
    set_attrs, attrs, sent, sent_batch = run_calls(old_python, url, key, secret, calls)
    ok(set_attrs)
    a = ok(attrs)["Attributes"]
    assert a["VisibilityTimeout"] == "45" and a["MaximumMessageSize"] == "2048"
    assert a["QueueArn"].endswith(":" + name)
    assert ok(sent)["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert len(ok(sent)["MessageId"]) == 36
    assert sorted(e["Id"] for e in ok(sent_batch)["Successful"]) == ["e0", "e1", "e2"]
    assert not ok(sent_batch).get("Failed")

    calls = [
        {"op": "receive_message",
         "params": {"QueueUrl": qurl, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1,
                    "AttributeNames": ["All"], "MessageAttributeNames": ["All"]}},
    ]  # fmt: skip
    got: list[dict[str, Any]] = []
    for _ in range(5):  # SQS may answer with fewer than there are; bounded
        got += ok(run_calls(old_python, url, key, secret, calls)[0]).get("Messages", [])
        if len(got) >= 4:
            break
    bodies = sorted(m["Body"] for m in got)
    assert bodies == sorted([body, "batch-0", "batch-1", "batch-2"])
    first = next(m for m in got if m["Body"] == body)
    assert first["MessageAttributes"]["kind"]["StringValue"] == "x"
    assert first["MessageAttributes"]["n"] == {"DataType": "Number", "StringValue": "7"}
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(first["Attributes"]["SentTimestamp"]) > 0

    handles = [m["ReceiptHandle"] for m in got]
    calls = [
        {"op": "change_message_visibility",
         "params": {"QueueUrl": qurl, "ReceiptHandle": handles[0], "VisibilityTimeout": 60}},
        {"op": "delete_message", "params": {"QueueUrl": qurl, "ReceiptHandle": handles[0]}},
        {"op": "delete_message_batch",
         "params": {"QueueUrl": qurl, "Entries": [
             {"Id": f"d{i}", "ReceiptHandle": h} for i, h in enumerate(handles[1:])]}},
        {"op": "get_queue_attributes",
         "params": {"QueueUrl": qurl, "AttributeNames": ["ApproximateNumberOfMessages",
                                                          "ApproximateNumberOfMessagesNotVisible"]}},
        {"op": "purge_queue", "params": {"QueueUrl": qurl}},
        {"op": "delete_queue", "params": {"QueueUrl": qurl}},
        {"op": "get_queue_url", "params": {"QueueName": name}},
    ]  # fmt: skip
    changed, deleted, deleted_batch, counts, purged, dropped, gone = run_calls(
        old_python, url, key, secret, calls
    )
    ok(changed), ok(deleted), ok(purged), ok(dropped)
    assert len(ok(deleted_batch)["Successful"]) == 3 and not ok(deleted_batch).get("Failed")
    c = ok(counts)["Attributes"]
    assert c["ApproximateNumberOfMessages"] == "0"
    assert c["ApproximateNumberOfMessagesNotVisible"] == "0"
    err = error_response(gone)
    assert err["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert err["Type"] == "Sender"
    assert gone["error"]["status"] == 400


def test_old_botocore_gets_errors_in_the_xml_error_response_shape(
    old_python: Path, endpoint: tuple[str, str, str]
) -> None:
    url, key, secret = endpoint
    name = f"q-{uuid.uuid4().hex[:10]}"
    create = {"op": "create_queue", "params": {"QueueName": name}}
    qurl = ok(run_calls(old_python, url, key, secret, [create])[0])["QueueUrl"]
    calls: list[dict[str, Any]] = [
        {"op": "send_message_batch",
         "params": {"QueueUrl": qurl,
                    "Entries": [{"Id": f"e{i}", "MessageBody": "x"} for i in range(11)]}},
        {"op": "send_message_batch",
         "params": {"QueueUrl": qurl, "Entries": [{"Id": "same", "MessageBody": "x"},
                                                  {"Id": "same", "MessageBody": "y"}]}},
        {"op": "set_queue_attributes",
         "params": {"QueueUrl": qurl, "Attributes": {"VisibilityTimeout": "not-a-number"}}},
        {"op": "delete_message", "params": {"QueueUrl": qurl, "ReceiptHandle": "bogus"}},
        {"op": "send_message_batch",
         "params": {"QueueUrl": qurl, "Entries": [
             {"Id": "fine", "MessageBody": "x"},
             {"Id": "big", "MessageBody": "x" * (256 * 1024 + 1)}]}},
    ]  # fmt: skip
    too_many, not_distinct, bad_value, bad_handle, too_big = run_calls(
        old_python, url, key, secret, calls
    )
    assert error_response(too_many)["Code"] == (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    )
    assert error_response(not_distinct)["Code"] == (
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    )
    assert error_response(bad_value)["Code"] == "InvalidAttributeValue"
    assert error_response(bad_handle)["Code"] == "ReceiptHandleIsInvalid"
    # One entry bigger than the queue's MaximumMessageSize: that entry fails, the other is sent
    # (a BatchResultErrorEntry in the XML answer).
    result = ok(too_big)
    assert [e["Id"] for e in result["Successful"]] == ["fine"]
    (failed,) = result["Failed"]
    assert failed["Id"] == "big" and failed["SenderFault"] is True, failed
    assert failed["Code"] == "InvalidParameterValue" and "shorter than" in failed["Message"]
    # And a request whose signature does not match (a wrong secret): refused in XML too.
    denied = run_calls(old_python, url, key, secret + "x",
                       [{"op": "get_queue_url", "params": {"QueueName": name}}])[0]  # fmt: skip
    if os.environ.get("RAFTQ_SQS_TARGET") != "moto":  # moto checks no signature
        fields = error_response(denied)
        assert fields["Code"] == "SignatureDoesNotMatch" and denied["error"]["status"] == 403
