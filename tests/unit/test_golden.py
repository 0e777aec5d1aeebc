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

import gzip
import json
import pathlib
from types import SimpleNamespace

import numpy as np
import pytest

from vmdisktouch.core.policy import Observation, Policy, PolicyParams
from vmdisktouch.core.runs import runs_to_mask
from vmdisktouch.core.sparse import Sparse

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden" / "policy"
SCENARIOS = ("base", "move", "write50", "bigset")


def load(name: str) -> list[dict]:
    with gzip.open(GOLDEN / f"{name}.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def observation(c: dict) -> Observation:
    n = c["nblocks"]
    resident = np.zeros(n, dtype=np.float32)
    blocks, values = c["resident"]
    resident[blocks] = values
    rblocks, rvalues = c["rewritten"]
    return Observation(now=c["t"], resident=resident, held=runs_to_mask(c["held"], n),
                       rewritten=Sparse(np.asarray(rblocks, dtype=np.intp),
                                        np.asarray(rvalues, dtype=float)),
                       allocation=c.get("allocation"), holding=c["enabled"])


class RecordedProbes:
    """Answers the policy's hole probes from the record, in the recorded order.

    ``strict``: a probe the recorded cycle did not make fails the test;
    otherwise it is answered "all data".
    """

    def __init__(self, probes, strict: bool = True):
        self.left = [((a, b), [tuple(r) for r in data]) for a, b, data in probes]
        self.strict = strict

    def __call__(self, run):
        if self.left and tuple(run) == self.left[0][0]:
            return self.left.pop(0)[1]
        assert not self.strict, f"probe of {run}; the recorded cycle made {self.left[:1]}"
        return [tuple(run)]


def replay(cycles: list[dict], strict: bool = True):
    """Yield (cycle number, record, plan, policy) for every recorded cycle."""
    first = cycles[0]
    settings = first["settings"]
    policy = Policy(first["nblocks"], PolicyParams.of(SimpleNamespace(**settings)),
                    sparse_file=first["skip_holes"])
    for i, c in enumerate(cycles):
        if c["settings"] != settings:
            settings = c["settings"]
            policy.params = PolicyParams.of(SimpleNamespace(**settings))
        if c["nblocks"] != policy.nblocks:
            policy.resize(c["nblocks"])
        probes = RecordedProbes(c["probes"], strict)
        plan = policy.decide(observation(c), probes)
        assert not (strict and probes.left), f"cycle {i}: recorded probes not made: {probes.left}"
        yield i, c, plan, policy
        policy.settle(runs_to_mask(c["held_after"], c["nblocks"]),
                      holes=[tuple(r) for r in c.get("holes_found", [])],
                      ceded=[tuple(r) for r in c.get("ceded", [])])


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
