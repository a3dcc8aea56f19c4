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
