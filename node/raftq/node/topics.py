"""HTTP routes for topics and consumer groups: create, list, read stats, change config, delete,
purge. Writes are one command each; reads are linearizable (``read_latest``)."""

from __future__ import annotations

import bisect
import itertools
from typing import Any

from aiohttp import web

from raftq.cluster import validate
from raftq.node import commands, httpio
from raftq.node.auth import ADMIN, AUTHENTICATED, BODY, PATH, TOPIC, Permission
from raftq.node.routes import Query, Route, path_name, principal, query
from raftq.node.service import BrokerService


def _created(request: web.Request, res: dict[str, object]) -> web.Response:
    return httpio.respond(request, res, 201 if res.get("created") else 200)


def _dead_letter_topics(topic: str, configs: list[Any], new: bool) -> list[str]:
    """The dead-letter topics that group configs make their groups publish to: the named
    one, or (for a new group that names none) ``<topic>.dlq``."""
    out = []
    for config in configs:
        named = isinstance(config, dict) and "dead_letter_topic" in config
        dlq = config["dead_letter_topic"] if named else None
        if not named and new:
            dlq = validate.default_dead_letter_topic(topic)
        if isinstance(dlq, str):
            out.append(dlq)
    return out


def _may_configure(request: web.Request, topic: str, configs: list[Any], new: bool) -> None:
    """``admin`` on the topic, and on every dead-letter topic its groups would publish to
    (a dead-letter topic is made on demand: it could be somebody else's)."""
    who = principal(request)
    who.require(ADMIN, topic)
    for dlq in _dead_letter_topics(topic, configs, new):
        who.require(ADMIN, dlq)


