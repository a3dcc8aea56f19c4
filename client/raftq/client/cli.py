"""Client subcommands of the ``raftq`` CLI: status, topic, group, publish, consume, receive and
settle, dlq, token, context.

``raftq.node.cli`` owns the parser and the server commands and calls ``register`` to add these.
Client options (``--url``, ``--token``, ``--json``...) go before or after the subcommand. Where
to connect is, in order: flags, environment (``RAFTQ_URL``, ``RAFTQ_TOKEN``...), the named
context (``--context``, ``RAFTQ_CONTEXT``, else the config file's current one), then the local
dev cluster and the token file ``raftq cluster up`` writes. Every command prints a human table
by default and JSON with ``--json``; errors are one line on stderr (a JSON object with
``--json``). Exit codes: 0 done, 1 the server refused (bad input, not found, full...), 2 usage,
3 cluster unavailable or timed out (``status``: no leader answers), 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import errno
import json
import os
import re
import socket
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from raftq.client import _tls
from raftq.client._http_sync import SyncHttpPool
from raftq.client._sync import CONNECT_TIMEOUT, Client
from raftq.client.errors import (
    InvalidArgument,
    RaftqError,
    TLSError,
    TopicNotFound,
    Unavailable,
)
from raftq.client.transport import ConnectFailed, Response, Transport

DEFAULT_URLS = "http://127.0.0.1:8001,http://127.0.0.1:8002,http://127.0.0.1:8003"
DEV_TOKEN_FILE = os.path.join(".raftq", "admin.token")  # written by raftq cluster up
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# When every seed refuses connections for this long, nothing is listening there: say so now
# rather than retrying until --timeout: the command ends ~2 s after it started.
FAIL_FAST = 1.5

Handler = Callable[[argparse.Namespace, Client], int]
LocalHandler = Callable[[argparse.Namespace], int]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows an option's default when it has a meaningful one and its help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" not in text
            and default not in (None, False, argparse.SUPPRESS, [])
            and action.option_strings
        ):
            text += " (default: %(default)s)"
        return text


# One example per command, shown at the end of its --help.
EXAMPLES = {
    "status": "raftq status    # exits 3 when there is no leader",
    "settings": "raftq settings --max-retained-bytes 50GiB    # none: no limit",
    "member add": "raftq member add n4 10.0.0.4:9001 10.0.0.4:8001",
    "member remove": "raftq member remove n4",
    "topic create": "raftq topic create orders --config max_messages=100000",
    "topic list": "raftq topic list --json",
    "topic show": "raftq topic show orders",
    "topic peek": "raftq topic peek orders --limit 5 --from-seq 100",
    "topic delete": "raftq topic delete orders --yes",
    "topic purge": "raftq topic purge orders",
    "group create": "raftq group create orders billing --config max_attempts=5 --start earliest",
    "group list": "raftq group list orders",
    "group show": "raftq group show orders billing",
    "group delete": "raftq group delete orders billing",
    "publish": "tail -f app.log | raftq publish logs    # or: raftq publish orders '{\"id\": 1}'",
    "consume": "raftq consume orders --group billing --follow --verbose",
    "receive": (
        "raftq receive orders --group billing | while IFS=$'\\t' read -r receipt body; do\n"
        '    handle "$body" && raftq ack "$receipt" || raftq nack "$receipt" --delay 10; done'
    ),
    "ack": "raftq ack RECEIPT [RECEIPT...]",
    "nack": "raftq nack RECEIPT --delay 30",
    "extend": "raftq extend RECEIPT --seconds 60",
    "term": "raftq term RECEIPT --reason 'bad input'",
    "dlq peek": "raftq dlq peek orders.dlq",
    "dlq redrive": "raftq dlq redrive orders.dlq --max 1000",
    "token create": "raftq token create billing --grant 'billing.*=consume'",
    "token list": "raftq token list",
    "sqs credentials": "eval $(raftq sqs credentials)   # then: aws --endpoint-url ... sqs",
    "token show": "raftq token show billing",
    "token revoke": "raftq token revoke billing",
    "token new": "export RAFTQ_ADMIN_TOKEN=$(raftq token new)",
    "context add": (
        "raftq context add prod --url https://mq1:8001,https://mq2:8001"
        " --token-file ~/.raftq-prod.token --ca prod-ca.pem --use"
    ),
    "context use": "raftq context use prod",
    "context list": "raftq context list",
    "context remove": "raftq context remove prod",
}


def _client_options(p: argparse.ArgumentParser, top: bool) -> None:
    """The options every client command takes. They are given on the top parser (with their
    defaults) and again on each subcommand with no default (``SUPPRESS``), so that one given
    after the subcommand wins and one given before it is kept."""

    def d(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    g = p.add_argument_group("client options (before or after the command)")
    g.add_argument(
        "--url",
        default=d(None),
        help="comma-separated node URLs [RAFTQ_URL] (default: the context's, else the local"
        " 3-node cluster)",
    )
    g.add_argument(
        "--token",
        default=d(None),
        help="API token rq_<id>.<secret> [RAFTQ_TOKEN] (default: --token-file, the context's,"
        f" else {DEV_TOKEN_FILE} when it exists: the one raftq cluster up writes)",
    )
    g.add_argument(
        "--token-file", default=d(None), help="read the token from this file [RAFTQ_TOKEN_FILE]"
    )
    g.add_argument(
        "--ca",
        default=d(None),
        help="CA file (PEM) to verify https:// nodes with [RAFTQ_CA] (default: the context's,"
        " else the system's store)",
    )
    g.add_argument(
        "--client-cert",
        default=d(None),
        help="client certificate (PEM) for nodes that require one [RAFTQ_CLIENT_CERT]",
    )
    g.add_argument(
        "--client-key",
        default=d(None),
        help="its private key, if not in the --client-cert file [RAFTQ_CLIENT_KEY]",
    )
    g.add_argument(
        "--context",
        default=d(None),
        help="named context from the config file [RAFTQ_CONTEXT] (default: its current one)",
    )
    g.add_argument("--json", action="store_true", default=d(False), help="print JSON (errors too)")
    g.add_argument(
        "--timeout", type=float, default=d(30.0), help="overall seconds per call (default 30)"
    )


def register(sub: Any, parser: argparse.ArgumentParser | None = None) -> None:
    """Add the client commands to an ``argparse`` subparsers object, and (given the top
    parser) the client options and ``--version`` to it."""
    if parser is not None:
        _client_options(parser, top=True)
        parser.add_argument("--version", action="version", version=f"raftq {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    _client_options(common, top=False)

    def group(name: str, help: str) -> Any:
        p = sub.add_parser(name, help=help, description=help)
        return p.add_subparsers(dest=f"{name}_cmd", required=True, metavar="COMMAND")

    def cmd(
        parser: Any,
        key: str,
        fn: Handler | None,
        help: str,
        local: LocalHandler | None = None,
    ) -> argparse.ArgumentParser:
        example = EXAMPLES.get(key)
        p: argparse.ArgumentParser = parser.add_parser(
            key.rsplit(" ", 1)[-1],
            parents=[common],
            help=help,
            description=help,
            formatter_class=_Formatter,
            epilog=f"example:\n  {example}" if example else None,
        )
        if local is not None:
            p.set_defaults(func=lambda args: run_local(args, local))
        else:
            assert fn is not None
            p.set_defaults(func=lambda args: run(args, fn))
        return p

    cmd(sub, "status", _status, "show the cluster: members, observed roles, leader, indexes")

    p = cmd(
        sub,
        "settings",
        _settings,
        "show the cluster settings and the bytes retained, or change a setting (a cluster token)",
    )
    p.add_argument(
        "--max-retained-bytes",
        type=size_arg,
        default=argparse.SUPPRESS,
        metavar="SIZE",
        help="payload bytes retained over every topic at most (e.g. 50GiB, 500MB; none: no"
        " limit): a publish past it is refused, storage_full",
    )

    msub = group("member", "add or remove cluster members")
    p = cmd(msub, "member add", _member_add, "add a started node to the cluster")
    p.add_argument("id")
    p.add_argument("raft", help="its Raft host:port")
    p.add_argument("api", help="its HTTP host:port")
    p = cmd(msub, "member remove", _member_remove, "remove a node from the cluster")
    p.add_argument("id")

    ssub = group("sqs", "the SQS-compatible endpoint")
    cmd(
        ssub,
        "sqs credentials",
        _sqs_credentials,
        "this token's SQS credentials (access key id, secret access key), as shell exports",
    )

    tsub = group("topic", "create, list, show, peek, delete or purge topics")
    p = cmd(tsub, "topic create", _topic_create, "create a topic")
    p.add_argument("topic")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic config, e.g. max_messages=1000 overflow=drop_oldest",
    )
    p.add_argument("--if-not-exists", action="store_true", help="succeed if it exists already")
    cmd(tsub, "topic list", _topic_list, "list topics")
    p = cmd(tsub, "topic show", _topic_show, "show a topic's stats and groups")
    p.add_argument("topic")
    p = cmd(tsub, "topic peek", _topic_peek, "show retained messages without consuming them")
    p.add_argument("topic")
    p.add_argument("--limit", type=int, default=10, help="at most this many messages")
    p.add_argument("--from-seq", type=int, help="first sequence number (default: the oldest)")
    p = cmd(tsub, "topic delete", _topic_delete, "delete a topic and its messages")
    p.add_argument("topic")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p = cmd(tsub, "topic purge", _topic_purge, "drop every message of a topic")
    p.add_argument("topic")

    gsub = group("group", "create, list, show or delete consumer groups")
    p = cmd(gsub, "group create", _group_create, "create a consumer group")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="group config, e.g. visibility_timeout=60 max_attempts=3 backoff=[1,5]",
    )
    p.add_argument(
        "--start",
        choices=["latest", "earliest"],
        default="latest",
        help="deliver messages published from now on, or every retained one",
    )
    p.add_argument("--if-not-exists", action="store_true", help="succeed if it exists already")
    p = cmd(gsub, "group list", _group_list, "list a topic's groups")
    p.add_argument("topic")
    p = cmd(gsub, "group show", _group_show, "show a group's stats and config")
    p.add_argument("topic")
    p.add_argument("group")
    p = cmd(gsub, "group delete", _group_delete, "delete a consumer group")
    p.add_argument("topic")
    p.add_argument("group")

    p = cmd(sub, "publish", _publish, "publish messages (arguments, or one per stdin line)")
    p.add_argument("topic")
    p.add_argument(
        "messages",
        nargs="*",
        help="payloads; none: read lines (bytes) from stdin, each sent as soon as it is read",
    )
    p.add_argument("--header", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    p.add_argument("--key", help="idempotency key (single message only)")
    p.add_argument("--delay", type=float, help="seconds before the message becomes available")
    p.add_argument(
        "--batch", type=int, default=100, help="at most this many stdin lines per request"
    )
    # ``publish t --key k hello``: argparse gives the payload after an option back unparsed
    p.set_defaults(extra_positionals="messages")

    p = cmd(sub, "consume", _consume, "receive messages, print and acknowledge them")
    p.add_argument("topic")
    p.add_argument("--group", default="default", help="consumer group")
    p.add_argument("--count", type=int, help="stop after this many messages")
    p.add_argument("--follow", action="store_true", help="keep waiting for new messages")
    p.add_argument(
        "--wait",
        type=float,
        default=2.0,
        help="without --follow: stop after this many idle seconds",
    )
    p.add_argument("--prefetch", type=int, default=10, help="messages asked for at a time")
    p.add_argument(
        "--no-ack", action="store_true", help="do not acknowledge; deliveries are released on exit"
    )
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="print each message's seq, attempt, size and headers before its payload",
    )

    p = cmd(
        sub,
        "receive",
        _receive,
        "receive messages without settling them: print each one's receipt, a tab, its payload"
        " (settle them with ack, nack, extend or term)",
    )
    p.add_argument("topic")
    p.add_argument("--group", default="default", help="consumer group")
    p.add_argument("--max", type=int, default=1, help="at most this many messages")
    p.add_argument("--wait", type=float, default=0.0, help="long-poll up to this many seconds")
    p.add_argument(
        "--visibility",
        type=float,
        help="seconds before an unsettled message is delivered again (default: the group's)",
    )
    for key, fn, help in (
        ("ack", _ack, "acknowledge received messages: they are done"),
        ("nack", _nack, "give received messages back for redelivery"),
        ("extend", _extend, "give received messages more time before redelivery"),
        ("term", _term, "dead-letter received messages: they will never succeed"),
    ):
        p = cmd(sub, key, fn, help)
        p.add_argument("receipts", nargs="+", metavar="RECEIPT", help="as receive printed them")
        if key == "nack":
            p.add_argument("--delay", type=float, help="seconds before redelivery")
        elif key == "extend":
            p.add_argument("--seconds", type=float, required=True, help="new deadline from now")
        elif key == "term":
            p.add_argument("--reason", default="terminated", help="kept in the dead letter")

    ksub = group("token", "create, list, show or revoke API tokens")
    p = cmd(ksub, "token create", _token_create, "create a token; its secret is printed once")
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
    cmd(ksub, "token list", _token_list, "list tokens (never their secrets)")
    p = cmd(ksub, "token show", _token_show, "show one token")
    p.add_argument("id", help="the token's id (rq_<id>.<secret>) or its name")
    p = cmd(ksub, "token revoke", _token_revoke, "revoke a token: every node refuses it at once")
    p.add_argument("id", help="the token's id or its name")
    cmd(ksub, "token new", None, "print a fresh random token for RAFTQ_ADMIN_TOKEN", _token_new)

    dsub = group("dlq", "inspect and redrive dead-letter topics")
    p = cmd(dsub, "dlq peek", _dlq_peek, "show dead letters without consuming them")
    p.add_argument("topic", help="the dead-letter topic, e.g. orders.dlq")
    p.add_argument("--limit", type=int, default=10, help="at most this many messages")
    p.add_argument("--from-seq", type=int, help="first sequence number (default: the oldest)")
    p = cmd(dsub, "dlq redrive", _dlq_redrive, "move dead letters back to their source groups")
    p.add_argument("topic", help="the dead-letter topic, e.g. orders.dlq")
    p.add_argument("--max", type=int, default=100, help="move at most this many")

    csub = group("context", f"named connection settings, kept in {_config_path_help()}")
    p = cmd(
        csub,
        "context add",
        None,
        "add (or replace) a context from --url, --token-file or --token, --ca...",
        _context_add,
    )
    p.add_argument("name")
    p.add_argument("--use", action="store_true", help="make it the current context")
    p = cmd(csub, "context use", None, "make a context the current one", _context_use)
    p.add_argument("name")
    cmd(csub, "context list", None, "list contexts (* marks the current one)", _context_list)
    p = cmd(csub, "context remove", None, "remove a context", _context_remove)
    p.add_argument("name")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raftq")
    except PackageNotFoundError:  # (run from a source tree without installing)
        return "unknown"


# ---------------------------------------------------------------------- contexts


def config_path() -> str:
    """``$RAFTQ_CONFIG``, else ``$XDG_CONFIG_HOME/raftq/config.toml`` (``~/.config``)."""
    if os.environ.get("RAFTQ_CONFIG"):
        return os.environ["RAFTQ_CONFIG"]
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "raftq", "config.toml")


def _config_path_help() -> str:
    return "$RAFTQ_CONFIG or ~/.config/raftq/config.toml"


CONTEXT_KEYS = ("url", "token", "token_file", "ca", "client_cert", "client_key")


def load_config() -> dict[str, Any]:
    """``{"current": name, "contexts": {name: {url, token_file|token, ca...}}}``; a missing
    file is an empty config, a broken one a usage error naming the file."""
    path = config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {"contexts": {}}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"config file {path}: {e}") from None
    contexts = data.get("contexts", {})
    if not isinstance(contexts, dict) or not all(isinstance(c, dict) for c in contexts.values()):
        raise ValueError(f"config file {path}: [contexts.NAME] tables expected")
    return {"current": data.get("current"), "contexts": contexts}


def save_config(cfg: Mapping[str, Any]) -> str:
    """Write the config (mode 0600: it may hold a token). TOML strings are written as JSON
    strings, which TOML reads alike."""
    path = config_path()
    lines = []
    if cfg.get("current"):
        lines.append(f"current = {json.dumps(cfg['current'])}")
    for name, ctx in sorted(cfg["contexts"].items()):
        lines.append(f"\n[contexts.{json.dumps(name)}]")
        lines += [f"{k} = {json.dumps(str(ctx[k]))}" for k in CONTEXT_KEYS if ctx.get(k)]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines).lstrip("\n") + "\n")
    os.replace(path + ".tmp", path)
    return path


def _context(args: argparse.Namespace) -> dict[str, Any]:
    """The context in use: --context, else RAFTQ_CONTEXT, else the config's current; {}."""
    name = args.context or os.environ.get("RAFTQ_CONTEXT")
    cfg = load_config()
    if name is None:
        name = cfg.get("current")
        if name is None:
            return {}
    if name not in cfg["contexts"]:
        raise ValueError(f"no context {name!r} in {config_path()} (raftq context list)")
    return dict(cfg["contexts"][name])


