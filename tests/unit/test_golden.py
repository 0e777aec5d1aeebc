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

The ``trace-*`` files are the same four variants run with ``--access-source
trace`` (commit 876a386, 100 s each): their cycles also carry the guest's
reads, read counts (all and by recency) and refaults, and pin the rules only
that source uses: the stay, the split, the read intensity, the thrash and
the traced incumbency. (The spill is not recorded, so not replayed.)

Issue 32 changed the selection's rules (``core.regions``: benefit per byte):
the observations stay as recorded, and every cycle's plan was re-derived from
them by ``python -m tools.golden_replan`` (each cycle's ``replanned`` says
why); 21 of the 184 cycles changed, in their order or at a zone's edges.

``host-three`` is a host of three disks (``python -m tests.support.golden_host``: the
daemon on three 64M data images under 24M, hot zones of 8M, 16M and 8M, the
last read in the first half only), one line per host cycle: every disk's
record, the budget and the shared selection. Its replay runs a fresh
``Policy`` per disk and one selection over the three maps
(``tests.support.replay.replay_host``), and asserts every disk's plan and share.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

from tests.support.golden import GOLDEN, HOST_SCENARIOS, SCENARIOS, TRACE_SCENARIOS
from tests.support.replay import read_record, replay, replay_host

MiB = 1 << 20


def load(name: str) -> list[dict]:
    return read_record(GOLDEN / f"{name}.jsonl.gz")


@pytest.mark.parametrize("name", SCENARIOS + TRACE_SCENARIOS)
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


# -- the trace source's traces ------------------------------------------------

def held_share(c: dict, start_mib: int, length_mib: int) -> float:
    """The share of a zone (MiB, as bench_hotzone prints its phases) held after cycle ``c``."""
    bs = c["settings"]["block_size"]
    a, b = start_mib * MiB // bs, (start_mib + length_mib) * MiB // bs
    return sum(max(0, min(b, y) - max(a, x)) for x, y in c["held_after"]) / (b - a)


