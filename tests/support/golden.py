"""Where the golden traces are and which ones there are: tests/unit/test_golden.py
replays them, ``python -m tools.golden_replan`` re-derives their plans."""

from __future__ import annotations

import pathlib

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden" / "policy"
SCENARIOS = ("base", "move", "write50", "bigset")
TRACE_SCENARIOS = tuple(f"trace-{name}" for name in SCENARIOS)
HOST_SCENARIOS = ("host-three",)
