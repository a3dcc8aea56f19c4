"""Fixtures for the state machine tests: a broker driven by a fake leader clock."""

from __future__ import annotations

import pytest
from state_harness import Harness  # type: ignore[import-not-found]


@pytest.fixture
def h() -> Harness:
    return Harness()
