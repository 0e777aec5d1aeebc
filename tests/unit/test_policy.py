"""The policy on a simulated image: suppression, grace, leases, holes, cede, holding off.

No page cache here: ``World`` plays the guest, the page cache and the holder
in a few lines (what the guest caches stays cached, what the daemon loads
stays cached after its release, holes are never held), so every rule of
``vmdisktouch.core.policy`` can be driven cycle by cycle in milliseconds.
The same rules on the real page cache are covered end to end
(tests/e2e/test_daemon_e2e.py) and replayed on recorded runs
(tests/unit/test_golden.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.replay import plan_one
from vmdisktouch.core import heat, policy, rules
from vmdisktouch.core.policy import Observation, Policy, PolicyParams
from vmdisktouch.core.runs import consecutive_runs, runs_to_mask
from vmdisktouch.core.sparse import Sparse

MiB = 1 << 20


def params(max_hold_blocks: int, **over) -> PolicyParams:
    cfg = dict(amp_resident=1.0, sigma_resident=2.0, amp_rewritten=1.0, sigma_rewritten=2.0,
               decay=0.1, threshold=0.05, max_hold=max_hold_blocks * MiB, block_size=MiB,
               interval=5.0, rewritten_seconds=60.0)
    cfg.update(over)
    return PolicyParams.of(SimpleNamespace(**cfg))


class World:
    """The guest's cache, the daemon's loads and a holder that never holds a hole."""

    def __init__(self, n: int, guest, budget_blocks: int, data=None, sparse_file=False):
        self.n = n
        self.guest = np.zeros(n, np.float32)        # what the guest keeps cached (pinned)
        self.guest[guest] = 1.0
        self.loaded = np.zeros(n, bool)             # cached because the daemon loaded it
        self.held = np.zeros(n, bool)
        self.data = np.ones(n, bool) if data is None else data
        self.allocation = int(self.data.sum()) if sparse_file else None
        self.policy = Policy(n, params(budget_blocks), sparse_file=sparse_file)
        self.budget_blocks = budget_blocks
        self.now = 0.0
        self.probes: list = []

    def probe(self, run):
        self.probes.append(run)
        a, b = run
        return [(a + s, a + e) for s, e in consecutive_runs(np.flatnonzero(self.data[a:b]))]

    def cycle(self, holding=True, ceded_now=()):
        self.now += 5.0
        resident = np.maximum(self.guest, (self.loaded & self.data).astype(np.float32))
        obs = Observation(self.now, resident, self.held.copy(), Sparse.empty(),
                          self.allocation, holding)
        plan = plan_one(self.policy, obs, self.probe, self.budget_blocks)
        wanted = runs_to_mask(plan.targets, self.n)
        self.held = wanted & self.data
        self.held[list(ceded_now)] = False
        self.loaded |= self.held
        holes = consecutive_runs(np.flatnonzero(wanted & ~self.data))
        ceded = consecutive_runs(np.asarray(sorted(ceded_now), dtype=np.intp))
        self.policy.settle(self.held, holes=holes, ceded=ceded)
        return plan

    def held_blocks(self) -> set[int]:
        return set(np.flatnonzero(self.held).tolist())


# -- released blocks: the grace --------------------------------------------

def test_released_blocks_do_not_heat_until_the_grace_has_passed():
    assert policy.RELEASED_GRACE == 20.0
    w = World(64, slice(8, 16), 16)
    w.cycle()
    w.cycle()
    (s, e), = consecutive_runs(np.flatnonzero(w.held))
    assert s <= 8 and e >= 16

    def heat_of_the_guest_blocks(**kw):
        w.cycle(**kw)
        return float(w.policy.state.heat_resident[8:16].mean())

    h = [heat_of_the_guest_blocks(holding=False)]          # t = 15: everything released
    assert not w.held.any()
    h += [heat_of_the_guest_blocks(holding=False) for _ in range(5)]
    # Fully resident all along, yet no heat for 20 s: right after a release the
    # residency is the daemon's own doing. Then the guest's residency counts again.
    assert h[1] < h[0] and h[2] < h[1] and h[3] < h[2], h
    assert h[4] > h[3] + 0.2, h


def test_a_lease_that_ran_out_is_renewed_on_its_residency_at_once():
    """Released because its heat fell below the hysteresis level: no grace, held next cycle."""
    w = World(64, [8], 16)                                  # a lone guest block: a short lease
    held_at = []
    for _ in range(16):
        w.cycle()
        held_at.append(bool(w.held[8]))
    gaps = [i for i in range(1, len(held_at)) if not held_at[i] and held_at[i - 1]]
    assert gaps, held_at                                    # the lease ran out at least once
    for i in gaps:                                          # and was renewed the next cycle
        assert i + 1 == len(held_at) or held_at[i + 1], held_at
    assert 8 not in w.policy.released.blocks.tolist()


def test_a_displaced_block_waits_out_the_grace_but_a_lease_does_not():
    """Displaced (still a candidate when released) starts the grace; between cycles too."""
    w = World(64, slice(8, 16), 16)
    w.cycle()
    w.cycle()
    w.held[:] = False                    # released between cycles (a reload, the domain stopped)
    w.cycle(holding=False)
    assert set(w.policy.released.blocks.tolist()) >= set(range(8, 16))
    for _ in range(4):                   # t = 20 .. 35: past the grace, forgotten
        w.cycle(holding=False)
    assert not w.policy.released.blocks.size




def test_shoulders_the_daemon_loaded_are_suppressed_until_evicted():
    w = World(64, [30], 16)
    w.cycle()
    shoulders = w.held & (w.guest == 0)
    assert shoulders.any() and w.policy.self_loaded[shoulders].all()
    assert not w.policy.self_loaded[30]                     # the guest's own block


# -- holes of a sparse file ----------------------------------------------------

DATA = list(range(10, 26, 2))          # blocks 10, 12, ..., 24 hold data; 11, 13, ... are holes


def test_the_budget_goes_to_data_blocks_not_to_the_holes_between_them():
    data = np.zeros(64, bool)
    data[DATA] = True
    # The guest reads blocks 10-25, data and holes alike (a hole read is cached as zeros).
    w = World(64, slice(10, 26), 8, data=data, sparse_file=True)
    # The candidates are probed before the first selection: the budget goes to the
    # eight data blocks at once, none of it to the holes between them.
    w.cycle()
    assert w.held_blocks() == set(DATA) and w.probes
    assert set(np.flatnonzero(w.policy.known.holes).tolist()) >= {11, 13, 15}
    for _ in range(3):
        w.cycle()
        assert w.held_blocks() <= set(DATA)

    # The guest fills hole 17: the allocation grew, the known holes are probed again as
    # they become candidates, and block 17 competes as data. Never a hole held.
    w.data[17] = True
    w.allocation += 1
    w.cycle()
    assert not w.policy.known.holes[17]
    for _ in range(8):
        w.cycle()
        assert w.held_blocks() <= set(DATA) | {17}
        if len(w.held_blocks()) == 8:
            break
    assert len(w.held_blocks()) == 8
    assert not w.policy.known.holes[17] and w.policy.known.holes[[11, 13, 15]].all()


def test_a_shrinking_allocation_forgets_everything_known():
    data = np.zeros(64, bool)
    data[DATA] = True
    w = World(64, slice(10, 26), 8, data=data, sparse_file=True)
    w.cycle()
    assert w.policy.known.probed.any()
    w.allocation -= 1                                        # something was punched
    w.probes.clear()
    w.cycle()
    assert w.probes                                          # probed again from scratch


def test_a_block_device_is_never_probed():
    w = World(64, slice(10, 26), 8)
    w.cycle()
    assert not w.probes and w.held.sum() == 8


# -- ceded blocks, holding off, resizing --------------------------------------

def test_ceded_blocks_stay_out_of_the_selection_for_the_cede_time():
    w = World(64, slice(8, 16), 16)
    w.cycle()
    w.cycle(ceded_now={9, 10})
    assert not w.held[[9, 10]].any()
    for _ in range(int(policy.CEDE_SECONDS // 5) - 1):     # 5 .. 55 s after the cede
        w.cycle()
        assert not w.held[[9, 10]].any(), w.now
    w.cycle()                                               # 60 s: the guest's time is up
    assert w.held[[9, 10]].all()


def test_holding_off_plans_nothing_but_keeps_the_heat():
    w = World(64, slice(8, 16), 16)
    plan = w.cycle(holding=False)
    assert plan.targets == [] and plan.heat[8:16].min() > 0


def test_resize_keeps_the_common_prefix_and_forgets_the_holes():
    w = World(64, slice(8, 16), 16)
    w.cycle()
    before = w.policy.state.total[:32].copy()
    w.policy.resize(32)
    assert w.policy.nblocks == 32 and w.policy.held_after.size == 32
    np.testing.assert_array_equal(w.policy.state.total, before)
    w.policy.resize(128)
    assert w.policy.state.total[32:].sum() == 0 and not w.policy.known.holes.any()


def test_rewrites_make_a_region_first_class_and_red():
    w = World(64, [], 4)
    pol = w.policy
    held = np.zeros(64, bool)
    held[40:44] = True
    resident = np.zeros(64, np.float32)
    resident[8:16] = 1.0                                    # much hotter by residency
    rew = Sparse(np.arange(40, 44), np.full(4, 0.5))
    plan = plan_one(pol, Observation(5.0, resident, held, rew, None), w.probe, 4)
    assert plan.targets[0][0] >= 36 and plan.recent[40:44].min() == 0.5
    assert pol.red.runs() == [(40, 44)]
    pol.settle(held)
    plan = plan_one(pol, Observation(10.0, resident, held, Sparse.empty(), None), w.probe, 4)
    assert plan.recent is not None and plan.recent[40] == 0.5   # the cycle before counts
    assert not plan.quiet[40] and plan.quiet[8]


def test_the_policy_decides_with_the_rules_of_core_rules():
    """The policy's constants are those of ``core.rules``, each stated with a unit and a
    meaning (the table of docs/algorithm.md is generated from them)."""
    for name in ("INCUMBENT_WEIGHT", "HOLD_FRACTION", "REWRITTEN_DENSITY", "GUEST_RESIDENT",
                 "RELEASED_GRACE", "CEDE_SECONDS", "TRACED_INCUMBENT", "SPLIT_CONTRAST",
                 "SPLIT_MIN_RATIO", "SPLIT_MIN_BLOCKS"):
        rule = rules.BY_NAME[name]
        assert getattr(policy, name) == rule.value, name
        assert rule.unit and rule.meaning, name
    for name in ("INCUMBENT_WEIGHT", "HOLD_FRACTION", "REWRITTEN_DENSITY", "GUEST_RESIDENT",
                 "RELEASED_GRACE", "CEDE_SECONDS"):
        assert isinstance(getattr(policy, name), float), name


def test_self_loaded_marks_only_what_the_daemon_brought_into_the_cache():
    frac = np.array([0.0, 1.0, 0.2, 0.0, 0.9], np.float32)      # scanned before the load
    before = np.array([0, 0, 0, 0, 0], bool)
    after = np.array([1, 1, 1, 0, 0], bool)                       # blocks 0-2 loaded now
    marked = policy.self_loaded(None, frac, before, after)
    assert marked.tolist() == [True, False, True, False, False]   # 1 was the guest's


def test_self_loaded_lasts_while_held_or_cached_and_ends_at_eviction():
    n = 3
    marked = np.array([True, True, True])
    held = np.array([True, False, False])
    # Block 0 still held, block 1 released but still cached, block 2 evicted.
    frac = np.array([1.0, 1.0, 0.1], np.float32)
    out = policy.self_loaded(marked, frac, held, held)
    assert out.tolist() == [True, True, False]
    # Once evicted, residency there is the guest's again: a re-read is evidence.
    out2 = policy.self_loaded(out, np.array([1.0, 0.0, 1.0], np.float32), held, held)
    assert out2.tolist() == [True, False, False]
    assert policy.self_loaded(None, np.zeros(n, np.float32), np.zeros(n, bool),
                            np.zeros(n, bool)).tolist() == [False] * n


def test_released_shoulders_do_not_heat_their_region_wider():
    """A lone guest block held with its shoulders, released, still cached: no creep."""
    p = heat.HeatParams(amp_resident=1.0, sigma_resident=2.0, amp_rewritten=1.0,
                        sigma_rewritten=2.0, decay=0.1, threshold=0.05)
    n = 200
    guest = np.zeros(n, np.float32)
    guest[100] = 1.0
    state = heat.new_state(n)
    for _ in range(20):                                           # its steady state
        state = heat.step(state, guest, None, None, 5.0, p)
    region = np.flatnonzero(state.total >= p.threshold)
    assert region.size > 1
    held = np.zeros(n, bool)
    held[region] = True
    marked = policy.self_loaded(None, guest, np.zeros(n, bool), held)
    assert marked.sum() == region.size - 1                        # all but the guest's block
    cached = guest.copy()
    cached[region] = 1.0                                          # after the load, and after
    released = np.zeros(n, bool)                                  # its release: still cached
    marked = policy.self_loaded(marked, cached, held, released)
    for _ in range(10):
        state = heat.step(state, cached, released | marked, None, 5.0, p)
    wider = np.flatnonzero(state.total >= p.threshold)
    assert set(wider) <= set(region), (region, wider)
    unmarked = heat.step(state, cached, released, None, 5.0, p)
    assert np.flatnonzero(unmarked.total >= p.threshold).size > region.size   # the creep
