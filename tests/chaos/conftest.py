"""Chaos tests import the harness from the top-level ``chaos/`` folder (not part of raftq)."""

from __future__ import annotations

import sys
from pathlib import Path

CHAOS_ROOT = Path(__file__).resolve().parents[2] / "chaos"
if str(CHAOS_ROOT) not in sys.path:
    sys.path.insert(0, str(CHAOS_ROOT))