def since_start(cycles: list[dict], c: dict) -> float:
    return c["t"] - cycles[0]["t"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_trace_traces_carry_the_guests_reads(name):
    """Every cycle of a trace trace has the trace source's evidence, and reads were seen."""
    cycles = load(f"trace-{name}")
    assert all(c.get("reads") is not None and c.get("read_counts") and c.get("read_recent")
               and c.get("refaults") for c in cycles)
    assert sum(bool(c["reads"]) for c in cycles) >= len(cycles) - 1     # all but the first
    assert sum(bool(c["read_counts"][0]) for c in cycles) >= len(cycles) - 1
    assert sum(bool(c["targets"]) for c in cycles) >= len(cycles) // 2


def test_trace_base_holds_the_hot_zone_and_stays():
    """The hot zone (409M at 1024M) is held from the first plan on, and the held set does
    not change in the second half (the stay and the traced incumbency)."""
    cycles = load("trace-base")
    assert all(held_share(c, 1024, 409) >= 0.95 for c in cycles[1:])
    assert len({tuple(map(tuple, c["held_after"])) for c in cycles[len(cycles) // 2:]}) == 1


def test_trace_move_follows_the_zones_that_moved():
    """Two zones of 204M at 614M and 2252M move at 50 s to 1433M and 3276M: the first are
    held before the move, the new ones within 15 s after it (the intensity), and the old
    ones are let go."""
    old, new = [(614, 204), (2252, 204)], [(1433, 204), (3276, 204)]
    cycles = load("trace-move")
    before = [c for c in cycles[1:] if since_start(cycles, c) < 50]
    assert before and all(held_share(c, *z) >= 0.95 for c in before for z in old)
    assert not any(held_share(c, *z) for c in before for z in new)
    followed = [c for c in cycles if all(held_share(c, *z) >= 0.95 for z in new)]
    assert followed and since_start(cycles, followed[0]) <= 65
    assert not any(held_share(cycles[-1], *z) for z in old)


def test_trace_write50_sees_the_writes():
    """Half the guest's I/O is writes: rewrites every cycle, held blocks shown red, and
    the hot zone (409M at 1024M) held."""
    cycles = load("trace-write50")
    assert sum(bool(c["rewritten"][0]) for c in cycles) >= len(cycles) - 1
    assert sum(bool(c["red"]) for c in cycles) >= len(cycles) // 2
    assert held_share(cycles[-1], 1024, 409) >= 0.95


def test_trace_bigset_thrashes_and_the_hotter_zone_keeps_the_hold():
    """A hot set twice the budget (409M at 1024M, 613M at 1689M): pages refault, blocks
    thrash, the budget is full and the hotter zone has it."""
    cycles = load("trace-bigset")
    assert sum(bool(c["refaults"][0]) for c in cycles) >= len(cycles) // 2
    assert [i for i, _, _, policy in replay(cycles) if policy.thrashing().size]
    last = cycles[-1]
    budget = last["settings"]["max_hold"] // last["settings"]["block_size"]
    assert sum(b - a for a, b in last["held_after"]) == budget
    assert held_share(last, 1024, 409) >= 0.95


def _traced_rules(**changes):
    def change(monkeypatch):
        from vmdisktouch.core import policy as policy_mod
        monkeypatch.setattr(policy_mod, "TRACED_RULES",
                            dataclasses.replace(policy_mod.TRACED_RULES, **changes))
    return change


def _constant(module: str, name: str, value):
    def change(monkeypatch):
        monkeypatch.setattr(importlib.import_module(f"vmdisktouch.core.{module}"), name, value)
    return change


@pytest.mark.parametrize("name, change", [
    ("base", _traced_rules(stay_unless_better=False)),
    ("move", _traced_rules(split_contrast=None)),
    ("base", _traced_rules(incumbent_weight=1.0)),
    ("write50", _traced_rules(rewritten_first=True)),
    ("move", _constant("intensity", "RATE_SECONDS", 25.0)),
    ("move", _constant("thrash", "WEIGHT", 0.0)),
], ids=["stay", "split", "traced-incumbent", "no-first-class", "intensity", "thrash"])
def test_a_changed_trace_rule_changes_the_plans(monkeypatch, name, change):
    """The trace traces pin the trace source's own rules: without one, a replay diverges."""
    change(monkeypatch)
    cycles = load(f"trace-{name}")
    differ = [i for i, c, plan, _ in replay(cycles, strict=False)
              if [list(r) for r in plan.targets] != c["targets"]]
    assert differ


# -- a host of three disks ------------------------------------------------------

def test_the_host_makes_the_recorded_plans_and_shares_every_cycle():
    cycles = load("host-three")
    assert len(cycles) >= 12
    for i, h, disks, alloc in replay_host(cycles):
        assert len(disks) == 3
        for c, plan, policy in disks:
            where = f"cycle {i}, {c['path']}"
            assert [list(r) for r in plan.targets] == c["targets"], where
            assert float(plan.heat.sum(dtype=np.float64)) == pytest.approx(
                c["heat_sum"], rel=1e-6, abs=1e-9), where
            assert [list(r) for r in policy.red.runs()] == c["red"], where
        chosen = [s for s in h["selection"] if s is not None]
        assert [s["runs"] for s in chosen] == [[list(r) for r in rs] for rs in alloc.runs]
        assert [(s["share"], s["wanted"], s["limit"]) for s in chosen] == \
            list(zip(alloc.share, alloc.wanted, alloc.limit)), f"cycle {i}"


def test_the_host_trace_shares_a_full_budget():
    """The three zones want more than the budget: it is full, every disk holds some of it,
    and the disk read only in the first half is let go for the others."""
    cycles = load("host-three")
    budget = cycles[0]["budget_blocks"]
    held = [{d["path"]: sum(b - a for a, b in d["held_after"]) for d in h["disks"]}
            for h in cycles]
    assert any(sum(x.values()) == budget for x in held)
    assert all(sum(x.values()) <= budget for x in held)
    assert any(s and s["limit"] == "budget" for h in cycles for s in h["selection"])
    a, b, c = cycles[0]["disks"]
    assert all(any(x[d["path"]] for x in held) for d in (a, b, c))
    assert held[-1][c["path"]] == 0 and held[-1][a["path"]] and held[-1][b["path"]]


def test_the_host_plans_are_the_shared_selections():
    """Each disk replayed alone under the whole budget plans otherwise: the one selection
    over the three maps is what the trace pins."""
    cycles = load("host-three")
    differ = []
    for k in range(3):
        alone = [dict(h, disks=[h["disks"][k]], selection=[h["selection"][k]])
                 for h in cycles]
        differ += [(i, k) for i, _, [(c, plan, _)], _ in replay_host(alone)
                   if [list(r) for r in plan.targets] != c["targets"]]
    assert differ
