"""The client CLI against one in-process node (LocalRaft, real HTTP on 127.0.0.1): where it
connects, how it fails, publishing from a pipe, settling by receipt, and what it prints."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tests.client.conftest import name
from tests.support import ADMIN_TOKEN, free_ports, wait_for

from raftq.client import cli
from raftq.client.cli import EXAMPLES, EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE
from raftq.node.cli import build_parser
from raftq.node.cli import main as cli_main
from raftq.node.local import LocalRaft


def run_cli(*argv: str, stdin: str | bytes = b"") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    data = stdin.encode() if isinstance(stdin, str) else stdin
    fake_in = io.TextIOWrapper(io.BufferedReader(io.BytesIO(data)))
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _swapped_stdin(fake_in),
    ):
        code = cli_main(list(argv))
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _swapped_stdin(new: Any) -> Iterator[None]:
    old, sys.stdin = sys.stdin, new
    try:
        yield
    finally:
        sys.stdin = old


def stats(raft: LocalRaft, topic: str) -> dict[str, Any]:
    return raft.read(lambda b: b.topic_stats(topic))


async def test_client_options_go_before_or_after_the_command(
    server: tuple[LocalRaft, str],
) -> None:
    _, url = server
    topic = name()

    def work() -> None:
        assert run_cli("--url", url, "topic", "create", topic)[0] == EXIT_OK
        code, out, _ = run_cli("--url", url, "--json", "topic", "show", topic)
        assert code == EXIT_OK and json.loads(out)["topic"] == topic
        # after the command, a flag wins over the same flag before it
        code, out, _ = run_cli("--url", "http://127.0.0.1:1", "topic", "show", topic, "--url", url)
        assert code == EXIT_OK and topic in out
        with pytest.raises(SystemExit) as done:
            run_cli("--version")
        assert done.value.code == 0
        # a parser built without the top-level options still has their defaults
        bare = argparse.ArgumentParser()
        cli.register(bare.add_subparsers())
        args = bare.parse_args(["topic", "show", topic, "--url", url])
        assert args.func(args) == EXIT_OK

    await asyncio.to_thread(work)


async def test_contexts_supply_url_and_token_and_flags_and_env_win(
    server: tuple[LocalRaft, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = server
    topic = name()
    for var in ("RAFTQ_TOKEN", "RAFTQ_TOKEN_FILE", "RAFTQ_URL", "RAFTQ_CONTEXT", "RAFTQ_CA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAFTQ_CONFIG", str(tmp_path / "cfg" / "config.toml"))
    (tmp_path / "admin.token").write_text(ADMIN_TOKEN + "\n")
    monkeypatch.chdir(tmp_path)

    def work() -> None:
        assert run_cli("topic", "list", "--url", url)[0] == EXIT_REFUSED  # no token anywhere
        code, out, _ = run_cli("context", "add", "dev", "--url", url, "--token-file", "admin.token")
        assert code == EXIT_OK and "current" in out, out
        assert (tmp_path / "cfg" / "config.toml").stat().st_mode & 0o077 == 0
        assert run_cli("topic", "create", topic)[0] == EXIT_OK  # url and token: the context's
        code, out, _ = run_cli("context", "list")
        assert code == EXIT_OK and "* " in out and "dev" in out and url in out
        # a flag beats the context, and so does the environment
        code, _, err = run_cli("topic", "show", topic, "--url", "http://127.0.0.1:1",
                               "--timeout", "0.3")  # fmt: skip
        assert code == EXIT_UNAVAILABLE, err
        monkeypatch.setenv("RAFTQ_TOKEN", "rq_nobody.not-a-valid-secret-at-all")
        code, _, err = run_cli("topic", "show", topic)
        assert code == EXIT_REFUSED and "unauthenticated" in err, err
        monkeypatch.delenv("RAFTQ_TOKEN")
        code, _, err = run_cli("topic", "show", topic, "--context", "prod")
        assert code == EXIT_USAGE and "no context 'prod'" in err
        assert run_cli("context", "remove", "dev")[0] == EXIT_OK
        # Without a context, the dev cluster's token file is still found.
        (tmp_path / ".raftq").mkdir()
        (tmp_path / ".raftq" / "admin.token").write_text(ADMIN_TOKEN)
        assert run_cli("topic", "show", topic, "--url", url)[0] == EXIT_OK

    await asyncio.to_thread(work)


def test_when_every_seed_refuses_the_cli_gives_up_in_seconds_naming_them() -> None:
    urls = ",".join(f"http://127.0.0.1:{p}" for p in free_ports(2))
    started = time.monotonic()
    code, _, err = run_cli("topic", "list", "--url", urls, "--timeout", "30")
    took = time.monotonic() - started
    assert code == EXIT_UNAVAILABLE and took < 10, (took, err)  # (not the 30 s timeout)
    assert err.count("\n") == 1 and "connection refused" in err and urls.split(",")[1] in err
    assert "Error(" not in err  # no Python reprs
    code, _, err = run_cli("topic", "list", "--url", urls, "--timeout", "30", "--json")
    got = json.loads(err)
    assert code == EXIT_UNAVAILABLE and got["exit"] == 3 and got["error"]["code"] == "unavailable"


async def test_json_errors_are_json_objects_with_the_servers_code(
    server: tuple[LocalRaft, str],
) -> None:
    _, url = server

    def work() -> None:
        code, out, err = run_cli("--json", "topic", "show", "nope", "--url", url)
        got = json.loads(err)
        assert (code, out, got["exit"]) == (EXIT_REFUSED, "", EXIT_REFUSED)
        assert got["error"]["code"] == "topic_not_found" and "nope" in got["error"]["message"]
        code, _, err = run_cli(
            "--json", "group", "create", "nope", "g", "--config", "x", "--url", url
        )
        assert code == EXIT_USAGE and json.loads(err)["error"]["code"] == "usage"

    await asyncio.to_thread(work)


async def test_publish_from_a_pipe_sends_each_line_as_it_comes_and_takes_any_bytes(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()

    def work() -> None:
        assert run_cli("topic", "create", topic, "--url", url)[0] == EXIT_OK
        proc = subprocess.Popen(
            [sys.executable, "-m", "raftq.node", "publish", topic, "--url", url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"first\n")
            proc.stdin.flush()  # ... and nothing more for now, as from tail -f
            wait_for("the first line", lambda: stats(raft, topic)["messages"] == 1, 20)
            out, err = proc.communicate(b"\xff\xfe not utf-8\nlast without newline", timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
        assert b"published 3 messages (seq 1..3)" in out, out
        got = raft.read(lambda b: b.peek(topic, None, 10))
        assert [m["payload"] for m in got] == [
            b"first",
            b"\xff\xfe not utf-8",
            b"last without newline",
        ]
        # in process, from a buffered stream, fast input goes in batches
        code, text, _ = run_cli("publish", topic, "--url", url, "--batch", "2", stdin=b"a\nb\nc\n")
        assert code == EXIT_OK and "3 messages (seq 4..6)" in text
        # A line the server refuses is reported alone; the others are published.
        big = b"x" * (1 << 20 | 1)
        code, text, said = run_cli("publish", topic, "--url", url, stdin=b"d\n" + big + b"\ne\n")
        assert code == EXIT_REFUSED and "2 messages (seq 7..8), 1 rejected" in text, said
        assert said.startswith("raftq: line 2 not published: message_too_large"), said
        assert [m["payload"] for m in raft.read(lambda b: b.peek(topic, 7, 10))] == [b"d", b"e"]

    await asyncio.to_thread(work)


async def test_a_shell_worker_receives_receipts_and_settles_by_them(
    server: tuple[LocalRaft, str],
) -> None:
    raft, url = server
    topic = name()

    def pending() -> tuple[int, int]:
        g = raft.read(lambda b: b.group_stats(topic, "default"))
        return g["pending"], g["in_flight"]

    def work() -> None:
        assert run_cli("topic", "create", topic, "--url", url)[0] == EXIT_OK
        assert run_cli("publish", topic, "one", "two", "three", "--url", url)[0] == EXIT_OK
        code, out, _ = run_cli("receive", topic, "--max", "2", "--url", url)
        lines = [ln.split("\t") for ln in out.splitlines()]
        assert code == EXIT_OK and [p for _, p in lines] == ["one", "two"], out
        (r1, _), (r2, _) = lines
        assert pending() == (1, 2)
        code, out, _ = run_cli("extend", r2, "--seconds", "120", "--url", url)
        assert code == EXIT_OK and "extended 1 message" in out
        assert run_cli("ack", r1, "--url", url)[0] == EXIT_OK
        assert run_cli("nack", r2, "--url", url)[0] == EXIT_OK
        assert pending() == (2, 0)
        code, _, err = run_cli("ack", r1, "--url", url)  # settled already
        assert code == EXIT_REFUSED and "receipt" in err, err
        code, out, _ = run_cli("receive", topic, "--url", url, "--json")
        got = json.loads(out)
        assert got["payload"] == "two" and got["attempt"] == 2 and got["receipt"]
        code, out, _ = run_cli("term", got["receipt"], "--reason", "bad", "--url", url)
        assert code == EXIT_OK and "terminated 1 message" in out

    await asyncio.to_thread(work)


async def test_peek_verbose_consume_and_tables_for_people(
    server: tuple[LocalRaft, str],
) -> None:
    _, url = server
    topic = name()

    def work() -> None:
        assert run_cli("topic", "create", topic, "--url", url)[0] == EXIT_OK
        code, out, _ = run_cli("topic", "show", topic, "--url", url)
        assert "0 messages" in out and "no messages" in out and "None" not in out, out
        assert run_cli("group", "create", topic, "billing", "--config", "max_attempts=3",
                       "--url", url)[0] == EXIT_OK  # fmt: skip
        payload = "x" * 2000
        code, _, _ = run_cli("publish", topic, payload, "--header", "kind=big", "--url", url)
        code, out, _ = run_cli("topic", "show", topic, "--url", url)
        assert "1 message," in out and "2.0 KiB" in out and "seq 1..1" in out, out
        code, out, _ = run_cli("topic", "list", "--url", url)
        assert "2.0 KiB" in out and "oldest" in out
        code, out, _ = run_cli("topic", "peek", topic, "--url", url)
        assert code == EXIT_OK and "kind=big" in out and "2.0 KiB" in out and "xxx" in out, out
        code, out, _ = run_cli("group", "show", topic, "billing", "--url", url)
        assert code == EXIT_OK and "{" not in out and "max_attempts" in out, out
        assert any(ln.split() == ["max_attempts", "3"] for ln in out.splitlines()), out
        code, out, err = run_cli("consume", topic, "--group", "billing", "--count", "1",
                                 "--verbose", "--url", url)  # fmt: skip
        first = out.splitlines()[0]
        assert first.startswith("#1 attempt=1 size=2.0 KiB") and "kind=big" in first, out
        assert out.splitlines()[1] == payload and "(1 message)" in err

    await asyncio.to_thread(work)


async def test_topic_delete_asks_first_and_a_script_must_say_yes(
    server: tuple[LocalRaft, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    raft, url = server
    topic = name()

    def work() -> None:
        assert run_cli("topic", "create", topic, "--url", url)[0] == EXIT_OK
        code, _, err = run_cli("topic", "delete", topic, "--url", url)  # stdin: not a terminal
        assert code == EXIT_USAGE and "--yes" in err
        monkeypatch.setattr(cli, "_confirm", lambda question: "its 1 message" not in question)
        assert run_cli("topic", "delete", topic, "--url", url)[0] == EXIT_OK
        assert run_cli("topic", "create", topic, "--url", url)[0] == EXIT_OK
        assert run_cli("publish", topic, "m", "--url", url)[0] == EXIT_OK
        code, _, err = run_cli("topic", "delete", topic, "--url", url)  # answered no
        assert code == EXIT_USAGE and "kept" in err
        assert stats(raft, topic)["topic"] == topic
        monkeypatch.undo()
        assert run_cli("topic", "delete", topic, "--yes", "--url", url)[0] == EXIT_OK

    await asyncio.to_thread(work)


async def test_dlq_commands_say_when_a_topic_is_not_a_dead_letter_topic(
    server: tuple[LocalRaft, str],
) -> None:
    _, url = server
    topic, dlq = name(), name()

    def work() -> None:
        assert run_cli("topic", "create", topic, "--url", url)[0] == EXIT_OK
        assert run_cli("publish", topic, "plain", "--url", url)[0] == EXIT_OK
        for command in ("peek", "redrive"):
            code, _, err = run_cli("dlq", command, topic, "--url", url)
            assert code == EXIT_USAGE and "not a dead-letter topic" in err, err
        assert run_cli("group", "create", topic, "g", "--config", f"dead_letter_topic={dlq}",
                       "--config", "max_attempts=1", "--start", "earliest",
                       "--url", url)[0] == EXIT_OK  # fmt: skip
        assert run_cli("topic", "create", dlq, "--url", url)[0] == EXIT_OK
        code, _, err = run_cli("dlq", "peek", dlq, "--url", url)  # empty, but one
        assert code == EXIT_OK, err

    await asyncio.to_thread(work)


@contextlib.asynccontextmanager
async def stub_cluster(body: dict[str, Any]) -> AsyncIterator[str]:
    """A node stub whose /cluster answers ``body``."""

    async def cluster(request: web.Request) -> web.Response:
        return web.json_response(body)

    application = web.Application()
    application.router.add_get("/cluster", cluster)
    srv = TestServer(application, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}"
    finally:
        await srv.close()


async def test_status_shows_observed_roles_and_fails_without_a_leader() -> None:
    members = {
        "n1": {"api": "127.0.0.1:1", "raft": "127.0.0.1:2", "self": True},
        "n2": {"api": "127.0.0.1:3", "raft": "127.0.0.1:4", "answers": False},
        "n3": {"api": "127.0.0.1:5", "raft": "127.0.0.1:6", "answers": True},
    }
    body = {"node": "n1", "role": "candidate", "leader": None, "term": 7, "commit_index": 3,
            "applied_index": 3, "members": members}  # fmt: skip
    async with stub_cluster(body) as url:
        code, out, err = await asyncio.to_thread(run_cli, "status", "--url", url)
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    assert code == EXIT_UNAVAILABLE and "no leader" in err, (out, err)
    assert "candidate" in rows["n1"] and "no answer" in rows["n2"] and "follower" in rows["n3"]
    body["leader"] = "n2"  # (which the asked node still believes in)
    async with stub_cluster(body) as url:
        code, out, err = await asyncio.to_thread(run_cli, "status", "--url", url)
    assert code == EXIT_UNAVAILABLE and "leader (no answer)" in out and "n2 does not answer" in err
    body["leader"] = "n3"
    async with stub_cluster(body) as url:
        code, out, _ = await asyncio.to_thread(run_cli, "status", "--url", url)
    assert code == EXIT_OK and out.splitlines()[4].split()[3] == "leader", out


def _commands(parser: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for key, sub in action.choices.items():
                full = f"{prefix} {key}".strip()
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from _commands(sub, full)
                else:
                    yield full, sub


def test_every_client_command_has_an_example_and_help_shows_defaults() -> None:
    parser = build_parser()
    client_commands = {
        k: p for k, p in _commands(parser) if k.split()[0] not in ("node", "cluster", "bench")
    }
    assert set(client_commands) == set(EXAMPLES)
    for key, p in client_commands.items():
        assert "example:" in p.format_help(), key
    text = client_commands["consume"].format_help()
    assert "(default: default)" in text and "(default: 10)" in text and "None" not in text
