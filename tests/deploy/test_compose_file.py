"""docker-compose.yml: each node takes the cluster secret and the bootstrap admin token from the
environment or the .env file deploy/compose-env.sh writes, both required (compose stops instead
of starting a cluster nobody can use); nodes that die come back."""

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


def test_every_node_serves_sqs_published_on_loopback_only() -> None:
    published = set()
    for name, svc in services().items():
        listen = svc["environment"]["RAFTQ_SQS_LISTEN"]
        assert listen.endswith(":9324"), (name, listen)
        sqs = [p for p in svc["ports"] if p.endswith(":9324")]
        assert len(sqs) == 1 and sqs[0].startswith("127.0.0.1:"), (name, svc["ports"])
        published.add(sqs[0].split(":")[1])
    assert len(published) == 3  # (a host port each)


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


COMPOSE_ENV = COMPOSE.parent / "deploy" / "compose-env.sh"


def test_compose_env_writes_a_private_env_file_once(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    done = subprocess.run(["sh", str(COMPOSE_ENV), str(env_file)], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert env_file.stat().st_mode & 0o777 == 0o600
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert set(values) == set(REQUIRED)
    assert re.fullmatch(r"[0-9a-f]{32}", values["RAFTQ_SECRET"])
    assert re.fullmatch(r"rq_admin\.[0-9a-f]{64}", values["RAFTQ_ADMIN_TOKEN"])
    before = env_file.read_text()
    again = subprocess.run(["sh", str(COMPOSE_ENV), str(env_file)], capture_output=True,
                           text=True, timeout=30)  # fmt: skip
    assert again.returncode != 0 and "exists" in again.stderr
    assert env_file.read_text() == before  # (the cluster's data was made with that secret)


def test_ps_logs_and_down_work_from_a_fresh_shell_with_the_env_file(tmp_path: Path) -> None:
    """No variable exported: compose reads them from .env beside the project, every command."""
    cmd = _compose()
    if cmd is None:
        pytest.skip("no docker-compose (nor docker compose)")
    subprocess.run(["sh", str(COMPOSE_ENV), str(tmp_path / ".env")], check=True, timeout=30,
                   capture_output=True)  # fmt: skip
    token = (tmp_path / ".env").read_text().split("RAFTQ_ADMIN_TOKEN=")[1].strip()
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED}
    base = [*cmd, "-f", str(COMPOSE), "--project-directory", str(tmp_path),
            "-p", f"raftqfile{tmp_path.name[-8:].lower().replace('_', '')}"]  # fmt: skip
    config = subprocess.run([*base, "config"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert config.returncode == 0, config.stderr
    assert config.stdout.count(token) == 3
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return  # (no daemon for ps / logs / down)
    for args in (["ps"], ["logs"], ["down", "-v"]):
        done = subprocess.run([*base, *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, (args, done.stderr)


def test_a_node_that_dies_is_restarted_and_runs_locked_down() -> None:
    for name, svc in services().items():
        assert svc["restart"] in ("unless-stopped", "always"), name
        assert svc["init"] is True, name  # (signals and reaping as usual)
        assert svc["read_only"] is True and "/tmp" in svc["tmpfs"], name
        assert svc["cap_drop"] == ["ALL"] and "no-new-privileges:true" in svc["security_opt"]
    readme = (COMPOSE.parent / "README.md").read_text()
    assert "deploy/compose-env.sh" in readme and "docker kill" in readme