def _setting(args: argparse.Namespace, ctx: Mapping[str, Any], name: str) -> str | None:
    """A flag, else its environment variable, else the context's value."""
    value = getattr(args, name, None) or os.environ.get(f"RAFTQ_{name.upper()}") or ctx.get(name)
    return str(value) if value else None


def _token(args: argparse.Namespace, ctx: Mapping[str, Any]) -> str | None:
    """--token, --token-file, RAFTQ_TOKEN, RAFTQ_TOKEN_FILE, the context's token or token file,
    else the dev cluster's token file when it is there."""
    for given, is_file in (
        (args.token, False),
        (args.token_file, True),
        (os.environ.get("RAFTQ_TOKEN"), False),
        (os.environ.get("RAFTQ_TOKEN_FILE"), True),
        (ctx.get("token"), False),
        (ctx.get("token_file"), True),
        (DEV_TOKEN_FILE if os.path.exists(DEV_TOKEN_FILE) else None, True),
    ):
        if given:
            return _read_token(str(given)) if is_file else str(given)
    return None


def _read_token(path: str) -> str | None:
    path = os.path.expanduser(path)
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError as e:
        raise ValueError(f"token file: {e.strerror or e}: {path}") from None


def _context_add(args: argparse.Namespace) -> int:
    if not args.url:
        raise ValueError("context add: --url is required")
    cfg = load_config()
    ctx = {"url": args.url, "token": args.token, "token_file": args.token_file, "ca": args.ca,
           "client_cert": args.client_cert, "client_key": args.client_key}  # fmt: skip
    for k in ("token_file", "ca", "client_cert", "client_key"):
        if ctx[k]:
            ctx[k] = os.path.abspath(os.path.expanduser(ctx[k]))  # (used from any directory)
    cfg["contexts"][args.name] = {k: v for k, v in ctx.items() if v}
    if args.use or not cfg.get("current"):
        cfg["current"] = args.name
    path = save_config(cfg)
    return _emit(args, {"context": args.name, "file": path}, lambda: f"context {args.name} saved"
                 f" in {path}" + (" (current)" if cfg["current"] == args.name else ""))  # fmt: skip


