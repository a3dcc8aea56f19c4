"""The raftq command line: option parsing, and ``raftq cluster up`` as a real process."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftq.node.cli import build_parser, main
from raftq.node.logfmt import JsonFormatter
from raftq.node.server import parse_peers
from tests.node.cluster_fixture import Cluster, http, wait_for


def test_peer_syntax_is_id_equals_raft_slash_api() -> None:
    assert parse_peers("n2=127.0.0.1:9002/127.0.0.1:8002, n3=h:9003/h:8003") == {
        "n2": ("127.0.0.1:9002", "127.0.0.1:8002"),
        "n3": ("h:9003", "h:8003"),
    }
    assert parse_peers("") == {}
    for bad in ("n2=127.0.0.1:9002", "n2=a/b", "=h:1/h:2", "n2=h:1/h:2,n2=h:3/h:4", "n2=h:0/h:1"):
        with pytest.raises(ValueError):
            parse_peers(bad)


def test_node_refuses_to_start_without_id_or_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("RAFTQ_ID", "RAFTQ_SECRET", "RAFTQ_INSECURE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["node", "--secret", "s"])
    assert e.value.code == 2 and "--id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["node", "--id", "n1"])
    assert "--secret" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["node", "--id", "n1", "--secret", "s", "--in-memory", "--peers", "n2=oops"])
    assert "peer must be" in capsys.readouterr().err


def test_bad_environment_values_and_a_missing_data_dir_are_usage_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("RAFTQ_DATA_DIR", "RAFTQ_IN_MEMORY"):
        monkeypatch.delenv(var, raising=False)
    base = ["node", "--id", "n1", "--secret", "s"]
    with pytest.raises(SystemExit) as e:
        main(base)  # would keep everything in memory, silently
    assert e.value.code == 2 and "--data-dir" in capsys.readouterr().err
    for var, value, says in (
        ("RAFTQ_FSYNC", "yes", "--fsync"),
        ("RAFTQ_MAX_BODY", "8MiB", "--max-body"),
        ("RAFTQ_LOG_LEVEL", "verbose", "--log-level"),
        ("RAFTQ_LOG_FORMAT", "xml", "--log-format"),
        ("RAFTQ_SHUTDOWN_TIMEOUT", "soon", "--shutdown-timeout"),
        ("RAFTQ_METRICS_TOPICS", "-1", "--metrics-topics"),
    ):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(SystemExit) as e:
                main([*base, "--in-memory"])
            err = capsys.readouterr().err
            assert e.value.code == 2 and says in err and "Traceback" not in err, err
    monkeypatch.setenv("RAFTQ_SHUTDOWN_TIMEOUT", "3")
    assert build_parser().parse_args(["node"]).shutdown_timeout == 3.0
    assert build_parser().parse_args(["node"]).metrics_topics == 100  # (the default)
    for value, topics in (("all", None), ("0", 0), ("25", 25)):
        assert build_parser().parse_args(["node", "--metrics-topics", value]).metrics_topics == (
            topics
        )
    # An explicit --in-memory wins over RAFTQ_DATA_DIR (the image sets it), as flags do.
    monkeypatch.setenv("RAFTQ_DATA_DIR", "/data")
    monkeypatch.setenv("RAFTQ_FSYNC", "bogus")  # stops it right after the data-dir choice
    with pytest.raises(SystemExit):
        main([*base, "--in-memory"])
    assert "exclude" not in capsys.readouterr().err


def test_environment_variables_fill_in_node_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAFTQ_ID", "n7")
    monkeypatch.setenv("RAFTQ_LISTEN", "127.0.0.1:8107")
    monkeypatch.setenv("RAFTQ_PEERS", "n8=127.0.0.1:9108/127.0.0.1:8108")
    args = build_parser().parse_args(["node"])
    assert (args.id, args.listen, args.peers) == (
        "n7",
        "127.0.0.1:8107",
        "n8=127.0.0.1:9108/127.0.0.1:8108",
    )
    args = build_parser().parse_args(["node", "--id", "n9"])
    assert args.id == "n9"  # a flag wins over the variable


def test_json_log_lines_carry_time_level_logger_message_and_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "raftq.node", logging.ERROR, __file__, 1, 'a %s "quoted" line', ("bad",), None
        )
        record.exc_info = sys.exc_info()
    record.created, record.msecs = 1_700_000_000.25, 250.0
    line = json.loads(JsonFormatter().format(record))
    assert {k: line[k] for k in ("time", "level", "logger", "message")} == {
        "time": "2023-11-14T22:13:20.250Z",
        "level": "ERROR",
        "logger": "raftq.node",
        "message": 'a bad "quoted" line',
    }
    assert "ValueError: boom" in line["exception"]


@pytest.mark.slow
def test_a_node_started_with_log_format_json_writes_one_json_object_per_line(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path, 1, extra_args=["--log-format", "json"])
    try:
        c.start()
        node = c.nodes["n1"]

        def said(text: str) -> bool:
            return text in node.log.read_text()

        wait_for("the election line", lambda: said("raft n1: elected leader in term"), 10)
    finally:
        c.close()
    lines = [json.loads(line) for line in node.log.read_text().splitlines() if line.strip()]
    assert lines and all(set(x) >= {"time", "level", "logger", "message"} for x in lines)
    assert any(x["logger"] == "raftq.cluster.raft" and x["level"] == "INFO" for x in lines)


def _consecutive_free_ports(n: int) -> int:
    for _ in range(50):
        base = random.randint(20000, 60000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


@contextlib.contextmanager
def running(
    cmd: list[str], out: Path, stop: int = signal.SIGINT, **popen: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` in a session of its own, output to ``out``; at the end stopped with ``stop``,
    which must end it with exit 0 within 40 s (else it is killed and the test fails)."""
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, **popen
        )
    try:
        yield proc
    finally:
        proc.send_signal(stop)
        try:
            assert proc.wait(40) == 0, out.read_text()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.mark.slow
