"""docker-compose.yml: each node takes the cluster secret and the bootstrap admin token from the
environment, both required (compose stops instead of starting a cluster nobody can use)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from raftq.node.cli import build_parser

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
REQUIRED = ("RAFTQ_SECRET", "RAFTQ_ADMIN_TOKEN")


def services() -> dict[str, Any]:
    result: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return result


def test_the_secret_and_the_admin_token_are_required_from_the_environment() -> None:
    assert sorted(services()) == ["n1", "n2", "n3"]
    for name, svc in services().items():
        env = svc["environment"]
        for var in REQUIRED:
            # ${VAR:?message}: no default, compose refuses to go on without it
            assert re.fullmatch(rf"\$\{{{var}:\?[^}}]+\}}", env[var]), (name, var, env[var])
        assert env.get("RAFTQ_AUTH", "on") != "off", name


def test_every_env_var_is_a_node_option() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    choices: Any = sub.choices
    help_text = choices["node"].format_help()
    for svc in services().values():
        for name in svc["environment"]:
            assert f"[{name}]" in help_text, f"{name} is not an option of `raftq node`"


def _compose() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_stops_without_an_admin_token(tmp_path: Path) -> None:
    cmd = _compose()
    if cmd is None:
        pytest.skip("no docker-compose (nor docker compose)")
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED}

    def config(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            # (project dir: an empty one, so no .env file there sets either variable)
            [*cmd, "-f", str(COMPOSE), "--project-directory", str(tmp_path), "config"],
            env={**env, **extra}, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    refused = config(RAFTQ_SECRET="s" * 32)
    assert refused.returncode != 0 and "RAFTQ_ADMIN_TOKEN" in refused.stderr, refused.stderr
    token = "rq_admin.compose-file-test-token"
    done = config(RAFTQ_SECRET="s" * 32, RAFTQ_ADMIN_TOKEN=token)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(token) == 3
