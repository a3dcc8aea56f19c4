"""Chaos tests import the harness from the top-level ``chaos/`` folder (not part of raftq), and
print every scenario's summary table at the end of the session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CHAOS_ROOT = Path(__file__).resolve().parents[2] / "chaos"
if str(CHAOS_ROOT) not in sys.path:
    sys.path.insert(0, str(CHAOS_ROOT))

from raftq_chaos.runner import Report, summary_table  # noqa: E402

REPORTS = pytest.StashKey[list[Report]]()


@pytest.fixture
def chaos_reports(request: pytest.FixtureRequest) -> list[Report]:
    """Scenario tests append their reports; one table is printed at the end."""
    return request.config.stash.setdefault(REPORTS, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reports = terminalreporter.config.stash.get(REPORTS, [])
    if reports:
        terminalreporter.section("chaos summary")
        terminalreporter.write_line(summary_table(reports))
