"""The query protocol (form-encoded requests, XML answers), as older botocore releases and
kombu's async client speak it: the current botocore driven with the SQS model of botocore
1.33 (the last to use the query protocol), fetched once with pip into pytest's cache. Skipped
with the reason when pip cannot fetch it (no network)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.sqs.conftest import SqsCluster

pytestmark = pytest.mark.slow
QUERY_BOTOCORE = "botocore==1.33.13"
MODEL = "botocore/data/sqs/2012-11-05/service-2.json.gz"


@pytest.fixture(scope="module")
def query_models(request: pytest.FixtureRequest) -> Path:
    """A botocore data directory holding the query-protocol SQS model."""
    root = Path(request.config.cache.mkdir("sqs-query-model"))
    target = root / "sqs" / "2012-11-05" / "service-2.json.gz"
    if not target.exists():
        wheels = root / "wheels"
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
             QUERY_BOTOCORE],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        found = sorted(wheels.glob("botocore-*.whl")) if r.returncode == 0 else []
        if not found:
            pytest.skip(f"pip could not fetch {QUERY_BOTOCORE}: {r.stderr.strip()[-300:]}")
        with zipfile.ZipFile(found[0]) as z:
            data = z.read(MODEL)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    assert json.loads(gzip.decompress(target.read_bytes()))["metadata"]["protocol"] == "query"
    return root


def query_client(c: SqsCluster, nid: str, models: Path) -> Any:
    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.insert(0, str(models))
    creds = c.credentials()
    client = boto3.session.Session(botocore_session=session).client(
        "sqs", endpoint_url=c.sqs_url(nid), region_name="us-east-1",
        aws_access_key_id=creds["access_key_id"],
        aws_secret_access_key=creds["secret_access_key"],
        config=Config(retries={"max_attempts": 2, "mode": "standard"}),
    )  # fmt: skip
    assert client.meta.service_model.protocol == "query"
    return client


def test_core_actions_over_the_query_protocol(
    sqs_cluster: SqsCluster, query_models: Path, qname: str
) -> None:
    sqs = query_client(sqs_cluster, sqs_cluster.followers()[0], query_models)
    url = sqs.create_queue(QueueName=qname, Attributes={"VisibilityTimeout": "9"})["QueueUrl"]
    assert url.endswith(f"/000000000000/{qname}")
    assert sqs.get_queue_url(QueueName=qname)["QueueUrl"] == url
    assert sqs.list_queues(QueueNamePrefix=qname)["QueueUrls"] == [url]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "9"
    body = 'xml <&"> text\r\nline two'
    mattrs = {"k": {"DataType": "String", "StringValue": "v<"},
              "b": {"DataType": "Binary", "BinaryValue": b"\x01\x02"}}  # fmt: skip
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=mattrs)
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "a", "MessageBody": "two"},
                 {"Id": "b", "MessageBody": "x", "DelaySeconds": 999}],
    )  # fmt: skip
    assert [s["Id"] for s in batch["Successful"]] == ["a"]
    assert [(f["Id"], f["Code"]) for f in batch["Failed"]] == [("b", "InvalidParameterValue")]
    got: list[dict[str, Any]] = []
    for _ in range(10):
        got += sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2,
            AttributeNames=["All"], MessageAttributeNames=["All"],
        ).get("Messages", [])  # fmt: skip
        if len(got) >= 2:
            break
    by_body = {m["Body"]: m for m in got}
    assert set(by_body) == {body, "two"}  # (the CR survives the XML)
    first = by_body[body]
    assert first["MessageId"] == sent["MessageId"]
    assert first["MessageAttributes"] == mattrs
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    res = sqs.change_message_visibility_batch(
        QueueUrl=url, Entries=[{"Id": "1", "ReceiptHandle": first["ReceiptHandle"],
                                "VisibilityTimeout": 0}],
    )  # fmt: skip
    assert [s["Id"] for s in res["Successful"]] == ["1"]
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"])
    assert again["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "2"
    out = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "x", "ReceiptHandle": again["Messages"][0]["ReceiptHandle"]},
                 {"Id": "y", "ReceiptHandle": by_body["two"]["ReceiptHandle"]},
                 {"Id": "z", "ReceiptHandle": "junk"}],
    )  # fmt: skip
    assert sorted(s["Id"] for s in out["Successful"]) == ["x", "y"]
    assert [(f["Id"], f["Code"]) for f in out["Failed"]] == [("z", "ReceiptHandleIsInvalid")]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "3"})
    sqs.purge_queue(QueueUrl=url)
    sqs.delete_queue(QueueUrl=url)


def test_errors_come_as_xml_error_responses(
    sqs_cluster: SqsCluster, query_models: Path, qname: str
) -> None:
    sqs = query_client(sqs_cluster, sqs_cluster.followers()[0], query_models)
    with pytest.raises(ClientError) as e:
        sqs.get_queue_url(QueueName=qname)
    err = e.value.response["Error"]
    assert err["Code"] == "AWS.SimpleQueueService.NonExistentQueue" and err["Type"] == "Sender"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    url = sqs.create_queue(QueueName=qname)["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Bogus"])
    assert e.value.response["Error"]["Code"] == "InvalidAttributeName"
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[])
    assert e.value.response["Error"]["Code"] == "AWS.SimpleQueueService.EmptyBatchRequest"
