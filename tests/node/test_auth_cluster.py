"""Access control on a real 3-node cluster of ``raftq node`` processes: a revoke reaches every
node, a request through a follower is checked on both hops, tokens survive a restart."""

from __future__ import annotations

import functools
import time
import urllib.error
import urllib.request

import pytest

from raftq.client import Client, Forbidden, Unauthenticated
from tests.node.cluster_fixture import Cluster
from tests.support import wait_for

pytestmark = pytest.mark.slow


def status_at(url: str, token: str) -> int:
    """GET /cluster at exactly this node (answered from its own state; no client routing)."""
    req = urllib.request.Request(url + "/cluster", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def answers(url: str, token: str, status: int) -> bool:
    return status_at(url, token) == status


def test_a_token_revoked_on_the_leader_is_refused_by_every_node(cluster3: Cluster) -> None:
    leader = cluster3.wait_leader()
    urls = {nid: cluster3.url(nid) for nid in cluster3.nodes}
    with Client(urls[leader]) as admin:
        admin.create_topic("orders.eu")
        made = admin.create_token("ci-publisher", [{"topics": "orders.*", "actions": ["publish"]}])
    token = made["token"]
    clients = {nid: Client(url, token=token, timeout=5) for nid, url in urls.items()}
    try:
        # Known on every node once applied there (each checks with its own state).
        for nid, c in clients.items():
            wait_for(f"the token on {nid}", functools.partial(answers, urls[nid], token, 200), 10)
            assert c.publish("orders.eu", b"through " + nid.encode()) >= 1
            with pytest.raises(Forbidden):  # ... but only where its grants say
                c.topic("billing")
        with Client(urls[leader]) as admin:
            t0 = time.monotonic()
            admin.revoke_token(made["id"])
        refused: dict[str, float] = {}
        deadline = time.monotonic() + 10
        while len(refused) < len(urls) and time.monotonic() < deadline:
            for nid, url in urls.items():  # each node in turn, timed on its own
                if nid not in refused and status_at(url, token) == 401:
                    refused[nid] = time.monotonic() - t0
        assert set(refused) == set(urls), refused
        for c in clients.values():
            with pytest.raises(Unauthenticated):
                c.publish("orders.eu", b"after the revoke")
        print(f"revoke -> refused (s): {refused}")
        assert max(refused.values()) < 1.0
    finally:
        for c in clients.values():
            c.close()


def test_tokens_survive_a_restart_of_the_whole_cluster(cluster3: Cluster) -> None:
    leader = cluster3.wait_leader()
    with Client(cluster3.url(leader)) as admin:
        made = admin.create_token("survivor", [{"topics": "*", "actions": ["consume"]}])
    for nid in list(cluster3.nodes):
        cluster3.stop_node(nid)
    for nid in list(cluster3.nodes):
        cluster3.start_node(nid)
    cluster3.wait_leader()
    for nid in cluster3.nodes:
        known = functools.partial(answers, cluster3.url(nid), made["token"], 200)
        wait_for(f"{nid} to know the token again", known, 20)
