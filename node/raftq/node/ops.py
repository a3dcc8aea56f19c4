"""HTTP routes for operators: this node and its cluster (``/cluster``), membership changes,
health and readiness probes, Prometheus metrics and the OpenAPI document. All but membership
changes answer from this node's own state."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aiohttp import web

from raftq.node import commands, httpio
from raftq.node.auth import AUTHENTICATED, CLUSTER, OBSERVE, PUBLIC, Permission
from raftq.node.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from raftq.node.proxy import Forwarder
from raftq.node.routes import LOCAL, Query, Route, principal, query
from raftq.node.service import BrokerService

FORWARDER: web.AppKey[Forwarder] = web.AppKey("forwarder", Forwarder)
DOCUMENT: web.AppKey[dict[str, Any]] = web.AppKey("openapi", dict)


def _peers(request: web.Request) -> Forwarder:
    return request.app[FORWARDER]


async def add_member(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """Dynamic membership: start the new node with every member as a peer, then add it. The
    leader checks the change is safe (``raftq.cluster.raft._membership``): 409 otherwise."""
    node_id, raft, api = commands.member(await httpio.read_body(request))
    await svc.membership(svc.raft.add_member(node_id, raft, api))
    return httpio.respond(request, {"added": node_id, "members": _member_ids(svc)})


async def remove_member(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    node_id = commands.name(request.match_info["node"], "node")
    commands.empty(await httpio.read_body(request))
    await svc.membership(svc.raft.remove_member(node_id))
    return httpio.respond(request, {"removed": node_id, "members": _member_ids(svc)})


def _member_ids(svc: BrokerService) -> list[str]:
    return sorted(svc.raft.status().members)


def _rss_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``; None elsewhere). (Read here rather than
    from prometheus_client's process collector, which would render every process series.)"""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def figures(svc: BrokerService) -> dict[str, Any]:
    """This node's own figures, for ``/cluster`` (and the peers' ``/healthz``): its Raft role,
    term and indices, its memory, its time in fsync and its snapshots."""
    st = svc.raft.status()
    stats = getattr(svc.raft, "stats", None)
    stats = stats if isinstance(stats, dict) else {}
    return {
        "role": st.role,
        "term": st.term,
        "commit_index": st.commit_index,
        "applied_index": st.applied_index,
        "rss_bytes": _rss_bytes(),
        "fsyncs": stats.get("syncs"),
        "fsync_seconds": stats["sync_us"] / 1e6 if "sync_us" in stats else None,
        "snapshots": stats.get("snapshots"),
        "last_snapshot_at": (
            stats["last_snapshot_timestamp_ms"] / 1e3
            if stats.get("last_snapshot_timestamp_ms")
            else None
        ),
        "last_snapshot_seconds": (
            stats["last_snapshot_ms"] / 1e3 if "last_snapshot_ms" in stats else None
        ),
    }


def _caller(request: web.Request) -> dict[str, Any]:
    """Who calls and what they may do, so that a client (the web console) shows and enables
    only that: ``all`` for the bootstrap admin or with access control off."""
    who = principal(request)
    grants = [dict(g) for g in who.grants]
    return {"name": who.name, "cluster": who.may(CLUSTER), "all": who.everything, "grants": grants}


