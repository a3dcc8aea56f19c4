"""``bench/backlog.py`` (issue 22): its smoke scale runs end to end on a real 3-node cluster
and reports every measure, and its memory-cap case sees an OOM kill in its cgroup."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "backlog.py"


def _backlog() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_backlog", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclass looks its module up)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_quick_scale_measures_fill_restart_consume_and_join(tmp_path: Path) -> None:
    out = tmp_path / "backlog.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["messages"], row["size"], row["topics"]) == (3000, 100, 2)
    assert "error" not in row and "nodes_exited" not in row
    for key in ("rss_peak_mb", "rss_settled_mb", "disk_mb", "rss_after_restart_mb"):
        assert set(row[key]) == {"n1", "n2", "n3"}, key
        assert all(v > 0 for v in row[key].values()), key
    assert row["restart_publish_s"] > 0 and row["restart_ready_s"] is not None
    assert row["warm_consume_rate"] > 0 and row["cold_consume_rate"] > 0
    assert row["rounds"] == 2 and len(row["cold_over_warm_pairs"]) == 2
    assert all(r > 0 for r in row["cold_consume_rates"] + row["warm_consume_rates"])
    assert len(row["warmed_mb"]) == 2 and all(mb > 0 for mb in row["warmed_mb"])
    assert row["join_s"] > 0 and row["join_rss_new_mb"] > 0
    assert "| 3,000 x 100 B, 2 topic(s) |" in run.stdout


def test_an_oom_kill_in_a_capped_cgroup_is_seen() -> None:
    mod = _backlog()
    cap, how = mod.MemCap.make(f"raftq-test-{uuid.uuid4().hex[:8]}", 64 << 20)
    if cap is None:
        pytest.skip(f"no memory cgroup here: {how}")
    try:
        hog = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; sys.stdin.read(1); x = [bytearray(8 << 20) for _ in range(64)]"],
            stdin=subprocess.PIPE,
        )  # fmt: skip
        cap.add(hog.pid)
        assert hog.stdin is not None
        hog.stdin.write(b"x")
        hog.stdin.close()
        assert hog.wait(60) == -9
        assert cap.oom_kills() >= 1
        peak = cap.peak_mb()
        assert peak is None or peak <= 64.5
    finally:
        cap.remove()
