"""A payload the store cannot read, over HTTP (issue 22): a peek answers 503 shutting_down
(this node's Raft stopped), never a 500 and never a payload."""

from __future__ import annotations

from pathlib import Path

from raftq.cluster.raft import RaftConfig, RaftNode
from tests.node.inprocess import admin_client, app
from tests.raft.faultdisk import FaultDisk
from tests.raft.harness import free_ports
from tests.raft.test_node import pub, until


async def test_a_peek_whose_store_read_fails_answers_503_not_500(tmp_path: Path) -> None:
    raft_port, api_port = free_ports(2)
    cfg = RaftConfig("n1", f"127.0.0.1:{raft_port}", f"127.0.0.1:{api_port}", {},
                     str(tmp_path / "n1"), "secret")  # fmt: skip
    disk = FaultDisk()
    node = RaftNode(cfg, disk=disk, store_segment_bytes=4096)
    node.start()
    try:
        await until("a leader", node.is_leader)
        await node.propose([{"op": "create_topic", "topic": "t"}])
        for i in range(30):  # several sealed segments: the peek reads from the files
            await node.propose([pub("t", b"m%02d" % i + b"x" * 300)])
        async with admin_client(app(node)) as client:
            r = await client.get("/topics/t/messages", params={"limit": "2"})
            assert r.status == 200, await r.text()
            assert len((await r.json())["messages"]) == 2
            disk.eio_reads = True
            r = await client.get("/topics/t/messages", params={"from_seq": "3", "limit": "5"})
            body = await r.json()
            assert r.status == 503, body
            assert body["code"] == "shutting_down" and "read failed" in body["message"], body
            assert "messages" not in body
            for path in ("/topics/t/messages", "/topics/t"):  # stopped: not "no leader"
                r = await client.get(path, params={"limit": "1"} if "messages" in path else {})
                assert r.status == 503 and (await r.json())["code"] == "shutting_down", path
        assert node.status().role == "stopped"
    finally:
        await node.stop()