def _context_use(args: argparse.Namespace) -> int:
    cfg = load_config()
    if args.name not in cfg["contexts"]:
        raise ValueError(f"no context {args.name!r} in {config_path()} (raftq context list)")
    cfg["current"] = args.name
    save_config(cfg)
    return _emit(args, {"current": args.name}, lambda: f"using context {args.name}")


def _context_remove(args: argparse.Namespace) -> int:
    cfg = load_config()
    if cfg["contexts"].pop(args.name, None) is None:
        raise ValueError(f"no context {args.name!r} in {config_path()}")
    if cfg.get("current") == args.name:
        cfg["current"] = None
    save_config(cfg)
    return _emit(args, {"removed": args.name}, lambda: f"context {args.name} removed")


def _context_list(args: argparse.Namespace) -> int:
    cfg = load_config()
    cur = cfg.get("current")
    data = [
        {"name": n, "current": n == cur, "url": c.get("url"),
         "token": "token" if c.get("token") else c.get("token_file"), "ca": c.get("ca")}
        for n, c in sorted(cfg["contexts"].items())
    ]  # fmt: skip
    rows = [["*" if d["current"] else "", d["name"], d["url"], d["token"], d["ca"]] for d in data]
    return _emit(args, data, lambda: table(rows, ["", "context", "url", "token", "ca"]))


