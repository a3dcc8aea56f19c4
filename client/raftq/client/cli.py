"""Client subcommands of the ``raftq`` CLI: status, topic, group, publish, consume, dlq.

``raftq.node.cli`` owns the parser and the server commands and calls ``register`` to add these.
Every command prints a human table by default and JSON with ``--json``; errors are one line on
stderr. Exit codes: 0 done, 1 the server refused (bad input, not found, full...), 2 usage,
3 cluster unavailable or timed out, 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from raftq.client._sync import Client
from raftq.client.errors import RaftqError, TLSError, TopicNotFound, Unavailable

DEFAULT_URLS = "http://127.0.0.1:8001,http://127.0.0.1:8002,http://127.0.0.1:8003"
DEV_TOKEN_FILE = os.path.join(".raftq", "admin.token")  # written by raftq cluster up
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

Handler = Callable[[argparse.Namespace, Client], int]


def register(sub: Any) -> None:
    """Add the client commands to an ``argparse`` subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("RAFTQ_URL", DEFAULT_URLS),
        help="comma-separated node URLs (env RAFTQ_URL; default: the local 3-node cluster)",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("RAFTQ_TOKEN"),
        help="API token rq_<id>.<secret> (env RAFTQ_TOKEN; else --token-file)",
    )
    common.add_argument(
        "--token-file",
        default=os.environ.get("RAFTQ_TOKEN_FILE"),
        help=f"read the token from this file (env RAFTQ_TOKEN_FILE; default {DEV_TOKEN_FILE}"
        " when it exists: the one raftq cluster up writes)",
    )
    common.add_argument(
        "--ca",
        default=os.environ.get("RAFTQ_CA"),
        help="CA file (PEM) to verify https:// nodes with (env RAFTQ_CA; default: the"
        " system's store)",
    )
    common.add_argument(
        "--client-cert",
        default=os.environ.get("RAFTQ_CLIENT_CERT"),
        help="client certificate (PEM) for nodes that require one (env RAFTQ_CLIENT_CERT)",
    )
    common.add_argument(
        "--client-key",
        default=os.environ.get("RAFTQ_CLIENT_KEY"),
        help="its private key, if not in the --client-cert file (env RAFTQ_CLIENT_KEY)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument("--timeout", type=float, default=30.0, help="overall seconds per call")

    def cmd(parser: Any, name: str, fn: Handler, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parser.add_parser(name, parents=[common], help=help)
        p.set_defaults(func=lambda args: run(args, fn))
        return p

    cmd(sub, "status", _status, "show the cluster: members, roles, leader, indexes")

    member = sub.add_parser("member", help="add or remove cluster members")
    msub = member.add_subparsers(dest="member_cmd", required=True)
    p = cmd(msub, "add", _member_add, "add a started node to the cluster")
    p.add_argument("id")
    p.add_argument("raft", help="its Raft host:port")
    p.add_argument("api", help="its HTTP host:port")
    p = cmd(msub, "remove", _member_remove, "remove a node from the cluster")
    p.add_argument("id")

    topic = sub.add_parser("topic", help="create, list, show, delete or purge topics")
    tsub = topic.add_subparsers(dest="topic_cmd", required=True)
    p = cmd(tsub, "create", _topic_create, "create a topic")
    p.add_argument("topic")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic config, e.g. max_messages=1000 overflow=drop_oldest",
    )
    p.add_argument("--if-not-exists", action="store_true")
    cmd(tsub, "list", _topic_list, "list topics")
    p = cmd(tsub, "show", _topic_show, "show a topic's stats and groups")
    p.add_argument("topic")
    p = cmd(tsub, "delete", _topic_delete, "delete a topic and its messages")
    p.add_argument("topic")
    p = cmd(tsub, "purge", _topic_purge, "drop every message of a topic")
    p.add_argument("topic")

    group = sub.add_parser("group", help="create, list, show or delete consumer groups")
    gsub = group.add_subparsers(dest="group_cmd", required=True)
    p = cmd(gsub, "create", _group_create, "create a consumer group")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="group config, e.g. visibility_timeout=60 max_attempts=3 backoff=[1,5]",
    )
    p.add_argument("--start", choices=["latest", "earliest"], default="latest")
    p.add_argument("--if-not-exists", action="store_true")
    p = cmd(gsub, "list", _group_list, "list a topic's groups")
    p.add_argument("topic")
    p = cmd(gsub, "show", _group_show, "show a group's stats")
    p.add_argument("topic")
    p.add_argument("group")
    p = cmd(gsub, "delete", _group_delete, "delete a consumer group")
    p.add_argument("topic")
    p.add_argument("group")

    p = cmd(sub, "publish", _publish, "publish messages (arguments, or one per stdin line)")
    p.add_argument("topic")
    p.add_argument("messages", nargs="*", help="payloads; none: read lines from stdin")
    p.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--key", help="idempotency key (single message only)")
    p.add_argument("--delay", type=float, help="seconds before the message becomes available")
    p.add_argument("--batch", type=int, default=100, help="messages per request from stdin")
    # ``publish t --key k hello``: argparse gives the payload after an option back unparsed
    p.set_defaults(extra_positionals="messages")

    p = cmd(sub, "consume", _consume, "receive messages, print and acknowledge them")
    p.add_argument("topic")
    p.add_argument("--group", default="default")
    p.add_argument("--count", type=int, help="stop after this many messages")
    p.add_argument("--follow", action="store_true", help="keep waiting for new messages")
    p.add_argument(
        "--wait",
        type=float,
        default=2.0,
        help="without --follow: stop after this many idle seconds",
    )
    p.add_argument("--prefetch", type=int, default=10)
    p.add_argument(
        "--no-ack", action="store_true", help="do not acknowledge; deliveries are released on exit"
    )

    tok = sub.add_parser("token", help="create, list, show or revoke API tokens")
    ksub = tok.add_subparsers(dest="token_cmd", required=True)
    p = cmd(ksub, "create", _token_create, "create a token; its secret is printed once")
    p.add_argument("name")
    p.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="TOPICS=ACTIONS",
        help="e.g. 'orders.*=publish,consume' or '*=admin' (topics: a name, prefix.* or *;"
        " actions: publish, consume, admin); repeatable",
    )
    p.add_argument("--cluster", action="store_true", help="may manage members and tokens")
    p.add_argument("--expires-in", type=float, metavar="SECONDS", help="expire after this long")
    cmd(ksub, "list", _token_list, "list tokens (never their secrets)")
    p = cmd(ksub, "show", _token_show, "show one token")
    p.add_argument("id", help="the token's id (rq_<id>.<secret>) or its name")
    p = cmd(ksub, "revoke", _token_revoke, "revoke a token: every node refuses it at once")
    p.add_argument("id", help="the token's id or its name")
    new = ksub.add_parser("new", help="print a fresh random token for RAFTQ_ADMIN_TOKEN")
    new.set_defaults(func=_token_new)

    dlq = sub.add_parser("dlq", help="inspect and redrive dead-letter topics")
    dsub = dlq.add_subparsers(dest="dlq_cmd", required=True)
    p = cmd(dsub, "peek", _dlq_peek, "show dead letters without consuming them")
    p.add_argument("topic", help="the dead-letter topic, e.g. orders.dlq")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--from-seq", type=int)
    p = cmd(dsub, "redrive", _dlq_redrive, "move dead letters back to their source groups")
    p.add_argument("topic", help="the dead-letter topic, e.g. orders.dlq")
    p.add_argument("--max", type=int, default=100)


