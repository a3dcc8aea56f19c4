"""The SQS endpoint through boto3 with the current botocore (AWS JSON 1.0 protocol) against a
real 3-node cluster: queue lifecycle, attributes, batches, visibility, redelivery, dead letters
and their move back, error codes, rights. Requests go to followers too (they forward)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from raftq.node.sqs.message import md5_attributes
from tests.sqs.conftest import SqsCluster
from tests.support import wait_for

pytestmark = pytest.mark.slow


def code(e: pytest.ExceptionInfo[ClientError]) -> str:
    c: str = e.value.response["Error"]["Code"]
    return c


def follower(c: SqsCluster) -> str:
    return c.followers()[0]


def test_queue_lifecycle_through_a_follower(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client(follower(sqs_cluster))
    url = sqs.create_queue(QueueName=qname, Attributes={"VisibilityTimeout": "7"})["QueueUrl"]
    assert url == f"{sqs_cluster.sqs_url(follower(sqs_cluster))}/000000000000/{qname}"
    # Creating it again with the same attributes answers the same URL; other values refuse.
    assert (
        sqs.create_queue(QueueName=qname, Attributes={"VisibilityTimeout": "7"})["QueueUrl"] == url
    )
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=qname, Attributes={"VisibilityTimeout": "8"})
    assert code(e) == "QueueAlreadyExists"
    assert sqs.get_queue_url(QueueName=qname)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=qname)["QueueUrls"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "7"
    assert attrs["QueueArn"] == f"arn:aws:sqs:us-east-1:000000000000:{qname}"
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert "RedrivePolicy" not in attrs
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={"VisibilityTimeout": "0", "MessageRetentionPeriod": "3600",
                    "MaximumMessageSize": "2048"},
    )  # fmt: skip
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout", "MessageRetentionPeriod",
                                      "MaximumMessageSize"],
    )["Attributes"]  # fmt: skip
    assert attrs == {"VisibilityTimeout": "0", "MessageRetentionPeriod": "3600",
                     "MaximumMessageSize": "2048"}  # fmt: skip
    sqs.purge_queue(QueueUrl=url)
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as e:
        sqs.get_queue_url(QueueName=qname)
    assert code(e) == "AWS.SimpleQueueService.NonExistentQueue"
    assert e.value.response["Error"]["QueryErrorCode"] == "QueueDoesNotExist"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x")
    assert code(e) == "AWS.SimpleQueueService.NonExistentQueue"


def test_list_queues_pages_with_next_token(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client()
    names = [f"{qname}-{i}" for i in range(5)]
    for n in names:
        sqs.create_queue(QueueName=n)
    seen: list[str] = []
    kwargs: dict[str, Any] = {"QueueNamePrefix": qname, "MaxResults": 2}
    pages = 0
    while True:
        page = sqs.list_queues(**kwargs)
        pages += 1
        seen += [u.rsplit("/", 1)[1] for u in page.get("QueueUrls", [])]
        if "NextToken" not in page:
            break
        kwargs["NextToken"] = page["NextToken"]
    assert seen == names and pages == 3


def test_send_receive_delete_with_attributes_and_md5s(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client(follower(sqs_cluster))
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    attrs: dict[str, dict[str, Any]] = {
        "s": {"DataType": "String", "StringValue": "héllo"},
        "n": {"DataType": "Number", "StringValue": "12.5"},
        "b": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
        "c": {"DataType": "String.custom", "StringValue": "x"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="body <&> ünïcode", MessageAttributes=attrs)
    assert sent["MD5OfMessageBody"] == hashlib.md5("body <&> ünïcode".encode()).hexdigest()
    got = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5,
        AttributeNames=["All"], MessageAttributeNames=["All"],
    )["Messages"]  # fmt: skip
    assert len(got) == 1
    m = got[0]
    assert m["MessageId"] == sent["MessageId"] and m["Body"] == "body <&> ünïcode"
    assert m["MessageAttributes"] == attrs
    assert m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    as_text = {k: {**v, "BinaryValue": base64.b64encode(v["BinaryValue"]).decode()}
               if "BinaryValue" in v else v for k, v in attrs.items()}  # fmt: skip
    assert m["MD5OfMessageAttributes"] == md5_attributes(as_text)  # (test_sqs_wire: AWS's vectors)
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(m["Attributes"]["SentTimestamp"]) - time.time() * 1000) < 60_000
    # Only the attributes asked for, and the digest of those.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                  VisibilityTimeout=0)  # fmt: skip
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, MessageAttributeNames=["s"])
    m2 = again["Messages"][0]
    assert m2["MessageAttributes"] == {"s": attrs["s"]} and "Attributes" not in m2
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)


def test_batches_limits_and_per_entry_failures(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client()
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(11)]
        )
    assert code(e) == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "m"}] * 2)
    assert code(e) == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[])
    assert code(e) == "AWS.SimpleQueueService.EmptyBatchRequest"
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a b", "MessageBody": "m"}])
    assert code(e) == "AWS.SimpleQueueService.InvalidBatchEntryId"
    big = "x" * 200_000
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": big} for i in range(6)]
        )
    assert code(e) == "AWS.SimpleQueueService.BatchRequestTooLong"
    # message attributes count toward the batch's size too (bodies alone are under it here)
    attr = {"a": {"DataType": "String", "StringValue": "v" * 4000}}
    near = [{"Id": str(i), "MessageBody": "x" * 260_000, "MessageAttributes": attr}
            for i in range(4)]  # fmt: skip
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=near)
    assert code(e) == "AWS.SimpleQueueService.BatchRequestTooLong"
    res = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok1", "MessageBody": "one"},
            {"Id": "bad", "MessageBody": "two", "DelaySeconds": 901},
            {"Id": "big", "MessageBody": "y" * 262_145},
            {"Id": "ok2", "MessageBody": "three"},
        ],
    )
    assert [s["Id"] for s in res["Successful"]] == ["ok1", "ok2"]
    failed = {f["Id"]: f for f in res["Failed"]}
    assert set(failed) == {"bad", "big"}
    assert all(f["SenderFault"] and f["Code"] == "InvalidParameterValue" for f in failed.values())
    msgs: list[dict[str, Any]] = []

    def both() -> bool:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        msgs.extend(got.get("Messages", []))
        return len(msgs) >= 2

    wait_for("both messages", both, 20)
    assert sorted(m["Body"] for m in msgs) == ["one", "three"]
    out = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "a", "ReceiptHandle": msgs[0]["ReceiptHandle"]},
                 {"Id": "b", "ReceiptHandle": msgs[1]["ReceiptHandle"]},
                 {"Id": "c", "ReceiptHandle": "not-a-receipt"}],
    )  # fmt: skip
    assert sorted(s["Id"] for s in out["Successful"]) == ["a", "b"]
    assert [(f["Id"], f["Code"]) for f in out["Failed"]] == [("c", "ReceiptHandleIsInvalid")]


def test_visibility_zero_redelivers_now_with_the_same_message_id(
    sqs_cluster: SqsCluster, qname: str
) -> None:
    sqs = sqs_cluster.client(follower(sqs_cluster))
    url = sqs.create_queue(QueueName=qname, Attributes={"VisibilityTimeout": "600"})["QueueUrl"]
    mid = sqs.send_message(QueueUrl=url, MessageBody="again")["MessageId"]
    first = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"])
    m1 = first["Messages"][0]
    # Invisible for its 600 s: nothing now.
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    res = sqs.change_message_visibility_batch(
        QueueUrl=url, Entries=[{"Id": "x", "ReceiptHandle": m1["ReceiptHandle"],
                                "VisibilityTimeout": 0}],
    )  # fmt: skip
    assert [s["Id"] for s in res["Successful"]] == ["x"]
    m2 = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"])["Messages"][0]
    assert m2["MessageId"] == m1["MessageId"] == mid
    assert m2["Attributes"]["ApproximateReceiveCount"] == "2"
    assert m2["ReceiptHandle"] != m1["ReceiptHandle"]
    # The first receipt is stale: changing its visibility fails as SQS says; deleting with it
    # succeeds and changes nothing (SQS's documented rule).
    with pytest.raises(ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
                                      VisibilityTimeout=5)  # fmt: skip
    assert code(e) == "AWS.SimpleQueueService.MessageNotInflight"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"
    # A receive's own VisibilityTimeout: 1 s, then it comes back by itself (count 3).
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"],
                                  VisibilityTimeout=1)  # fmt: skip
    m3 = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10, AttributeNames=["All"])["Messages"][
        0
    ]
    assert m3["Attributes"]["ApproximateReceiveCount"] == "3"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m3["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
    assert attrs["ApproximateNumberOfMessages"] == "0"


def test_redrive_policy_dead_letters_after_max_receive_count_and_moves_back(
    sqs_cluster: SqsCluster, qname: str
) -> None:
    sqs = sqs_cluster.client(follower(sqs_cluster))
    dlq = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName=qname, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    got = json.loads(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"][
            "RedrivePolicy"
        ]
    )
    assert got == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    mid = sqs.send_message(QueueUrl=url, MessageBody="poison")["MessageId"]
    for count in (1, 2):
        m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"])[
            "Messages"
        ][0]
        assert m["Attributes"]["ApproximateReceiveCount"] == str(count)
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                      VisibilityTimeout=0)  # fmt: skip
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    dead = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=5, AttributeNames=["All"])["Messages"]
    assert [d["Body"] for d in dead] == ["poison"]
    assert dead[0]["MessageId"] == mid  # (SQS keeps the id in the dead-letter queue)
    assert dead[0]["Attributes"]["DeadLetterQueueSourceArn"].endswith(":" + qname)
    sqs.change_message_visibility(QueueUrl=dlq, ReceiptHandle=dead[0]["ReceiptHandle"],
                                  VisibilityTimeout=0)  # fmt: skip
    # Removing the policy: no more dead-lettering.
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in attrs
    with pytest.raises(ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn + "-nope", "maxReceiveCount": 2})})  # fmt: skip
    assert code(e) == "InvalidParameterValue"


def test_errors_are_sqs_codes(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client()
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Nope"]),
         "InvalidAttributeName"),
        (lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"Nope": "1"}),
         "InvalidAttributeName"),
        (lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "-1"}),
         "InvalidAttributeValue"),
        (lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11),
         "InvalidParameterValue"),
        (lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=21), "InvalidParameterValue"),
        (lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="x"), "ReceiptHandleIsInvalid"),
        (lambda: sqs.change_message_visibility(QueueUrl=url, VisibilityTimeout=1,
                                               ReceiptHandle=f"{qname}:default:0:1:00"),
         "AWS.SimpleQueueService.MessageNotInflight"),
        (lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="other:default:0:1:00"),
         "ReceiptHandleIsInvalid"),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="a\x00b"), "InvalidMessageContents"),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="m", MessageAttributes={
            "x": {"DataType": "Strange", "StringValue": "v"}}), "InvalidParameterValue"),
        (lambda: sqs.create_queue(QueueName="bad name"), "InvalidParameterValue"),
        (lambda: sqs.create_queue(QueueName=qname + "-x.fifo"), "InvalidParameterValue"),
        (lambda: sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["1"],
                                    Actions=["SendMessage"]),
         "AWS.SimpleQueueService.UnsupportedOperation"),
    ]  # fmt: skip
    for call, expected in cases:
        with pytest.raises(ClientError) as e:
            call()
        assert code(e) == expected, e.value.response["Error"]


def test_rights_map_to_sqs_actions(sqs_cluster: SqsCluster, qname: str) -> None:
    admin = sqs_cluster.client()
    url = admin.create_queue(QueueName=qname)["QueueUrl"]
    _, pub = sqs_cluster.new_token([{"topics": qname, "actions": ["publish"]}])
    _, con = sqs_cluster.new_token([{"topics": qname, "actions": ["consume"]}])
    producer = sqs_cluster.client(follower(sqs_cluster), pub)
    consumer = sqs_cluster.client(follower(sqs_cluster), con)
    producer.send_message(QueueUrl=url, MessageBody="m")
    with pytest.raises(ClientError) as e:
        producer.receive_message(QueueUrl=url)
    assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        consumer.send_message(QueueUrl=url, MessageBody="m")
    assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        consumer.purge_queue(QueueUrl=url)
    assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        consumer.create_queue(QueueName=qname + "-new")
    assert code(e) == "AccessDenied"
    # (an existing queue: CreateQueue answers its URL to any right on it, as kombu needs)
    assert consumer.create_queue(QueueName=qname)["QueueUrl"].endswith(qname)
    m = consumer.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    consumer.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert qname not in json.dumps(producer.list_queues(QueueNamePrefix="zz-none"))
    listed = consumer.list_queues().get("QueueUrls", [])
    assert listed == [url.replace(sqs_cluster.sqs_url(sqs_cluster.leader() or "n1"),
                                  sqs_cluster.sqs_url(follower(sqs_cluster)))]  # fmt: skip
