"""Session-wide test setup: every client in the suite authenticates as the bootstrap admin
(``RAFTQ_TOKEN``) unless a test says otherwise; nodes started by the suite are given the same
token (``RAFTQ_ADMIN_TOKEN``, inherited by the processes they start)."""

from __future__ import annotations

import os

from tests.support import ADMIN_TOKEN

os.environ["RAFTQ_TOKEN"] = ADMIN_TOKEN
os.environ["RAFTQ_ADMIN_TOKEN"] = ADMIN_TOKEN
# The CLI reads named contexts from the user's config file: the suite's must not depend on it.
os.environ["RAFTQ_CONFIG"] = os.path.join(os.path.dirname(__file__), "no-such-raftq-config.toml")
# The nodes' default free-disk reserve (1 GiB) would refuse every publish of the suite on a CI
# machine with less free space; the reserve's own tests set theirs (tests/node/test_limits.py).
os.environ.setdefault("RAFTQ_MIN_FREE_DISK", "64MiB")