async def show_settings(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    return httpio.respond(request, await svc.read_latest(lambda b: b.storage()))


async def change_settings(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """Cluster settings are replicated state: every node applies the same limit."""
    cmd = commands.cluster_settings(await httpio.read_body(request))
    return httpio.respond(request, await svc.call(cmd))


def _storage(svc: BrokerService) -> dict[str, Any]:
    """Retained bytes vs the cluster's limit (this replica's view), and this node's disk."""
    out: dict[str, Any] = svc.raft.read(lambda b: b.storage())
    out["max_retained_bytes"] = out.pop("settings")["max_retained_bytes"]
    disk = svc.disk.status()
    if disk is not None:
        out["disk"] = disk
    return out


async def cluster(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    st = svc.raft.status()
    members = {k: dict(v) for k, v in st.members.items()}
    peers = _peers(request)
    probes = {
        mid: asyncio.ensure_future(peers.health(m.get("api")))
        for mid, m in members.items()
        if not m.get("self")
    }
    if probes:
        await asyncio.wait(probes.values())
    for mid, m in members.items():
        # A peer's figures come from its /healthz (probed now, 0.5 s at most): what answers
        # there is up; one that does not answer is down, whatever its Raft connection says.
        health = {"ok": True, "figures": figures(svc)} if m.get("self") else probes[mid].result()
        m["answers"] = health is not None
        if health is not None and isinstance(health.get("figures"), dict):
            m["figures"] = health["figures"]
    body: dict[str, Any] = {
        "node": st.node_id,
        "role": st.role,
        "leader": st.leader_id,
        "leader_api": st.leader_api,
        "term": st.term,
        "commit_index": st.commit_index,
        "applied_index": st.applied_index,
        "last_log_index": st.last_log_index,
        "last_log_term": st.last_log_term,
        "members": members,
        "running": st.running,
        "you": _caller(request),
        "storage": _storage(svc),
    }
    if st.error is not None:
        body["error"] = st.error  # why Raft stopped (role "stopped"; the process exits soon)
    if query(request)["digest"]:
        principal(request).require(CLUSTER)  # (O(state) under the apply lock: operators only)
        # Fingerprint of this replica's state (O(state): for checks, not for polling).
        body["digest"] = svc.raft.read(lambda b: b.digest())
    return httpio.respond(request, body)


async def healthz(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    error = svc.raft.status().error
    if error is not None:  # Raft stopped on a failure: restart the process
        body = {"ok": False, "node": svc.settings.node_id, "raft_error": error}
        return httpio.respond(request, body, 503)
    body = {"ok": True, "node": svc.settings.node_id}
    if not svc.settings.auth_observe:  # (what /metrics shows anyone then, in short)
        body["figures"] = figures(svc)
    return httpio.respond(request, body)


async def readyz(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    body = svc.readiness()
    return httpio.respond(request, body, 200 if body["ready"] else 503)


async def metrics(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    return web.Response(body=svc.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def openapi(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[DOCUMENT])


ROUTES = [
    Route("GET", "/cluster", cluster, "This node, its role, the leader and the members",
          where=LOCAL, strict_query=False, answer="Cluster", op="getCluster",
          perm=Permission(AUTHENTICATED),
          query=(Query("digest", kind="flag",
                       doc="1 or true: add a fingerprint of this replica's state (needs a"
                           " cluster token)"),)),
    Route("GET", "/cluster/settings", show_settings,
          "Cluster settings (max_retained_bytes) and the payload bytes retained",
          answer="ClusterSettings", op="getClusterSettings", perm=Permission(AUTHENTICATED)),
    Route("PATCH", "/cluster/settings", change_settings,
          "Change cluster settings: max_retained_bytes (null: no limit)",
          body="UpdateClusterSettings", answer="ClusterSettings", op="updateClusterSettings",
          perm=Permission(CLUSTER)),
    Route("POST", "/cluster/members", add_member, "Add a member (start it first)",
          body="AddMember", answer="Membership", op="addMember", perm=Permission(CLUSTER)),
    Route("DELETE", "/cluster/members/{node}", remove_member, "Remove a member", body="Empty",
          answer="Membership", params={"node": "the member's id"}, op="removeMember",
          perm=Permission(CLUSTER)),
    Route("GET", "/healthz", healthz, "Process is alive and its Raft running (503 otherwise)",
          where=LOCAL, strict_query=False, ok=(200, 503), answer="Health",
          op="getHealth", perm=Permission(PUBLIC)),
    Route("GET", "/readyz", readyz, "Has a leader and is caught up (503 otherwise)",
          where=LOCAL, strict_query=False, ok=(200, 503), answer="Readiness",
          op="getReadiness", perm=Permission(PUBLIC)),
    Route("GET", "/metrics", metrics, "Prometheus metrics (text format)", where=LOCAL,
          strict_query=False, answer="text/plain", op="getMetrics", perm=Permission(OBSERVE)),
    Route("GET", "/openapi.json", openapi, "This document", where=LOCAL, strict_query=False,
          answer="application/json", op="getOpenApiDocument", perm=Permission(OBSERVE)),
]  # fmt: skip
