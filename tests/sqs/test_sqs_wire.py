"""The SQS endpoint in process (no cluster): arbitrary JSON and form input to every action
answers an SQS-shaped 4xx or success, never a 500; the query protocol's flattened names decode
as the JSON protocol's members; MD5s of message attributes follow AWS's published example."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftq.node.local import LocalRaft
from raftq.node.sqs import message, wire
from raftq.node.sqs.actions import ACTIONS
from raftq.node.sqs.listener import build_sqs_app
from tests.node.inprocess import app

scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(1 << 40), max_value=1 << 40)
    | st.text(max_size=12) | st.sampled_from(["q", "http://h/000000000000/q", "All", "0", "10"])
)  # fmt: skip
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["Id", "MessageBody", "DataType", "StringValue", "ReceiptHandle",
                         "VisibilityTimeout", "BinaryValue", "x"]), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
FIELDS = ["QueueUrl", "QueueName", "MessageBody", "Entries", "Attributes", "AttributeNames",
          "MessageAttributes", "MessageAttributeNames", "MaxNumberOfMessages", "WaitTimeSeconds",
          "VisibilityTimeout", "ReceiptHandle", "DelaySeconds", "Tags", "tags", "TagKeys",
          "MessageGroupId", "MessageDeduplicationId", "SourceArn", "DestinationArn",
          "MaxResults", "NextToken", "QueueNamePrefix"]  # fmt: skip
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=5)


async def _client() -> TestClient[Any, Any]:
    raft = LocalRaft()
    client = TestClient(TestServer(app(raft, auth=False)))
    await client.start_server()
    r = await client.post(
        "/sqs",
        data=json.dumps({"QueueName": "q"}),
        headers={"X-Amz-Target": "AmazonSQS.CreateQueue", "Content-Type": wire.JSON_CONTENT_TYPE},
    )
    assert r.status == 200, await r.text()
    return client


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(action=st.sampled_from(sorted(ACTIONS)), body=bodies)
async def test_any_json_input_answers_an_sqs_error_or_success(action: str, body: Any) -> None:
    client = await _client()
    try:
        if action == "ReceiveMessage":
            body["WaitTimeSeconds"] = 0
        r = await client.post("/sqs", data=json.dumps(body), headers={
            "X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": wire.JSON_CONTENT_TYPE,
            "x-amzn-query-mode": "true"})  # fmt: skip
        text = await r.text()
        assert r.status < 500, text
        if r.status >= 400:
            assert json.loads(text)["__type"].startswith("com.amazonaws.sqs#")
            assert ";Sender" in r.headers["x-amzn-query-error"]
    finally:
        await client.close()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    action=st.sampled_from(sorted(ACTIONS)),
    pairs=st.lists(st.tuples(
        st.sampled_from(["QueueUrl", "Attribute.1.Name", "Attribute.1.Value", "Attribute.x",
                         "MessageBody", "SendMessageBatchRequestEntry.1.Id",
                         "SendMessageBatchRequestEntry.1.MessageBody", "AttributeName.1",
                         "MessageAttribute.1.Name", "MessageAttribute.1.Value.DataType",
                         "MessageAttribute.1.Value.StringValue", "Tag.1.Key", "Tag.0.Value",
                         "MaxNumberOfMessages", "QueueName", "Entries"]),
        st.text(max_size=8) | st.sampled_from(["q", "All", "String", "1"])), max_size=6),
)  # fmt: skip
async def test_any_form_input_answers_xml(action: str, pairs: list[tuple[str, str]]) -> None:
    client = await _client()
    try:
        form = urllib.parse.urlencode([("Action", action), *pairs])
        r = await client.post("/sqs", data=form, headers={
            "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        text = await r.text()
        assert r.status < 500, text
        assert text.startswith('<?xml version="1.0"?>')
        if r.status >= 400:
            assert "<ErrorResponse" in text and "<Type>Sender</Type>" in text
    finally:
        await client.close()


def test_query_names_decode_as_json_members() -> None:
    call = wire.decode_query([
        ("Action", "SendMessageBatch"), ("Version", "2012-11-05"), ("QueueUrl", "u"),
        ("SendMessageBatchRequestEntry.2.Id", "b"),
        ("SendMessageBatchRequestEntry.2.MessageBody", "two"),
        ("SendMessageBatchRequestEntry.1.Id", "a"),
        ("SendMessageBatchRequestEntry.1.MessageBody", "one"),
        ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Name", "k"),
        ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType", "String"),
        ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue", "v"),
        ("SendMessageBatchRequestEntry.10.Id", "c"),
    ])  # fmt: skip
    assert call.action == "SendMessageBatch" and call.protocol == "query"
    assert call.params == {"QueueUrl": "u", "Entries": [
        {"Id": "a", "MessageBody": "one",
         "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
        {"Id": "b", "MessageBody": "two"}, {"Id": "c"}]}  # fmt: skip
    tags = wire.decode_query(
        [
            ("Action", "CreateQueue"),
            ("Tag.1.Key", "t"),
            ("Tag.1.Value", "v"),
            ("Attribute.1.Name", "DelaySeconds"),
            ("Attribute.1.Value", "3"),
        ]
    )
    assert tags.params == {"tags": {"t": "v"}, "Attributes": {"DelaySeconds": "3"}}
    with pytest.raises(wire.SqsError):
        wire.decode_query([("Action", "X"), ("AttributeName.0", "a")])


def test_message_attribute_md5_matches_published_vectors() -> None:
    # Values published by independent SQS implementations and SDK tests.
    vectors = [
        ({"SellerName": {"DataType": "String", "StringValue": "Example Store"}},
         "cd28f3b68aeee4b2eac9c66f2f694b58"),
        ({"timestamp": {"DataType": "Number", "StringValue": "1493147359900"}},
         "235c5c510d26fb653d073faed50ae77c"),
        ({"ordinal": {"DataType": "Number", "StringValue": "1"},
          "category": {"DataType": "String", "StringValue": "test"}},
         "d21ae90c49061e927f57df5f5d72be1f"),
    ]  # fmt: skip
    for attrs, digest in vectors:
        assert message.md5_attributes(attrs) == digest
    assert message.md5_body("hello") == "5d41402abc4b2a76b9719d911017c592"


async def test_a_query_request_sent_to_a_queue_url_names_that_queue() -> None:
    """kombu posts a queue's actions to the queue's URL, without a QueueUrl parameter."""
    api = app(LocalRaft(), auth=False)
    async with TestClient(TestServer(api)) as client:
        r = await client.post(
            "/sqs",
            data=json.dumps({"QueueName": "q"}),
            headers={
                "X-Amz-Target": "AmazonSQS.CreateQueue",
                "Content-Type": wire.JSON_CONTENT_TYPE,
            },
        )
        assert r.status == 200
        async with TestClient(TestServer(build_sqs_app(api))) as sqs:
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            r = await sqs.post("/000000000000/q", data="Action=SendMessage&MessageBody=hi",
                               headers=form)  # fmt: skip
            assert r.status == 200, await r.text()
            r = await sqs.post("/000000000000/q", data="Action=ReceiveMessage", headers=form)
            assert "<Body>hi</Body>" in await r.text()
            r = await sqs.post("/", data="Action=ReceiveMessage", headers=form)
            assert r.status == 400 and "<Code>MissingParameter</Code>" in await r.text()
