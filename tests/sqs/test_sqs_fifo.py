"""FIFO queues, tags, SQS-only attributes and message move tasks: what needs the state
machine's ordering keys (ordered groups) and topic labels."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.sqs.conftest import SqsCluster

pytestmark = pytest.mark.slow


def code(e: pytest.ExceptionInfo[ClientError]) -> str:
    c: str = e.value.response["Error"]["Code"]
    return c


def bodies(res: dict[str, Any]) -> list[str]:
    return [m["Body"] for m in res.get("Messages", [])]


def test_a_group_is_delivered_in_order_one_in_flight_at_a_time(
    sqs_cluster: SqsCluster, qname: str
) -> None:
    sqs = sqs_cluster.client(sqs_cluster.followers()[0])
    name = qname + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["FifoQueue"] == "true" and attrs["ContentBasedDeduplication"] == "false"
    seqs = []
    for body, group in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A")):
        res = sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group,
                               MessageDeduplicationId=body)  # fmt: skip
        seqs.append(int(res["SequenceNumber"]))
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, AttributeNames=["All"])
    assert bodies(first) == ["a1"]
    assert first["Messages"][0]["Attributes"]["MessageGroupId"] == "A"
    # a1 in flight: group A waits; B goes on.
    assert bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == ["b1"]
    assert bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == []
    # a1 failed (visible again): it comes again before a2.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["Messages"][0]["ReceiptHandle"],
                                  VisibilityTimeout=0)  # fmt: skip
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, AttributeNames=["All"])
    assert bodies(again) == ["a1"]
    assert again["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "2"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["Messages"][0]["ReceiptHandle"])
    # Done with a1: the rest of A, in order, in one receive.
    assert bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == ["a2", "a3"]


def test_deduplication_by_id_or_by_content(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client()
    url = sqs.create_queue(QueueName=qname + ".fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]  # fmt: skip
    one = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    two = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    three = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g",
                             MessageDeduplicationId="other")  # fmt: skip
    assert one["MessageId"] == two["MessageId"] != three["MessageId"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
    assert bodies(got) == ["same", "same"]
    assert got["Messages"][1]["Attributes"]["MessageDeduplicationId"] == "other"
    plain = sqs.create_queue(QueueName=qname + "-x.fifo", Attributes={"FifoQueue": "true"})
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=plain["QueueUrl"], MessageBody="m", MessageGroupId="g")
    assert code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="m")
    assert code(e) == "MissingParameter"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="m", MessageGroupId="g", DelaySeconds=1)
    assert code(e) == "InvalidParameterValue"


def test_tags_and_sqs_only_attributes(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client(sqs_cluster.followers()[0])
    url = sqs.create_queue(QueueName=qname, tags={"team": "billing"}, Attributes={
        "DelaySeconds": "1", "ReceiveMessageWaitTimeSeconds": "2"})["QueueUrl"]  # fmt: skip
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "dev", "team": "ops"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "ops", "env": "dev"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "dev"}
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["DelaySeconds"] == "1" and attrs["ReceiveMessageWaitTimeSeconds"] == "2"
    # The queue's DelaySeconds holds a message back; its wait time makes a receive long-poll.
    sent = time.monotonic()
    sqs.send_message(QueueUrl=url, MessageBody="later")
    got = sqs.receive_message(QueueUrl=url)
    assert bodies(got) == ["later"] and time.monotonic() - sent >= 0.9
    policy = json.dumps({"redrivePermission": "allowAll"})
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedriveAllowPolicy": policy,
                                                       "DelaySeconds": "0"})  # fmt: skip
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["RedriveAllowPolicy"] == policy and attrs["DelaySeconds"] == "0"
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "dev"}  # (tags kept)


def test_a_move_task_sends_dead_letters_back(sqs_cluster: SqsCluster, qname: str) -> None:
    sqs = sqs_cluster.client(sqs_cluster.followers()[0])
    dlq = sqs.create_queue(QueueName=qname + "-dlq")["QueueUrl"]
    dlq_arn = f"arn:aws:sqs:us-east-1:000000000000:{qname}-dlq"
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    url = sqs.create_queue(QueueName=qname, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    mid = sqs.send_message(QueueUrl=url, MessageBody="poison")["MessageId"]
    m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                  VisibilityTimeout=0)  # fmt: skip
    attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "1"
    task = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert tasks[0]["TaskHandle"] == task and tasks[0]["Status"] == "COMPLETED"
    assert tasks[0]["ApproximateNumberOfMessagesMoved"] == 1
    back = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert [b["Body"] for b in back] == ["poison"] and back[0]["MessageId"] == mid
    with pytest.raises(ClientError) as e:
        sqs.start_message_move_task(SourceArn=dlq_arn, DestinationArn=dlq_arn + "-other")
    assert code(e) in ("AWS.SimpleQueueService.UnsupportedOperation",)
