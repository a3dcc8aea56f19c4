"""The async and sync clients and the CLI against one in-process node (LocalRaft, real HTTP on
127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from tests.client.conftest import name

from raftq.client import (
    AsyncClient,
    Client,
    ReceiptStale,
    TopicExists,
    TopicFull,
    TopicNotFound,
)
from raftq.client.cli import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE
from raftq.node.cli import main as cli_main
from raftq.node.local import LocalRaft


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition the server reaches asynchronously (bounded)."""

    async def poll() -> None:
        while not pred():  # noqa: ASYNC110 - polling another component's state
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


def pending(raft: LocalRaft, topic: str, group: str = "default") -> tuple[int, int]:
    s = raft.read(lambda b: b.group_stats(topic, group))
    return s["pending"], s["in_flight"]


async def test_publish_receive_ack_round_trip(server: tuple[LocalRaft, str]) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        s1 = await c.publish(topic, b"one", headers={"k": "v"})
        s2, s3 = await c.publish_batch(topic, [b"two", {"payload": "three", "delay": 0}])
        assert (s1, s2, s3) == (1, 2, 3)
        msgs = await c.receive(topic, max=10, wait=1)
        assert [(m.seq, m.payload, m.attempt) for m in msgs] == [
            (1, b"one", 1),
            (2, b"two", 1),
            (3, b"three", 1),
        ]
        assert msgs[0].headers == {"k": "v"}
        for m in msgs:
            await m.ack()
        assert pending(raft, topic) == (0, 0)


async def test_server_errors_become_typed_exceptions_with_data(
    server: tuple[LocalRaft, str],
) -> None:
    _, url = server
    topic = name()
    async with AsyncClient(url) as c:
        with pytest.raises(TopicNotFound) as nf:
            await c.publish(topic, b"x")
        assert nf.value.topic == topic  # type: ignore[attr-defined]
        assert nf.value.status == 404
        await c.create_topic(topic, config={"max_messages": 1})
        with pytest.raises(TopicExists):
            await c.create_topic(topic)
        await c.publish(topic, b"a")
        async with AsyncClient(url, timeout=0.5) as impatient:
            with pytest.raises(TopicFull) as full:  # (Retry-After: 1 is past its deadline)
                await impatient.publish(topic, b"b")
            assert full.value.retry_after == 1.0
        [m] = await c.receive(topic, wait=1)
        await m.ack()
        with pytest.raises(ReceiptStale):
            await m.ack()