# ---------------------------------------------------------------------- running a command


class AllRefused(Exception):
    """Every seed refused the connection for ``FAIL_FAST`` seconds: nothing listens there."""


class _RefusalWatch:
    """The default transport, remembering which seeds refuse connections: once every one has
    refused for ``FAIL_FAST`` s with no answer from any node in between, ``AllRefused`` ends the
    call (the client retries unavailable nodes until its timeout)."""

    def __init__(self, inner: Transport, seeds: Sequence[str]) -> None:
        self.inner = inner
        self.seeds = {_origin(u) for u in seeds}
        self.refused: dict[str, float] = {}

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> Response:
        try:
            resp = self.inner.request(method, url, headers, body, timeout)
        except ConnectFailed as e:
            if _refused(e.__cause__):
                now = time.monotonic()
                self.refused.setdefault(_origin(url), now)
                if (
                    self.seeds <= self.refused.keys()
                    and now - min(self.refused.values()) >= FAIL_FAST
                ):
                    raise AllRefused(sorted(self.seeds)) from None
            raise
        self.refused.clear()
        return resp

    def close(self) -> None:
        self.inner.close()


def _origin(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else "http://" + url)
    return f"{parts.scheme}://{parts.netloc}"


def _refused(exc: BaseException | None) -> bool:
    return isinstance(exc, ConnectionRefusedError | socket.gaierror) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
    )


