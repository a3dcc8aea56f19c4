"""``raftq bench``: its NATS rounds and ratios, against a fake anchor directory (no NATS here),
and its local cluster, which runs with access control on."""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from raftq.node.bench import (
    LocalCluster,
    Nats,
    Results,
    SilentRelay,
    per_round,
    ratios,
    run_cases,
    summarize,
)

FAKE_BENCH = """
import json, os, sys, time
args = sys.argv[1:]
tag = args[args.index("--tag") + 1]
rate = {"sync-always-r1": 600.0, "sync-always-r2": 500.0, "sync-always-r3": 700.0}[tag]
out = os.path.join(os.environ["ANCHOR_WORK"], "results")
os.makedirs(out, exist_ok=True)
rows = [{"case": "(a) sync publish 100B", "run": 1, "n": 1, "secs": 1.0, "rate": rate,
         "p50_ms": 1.5, "p99_ms": 3.0},
        {"case": "(b) pipelined publish 100B (window 1000)", "run": 1, "n": 1, "secs": 1.0,
         "rate": rate * 40}]
with open(os.path.join(out, f"nats-{tag}-{time.time_ns()}.json"), "w") as f:
    json.dump({"runs": rows}, f)
"""


def test_nats_rounds_interleave_and_give_medians_and_ratios(tmp_path: Path) -> None:
    (tmp_path / "start_nats.sh").write_text('touch "$ANCHOR_WORK/started"\n')
    (tmp_path / "stop_nats.sh").write_text('rm -f "$ANCHOR_WORK/started"\n')
    (tmp_path / "bench_nats.py").write_text(FAKE_BENCH)
    args = argparse.Namespace(sizes="100", n=100, secs=1.0)
    anchor = Nats(str(tmp_path), args)
    anchor.start()
    assert Path(anchor.work, "started").exists()
    for run in (1, 2, 3):
        anchor.round(run)
    anchor.stop()
    assert not Path(anchor.work).exists()
    assert [r["run"] for r in anchor.rows] == [1, 1, 2, 2, 3, 3]
    nats = summarize(anchor.rows)
    assert (nats[0]["median_rate"], nats[0]["min_rate"], nats[0]["max_rate"]) == (600, 500, 700)
    ours = [
        {"case": "(a) sync publish 100B", "median_rate": 540.0},
        {"case": "(c) batch publish 100B (100/request, 10 in flight)", "median_rate": 48_000.0},
    ]
    table = {r["case"][:3]: round(r["ratio"], 2) for r in ratios(ours, nats)}
    assert table == {"(a)": 0.9, "(c)": 2.0}  # (c) is set against NATS's pipelined publishes
    mine = [{"case": "(a) sync publish 100B", "run": k, "rate": 600.0} for k in (1, 2, 3)]
    (a,) = (r for r in ratios(ours, nats) if r["case"].startswith("(a)"))
    assert per_round(a, mine, anchor.rows) == [1.0, 1.2, 600 / 700]


def test_a_nats_side_that_fails_ends_the_bench_naming_the_extra(tmp_path: Path) -> None:
    (tmp_path / "start_nats.sh").write_text("exit 1\n")  # (say, Debian's nats-server 2.9)
    anchor = Nats(str(tmp_path), argparse.Namespace(sizes="100", n=100, secs=1.0))
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[bench\]'"):
        anchor.start()
    anchor.stop()


@pytest.mark.slow
def test_the_local_cluster_hands_its_own_token_to_its_nodes_and_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("RAFTQ_TOKEN", "RAFTQ_ADMIN_TOKEN"):  # (the suite's: not what the bench uses)
        monkeypatch.delenv(var, raising=False)
    cl = LocalCluster("never")
    try:
        cl.start()
        leader = cl.leader()
        for p in cl.procs.values():  # given in the environment, not in argv (ps shows that)
            assert cl.token.encode() not in Path(f"/proc/{p.pid}/cmdline").read_bytes()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(cl.url_of(leader) + "/cluster", timeout=5)
        assert e.value.code == 401
        e.value.close()
        args = argparse.Namespace(cases="a,f", runs=1, sizes="100", secs=0.3, n=10, window=10)
        res = Results()
        asyncio.run(run_cases(cl, args, res))
        assert [r["case"][:3] for r in res.rows] == ["(a)", "(f)"]
        assert res.rows[0]["n"] > 0
        assert set(cl.raft_stats()) <= {n["id"] for n in cl.layout}
    finally:
        cl.stop()


def test_a_silent_relay_relays_until_silenced_then_connections_hang_until_revived() -> None:
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(8)
    host, port = target.getsockname()

    def echo() -> None:
        while True:
            try:
                conn, _ = target.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(100))

    threading.Thread(target=echo, daemon=True).start()
    relay = SilentRelay(f"{host}:{port}")
    rhost, rport = relay.addr.rsplit(":", 1)
    try:
        for silent in (False, True, False):
            if silent:
                relay.silence()
            else:
                relay.revive()
            with socket.socket() as s:
                s.settimeout(0.5)
                if silent:  # as a host that is gone: no refusal, no answer
                    with pytest.raises(TimeoutError):
                        s.connect((rhost, int(rport)))
                    continue
                s.connect((rhost, int(rport)))
                s.sendall(b"ping")
                assert s.recv(100) == b"ping"
    finally:
        relay.close()
        target.close()