async def list_topics(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    """A page of topic names in name order, those the token has a right on: at most
    ``limit``, after the name ``after``; ``next`` is the ``after`` of the next page (null on
    the last). A name cursor stays valid whatever is created or deleted meanwhile. With
    ``stats``, also each listed topic's ``summary`` (one read for a whole table)."""
    who = principal(request)
    q = query(request)
    limit, after = q["limit"], q["after"]
    names = sorted(await svc.read_latest(lambda b: b.list_topics()))
    page: list[str] = []
    more = False
    for name in itertools.islice(names, bisect.bisect_right(names, after) if after else 0, None):
        if who.may(TOPIC, name):
            if len(page) == limit:
                more = True
                break
            page.append(name)
    body: dict[str, Any] = {"topics": page, "next": page[-1] if more else None}
    if q["stats"]:
        # (read right after the barrier above: as new as it, or newer; a topic deleted
        # meanwhile leaves both lists)
        stats = svc.raft.read(lambda b: [summary(b.topic_stats(n)) for n in page if n in b.topics])
        body["topics"] = [s["topic"] for s in stats]
        body["stats"] = stats
    return httpio.respond(request, body)


def summary(stats: dict[str, Any]) -> dict[str, Any]:
    """A topic's figures in one flat row (``GET /topics?stats=1``): its own and its groups'
    summed; ``oldest_unsettled_age_ms`` is the oldest among its groups."""
    groups = stats["groups"]
    ages = [g["oldest_age_ms"] for g in groups if g["oldest_age_ms"] is not None]
    return {
        "topic": stats["topic"],
        "messages": stats["messages"],
        "bytes": stats["bytes"],
        "last_seq": stats["last_seq"],
        "oldest_age_ms": stats["oldest_age_ms"],
        "oldest_unsettled_age_ms": max(ages) if ages else None,
        "groups": len(groups),
        **{k: sum(g[k] for g in groups) for k in ("pending", "delayed", "in_flight", "consumers")},
        "counters": {k[:-6]: v for k, v in stats.items() if k.endswith("_total")},
        "group_counters": {
            k[:-6]: sum(g.get(k, 0) for g in groups)
            for k in (groups[0] if groups else {})
            if k.endswith("_total")
        },
    }


async def create_topic(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    cmd = commands.create_topic(await httpio.read_body(request))
    groups = [g.get("config") for g in cmd.get("groups") or [{}]]  # (none: group default)
    _may_configure(request, cmd["topic"], groups, new=True)
    return _created(request, await svc.call(cmd))


async def get_topic(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    return httpio.respond(request, await svc.read_latest(lambda b: b.topic_stats(topic)))


async def update_topic(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    cmd = commands.update_topic(topic, await httpio.read_body(request))
    return httpio.respond(request, await svc.call(cmd))


async def delete_topic(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    return httpio.respond(request, await svc.call({"op": "delete_topic", "topic": topic}))


async def purge_topic(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    commands.empty(await httpio.read_body(request))
    return httpio.respond(request, await svc.call({"op": "purge", "topic": topic}))


async def list_groups(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    stats = await svc.read_latest(lambda b: b.topic_stats(topic))
    return httpio.respond(request, {"topic": topic, "groups": stats["groups"]})


async def create_group(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic = path_name(request, "topic")
    cmd = commands.create_group(topic, await httpio.read_body(request))
    _may_configure(request, topic, [cmd.get("config")], new=True)
    return _created(request, await svc.call(cmd))


def topic_group(request: web.Request) -> tuple[str, str]:
    return path_name(request, "topic"), path_name(request, "group")


async def get_group(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic, group = topic_group(request)
    return httpio.respond(request, await svc.read_latest(lambda b: b.group_stats(topic, group)))


async def update_group(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic, group = topic_group(request)
    cmd = commands.update_group(topic, group, await httpio.read_body(request))
    _may_configure(request, topic, [cmd.get("config")], new=False)
    return httpio.respond(request, await svc.call(cmd))


async def delete_group(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic, group = topic_group(request)
    cmd = {"op": "delete_group", "topic": topic, "group": group}
    return httpio.respond(request, await svc.call(cmd))


async def purge_group(svc: BrokerService, request: web.Request) -> web.StreamResponse:
    topic, group = topic_group(request)
    commands.empty(await httpio.read_body(request))
    cmd = {"op": "purge", "topic": topic, "group": group}
    return httpio.respond(request, await svc.call(cmd))


DEFAULT_LIST = 1000  # topic names per page of GET /topics
MAX_LIST = 10_000
T = "/topics/{topic}"
TG = "/topics/{topic}/groups/{group}"
SEE = Permission(TOPIC, PATH)  # stats: any right on the topic
CONFIGURE = Permission(ADMIN, PATH)
ROUTES = [
    Route("GET", "/topics", list_topics,
          "List topic names in name order, those the token has a right on, a page at a time",
          query=(Query("limit", lo=1, hi=MAX_LIST, default=DEFAULT_LIST,
                       doc=f"at most this many names (1-{MAX_LIST})"),
                 Query("after", kind="name",
                       doc="start after this name: the previous page's next"),
                 Query("stats", kind="flag",
                       doc="1 or true: add stats, each listed topic's summary (the console's"
                           " topic table)")),
          answer="TopicList", op="listTopics", perm=Permission(AUTHENTICATED)),
    Route("POST", "/topics", create_topic,
          "Create a topic (with groups; default group 'default'); 200 if it existed and "
          "if_not_exists was set",
          body="CreateTopic", ok=(201, 200), answer="Created", op="createTopic",
          perm=Permission(ADMIN, BODY)),
    Route("GET", T, get_topic, "Topic stats, config and groups", answer="TopicStats",
          op="getTopic", perm=SEE),
    Route("PATCH", T, update_topic, "Change topic config", body="UpdateTopic",
          answer="Configured", op="updateTopic", perm=CONFIGURE),
    Route("DELETE", T, delete_topic, "Delete a topic", answer="Deleted", op="deleteTopic",
          perm=CONFIGURE),
    Route("POST", T + "/purge", purge_topic, "Drop every retained message", body="Empty",
          answer="Purged", op="purgeTopic", perm=CONFIGURE),
    Route("GET", T + "/groups", list_groups, "Group stats of a topic", answer="GroupList",
          op="listGroups", perm=SEE),
    Route("POST", T + "/groups", create_group,
          "Create a consumer group; 200 if it existed and if_not_exists was set",
          body="CreateGroup", ok=(201, 200), answer="Created", op="createGroup", perm=CONFIGURE),
    Route("GET", TG, get_group, "Group stats and config", answer="GroupStats", op="getGroup",
          perm=SEE),
    Route("PATCH", TG, update_group, "Change group config", body="UpdateGroup",
          answer="Configured", op="updateGroup", perm=CONFIGURE),
    Route("DELETE", TG, delete_group, "Delete a group", answer="Deleted", op="deleteGroup",
          perm=CONFIGURE),
    Route("POST", TG + "/purge", purge_group, "Settle everything pending in a group",
          body="Empty", answer="Purged", op="purgeGroup", perm=CONFIGURE),
]  # fmt: skip
