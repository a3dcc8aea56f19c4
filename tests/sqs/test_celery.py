"""A real Celery worker (kombu's SQS transport, prefork pool, its event loop and async SQS
client) working through raftq's SQS endpoint while the Raft leader is killed.

The producer (this process) sends 1,200 tasks through a follower's SQS listener; once a quarter
of them have run, the leader gets SIGKILL. Every task records its number in a file each time it
runs: at the end every number must be there (none lost); a number there twice is a duplicate
(at-least-once delivery allows them: a delete that never reached the dead leader, a send
retried after its answer was lost), counted and printed. Worker and producer talk to one node,
as through a load balancer that never sends them to the dead one. ``RAFTQ_SQS_TARGET=moto``
runs the same harness against moto_server (``moto[server]``, no leader to kill), for reference.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("celery", reason="celery is in the dev extra")
pytest.importorskip("boto3", reason="boto3 is in the dev extra")

from tests.sqs.celery_app import TASK, make_app
from tests.sqs.conftest import SqsCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TASKS = 1200
KILL_AFTER = TASKS // 4
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Endpoint:
    url: str
    key: str
    secret: str
    kill_leader: Callable[[], str] | None  # None: an emulator with no leader to kill


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    if os.environ.get("RAFTQ_SQS_TARGET") == "moto":  # the harness's reference run
        from tests.sqs.moto_server import KEY, SECRET, MotoServer

        moto = MotoServer(tmp_path / "moto.log").start()
        try:
            yield Endpoint(moto.url, KEY, SECRET, None)
        finally:
            moto.stop()
        return
    cluster = SqsCluster(tmp_path, 3)
    try:
        cluster.start()
        follower = cluster.followers()[0]
        creds = cluster.credentials()
        key, secret = creds["access_key_id"], creds["secret_access_key"]

        def kill_leader() -> str:
            lid = cluster.wait_leader()
            assert lid != follower
            cluster.kill(lid)
            return lid

        yield Endpoint(cluster.sqs_url(follower), key, secret, kill_leader)
    finally:
        cluster.close()


def broker_url(ep: Endpoint) -> str:
    host = urllib.parse.urlsplit(ep.url).netloc
    q = urllib.parse.quote
    return f"sqs://{q(ep.key, safe='')}:{q(ep.secret, safe='')}@{host}"


def recorded(path: Path) -> collections.Counter[int]:
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return collections.Counter()
    return collections.Counter(int(x) for x in lines[:-1])  # the last line may be half-written


def wait(what: str, cond: Callable[[], bool], timeout: float, worker: subprocess.Popen[bytes],
         log: Path) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout
    while not cond():
        if worker.poll() is not None:
            raise AssertionError(f"the worker exited ({worker.returncode}):\n{tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tail(log)}")
        time.sleep(0.1)


def tail(log: Path, n: int = 60) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def start_worker(ep: Endpoint, queue: str, record: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAFTQ_CELERY_BROKER": broker_url(ep), "RAFTQ_CELERY_QUEUE": queue,
           "RAFTQ_CELERY_RECORD": str(record), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    # The worker's AWS credentials come from the broker URL only, never from the user's files.
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.sqs.celery_app", "worker",
             "--pool", "prefork", "--concurrency", "2", "--queues", queue, "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is not None:
        return
    os.killpg(worker.pid, signal.SIGTERM)  # warm shutdown
    try:
        worker.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)


class Producer(threading.Thread):
    """Sends tasks 0..n-1 in order; a send that fails after botocore's own retries is sent again
    (so a task whose answer was lost may be sent twice) until ``deadline``."""

    def __init__(self, ep: Endpoint, queue: str, n: int, deadline: float) -> None:
        super().__init__(daemon=True)
        self.app = make_app(broker_url(ep), queue)
        self.queue, self.n, self.deadline = queue, n, deadline
        self.sent = 0
        self.resent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.app.producer_or_acquire() as producer:
                for i in range(self.n):
                    while True:
                        try:
                            self.app.send_task(TASK, args=[i], queue=self.queue, producer=producer)
                            break
                        except Exception:
                            if time.monotonic() > self.deadline:
                                raise
                            self.resent += 1
                            time.sleep(0.2)
                    self.sent = i + 1
        except BaseException as e:
            self.error = e


def test_celery_worker_runs_every_task_while_the_leader_is_killed(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    queue = f"celery-{uuid.uuid4().hex[:12]}"
    record, log = tmp_path / "ran.txt", tmp_path / "worker.log"
    t0 = time.monotonic()
    producer = Producer(endpoint, queue, TASKS, deadline=t0 + 60)
    worker = start_worker(endpoint, queue, record, log)
    try:
        producer.start()
        wait(f"{KILL_AFTER} tasks to run", lambda: len(recorded(record)) >= KILL_AFTER, 40,
             worker, log)  # fmt: skip
        killed = endpoint.kill_leader() if endpoint.kill_leader else None
        producing_at_kill = producer.sent < TASKS
        producer.join(max(1.0, t0 + 65 - time.monotonic()))
        assert not producer.is_alive(), f"the producer hung at task {producer.sent}"
        assert producer.error is None, f"the producer gave up: {producer.error!r}"
        wait(
            f"all {TASKS} tasks to run",
            lambda: len(recorded(record)) >= TASKS,
            max(20.0, t0 + 85 - time.monotonic()),
            worker,
            log,
        )
    finally:
        stop_worker(worker)
    ran = recorded(record)
    assert set(ran) == set(range(TASKS))
    dups = sum(c - 1 for c in ran.values())
    print(
        f"\n{TASKS} tasks ran; leader {killed} killed after {KILL_AFTER} had run "
        f"(producer still sending: {producing_at_kill}); duplicates: {dups} "
        f"({sum(1 for c in ran.values() if c > 1)} tasks ran more than once); "
        f"sends retried by the producer: {producer.resent}; {time.monotonic() - t0:.1f} s"
    )


def test_a_receive_that_no_leader_answers_is_empty_not_a_5xx(tmp_path: Path) -> None:
    """What keeps Celery polling through an election: kombu's async client stops polling a
    queue for good after a 5xx answer to ReceiveMessage, so a follower that cannot reach a
    leader answers a receive, once its long poll's time is up, with no messages."""
    from botocore.exceptions import ClientError

    cluster = SqsCluster(tmp_path, 3)
    try:
        cluster.start()
        survivor = cluster.followers()[0]
        sqs = cluster.client(survivor, max_attempts=1)
        url = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:10]}")["QueueUrl"]
        for nid in list(cluster.nodes):
            if nid != survivor:
                cluster.kill(nid)  # no quorum: no leader until they come back
        t = time.monotonic()
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, MaxNumberOfMessages=10)
        assert "Messages" not in got
        assert 1.5 <= time.monotonic() - t < 15  # it waited for a leader, as a long poll
        with pytest.raises(ClientError) as e:  # anything else says it could not be done
            sqs.send_message(QueueUrl=url, MessageBody="x")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    finally:
        cluster.close()