async def test_a_retried_publish_with_the_same_key_is_stored_once(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        a = await c.publish(topic, b"x", key="order-17")
        b = await c.publish(topic, b"x", key="order-17")
    assert a == b
    assert raft.read(lambda br: br.topic_stats(topic))["messages"] == 1


async def test_publishes_started_without_waiting_each_get_their_own_sequence(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        futures = [await c.publish_nowait(topic, f"m{i}") for i in range(50)]
        seqs = [await f for f in futures]
    assert seqs == list(range(1, 51))  # in the order started, one message each
    assert raft.read(lambda br: br.topic_stats(topic))["messages"] == 50


async def test_leaving_a_consume_loop_releases_what_it_prefetched(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        await c.publish_batch(topic, [b"1", b"2", b"3"])
        async for msg in c.consume(topic, prefetch=3, wait=1):
            await msg.ack()
            break
        await until(lambda: pending(raft, topic) == (2, 0))
        again = await c.receive(topic, max=5, wait=1)
        assert [(m.seq, m.attempt) for m in again] == [(2, 2), (3, 2)]


async def test_streaming_consumer_gets_pushed_deliveries_and_acks_on_the_socket(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        await c.publish_batch(topic, [f"m{i}" for i in range(5)])
        got = []
        async for msg in c.consume(topic, prefetch=2, stream=True):
            got.append(msg.payload)
            await msg.ack()
            if len(got) == 5:
                break
        assert got == [f"m{i}".encode() for i in range(5)]
        assert pending(raft, topic) == (0, 0)


async def test_acks_without_waiting_share_requests_and_take_effect(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic)
        await c.publish_batch(topic, [f"m{i}" for i in range(30)])
        n = 0
        async for msg in c.consume(topic, prefetch=10, stream=True):
            msg.ack_nowait()
            n += 1
            if n == 20:
                break
        for msg in await c.receive(topic, max=10, wait=1):
            msg.ack_nowait()
        await until(lambda: pending(raft, topic) == (0, 0))


async def test_closing_a_stream_releases_its_unacked_deliveries_at_once(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic, groups=[{"group": "g", "config": {"visibility_timeout": 600}}])
        await c.publish_batch(topic, [b"a", b"b", b"c"])
        async for _ in c.consume(topic, "g", prefetch=3, stream=True):
            break  # die holding up to three deliveries, none acked
        await until(lambda: pending(raft, topic, "g") == (3, 0))


async def test_auto_extend_keeps_a_slow_handlers_message_in_flight(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic, groups=[{"group": "g", "config": {"visibility_timeout": 1}}])
        await c.publish(topic, b"slow")
        async for msg in c.consume(topic, "g", prefetch=1, wait=1, auto_extend=True):
            await asyncio.sleep(2.5)  # well past the 1 s visibility timeout
            assert pending(raft, topic, "g") == (0, 1)
            await msg.ack()  # still its delivery: not stale
            break
        stats = raft.read(lambda b: b.group_stats(topic, "g"))
        assert stats["acked_total"] == 1 and stats["timed_out_total"] == 0


async def test_sync_client_twin(server: tuple[LocalRaft, str]) -> None:
    raft, url = server
    topic = name()

    def work() -> list[Any]:
        with Client(url) as c:
            c.create_topic(topic)
            c.publish(topic, "hello")
            c.publish_batch(topic, [b"a", b"b"])
            out = []
            for m in c.consume(topic, max_messages=3, idle_timeout=2):
                out.append((m.seq, m.payload))
                m.ack()
            return out

    assert await asyncio.to_thread(work) == [(1, b"hello"), (2, b"a"), (3, b"b")]
    assert pending(raft, topic) == (0, 0)


async def test_list_topics_follows_the_pages_and_a_page_can_be_asked_for(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    names = sorted(f"l-{i:05d}" for i in range(2500))  # (the server's page is 1000)
    raft.read(lambda b: [b.apply({"op": "create_topic", "topic": n, "now": 1}) for n in names])
    async with AsyncClient(url) as c:
        assert await c.list_topics() == names
        page = await c.list_topics_page(after=names[9], limit=3)
        assert page == {"topics": names[10:13], "next": names[12]}
    with Client(url) as sc:
        assert await asyncio.to_thread(sc.list_topics) == names


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(list(argv))
    return code, out.getvalue(), err.getvalue()


async def test_cli_commands_tables_json_and_exit_codes(server: tuple[LocalRaft, str]) -> None:
    _, url = server
    topic = name()

    def work() -> None:
        code, out, _ = run_cli("topic", "create", topic, "--url", url)
        assert code == EXIT_OK and "created" in out
        code, out, _ = run_cli("publish", topic, "hello", "world", "--url", url)
        assert code == EXIT_OK and "seq 2" in out
        code, out, _ = run_cli("topic", "show", topic, "--url", url, "--json")
        assert json.loads(out)["messages"] == 2
        code, out, _ = run_cli("consume", topic, "--count", "2", "--url", url)
        assert (code, out.split()) == (EXIT_OK, ["hello", "world"])
        code, _, err = run_cli("topic", "show", "nope", "--url", url)
        assert code == EXIT_REFUSED
        assert err.startswith("raftq: topic_not_found") and "Traceback" not in err
        code, _, err = run_cli("topic", "list", "--url", "http://127.0.0.1:1", "--timeout", "0.5")
        assert code == EXIT_UNAVAILABLE and err.count("\n") == 1
        # options before the payload, as one would write it
        code, out, _ = run_cli("publish", topic, "--key", "k1", "keyed", "--url", url)
        assert code == EXIT_OK and "seq 3" in out
        with pytest.raises(SystemExit) as usage:
            run_cli("publish", topic, "--nope", "x", "--url", url)
        assert usage.value.code == 2

    await asyncio.to_thread(work)


async def test_cli_token_commands_and_a_token_of_ones_own(server: tuple[LocalRaft, str]) -> None:
    _, url = server
    topic = name()

    def work() -> None:
        assert run_cli("topic", "create", topic, "--url", url)[0] == EXIT_OK
        code, out, _ = run_cli(
            "token", "create", "cli-pub", "--grant", f"{topic}=publish", "--url", url, "--json"
        )
        made = json.loads(out)
        assert code == EXIT_OK and made["token"].startswith("rq_")
        code, out, _ = run_cli("token", "list", "--url", url)
        assert code == EXIT_OK and "cli-pub" in out and f"{topic}=publish" in out
        assert made["token"].split(".")[1] not in out  # a secret is shown once, at create
        # The new token publishes to its topic, and may not look at another one.
        mine = ("--url", url, "--token", made["token"])
        assert run_cli("publish", topic, "hi", *mine)[0] == EXIT_OK
        code, _, err = run_cli("topic", "show", "somebody-elses", *mine)
        assert code == EXIT_REFUSED and err.startswith("raftq: forbidden")
        code, out, _ = run_cli("token", "show", "cli-pub", "--url", url, "--json")
        assert json.loads(out)["id"] == made["id"] and "hash" not in json.loads(out)
        # A name that is another token's id is ambiguous: refused, nothing revoked.
        assert run_cli("token", "create", made["id"], "--url", url)[0] == EXIT_OK
        code, _, err = run_cli("token", "revoke", made["id"], "--url", url)
        assert code == EXIT_USAGE and "give the id" in err
        assert run_cli("token", "revoke", "cli-pub", "--url", url)[0] == EXIT_OK
        code, _, err = run_cli("publish", topic, "again", *mine)
        assert code == EXIT_REFUSED and err.startswith("raftq: unauthenticated")
        code, out, _ = run_cli("token", "new")
        assert code == EXIT_OK and out.startswith("rq_admin.") and len(out.strip()) > 40

    await asyncio.to_thread(work)


async def test_ordering_keys_pass_through_both_clients(server: tuple[LocalRaft, str]) -> None:
    """``ordering_key`` on publish (keyword, batch dicts, sync twin) reaches the broker, and
    received messages expose it with their first receive time."""
    _, url = server
    topic = name()
    async with AsyncClient(url) as c:
        await c.create_topic(topic, groups=[{"group": "g", "config": {"ordered": True}}])
        await c.publish(topic, b"1", ordering_key="k")
        await c.publish_batch(topic, [{"payload": b"2", "ordering_key": "k"}, b"3"])
        first = await c.receive(topic, "g", max=10, wait=1)
        assert [(m.seq, m.ordering_key) for m in first] == [(1, "k"), (2, "k"), (3, None)]
        assert first[0].first_received_at_ms > 0
        await c.publish(topic, b"4", ordering_key="k")
        assert await c.receive(topic, "g", max=10) == []  # 1 and 2 of "k" are in flight
        assert [m.get("ordering_key") for m in await c.peek(topic)] == ["k", "k", None, "k"]

    def sync_publish() -> int:
        with Client(url) as s:
            return s.publish(topic, b"5", ordering_key="j")

    assert await asyncio.to_thread(sync_publish) == 5
    async with AsyncClient(url) as c:
        [m] = await c.receive(topic, "g", max=10)
        assert (m.seq, m.ordering_key) == (5, "j")
