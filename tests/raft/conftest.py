from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.raft.harness import RaftCluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[type[RaftCluster]]:
    """Build clusters under tmp_path; every process they started is killed afterwards."""
    made: list[RaftCluster] = []

    class Tracked(RaftCluster):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)  # type: ignore[arg-type]
            made.append(self)

    try:
        yield Tracked
    finally:
        for c in made:
            c.close()
