"""The clients and the CLI against the storage limits: 507 ``storage_full`` is ``StorageFull``,
raised at once (not retried until the timeout), and ``raftq settings`` changes the limit."""

from __future__ import annotations

import asyncio
import json

import pytest
from tests.client.conftest import name
from tests.client.test_client_inprocess import run_cli

from raftq.client import AsyncClient, Client, StorageFull, errors
from raftq.client import _core as core
from raftq.client.cli import EXIT_OK, EXIT_REFUSED
from raftq.node.local import LocalRaft

LONG = 60.0  # a client timeout far longer than the test's bound: a retry loop would show


def test_507_maps_to_storage_full_with_its_details_and_is_not_retried() -> None:
    body = {
        "code": "storage_full",
        "message": "full",
        "details": {"retained_bytes": 9, "max_retained_bytes": 10, "bytes": 2},
    }
    with pytest.raises(StorageFull) as info:
        core.decode(507, core.JSON, json.dumps(body).encode())
    err = info.value
    assert (err.status, err.max_retained_bytes) == (507, 10)  # type: ignore[attr-defined]
    req = core.Request("POST", "/topics/t/messages", {}, idempotent=True)
    assert core.retry_delay(err, req, 0, 30.0) is None
    assert isinstance(errors.error_from_body(507, None), StorageFull)  # (status alone)
    err.retry_after = 2.0  # a Retry-After, if a server sends one, is honoured
    delay = core.retry_delay(err, req, 0, 30.0)
    assert delay is not None and 2.0 <= delay <= 3.0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_publish_past_the_limit_raises_storage_full_at_once(
    server: tuple[LocalRaft, str], stream: bool
) -> None:
    _, url = server
    topic = name()
    async with AsyncClient(url, timeout=LONG, publish_stream=stream) as c:
        await c.create_topic(topic)
        await c.publish(topic, b"12345")
        settings = await c.update_cluster_settings(max_retained_bytes=5)
        assert settings == {"settings": {"max_retained_bytes": 5}, "retained_bytes": 5}
        with pytest.raises(StorageFull) as info:
            await asyncio.wait_for(c.publish(topic, b"6"), 10)
        assert info.value.retained_bytes == 5  # type: ignore[attr-defined]
        (msg,) = await c.receive(topic, max=1)
        await msg.ack()
        assert await c.publish(topic, b"6") == 2
        await c.update_cluster_settings(max_retained_bytes=None)


async def test_the_sync_client_and_the_cli_show_and_change_the_settings(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()

    def work() -> None:
        with Client(url, timeout=LONG) as c:
            c.create_topic(topic)
            c.publish(topic, b"abc")
            c.update_cluster_settings(max_retained_bytes=3)
            with pytest.raises(StorageFull):
                c.publish(topic, b"d")
            assert c.cluster_settings()["settings"] == {"max_retained_bytes": 3}
        code, out, _ = run_cli("settings", "--url", url)
        assert code == EXIT_OK and "max_retained_bytes  3 (" in out
        code, _, err = run_cli("publish", topic, "more", "--url", url, "--timeout", str(LONG))
        assert code == EXIT_REFUSED and err.startswith("raftq: storage_full")
        code, out, _ = run_cli("settings", "--max-retained-bytes", "1KiB", "--url", url, "--json")
        assert code == EXIT_OK
        assert json.loads(out)["settings"] == {"max_retained_bytes": 1024}
        code, out, _ = run_cli("settings", "--max-retained-bytes", "none", "--url", url)
        assert code == EXIT_OK and "max_retained_bytes  none" in out
        with pytest.raises(SystemExit) as usage:
            run_cli("settings", "--max-retained-bytes", "lots", "--url", url)
        assert usage.value.code == 2

    await asyncio.to_thread(work)
    assert raft.read(lambda b: b.settings) == {}