# What the client options are when given nowhere (the top parser sets them too).
CLIENT_DEFAULTS = {"url": None, "token": None, "token_file": None, "ca": None,
                   "client_cert": None, "client_key": None, "context": None, "json": False,
                   "timeout": 30.0}  # fmt: skip


def _defaults(args: argparse.Namespace) -> None:
    for name, value in CLIENT_DEFAULTS.items():
        if not hasattr(args, name):  # (a parser without the top-level options)
            setattr(args, name, value)


def run(args: argparse.Namespace, fn: Handler) -> int:
    _defaults(args)
    try:
        ctx = _context(args)
        urls = [u.strip() for u in (_setting(args, ctx, "url") or DEFAULT_URLS).split(",")]
        token = _token(args, ctx)
        ssl_context = _tls.client_context(
            _setting(args, ctx, "ca"),
            _setting(args, ctx, "client_cert"),
            _setting(args, ctx, "client_key"),
        )
        pool = SyncHttpPool(connect_timeout=CONNECT_TIMEOUT, ssl_context=ssl_context)
        with Client(
            urls, timeout=args.timeout, token=token or "", transport=_RefusalWatch(pool, urls)
        ) as client:
            return fn(args, client)
    except AllRefused as e:
        return _fail(
            args, EXIT_UNAVAILABLE, "unavailable",
            f"cluster unavailable: connection refused by {', '.join(e.args[0])}",
        )  # fmt: skip
    except TLSError as e:
        return _fail(args, EXIT_UNAVAILABLE, e.code, f"TLS: {e.message}")
    except Unavailable as e:
        return _fail(args, EXIT_UNAVAILABLE, e.code, f"cluster unavailable: {e.message}")
    except RaftqError as e:
        code = e.server_code or e.code
        return _fail(args, EXIT_REFUSED, code, f"{code}: {e.message}", e.details)
    except BrokenPipeError:
        return EXIT_OK
    except (ValueError, TypeError, OSError) as e:
        return _fail(args, EXIT_USAGE, "usage", str(e))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def run_local(args: argparse.Namespace, fn: LocalHandler) -> int:
    """A command that calls no node (contexts, token new)."""
    _defaults(args)
    try:
        return fn(args)
    except (ValueError, OSError) as e:
        return _fail(args, EXIT_USAGE, "usage", str(e))


