"""The read side at scale: per-topic metric series for the top topics only (cluster totals
always), and the topic list a page at a time."""

from __future__ import annotations

import base64
import uuid

from raftq.node.app import SERVICE
from raftq.node.local import LocalRaft
from tests.node.inprocess import admin_client, app


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def samples(text: str, prefix: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def test_metrics_show_the_topics_with_the_largest_backlog_and_cluster_totals() -> None:
    raft = LocalRaft()
    async with admin_client(app(raft, metrics_topics=2)) as client:
        backlog = {"small": 1, "big": 3, "middle": 2, "empty": 0}
        for topic, n in backlog.items():
            assert (await client.post("/topics", json={"topic": topic})).status == 201
            for i in range(n):
                r = await client.post(f"/topics/{topic}/messages", json={"payload": b64(b"%d" % i)})
                assert r.status == 200
        text = await (await client.get("/metrics")).text()
    assert samples(text, "raftq_group_pending") == {
        'raftq_group_pending{group="default",topic="big"}': 3.0,
        'raftq_group_pending{group="default",topic="middle"}': 2.0,
    }
    assert set(samples(text, "raftq_topic_published_total")) == {
        'raftq_topic_published_total{topic="big"}',
        'raftq_topic_published_total{topic="middle"}',
    }
    totals = samples(text, "raftq_cluster_")
    assert totals["raftq_cluster_topics"] == 4.0
    assert totals["raftq_cluster_groups"] == 4.0
    assert totals["raftq_cluster_pending"] == 6.0
    assert totals["raftq_cluster_messages"] == 6.0
    assert totals["raftq_cluster_topic_published_total"] == 6.0
    assert totals["raftq_cluster_group_delivered_total"] == 0.0
    assert "raftq_metrics_topics_shown 2.0" in text


async def test_metrics_topics_zero_shows_no_topic_and_none_shows_every_topic() -> None:
    for limit, shown in ((0, 0), (None, 3)):
        raft = LocalRaft()
        application = app(raft, metrics_topics=limit)
        async with admin_client(application) as client:
            for topic in ("a", "b", "c"):
                assert (await client.post("/topics", json={"topic": topic})).status == 201
        text = application[SERVICE].metrics.render().decode()
        assert len(samples(text, "raftq_topic_messages{")) == shown
        assert len(samples(text, "raftq_group_in_flight{")) == shown
        assert samples(text, "raftq_cluster_topics") == {"raftq_cluster_topics": 3.0}


async def test_the_topic_list_comes_in_pages_after_a_name_cursor() -> None:
    raft = LocalRaft()
    names = sorted(f"p-{uuid.uuid4().hex[:8]}" for _ in range(5))
    for name in reversed(names):  # (created out of order: the list is by name)
        raft.broker.apply({"op": "create_topic", "topic": name, "now": 1})
    async with admin_client(app(raft)) as client:
        got: list[str] = []
        after = None
        pages = 0
        while True:
            q = "limit=2" + (f"&after={after}" if after else "")
            body = await (await client.get(f"/topics?{q}")).json()
            got += body["topics"]
            pages += 1
            after = body["next"]
            if after is None:
                break
            assert after == body["topics"][-1]
        assert (got, pages) == (names, 3)
        # The default page holds them all; a cursor past the end answers an empty last page.
        assert await (await client.get("/topics")).json() == {"topics": names, "next": None}
        end = await (await client.get(f"/topics?after={names[-1]}")).json()
        assert end == {"topics": [], "next": None}
        # A deleted cursor topic still marks the place.
        assert (await client.delete(f"/topics/{names[1]}")).status == 200
        body = await (await client.get(f"/topics?limit=2&after={names[1]}")).json()
        assert body == {"topics": names[2:4], "next": names[3]}


async def test_a_page_counts_only_the_topics_the_token_may_see() -> None:
    raft = LocalRaft()
    for name in ("a1", "b1", "a2", "b2", "a3"):
        raft.broker.apply({"op": "create_topic", "topic": name, "now": 1})
    async with admin_client(app(raft)) as client:
        grants = [{"topics": t, "actions": ["consume"]} for t in ("a1", "a2", "a3")]
        r = await client.post("/tokens", json={"name": "reader", "grants": grants})
        assert r.status == 201
        headers = {"Authorization": f"Bearer {(await r.json())['token']}"}
        body = await (await client.get("/topics?limit=2", headers=headers)).json()
        assert body == {"topics": ["a1", "a2"], "next": "a2"}
        body = await (await client.get("/topics?limit=2&after=a2", headers=headers)).json()
        assert body == {"topics": ["a3"], "next": None}


async def test_a_bad_page_size_or_cursor_is_a_400_naming_it() -> None:
    async with admin_client(app(LocalRaft())) as client:
        for query, field in (
            ("limit=0", "limit"),
            ("limit=10001", "limit"),
            ("limit=x", "limit"),
            ("after=", "after"),
            ("after=-x", "after"),
        ):
            r = await client.get(f"/topics?{query}")
            body = await r.json()
            assert r.status == 400 and body["details"]["field"] == field, (query, body)
