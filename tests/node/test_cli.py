"""The raftq command line: option parsing, and ``raftq cluster up`` as a real process."""

from __future__ import annotations

import base64
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from raftq.node.cli import build_parser, main
from raftq.node.server import parse_peers
from tests.node.cluster_fixture import http, wait_for


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
        ("RAFTQ_SHUTDOWN_TIMEOUT", "soon", "--shutdown-timeout"),
    ):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(SystemExit) as e:
                main([*base, "--in-memory"])
            err = capsys.readouterr().err
            assert e.value.code == 2 and says in err and "Traceback" not in err, err
    monkeypatch.setenv("RAFTQ_SHUTDOWN_TIMEOUT", "3")
    assert build_parser().parse_args(["node"]).shutdown_timeout == 3.0
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


@pytest.mark.slow
def test_cluster_up_starts_stops_and_resumes_with_its_data(tmp_path: Path) -> None:
    api, raft = _consecutive_free_ports(3), _consecutive_free_ports(3)
    cmd = [sys.executable, "-m", "raftq.node", "cluster", "up", "--nodes", "3",
           "--dir", str(tmp_path / ".raftq"), "--api-port", str(api), "--raft-port", str(raft),
           "--fsync", "never"]  # fmt: skip

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
    try:
        text = out.read_text()
        assert f"http://127.0.0.1:{api + 2}" in text and "curl" in text
        assert http("POST", url + "/topics", {"topic": "kept"})[0] == 201
        assert http("POST", url + "/topics/kept/messages", {"payload": "aGk="})[0] == 200
    finally:
        down(proc, out)
    assert (tmp_path / ".raftq" / "secret").stat().st_mode & 0o077 == 0

    proc, out = up(2)
    try:
        code, got = http("POST", url + "/topics/kept/groups/default/receive", {"wait": 5})
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
             "--raft-port", str(raft)],
            capture_output=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1
    # Refused before starting anything: else the wait for a leader could find another
    # cluster's leader on those ports (the same --dir started twice) and report "up".
    assert b"already in use" in proc.stderr
    assert not list((tmp_path / ".raftq").glob("n1/node.log"))
