"""Chaos tests import the harness from the top-level ``chaos/`` folder (not part of raftq), and
print every scenario's summary table at the end of the session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CHAOS_ROOT = Path(__file__).resolve().parents[2] / "chaos"
if str(CHAOS_ROOT) not in sys.path:
    sys.path.insert(0, str(CHAOS_ROOT))

SUMMARIES = pytest.StashKey[list[str]]()


@pytest.fixture
def chaos_summaries(request: pytest.FixtureRequest) -> list[str]:
    return request.config.stash.setdefault(SUMMARIES, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    tables = terminalreporter.config.stash.get(SUMMARIES, [])
    if tables:
        terminalreporter.section("chaos summary")
        for table in tables:
            terminalreporter.write_line(table)