def test_cluster_up_starts_stops_and_resumes_with_its_data(tmp_path: Path) -> None:
    api, raft = _consecutive_free_ports(3), _consecutive_free_ports(3)
    cmd = [sys.executable, "-m", "raftq.node", "cluster", "up", "--nodes", "3",
           "--dir", str(tmp_path / ".raftq"), "--api-port", str(api), "--raft-port", str(raft),
           "--sqs-port", str(_consecutive_free_ports(3)), "--fsync", "never"]  # fmt: skip

    def up(run: int) -> tuple[subprocess.Popen[bytes], Path]:
        out = tmp_path / f"out{run}.txt"
        with open(out, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for("the cluster to come up", lambda: b"Try it" in out.read_bytes(), 60, 0.1)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        return proc, out

    def down(proc: subprocess.Popen[bytes], out: Path) -> None:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            assert proc.wait(40) == 0, out.read_text()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert "cluster stopped" in out.read_text()

    url = f"http://127.0.0.1:{api}"
    proc, out = up(1)
    token = (tmp_path / ".raftq" / "admin.token").read_text().strip()
    try:
        text = out.read_text()
        assert f"http://127.0.0.1:{api + 2}" in text and "curl" in text
        assert http("POST", url + "/topics", {"topic": "kept"}, token=token)[0] == 201
        assert (
            http("POST", url + "/topics/kept/messages", {"payload": "aGk="}, token=token)[0] == 200
        )
        # its own token, not the suite's (which the environment also holds)
        assert http("GET", url + "/cluster")[0] == 401
    finally:
        down(proc, out)
    for kept in ("secret", "admin.token"):
        assert (tmp_path / ".raftq" / kept).stat().st_mode & 0o077 == 0

    proc, out = up(2)
    try:
        assert (tmp_path / ".raftq" / "admin.token").read_text().strip() == token  # reused
        body = {"wait": 5}
        code, got = http("POST", url + "/topics/kept/groups/default/receive", body, token=token)
        assert code == 200, got
        assert [base64.b64decode(d["payload"]) for d in got["deliveries"]] == [b"hi"]
    finally:
        down(proc, out)


@pytest.mark.slow
def test_cluster_up_fails_fast_when_a_node_cannot_start(tmp_path: Path) -> None:
    api, raft = _consecutive_free_ports(1), _consecutive_free_ports(1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", api))
        busy.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "raftq.node", "cluster", "up", "--nodes", "1",
             "--dir", str(tmp_path / ".raftq"), "--api-port", str(api),
             "--raft-port", str(raft), "--sqs-port", str(_consecutive_free_ports(1))],
            capture_output=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1
    # Refused before starting anything: else the wait for a leader could find another
    # cluster's leader on those ports (the same --dir started twice) and report "up".
    assert b"already in use" in proc.stderr
    assert not list((tmp_path / ".raftq").glob("n1/node.log"))


def _without_tokens() -> dict[str, str]:
    """Our environment without the suite's tokens: what a developer's shell holds."""
    env = dict(os.environ)
    for var in ("RAFTQ_TOKEN", "RAFTQ_TOKEN_FILE", "RAFTQ_ADMIN_TOKEN", "RAFTQ_ADMIN_TOKEN_FILE"):
        env.pop(var, None)
    return env


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:  # (the field after the state is the parent's pid)
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_cluster_up_hands_out_a_token_that_the_cli_run_there_finds(tmp_path: Path) -> None:
    """The README's quick start: ``make run``, then the CLI from the same directory, with no
    token set anywhere: ``cluster up`` writes .raftq/admin.token and the CLI reads it."""
    api, raft = _consecutive_free_ports(3), _consecutive_free_ports(3)
    env = _without_tokens()
    out = tmp_path / "out.txt"
    urls = ",".join(f"http://127.0.0.1:{api + i}" for i in range(3))

    def cli(
        *args: str, cwd: Path = tmp_path, stdin: bytes = b""
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "raftq.node", *args, "--url", urls],
            input=stdin.decode(), capture_output=True, text=True, cwd=cwd, env=env, timeout=60,
        )  # fmt: skip

    sqs_port = _consecutive_free_ports(3)
    cmd = [sys.executable, "-m", "raftq.node", "cluster", "up", "--nodes", "3",
           "--api-port", str(api), "--raft-port", str(raft), "--sqs-port", str(sqs_port),
           "--fsync", "never"]  # fmt: skip
    with running(cmd, out, cwd=tmp_path, env=env) as proc:
        wait_for("the cluster to come up", lambda: b"Try it" in out.read_bytes(), 60, 0.1)
        path = tmp_path / ".raftq" / "admin.token"
        token = path.read_text().strip()
        assert token.startswith("rq_admin.") and len(token) >= 40
        assert path.stat().st_mode & 0o077 == 0
        text = out.read_text()
        assert token in text and "finds it" in text and "RAFTQ_TOKEN" in text
        nodes = _children(proc.pid)
        assert len(nodes) == 3
        for pid in nodes:  # the token reaches the nodes by their environment, not argv
            assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
            assert (
                f"RAFTQ_ADMIN_TOKEN={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
            )

        done = cli("status")
        assert done.returncode == 0 and "leader" in done.stdout, done.stderr
        assert cli("topic", "create", "orders").returncode == 0
        done = cli("publish", "orders", stdin=b"1\n2\n3\n")
        assert done.returncode == 0, done.stderr
        done = cli("consume", "orders", "--count", "3")
        assert (done.returncode, done.stdout.split()) == (0, ["1", "2", "3"]), done.stderr
        # Elsewhere, with no token at all, the cluster refuses the CLI.
        (tmp_path / "elsewhere").mkdir()
        done = cli("status", cwd=tmp_path / "elsewhere")
        assert done.returncode == 1 and "token" in done.stderr, done.stderr
        # The SQS endpoint on every node, with the credentials it printed.
        wait_for("the SQS note", lambda: b"AWS_SECRET_ACCESS_KEY=" in out.read_bytes(), 30)
        line = next(x for x in out.read_text().splitlines() if "AWS_SECRET_ACCESS_KEY=" in x)
        aws = dict(kv.split("=", 1) for kv in line.split()[1:])
        assert aws["AWS_ACCESS_KEY_ID"] == "admin"
        boto3 = pytest.importorskip("boto3")
        for i in range(3):
            sqs = boto3.client(
                "sqs", endpoint_url=f"http://127.0.0.1:{sqs_port + i}", region_name="us-east-1",
                aws_access_key_id="admin", aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"],
            )  # fmt: skip
            url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
            sqs.send_message(QueueUrl=url, MessageBody=f"via n{i + 1}")
            assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]


