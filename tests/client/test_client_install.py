"""The client installs and runs without the server's dependencies (pysyncobj, cryptography,
prometheus-client): they are the ``server`` extra."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("pysyncobj", "cryptography", "prometheus_client")

# Run in a child interpreter: the server's packages cannot be imported there, as on a machine
# that never installed them.
BLOCK = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_ONLY!r}:
            raise ImportError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
"""


def _names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
            .replace("-", "_").lower() for r in requirements}  # fmt: skip


def test_the_base_install_requires_only_what_the_client_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _names(project["dependencies"]) == {"aiohttp", "msgpack"}
    assert set(SERVER_ONLY) <= _names(project["optional-dependencies"]["server"])
    assert "raftq[server]" in project["optional-dependencies"]["dev"]


def test_the_client_and_its_cli_run_without_the_server_packages() -> None:
    code = (
        BLOCK
        + """
import raftq.client, raftq.client.cli, raftq.client.types
from raftq.node.cli import main
try:
    main(["node", "--id", "n1", "--insecure", "--in-memory"])
except SystemExit as e:
    print("EXIT", e.code)
try:
    main(["topic", "--help"])
except SystemExit as e:
    print("HELP", e.code)
leaked = [m for m in sys.modules if m.split(".")[0] in BLOCKED]
print("LEAKED", leaked)
""".replace("BLOCKED", repr(SERVER_ONLY))
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert (
        "EXIT raftq: running a node needs pysyncobj, cryptography, prometheus_client: "
        "pip install 'raftq[server]'" in out.stdout
    ), out
    assert "HELP 0" in out.stdout, out
    assert "LEAKED []" in out.stdout, out


@pytest.mark.slow
def test_a_fresh_venv_installs_the_client_without_the_server_packages(tmp_path: Path) -> None:
    """pip install of this checkout into a new venv (needs PyPI: skipped without it)."""
    venv.create(tmp_path / "v", with_pip=True)
    py = tmp_path / "v" / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("RAFTQ_TOKEN", None)
    try:
        subprocess.run(
            [py, "-m", "pip", "install", "-q", str(ROOT)],
            check=True, capture_output=True, text=True, timeout=240, env=env,
        )  # fmt: skip
    except subprocess.CalledProcessError as e:
        if "Could not find a version" in e.stderr or "NewConnectionError" in e.stderr:
            pytest.skip(f"no package index: {e.stderr[-300:]}")
        raise
    check = f"""
import importlib.metadata as md, importlib.util as u
missing = [m for m in {SERVER_ONLY!r} if u.find_spec(m) is None]
print(sorted(missing))
import raftq.client
print(raftq.client.AsyncClient.__name__)
"""
    out = subprocess.run(
        [py, "-c", check], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert out.stdout.splitlines() == [repr(sorted(SERVER_ONLY)), "AsyncClient"], out
    node = subprocess.run(
        [tmp_path / "v" / "bin" / "raftq", "node", "--id", "n1", "--insecure", "--in-memory"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert node.returncode != 0 and "pip install 'raftq[server]'" in node.stderr, node
