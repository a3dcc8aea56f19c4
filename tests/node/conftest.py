from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.cluster_fixture import Cluster


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    """A fresh 3-node cluster of real processes, stopped after the test."""
    c = Cluster(tmp_path, 3)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def shared_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 3-node cluster shared by a module's non-destructive tests (use unique topics)."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), 3)
    try:
        yield c.start()
    finally:
        c.close()