def _token(args: argparse.Namespace) -> str | None:
    """--token, else RAFTQ_TOKEN, else the token file (--token-file, else the dev cluster's)."""
    if args.token:
        return str(args.token)
    path = args.token_file or (DEV_TOKEN_FILE if os.path.exists(DEV_TOKEN_FILE) else None)
    if path is None:
        return None
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError as e:
        raise ValueError(f"--token-file: {e.strerror or e}: {path}") from None


def run(args: argparse.Namespace, fn: Handler) -> int:
    try:
        token = _token(args)
        with Client(
            args.url.split(","),
            timeout=args.timeout,
            token=token or "",
            ca=args.ca or None,
            cert=args.client_cert or None,
            key=args.client_key or None,
        ) as client:
            return fn(args, client)
    except TLSError as e:
        _fail(f"TLS: {e.message}")
        return EXIT_UNAVAILABLE
    except Unavailable as e:
        _fail(f"cluster unavailable: {e.message}")
        return EXIT_UNAVAILABLE
    except RaftqError as e:
        _fail(f"{e.code}: {e.message}")
        return EXIT_REFUSED
    except (ValueError, TypeError) as e:
        _fail(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


def _fail(msg: str) -> None:
    print(f"raftq: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------- output


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _emit(args: argparse.Namespace, data: Any, human: Callable[[], str]) -> int:
    if args.json:
        print(json.dumps(_jsonable(data), indent=None))
    else:
        print(human())
    return EXIT_OK


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, bytes):
        try:
            return obj.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(obj).decode()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def parse_config(items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; values are read as JSON when they parse (numbers, null, lists)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


# ---------------------------------------------------------------------- commands


def _status(args: argparse.Namespace, c: Client) -> int:
    info = c.cluster()

    def human() -> str:
        members = info.get("members") or {}
        leader = info.get("leader")
        rows = [
            [
                mid,
                m.get("api"),
                m.get("raft"),
                "leader" if mid == leader else "follower",
                "yes" if m.get("answers") else "no",
            ]
            for mid, m in sorted(members.items())
        ]
        head = (
            f"asked {info.get('node')} ({info.get('role')}): leader {leader or '(none)'}, "
            f"term {info.get('term')}, commit {info.get('commit_index')}, "
            f"applied {info.get('applied_index')}"
        )
        return head + "\n" + table(rows, ["node", "api", "raft", "role", "answers"])

    return _emit(args, info, human)


def _member_add(args: argparse.Namespace, c: Client) -> int:
    res = c.add_member(args.id, args.raft, args.api)
    return _emit(args, res, lambda: f"added {args.id}; members: {', '.join(res['members'])}")


def _member_remove(args: argparse.Namespace, c: Client) -> int:
    res = c.remove_member(args.id)
    return _emit(args, res, lambda: f"removed {args.id}; members: {', '.join(res['members'])}")


def _topic_create(args: argparse.Namespace, c: Client) -> int:
    res = c.create_topic(args.topic, parse_config(args.config), if_not_exists=args.if_not_exists)
    return _emit(
        args,
        res,
        lambda: (
            f"topic {args.topic} " + ("created" if res.get("created", True) else "already exists")
        ),
    )


def _topic_list(args: argparse.Namespace, c: Client) -> int:
    names = c.list_topics()
    rows = []
    for n in names:
        try:
            s = c.topic(n)
        except TopicNotFound:  # deleted since the list was read
            continue
        rows.append([n, s.get("messages"), s.get("bytes"), len(s.get("groups", []))])
    cols = ["topic", "messages", "bytes", "groups"]
    data = [dict(zip(cols, r, strict=True)) for r in rows]
    return _emit(args, data, lambda: table(rows, cols))


def _topic_show(args: argparse.Namespace, c: Client) -> int:
    s = c.topic(args.topic)

    def human() -> str:
        head = (
            f"topic {s['topic']}: {s.get('messages')} messages, {s.get('bytes')} bytes, "
            f"seq {s.get('first_seq')}..{s.get('last_seq')}, "
            f"published {s.get('published_total')}"
        )
        return head + "\n" + _groups_table(s.get("groups", []))

    return _emit(args, s, human)


def _groups_table(groups: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            g.get("group"),
            g.get("pending"),
            g.get("in_flight"),
            g.get("delayed"),
            g.get("acked_total"),
            g.get("dead_lettered_total"),
            g.get("consumers"),
        ]
        for g in groups
    ]
    return table(rows, ["group", "pending", "in_flight", "delayed", "acked", "dead", "consumers"])


def _topic_delete(args: argparse.Namespace, c: Client) -> int:
    res = c.delete_topic(args.topic)
    return _emit(args, res, lambda: f"topic {args.topic} deleted")


def _topic_purge(args: argparse.Namespace, c: Client) -> int:
    res = c.purge(args.topic)
    return _emit(args, res, lambda: f"purged {res.get('purged')} messages from {args.topic}")


def _group_create(args: argparse.Namespace, c: Client) -> int:
    res = c.create_group(
        args.topic,
        args.group,
        parse_config(args.config),
        start=args.start,
        if_not_exists=args.if_not_exists,
    )
    return _emit(
        args,
        res,
        lambda: (
            f"group {args.topic}/{args.group} "
            + ("created" if res.get("created", True) else "already exists")
        ),
    )


def _group_list(args: argparse.Namespace, c: Client) -> int:
    s = c.topic(args.topic)
    groups = s.get("groups", [])
    return _emit(args, groups, lambda: _groups_table(groups))


def _group_show(args: argparse.Namespace, c: Client) -> int:
    g = c.group(args.topic, args.group)
    return _emit(args, g, lambda: "\n".join(f"{k}: {v}" for k, v in g.items()))


def _group_delete(args: argparse.Namespace, c: Client) -> int:
    res = c.delete_group(args.topic, args.group)
    return _emit(args, res, lambda: f"group {args.topic}/{args.group} deleted")


def _publish(args: argparse.Namespace, c: Client) -> int:
    headers = {k: str(v) for k, v in parse_config(args.header).items()} or None
    if args.messages:
        if args.key and len(args.messages) != 1:
            raise ValueError("--key takes exactly one message")
        seqs = [
            c.publish(args.topic, m, headers=headers, key=args.key, delay=args.delay)
            for m in args.messages
        ]
        return _emit(args, {"seqs": seqs}, lambda: "\n".join(f"published seq {s}" for s in seqs))
    if args.key:
        raise ValueError("--key takes exactly one message, given as an argument (not stdin)")
    if args.batch < 1:
        raise ValueError("--batch must be at least 1")
    progress = sys.stderr.isatty() and not args.json
    total, first, last = 0, None, None
    started = time.monotonic()
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal total, first, last
        if not batch:
            return
        seqs = c.publish_batch(args.topic, batch)
        first = seqs[0] if first is None else first
        last = seqs[-1]
        total += len(batch)
        batch.clear()
        if progress:
            rate = total / max(1e-6, time.monotonic() - started)
            print(f"\rpublished {total} ({rate:,.0f}/s)", end="", file=sys.stderr, flush=True)

    for line in sys.stdin:
        m: dict[str, Any] = {"payload": line.rstrip("\n").encode()}
        if headers:
            m["headers"] = headers
        if args.delay is not None:
            m["delay"] = args.delay
        batch.append(m)
        if len(batch) >= args.batch:
            flush()
    flush()
    if progress:
        print(file=sys.stderr)
    res = {"published": total, "first_seq": first, "last_seq": last}
    return _emit(args, res, lambda: f"published {total} messages (seq {first}..{last})")


def _consume(args: argparse.Namespace, c: Client) -> int:
    if args.count is not None and args.count < 1:
        raise ValueError("--count must be at least 1")
    n = 0
    for msg in c.consume(
        args.topic,
        args.group,
        prefetch=args.prefetch,
        wait=20.0 if args.follow else min(args.wait, 20.0),
        max_messages=args.count,
        idle_timeout=None if args.follow else args.wait,
    ):
        if args.json:
            print(
                json.dumps(
                    _jsonable(
                        {
                            "seq": msg.seq,
                            "attempt": msg.attempt,
                            "headers": msg.headers,
                            "payload": msg.payload,
                        }
                    )
                ),
                flush=True,
            )
        else:
            print(msg.text, flush=True)
        if not args.no_ack:
            msg.ack()
        n += 1
    if not args.json:
        print(f"({n} messages)", file=sys.stderr)
    return EXIT_OK


def _dlq_peek(args: argparse.Namespace, c: Client) -> int:
    msgs = c.peek(args.topic, from_seq=args.from_seq, limit=args.limit)

    def human() -> str:
        rows = []
        for m in msgs:
            h = m.get("headers") or {}
            text = _jsonable(m.get("payload", b""))
            rows.append(
                [
                    m.get("seq"),
                    h.get("x-raftq-dlq-topic"),
                    h.get("x-raftq-dlq-group"),
                    h.get("x-raftq-dlq-attempts"),
                    h.get("x-raftq-dlq-reason"),
                    str(text)[:40],
                ]
            )
        return table(rows, ["seq", "source", "group", "attempts", "reason", "payload"])

    return _emit(args, msgs, human)


def _dlq_redrive(args: argparse.Namespace, c: Client) -> int:
    res = c.redrive(args.topic, max=args.max)
    return _emit(
        args,
        res,
        lambda: (
            f"redrove {res.get('redriven')} messages ({res.get('skipped', 0)} skipped: source gone)"
        ),
    )


# ---------------------------------------------------------------------- tokens


def parse_grants(items: Iterable[str]) -> list[dict[str, Any]]:
    """``TOPICS=ACTION,ACTION`` items as grants."""
    out = []
    for item in items:
        topics, sep, actions = item.partition("=")
        if not sep or not topics or not actions:
            raise ValueError(f"--grant: expected TOPICS=ACTIONS, got {item!r}")
        out.append({"topics": topics, "actions": [a.strip() for a in actions.split(",")]})
    return out


def _grants_text(grants: list[dict[str, Any]]) -> str:
    return " ".join(f"{g['topics']}={','.join(g['actions'])}" for g in grants) or "-"


def _tokens_table(tokens: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [t["id"], t["name"], _grants_text(t.get("grants") or []),
         "yes" if t.get("cluster") else "", "yes" if t.get("disabled") else "",
         _when(t.get("expires_at"))]
        for t in tokens
    ]  # fmt: skip
    return table(rows, ["id", "name", "grants", "cluster", "disabled", "expires"])


def _when(ms: int | None) -> str:
    return "" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _token_id(c: Client, given: str) -> str:
    """A token's id from its id, else from its name (a name that is another token's id is
    refused as ambiguous: revoking the wrong token would leave the right one live)."""
    tokens = c.list_tokens()
    by_id = [t for t in tokens if t["id"] == given]
    by_name = [t for t in tokens if t["name"] == given]
    if by_id and by_name and by_id[0]["id"] != by_name[0]["id"]:
        raise ValueError(
            f"{given!r} is the id of token {by_id[0]['name']!r} and the name of token"
            f" {by_name[0]['id']!r}: give the id of the one you mean"
        )
    found = by_id or by_name
    return str(found[0]["id"]) if found else given  # (the server says it is not found)


def _token_create(args: argparse.Namespace, c: Client) -> int:
    res = c.create_token(
        args.name, parse_grants(args.grant), cluster=args.cluster, expires_in=args.expires_in
    )

    def human() -> str:
        return (
            f"created token {res['name']} (id {res['id']}); its secret, shown only now:\n"
            f"{res['token']}"
        )

    return _emit(args, res, human)


def _token_list(args: argparse.Namespace, c: Client) -> int:
    tokens = c.list_tokens()
    return _emit(args, {"tokens": tokens}, lambda: _tokens_table(tokens))


def _token_show(args: argparse.Namespace, c: Client) -> int:
    t = c.token(_token_id(c, args.id))
    return _emit(args, t, lambda: _tokens_table([t]))


def _token_revoke(args: argparse.Namespace, c: Client) -> int:
    res = c.revoke_token(_token_id(c, args.id))
    return _emit(args, res, lambda: f"revoked token {res['id']}")


def _token_new(args: argparse.Namespace) -> int:
    import secrets

    print(f"rq_admin.{secrets.token_urlsafe(32)}")
    return EXIT_OK