def _fail(
    args: argparse.Namespace,
    exit_code: int,
    code: str,
    msg: str,
    details: Mapping[str, Any] | None = None,
) -> int:
    """One line on stderr: ``raftq: <message>``, or with --json
    ``{"error": {"code", "message", "details"}, "exit": n}``."""
    if getattr(args, "json", False):
        err = {"code": code, "message": msg, "details": _jsonable(dict(details or {}))}
        print(json.dumps({"error": err, "exit": exit_code}), file=sys.stderr)
    else:
        print(f"raftq: {msg}", file=sys.stderr)
    return exit_code


# ---------------------------------------------------------------------- output


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def plural(n: Any, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def size(n: object) -> str:
    """Bytes for people: 512 B, 1.5 KiB, 20 MiB (blank for anything but a number)."""
    if not isinstance(n, int | float):
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def age(ms: object) -> str:
    """Milliseconds for people: 850ms, 42s, 3m20s, 5h02m, 2d03h (blank for anything but a
    number)."""
    if not isinstance(ms, int | float):
        return ""
    if ms < 1000:
        return f"{int(ms)}ms"
    s = int(ms // 1000)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _seq_range(first: int | None, last: int | None) -> str:
    return "no messages" if first is None else f"seq {first}..{last}"


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


def _preview(payload: Any, width: int = 40) -> str:
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else str(payload)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _value(v: Any) -> str:
    return "-" if v is None else json.dumps(v) if isinstance(v, list | dict) else str(v)


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
    leader = info.get("leader")
    members = info.get("members") or {}

    def role(mid: str, m: Mapping[str, Any]) -> str:
        """What was observed: the asked node's own role; another answers or does not."""
        if mid == info.get("node"):
            return str(info.get("role"))
        if not m.get("answers"):
            return "leader (no answer)" if mid == leader else "no answer"
        return "leader" if mid == leader else "follower"

    for mid, m in members.items():
        m["observed_role"] = role(mid, m)

    def human() -> str:
        answers = {mid: "yes" if m.get("answers") else "no" for mid, m in members.items()}
        rows = [
            [mid, m.get("api"), m.get("raft"), m["observed_role"], answers[mid]]
            for mid, m in sorted(members.items())
        ]
        head = (
            f"asked {info.get('node')} ({info.get('role')}): leader {leader or '(none)'}, "
            f"term {info.get('term')}, commit {info.get('commit_index')}, "
            f"applied {info.get('applied_index')}"
        )
        return head + "\n" + table(rows, ["node", "api", "raft", "role", "answers"])

    _emit(args, info, human)
    if not leader:
        return _fail(args, EXIT_UNAVAILABLE, "no_leader", "no leader: the cluster cannot serve")
    if not (members.get(leader) or {}).get("answers"):
        return _fail(args, EXIT_UNAVAILABLE, "no_leader", f"the leader {leader} does not answer")
    return EXIT_OK


_SIZE = re.compile(r"([0-9]+)\s*([kmgt]i?)?b?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE_UNITS.update({"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40})


def size_arg(text: str) -> int | None:
    """``50GiB``, ``500MB``, ``1000`` (bytes) or ``none``. (The node's ``--min-free-disk``
    reads the same, and percentages: ``raftq.node.diskguard``; the client imports no node
    code.)"""
    if text.strip().lower() in ("none", "null"):
        return None
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size (e.g. 50GiB, 500MB, none): {text!r}")
    return int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]


def _settings(args: argparse.Namespace, c: Client) -> int:
    if hasattr(args, "max_retained_bytes"):
        res = c.update_cluster_settings(max_retained_bytes=args.max_retained_bytes)
    else:
        res = c.cluster_settings()

    def human() -> str:
        limit = res["settings"]["max_retained_bytes"]
        shown = "none" if limit is None else f"{limit} ({size(limit)})"
        retained = res["retained_bytes"]
        return f"max_retained_bytes  {shown}\nretained_bytes      {retained} ({size(retained)})"

    return _emit(args, res, human)


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
    stats = []
    for n in names:
        try:
            stats.append(c.topic(n))
        except TopicNotFound:  # deleted since the list was read
            continue
    data = [
        {"topic": s["topic"], "messages": s.get("messages"), "bytes": s.get("bytes"),
         "oldest_age_ms": s.get("oldest_age_ms"), "groups": len(s.get("groups", []))}
        for s in stats
    ]  # fmt: skip
    rows = [
        [d["topic"], d["messages"], size(d["bytes"]), age(d["oldest_age_ms"]), d["groups"]]
        for d in data
    ]
    return _emit(args, data, lambda: table(rows, ["topic", "messages", "size", "oldest", "groups"]))


