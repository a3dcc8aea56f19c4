"""The node's allocator setting (node/raftq/node/malloc.py)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest

from raftq.node import malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_the_mmap_threshold_is_fixed_unless_the_environment_sets_one() -> None:
    # In a child: the setting is process-wide and stays for the rest of the process.
    code = "from raftq.node.malloc import fix_mmap_threshold as f; print(f())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PATH": ""})  # fmt: skip
    assert out.stdout.strip() == "True"
    env = {"PATH": "", "MALLOC_MMAP_THRESHOLD_": "262144"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)  # fmt: skip
    assert out.stdout.strip() == "False", "the operator's own setting wins"


def test_without_mallopt_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoLibc:
        def __init__(self, name: object) -> None:
            raise OSError("no such library")

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", NoLibc)
    assert malloc.fix_mmap_threshold() is False
