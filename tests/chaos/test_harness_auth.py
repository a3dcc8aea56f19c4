"""The chaos harness runs its nodes with access control on (no root needed: a stand-in for the
network namespaces): the admin token reaches each node by its environment, never its argv, and
the harness's own calls carry it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from raftq_chaos.cluster import Cluster


class _FakeNet:
    """What ``Cluster`` uses of ``netns.Net``; a node's command is replaced by a program that
    prints the admin token it was given (``exec_argv`` is the hook ``Net`` has too)."""

    node_ids = ["n1", "n2"]
    ip = {"n1": "127.0.0.1", "n2": "127.0.0.1"}

    def __init__(self) -> None:
        self.argv: dict[str, list[str]] = {}

    def exec_argv(self, nid: str, *argv: str) -> list[str]:
        self.argv[nid] = list(argv)
        show = "import os; print('token=' + os.environ['RAFTQ_ADMIN_TOKEN'], flush=True)"
        return [sys.executable, "-c", show]

    def kill_processes(self) -> None:
        pass


async def test_nodes_get_the_token_by_environment_and_the_harness_sends_it(
    tmp_path: Path,
) -> None:
    net: Any = _FakeNet()
    c = Cluster(net, tmp_path)
    try:
        assert c.token.startswith("rq_admin.") and len(c.token) >= 40
        for nid in net.node_ids:
            c.start(nid)
        for nid in net.node_ids:
            node = c.nodes[nid]
            assert node.proc is not None
            node.proc.wait(10)
            assert c.token not in " ".join(net.argv[nid])  # (argv: what ps shows)
            deadline = time.monotonic() + 10
            while f"token={c.token}" not in node.log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)  # noqa: ASYNC251 - a short bounded wait on a child's log
            assert f"token={c.token}" in node.log.read_text()
        assert c.session().headers["Authorization"] == f"Bearer {c.token}"
        seen: list[str | None] = []

        async def topics(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Authorization"))
            return web.json_response({"topics": []})

        app = web.Application()
        app.router.add_get("/topics", topics)
        server = TestServer(app)
        await server.start_server()
        try:
            async with c.client([str(server.make_url(""))], timeout=5) as cl:
                assert await cl.list_topics() == []
        finally:
            await server.close()
        assert seen == [f"Bearer {c.token}"]
    finally:
        c.close()
        await c.aclose()


async def test_replica_figures_leave_out_the_age_each_node_measures_by_its_own_clock(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import raftq_chaos.cluster as chaos_cluster

    body = (
        'raftq_group_pending{group="g",topic="t"} 1.0\n'
        'raftq_group_oldest_unsettled_age_seconds{group="g",topic="t"} 12.5\n'
        "raftq_raft_term 3.0\n"
    )

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app)
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    monkeypatch.setattr(chaos_cluster.Node, "url", property(lambda n: url))
    monkeypatch.setattr(chaos_cluster.Node, "alive", property(lambda n: True))
    c = Cluster(_FakeNet(), tmp_path)  # type: ignore[arg-type]
    try:
        assert await c.broker_figures("n1") == {'raftq_group_pending{group="g",topic="t"}': 1.0}
    finally:
        monkeypatch.undo()  # (close() signals the nodes it thinks alive)
        await server.close()
        c.close()
        await c.aclose()
