"""The Celery application of tests/sqs/test_celery.py: one task that records that it ran.

The test imports ``make_app`` to produce; the worker process it starts runs
``celery -A tests.sqs.celery_app worker``, which builds the same app from the environment:
``RAFTQ_CELERY_BROKER`` (``sqs://KEY:SECRET@host:port``), ``RAFTQ_CELERY_QUEUE`` and
``RAFTQ_CELERY_RECORD`` (the file each run of the task appends its task number to).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

TASK = "tests.sqs.celery_app.record"


def transport_options(region: str = "us-east-1") -> dict[str, Any]:
    return {
        "region": region,
        "is_secure": False,  # the endpoint is plain HTTP on loopback
        # Short enough that a message received from a killed leader (whose delete never
        # landed) comes back within the test; long enough that none expires while queued in
        # the worker (tasks take microseconds).
        "visibility_timeout": 10,
        "wait_time_seconds": 2,  # long polls, as production workers run
        "polling_interval": 0.1,
        # botocore retries 5xx and connection errors itself (as against AWS during an outage).
        "client-config": {
            "retries": {"mode": "standard", "max_attempts": 8},
            "connect_timeout": 2,
            "read_timeout": 15,
        },
    }


def make_app(broker: str, queue: str) -> Celery:
    app = Celery("raftq_sqs_test", broker=broker)
    app.conf.update(
        broker_transport_options=transport_options(),
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        # Acknowledge (DeleteMessage) after the task ran: a delivery lost with the leader comes
        # back after its visibility timeout instead of being lost with the worker's memory.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=4,
        worker_enable_remote_control=False,  # no broadcast (SNS) queues
        worker_send_task_events=False,
        task_ignore_result=True,
        result_backend=None,
        worker_hijack_root_logger=False,
    )

    @app.task(name=TASK)  # type: ignore[untyped-decorator]
    def record(n: int) -> None:
        # One write() of a short line to an O_APPEND file is atomic: the pool's processes
        # cannot interleave lines.
        fd = os.open(os.environ["RAFTQ_CELERY_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{n}\n".encode())
        finally:
            os.close(fd)

    return app


if "RAFTQ_CELERY_BROKER" in os.environ:  # the worker process
    app = make_app(os.environ["RAFTQ_CELERY_BROKER"], os.environ["RAFTQ_CELERY_QUEUE"])