@pytest.mark.slow
def test_a_node_with_auth_off_says_so_loudly_and_asks_for_no_token(tmp_path: Path) -> None:
    api, raft = _consecutive_free_ports(1), _consecutive_free_ports(1)
    log = tmp_path / "node.log"
    cmd = [sys.executable, "-m", "raftq.node", "node", "--id", "n1", "--in-memory",
           "--insecure", "--auth", "off", "--listen", f"127.0.0.1:{api}",
           "--raft", f"127.0.0.1:{raft}"]  # fmt: skip
    with running(cmd, log, stop=signal.SIGTERM, env=_without_tokens()):
        url = f"http://127.0.0.1:{api}"
        wait_for("the node to answer", lambda: http("GET", url + "/healthz", token=None)[0], 30)
        text = log.read_text()
        assert "WARNING" in text and "ACCESS CONTROL IS OFF" in text, text
        code, body = http("GET", url + "/cluster", token=None)
        assert code == 200 and body["node"] == "n1", body
        wait_for("a leader", lambda: http("GET", url + "/readyz", token=None)[0] == 200, 30)
        assert http("POST", url + "/topics", {"topic": "open"}, token=None)[0] == 201


@pytest.mark.slow
def test_cluster_up_with_tls_serves_https_with_a_ca_it_hands_out(tmp_path: Path) -> None:
    api, raft = _consecutive_free_ports(2), _consecutive_free_ports(2)
    env = _without_tokens()
    out = tmp_path / "out.txt"
    urls = ",".join(f"https://127.0.0.1:{api + i}" for i in range(2))
    ca = tmp_path / ".raftq" / "tls" / "ca.pem"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "raftq.node", *args],
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
        )  # fmt: skip

    cmd = [sys.executable, "-m", "raftq.node", "cluster", "up", "--nodes", "2", "--tls",
           "--api-port", str(api), "--raft-port", str(raft),
           "--sqs-port", str(_consecutive_free_ports(2)), "--fsync", "never"]  # fmt: skip
    with running(cmd, out, cwd=tmp_path, env=env):
        wait_for("the cluster to come up", lambda: b"Try it" in out.read_bytes(), 60, 0.1)
        text = out.read_text()
        assert f"RAFTQ_CA={ca}" in text and "https://127.0.0.1" in text and ca.exists()
        done = cli("topic", "create", "secure", "--url", urls, "--ca", str(ca))
        assert done.returncode == 0, done.stderr
        done = cli("publish", "secure", "over-tls", "--url", urls, "--ca", str(ca))
        assert done.returncode == 0, done.stderr
        # Without the CA the certificate is not trusted: said at once, in one line.
        done = cli("status", "--url", urls, "--timeout", "5")
        assert done.returncode == 3 and "certificate" in done.stderr, done.stderr