def _topic_show(args: argparse.Namespace, c: Client) -> int:
    s = c.topic(args.topic)

    def human() -> str:
        head = (
            f"topic {s['topic']}: {plural(s.get('messages'), 'message')}, {size(s.get('bytes'))}, "
            f"{_seq_range(s.get('first_seq'), s.get('last_seq'))}, "
            f"oldest {age(s.get('oldest_age_ms')) or '-'}, "
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
            age(g.get("oldest_age_ms")),
            g.get("acked_total"),
            g.get("dead_lettered_total"),
            g.get("consumers"),
        ]
        for g in groups
    ]
    header = ["group", "pending", "in_flight", "delayed", "oldest", "acked", "dead", "consumers"]
    return table(rows, header)


def _topic_peek(args: argparse.Namespace, c: Client) -> int:
    msgs = c.peek(args.topic, from_seq=args.from_seq, limit=args.limit)
    now_ms = time.time() * 1000

    def human() -> str:
        rows = [
            [
                m.get("seq"),
                age(max(0, now_ms - m["published_at"])) if m.get("published_at") else "",
                size(len(m.get("payload", b""))),
                " ".join(f"{k}={v}" for k, v in (m.get("headers") or {}).items()),
                _preview(m.get("payload", b"")),
            ]
            for m in msgs
        ]
        return table(rows, ["seq", "age", "size", "headers", "payload"])

    return _emit(args, msgs, human)


