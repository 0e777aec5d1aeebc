"""Golden traces: the policy replayed on the observations of real bench_hotzone runs.

Each file of tests/golden/policy holds every cycle of one ``bench_hotzone``
run of the daemon (variants base, move, write50 and bigset: a guest under
memory pressure with a hot zone, hot zones that move, 50 % writes, a hot set
twice the budget), one gzip JSON line per cycle, written by the daemon with
``VMDISKTOUCH_RECORD=FILE`` (see docs/architecture.md, "Golden traces"):

* what the cycle observed: the time, the residency of every block, the held
  runs, the rewritten blocks, the file's allocation, the probes for holes
  and their answers;
* what it decided: the target runs in priority order, the heat map's sum
  and the blocks shown red;
* what the holder then held, the holes it met and the blocks ceded.

The replay feeds the observations to a fresh ``Policy``, answers its probes
from the record, and asserts that every cycle's plan is the recorded one.
The traces were recorded with the daemon as it was before the policy was
taken out of it (commit 5da9cb1), so they pin the behaviour across rewrites.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from tests.replay import read_record, replay

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden" / "policy"
SCENARIOS = ("base", "move", "write50", "bigset")


def load(name: str) -> list[dict]:
    return read_record(GOLDEN / f"{name}.jsonl.gz")


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_policy_makes_the_recorded_plan_every_cycle(name):
    cycles = load(name)
    assert len(cycles) >= 20
    for i, c, plan, policy in replay(cycles):
        assert [list(r) for r in plan.targets] == c["targets"], f"{name}, cycle {i}"
        assert float(plan.heat.sum(dtype=np.float64)) == pytest.approx(c["heat_sum"],
                                                                      rel=1e-6, abs=1e-9)
        assert [list(r) for r in policy.red.runs()] == c["red"], f"{name}, cycle {i}"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_traces_exercise_what_they_are_kept_for(name):
    """Each trace holds, releases and (but base) sees rewrites: a replay that checks something."""
    cycles = load(name)
    held_sets = [tuple(map(tuple, c["held_after"])) for c in cycles]
    assert sum(bool(c["targets"]) for c in cycles) >= len(cycles) // 2
    assert len(set(held_sets)) >= 3                     # the holds changed over the run
    assert any(c["rewritten"][0] for c in cycles)       # the guest's writes were seen


def test_a_changed_rule_changes_the_plans(monkeypatch):
    """The replay is sensitive: without the release grace the move trace diverges."""
    from vmdisktouch.core import policy as policy_mod
    monkeypatch.setattr(policy_mod, "RELEASED_GRACE", 0.0)
    cycles = load("move")
    differ = [i for i, c, plan, _ in replay(cycles, strict=False)
              if [list(r) for r in plan.targets] != c["targets"]]
    assert differ
