"""boto3 with botocore 1.33.x, the last line whose SQS client speaks the query protocol (form
bodies, XML answers), in a venv of its own: the current botocore of the test venv speaks JSON.

``old_botocore_python()`` builds the venv once under the cache directory
(``$RAFTQ_TEST_CACHE`` or ``~/.cache/raftq-tests``) with pip from PyPI and returns its python,
or None with the reason when pip cannot (offline): tests skip with it. ``run_calls`` runs a list
of SQS calls in that python (tests/sqs/old_botocore_runner.py) and returns each one's outcome.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

VERSION = "1.33.13"
RUNNER = Path(__file__).with_name("old_botocore_runner.py")


def cache_dir() -> Path:
    root = os.environ.get("RAFTQ_TEST_CACHE") or os.path.expanduser("~/.cache/raftq-tests")
    return Path(root)


def old_botocore_python() -> tuple[Path | None, str]:
    """(python of the venv, "") or (None, why it could not be made)."""
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    venv = cache_dir() / f"botocore-{VERSION}-{tag}"
    python = venv / "bin" / "python"
    ready = venv / "ready"
    cache_dir().mkdir(parents=True, exist_ok=True)
    # One builder at a time (parallel runs of the suite share the cache).
    with open(cache_dir() / f".botocore-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return python, ""
        shutil.rmtree(venv, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                           capture_output=True, timeout=120)  # fmt: skip
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 f"boto3=={VERSION}", f"botocore=={VERSION}"],
                check=True, capture_output=True, timeout=300,
            )  # fmt: skip
        except subprocess.CalledProcessError as e:
            shutil.rmtree(venv, ignore_errors=True)
            why = (e.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
            return None, f"pip could not install botocore {VERSION}: {' '.join(why)}"
        except subprocess.TimeoutExpired:
            shutil.rmtree(venv, ignore_errors=True)
            return None, f"pip did not install botocore {VERSION} within its time bound"
        ready.touch()
        return python, ""


def run_calls(
    python: Path, endpoint: str, key: str, secret: str, calls: list[dict[str, Any]],
    region: str = "us-east-1",
) -> list[dict[str, Any]]:  # fmt: skip
    """Each call ``{"op": "send_message", "params": {...}}`` -> ``{"ok": result}`` or
    ``{"error": {"code", "message", "status", "body"}}`` (``body``: the raw answer), and
    ``"protocol"``: what the request looked like ("query" or "json")."""
    spec = {"endpoint": endpoint, "key": key, "secret": secret, "region": region, "calls": calls}
    env = {**os.environ, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(var, None)
    out = subprocess.run(
        [str(python), str(RUNNER)], input=json.dumps(spec).encode(), capture_output=True,
        timeout=120, env=env,
    )  # fmt: skip
    if out.returncode:
        raise AssertionError(f"the runner failed:\n{out.stderr.decode(errors='replace')}")
    result: list[dict[str, Any]] = json.loads(out.stdout)
    return result