def _confirm(question: str) -> bool:
    """Ask on the terminal; without one (a script), refuse: it must say --yes."""
    if not sys.stdin.isatty():
        raise ValueError(f"{question}: not confirmed (no terminal to ask on; give --yes)")
    answer = input(f"{question} [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _topic_delete(args: argparse.Namespace, c: Client) -> int:
    if not args.yes:
        s = c.topic(args.topic)
        question = (
            f"delete topic {args.topic}, its {plural(s.get('messages'), 'message')} and"
            f" {plural(len(s.get('groups', [])), 'group')}?"
        )
        if not _confirm(question):
            return _fail(args, EXIT_USAGE, "not_confirmed", f"topic {args.topic} kept")
    res = c.delete_topic(args.topic)
    return _emit(args, res, lambda: f"topic {args.topic} deleted")


def _topic_purge(args: argparse.Namespace, c: Client) -> int:
    res = c.purge(args.topic)
    return _emit(
        args, res, lambda: f"purged {plural(res.get('purged'), 'message')} from {args.topic}"
    )


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

    def human() -> str:
        stats = [[k.removesuffix("_ms"), age(v)] if k.endswith("_age_ms") else [k, _value(v)]
                 for k, v in g.items() if k not in ("config", "group")]  # fmt: skip
        config = [[k, _value(v)] for k, v in sorted((g.get("config") or {}).items())]
        return (
            f"group {args.topic}/{g.get('group', args.group)}\n"
            + table(stats, ["stat", "value"])
            + "\n\n"
            + table(config, ["config", "value"])
        )

    return _emit(args, g, human)


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
    total, rejected, lineno, first, last = 0, 0, 0, None, None
    started = time.monotonic()

    def message(line: bytes) -> dict[str, Any]:
        m: dict[str, Any] = {"payload": line}
        if headers:
            m["headers"] = headers
        if args.delay is not None:
            m["delay"] = args.delay
        return m

    def send(lines: list[bytes]) -> None:
        nonlocal total, rejected, lineno, first, last
        try:
            seqs = c.publish_batch(args.topic, [message(line) for line in lines])
        except InvalidArgument as e:
            if len(lines) == 1:  # this line's own fault: said, and the others go on
                rejected += 1
                _fail(args, EXIT_REFUSED, e.server_code or e.code,
                      f"line {lineno + 1} not published: {e.server_code or e.code}: {e.message}",
                      e.details)  # fmt: skip
                lineno += 1
                return
            for line in lines:  # (a refused batch stored nothing: find the line(s) at fault)
                send([line])
            return
        lineno += len(lines)
        first = seqs[0] if first is None else first
        last = seqs[-1]
        total += len(lines)
        if progress:
            rate = total / max(1e-6, time.monotonic() - started)
            print(f"\rpublished {total} ({rate:,.0f}/s)", end="", file=sys.stderr, flush=True)

    for lines in stdin_lines(args.batch):
        send(lines)
    if progress:
        print(file=sys.stderr)
    res = {"published": total, "rejected": rejected, "first_seq": first, "last_seq": last}

    def human() -> str:
        text = f"published {plural(total, 'message')} ({_seq_range(first, last)})"
        return text + (f", {rejected} rejected" if rejected else "")

    _emit(args, res, human)
    return EXIT_REFUSED if rejected else EXIT_OK


def stdin_lines(most: int) -> Iterable[list[bytes]]:
    """stdin's lines as bytes (no decoding: a payload is any bytes), in lists of at most
    ``most``, each list as soon as what stdin had ready is read: slow input (``tail -f``) goes
    out line by line, fast input in full batches. A last line without a newline counts."""
    stream: Any = sys.stdin.buffer  # (a BufferedReader: read1 returns what is there)
    pending = b""
    while True:
        chunk = stream.read1(65536)  # what is there now, waiting only when nothing is
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for i in range(0, len(lines), most):
            yield lines[i : i + most]
    if pending:
        yield [pending]


def _message_json(msg: Any, receipt: bool = False) -> str:
    data = {"seq": msg.seq, "attempt": msg.attempt, "headers": msg.headers, "payload": msg.payload}
    if receipt:
        data = {"receipt": msg.receipt, **data}
    return json.dumps(_jsonable(data))


def _verbose(msg: Any) -> str:
    """``#seq attempt=N size=S [k=v ...]`` and the payload on the lines after."""
    head = f"#{msg.seq} attempt={msg.attempt} size={size(len(msg.payload))}"
    if msg.published_at_ms:
        head += f" age={age(max(0, time.time() * 1000 - msg.published_at_ms))}"
    head += "".join(f" {k}={v}" for k, v in msg.headers.items())
    return f"{head}\n{msg.text}"


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
            print(_message_json(msg), flush=True)
        elif args.verbose:
            print(_verbose(msg), flush=True)
        else:
            print(msg.text, flush=True)
        if not args.no_ack:
            msg.ack()
        n += 1
    if not args.json:
        print(f"({plural(n, 'message')})", file=sys.stderr)
    return EXIT_OK


def _receive(args: argparse.Namespace, c: Client) -> int:
    if args.max < 1:
        raise ValueError("--max must be at least 1")
    msgs = c.receive(
        args.topic, args.group, max=args.max, wait=args.wait, visibility=args.visibility
    )
    for msg in msgs:
        if args.json:
            print(_message_json(msg, receipt=True), flush=True)
        else:  # (a payload's own newlines would split it: workers that may get some use --json)
            print(f"{msg.receipt}\t{msg.text}", flush=True)
    return EXIT_OK


def _settled(args: argparse.Namespace, verb: str, res: Any) -> int:
    return _emit(args, res, lambda: f"{verb} {plural(len(args.receipts), 'message')}")


def _ack(args: argparse.Namespace, c: Client) -> int:
    return _settled(args, "acked", c.ack(args.receipts))


def _nack(args: argparse.Namespace, c: Client) -> int:
    return _settled(args, "nacked", c.nack(args.receipts, delay=args.delay))


def _extend(args: argparse.Namespace, c: Client) -> int:
    return _settled(args, "extended", c.extend(args.receipts, args.seconds))


def _term(args: argparse.Namespace, c: Client) -> int:
    return _settled(args, "terminated", c.term(args.receipts, reason=args.reason))


def _require_dlq(c: Client, topic: str, sample: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a topic that is not a dead-letter topic: no group sends its dead letters there
    and what it holds did not come as dead letters."""
    if any(DLQ_SOURCE in (m.get("headers") or {}) for m in sample):
        return
    c.topic(topic)  # (a missing topic: the server's topic_not_found)
    base = topic.removesuffix(".dlq")
    names = c.list_topics()
    for name in sorted(names, key=lambda n: n != base):  # (the default name's source first)
        try:
            groups = c.topic(name).get("groups", [])
        except TopicNotFound:
            continue
        if any((g.get("config") or {}).get("dead_letter_topic") == topic for g in groups):
            return
    raise ValueError(
        f"{topic} is not a dead-letter topic: no group sends dead letters to it (set a"
        f" group's dead_letter_topic; raftq topic peek {topic} shows its messages)"
    )


DLQ_SOURCE = "x-raftq-dlq-topic"


def _dlq_peek(args: argparse.Namespace, c: Client) -> int:
    msgs = c.peek(args.topic, from_seq=args.from_seq, limit=args.limit)
    _require_dlq(c, args.topic, msgs)

    def human() -> str:
        rows = []
        for m in msgs:
            h = m.get("headers") or {}
            rows.append(
                [
                    m.get("seq"),
                    h.get(DLQ_SOURCE),
                    h.get("x-raftq-dlq-group"),
                    h.get("x-raftq-dlq-attempts"),
                    h.get("x-raftq-dlq-reason"),
                    _preview(m.get("payload", b"")),
                ]
            )
        return table(rows, ["seq", "source", "group", "attempts", "reason", "payload"])

    return _emit(args, msgs, human)


def _dlq_redrive(args: argparse.Namespace, c: Client) -> int:
    _require_dlq(c, args.topic, c.peek(args.topic, limit=1))
    res = c.redrive(args.topic, max=args.max)
    return _emit(
        args,
        res,
        lambda: (
            f"redrove {plural(res.get('redriven'), 'message')}"
            f" ({res.get('skipped', 0)} skipped: source gone)"
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


def _sqs_credentials(args: argparse.Namespace, c: Client) -> int:
    creds = c.sqs_credentials()

    def human() -> str:
        return (
            f"export AWS_ACCESS_KEY_ID={creds['access_key_id']}"
            f" AWS_SECRET_ACCESS_KEY={creds['secret_access_key']}"
            f" AWS_DEFAULT_REGION={creds.get('region', 'us-east-1')}"
        )

    return _emit(args, creds, human)


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
