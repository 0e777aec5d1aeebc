"""Regions on synthetic heat maps: threshold, ranking, budget, hysteresis."""

import numpy as np
import pytest

from vmdisktouch.core import regions
from vmdisktouch.core.policy import HOLD_FRACTION, INCUMBENT_WEIGHT, SELECT_RULES


def select(heat, rewritten, threshold, budget, held=None, recent=None, candidates=None):
    """One disk's runs of the host's selection, with the policy's rules."""
    one = regions.DiskMap(heat, threshold, rewritten, held, recent, candidates)
    return regions.select_many([one], budget, SELECT_RULES)[0]


def candidate_mask(heat, threshold, held=None):
    return regions.candidate_mask(heat, threshold, held, SELECT_RULES)


def find_regions(heat, threshold):
    """Runs of blocks at or above the threshold (NaN is never hot)."""
    return regions.mask_runs(np.asarray(heat) >= threshold)

THR = 0.2


def heatmap(n, *spans):
    """A float32 map with ``(start, stop, value)`` spans."""
    h = np.zeros(n, np.float32)
    for start, stop, value in spans:
        h[start:stop] = value
    return h


def total_len(runs):
    return sum(e - s for s, e in runs)


# -- runs at the threshold ---------------------------------------------------------

def test_find_regions_cuts_at_the_threshold_inclusive():
    h = np.array([0, 0.2, 0.3, 0.1, 0.5, 0.19, 0.2], np.float32)
    assert find_regions(h, np.float32(0.2)) == [(1, 3), (4, 5), (6, 7)]
    assert find_regions(np.zeros(5), THR) == []
    assert find_regions(np.ones(3), THR) == [(0, 3)]
    assert find_regions(np.zeros(0), THR) == []
    assert find_regions(np.array([np.nan, 1.0]), THR) == [(1, 2)]
    assert all(type(x) is int for run in find_regions(np.ones(3), THR) for x in run)


def test_find_regions_matches_a_naive_scan():
    rng = np.random.default_rng(4)
    for _ in range(50):
        h = rng.random(int(rng.integers(1, 300))).astype(np.float32)
        want, start = [], None
        for i, v in enumerate(h):
            if v >= 0.6 and start is None:
                start = i
            if v < 0.6 and start is not None:
                want.append((start, i))
                start = None
        if start is not None:
            want.append((start, len(h)))
        assert find_regions(h, 0.6) == want


# -- select: threshold and ranking --------------------------------------

def test_below_threshold_blocks_are_never_selected():
    rng = np.random.default_rng(5)
    for _ in range(100):
        n = int(rng.integers(1, 400))
        h = (rng.random(n) * 0.5).astype(np.float32)
        out = select(h, None, THR, int(rng.integers(0, n + 5)), None)
        for s, e in out:
            assert (h[s:e] >= THR).all()


def test_regions_are_ranked_by_heat_per_block_narrow_hot_beats_wide_warm():
    """Benefit per byte (#32): before, by summed heat, the wide warm region came first and
    took a budget of 40 whole."""
    h = heatmap(200, (10, 14, 3.0),          # narrow hot: 3 per block (sum 12)
                (50, 90, 0.5),               # wide warm: 0.5 per block (sum 20)
                (120, 125, 0.3))             # small warm: 0.3 per block
    assert select(h, None, THR, 1000, None) == [(10, 14), (50, 90), (120, 125)]
    # the hot one first, the wide one windowed to what is left
    out = select(h, None, THR, 40, None)
    assert out[0] == (10, 14) and total_len(out) == 40 and 50 <= out[1][0] < out[1][1] <= 90


def mask(n, *runs):
    m = np.zeros(n, bool)
    for a, b in runs:
        m[a:b] = True
    return m


def test_recently_rewritten_blocks_raise_priority():
    h = heatmap(300, (10, 60, 1.0),          # hot by residency: sum 50
                (100, 150, 0.5))             # cooler, but rewritten
    w = heatmap(300, (100, 150, 0.3))
    recent = mask(300, (100, 150))           # rewritten all over this cycle
    assert select(h, None, THR, 50, None) == [(10, 60)]
    assert select(h, w, THR, 50, None, recent) == [(100, 150)]
    assert select(h, w, THR, 100, None, recent) == [(100, 150), (10, 60)]


def test_recently_rewritten_regions_rank_among_themselves_by_rewritten_sum():
    h = heatmap(300, (10, 20, 2.0), (100, 110, 1.0))
    w = heatmap(300, (10, 20, 0.1), (100, 110, 0.5))
    recent = mask(300, (10, 20), (100, 110))
    assert select(h, w, THR, 100, None, recent) == [(100, 110), (10, 20)]


def test_rewritten_heat_without_a_recent_rewrite_only_adds_heat():
    """A zone the guest stopped writing competes on its total heat, however large its
    rewritten heat still is (the moved hot zone of docs/benchmarks.md, hotzone-move)."""
    h = heatmap(300, (10, 60, 1.0), (100, 150, 0.5))
    w = heatmap(300, (100, 150, 0.4))        # large, but no block rewritten recently
    assert select(h, w, THR, 50, None, mask(300)) == [(10, 60)]
    assert select(h, w, THR, 50, None, None) == [(10, 60)]
    assert select(h, w, THR, 50, None, mask(300, (100, 150))) == [(100, 150)]


def test_stray_rewrites_do_not_make_a_region_rewritten_but_dense_ones_do():
    """The zone a guest left still takes stray writes: a quarter of its blocks, a
    sixteenth of each, per cycle. The zone it writes now: most of most blocks."""
    h = heatmap(300, (10, 60, 1.0), (100, 150, 0.5))
    w = heatmap(300, (100, 150, 0.4))
    stray = np.zeros(300, np.float32)
    stray[100:150:4] = 1 / 16
    assert select(h, w, THR, 50, None, stray) == [(10, 60)]
    dense = np.zeros(300, np.float32)
    dense[100:150] = 0.75
    assert select(h, w, THR, 50, None, dense) == [(100, 150)]
    # At the density level exactly: one rewritten sixteenth per block on average.
    edge = np.zeros(300, np.float32)
    edge[100:150:2] = 2 / 16
    assert select(h, w, THR, 50, None, edge) == [(100, 150)]


def test_incumbency_weighs_resident_heat_not_rewritten_heat():
    # Held zone A was written long ago: heat 0.6, all of it rewritten heat.
    # Unheld zone B is used now: resident heat 0.7.
    h = heatmap(100, (10, 20, 0.6), (50, 60, 0.7))
    w = heatmap(100, (10, 20, 0.6))
    held = mask(100, (10, 20))
    assert select(h, w, THR, 10, held) == [(50, 60)]
    # The same heat as resident heat (suppressed while held) keeps its place.
    assert select(h, None, THR, 10, held) == [(10, 20)]


def test_recent_rewrites_of_the_wrong_shape_are_refused():
    h = heatmap(100, (10, 20, 1.0))
    with pytest.raises(ValueError, match="recent_rewrites"):
        select(h, None, THR, 10, None, np.zeros(99, bool))


def test_ties_go_to_the_lower_block_number():
    h = heatmap(100, (60, 70, 1.0), (10, 20, 1.0))
    assert select(h, None, THR, 100, None) == [(10, 20), (60, 70)]


# -- select: budget -------------------------------------------------------

def test_zero_budget_or_empty_map_selects_nothing():
    h = heatmap(10, (0, 10, 1.0))
    assert select(h, None, THR, 0, None) == []
    assert select(np.zeros(0, np.float32), None, THR, 5, None) == []
    with pytest.raises(ValueError):
        select(h, None, THR, -1, None)
    with pytest.raises(ValueError):
        select(h, None, 0.0, 5, None)


def test_a_region_that_does_not_fit_is_cut_to_its_hottest_window():
    h = heatmap(100, (10, 40, 0.5), (25, 30, 2.0))   # one region, hot core 25..30
    assert select(h, None, THR, 5, None) == [(25, 30)]
    out = select(h, None, THR, 9, None)
    assert total_len(out) == 9 and out[0][0] <= 25 and out[0][1] >= 30


def test_a_denser_region_comes_before_a_larger_one_at_any_budget():
    # A: 100 blocks at 0.5 (sum 50); B: 10 blocks at 3 (sum 30): B is denser.
    h = heatmap(300, (0, 100, 0.5), (200, 210, 3.0))
    for budget in (5, 40, 80, 105):
        out = select(h, None, THR, budget, None)
        assert total_len(out) == budget
        assert out[0] == ((200, 200 + budget) if budget < 10 else (200, 210))
        if budget > 10:
            assert out[1][1] - out[1][0] == budget - 10 and out[1][1] <= 100


def test_the_budget_is_never_exceeded_and_runs_never_overlap():
    rng = np.random.default_rng(6)
    for trial in range(500):
        n = int(rng.integers(1, 600))
        # blobby maps: smoothed noise with a few hot spots
        h = np.convolve(rng.random(n) ** 4, np.ones(5) / 5, mode="same").astype(np.float32)
        h *= rng.uniform(0.2, 3.0)
        w = (rng.random(n) < 0.05) * rng.random(n) if trial % 2 else None
        held = rng.random(n) < 0.3 if trial % 3 else None
        budget = int(rng.integers(0, n + 10))
        out = select(h, w, THR, budget, held)
        assert total_len(out) <= budget
        mask = np.zeros(n, int)
        for s, e in out:
            assert 0 <= s < e <= n
            mask[s:e] += 1
        assert mask.max(initial=0) <= 1                      # no overlap
        cand = candidate_mask(h, THR, held)
        assert cand[mask.astype(bool)].all()                  # only candidate blocks
        # the budget is used up whenever the candidates cover it
        assert total_len(out) == min(budget, int(cand.sum()))
        # output runs are not adjacent (so each is a hold of its own)
        ends = sorted(out)
        assert all(a[1] < b[0] for a, b in zip(ends, ends[1:]))


# -- select: hysteresis ---------------------------------------------------

def test_held_blocks_stay_candidates_down_to_the_hold_fraction():
    h = heatmap(100, (10, 30, THR * 0.75))      # below the threshold, above half of it
    held = np.zeros(100, bool)
    assert select(h, None, THR, 100, held) == []
    held[10:30] = True
    assert select(h, None, THR, 100, held) == [(10, 30)]
    h2 = heatmap(100, (10, 30, THR * HOLD_FRACTION * 0.9))
    assert select(h2, None, THR, 100, held) == []           # released below the lower level


def test_hysteresis_applies_only_to_held_blocks():
    h = heatmap(100, (10, 30, THR * 0.75), (30, 40, 1.0))
    held = np.zeros(100, bool)
    held[10:20] = True
    # held 10..20 stays, unheld 20..30 warm-but-below does not join; 30..40 is hot
    assert sorted(select(h, None, THR, 100, held)) == [(10, 20), (30, 40)]


# -- scale ----------------------------------------------------------------

def test_a_million_block_selection_runs():
    n = 1 << 20
    rng = np.random.default_rng(8)
    h = np.convolve(rng.random(n) ** 8, np.ones(9) / 9, mode="same").astype(np.float32)
    h[1000:50000] = 0.9
    held = np.zeros(n, bool)
    held[1000:30000] = True
    out = select(h, h * 0.01, THR, 40000, held, h > 0.95)
    assert 0 < total_len(out) <= 40000
    assert all(h[a:b].min() >= THR * HOLD_FRACTION for a, b in out)


# -- select: incumbency ---------------------------------------------------

def test_a_held_region_keeps_its_place_against_an_equal_unheld_one():
    # Feedback suppression has cooled the held region to a third of an equal unheld one.
    h = heatmap(100, (10, 20, 0.3), (50, 60, 0.9))
    held = np.zeros(100, bool)
    assert select(h, None, THR, 10, held) == [(50, 60)]      # nothing held: the hotter wins
    held[10:20] = True
    assert select(h, None, THR, 10, held) == [(10, 20)]      # held: it keeps the budget


def test_a_much_hotter_challenger_displaces_a_held_region():
    held = np.zeros(100, bool)
    held[10:20] = True
    weak = INCUMBENT_WEIGHT * 0.3
    assert select(heatmap(100, (10, 20, 0.3), (50, 60, weak * 0.9)), None, THR, 10,
                  held) == [(10, 20)]
    assert select(heatmap(100, (10, 20, 0.3), (50, 60, weak * 1.1)), None, THR, 10,
                  held) == [(50, 60)]


def test_a_window_cut_to_the_budget_stays_on_the_held_blocks():
    h = heatmap(100, (10, 40, 0.5))
    held = np.zeros(100, bool)
    held[25:35] = True
    assert select(h, None, THR, 10, held) == [(25, 35)]
    assert select(h, None, THR, 10, None) == [(10, 20)]      # unheld: the first on ties


def test_equal_candidates_larger_than_the_budget_do_not_thrash():
    """Twenty equally used extents, a budget of five: the holds last their lease, not a cycle."""
    from vmdisktouch.core import heat
    p = heat.HeatParams(amp_resident=1.0, sigma_resident=2.0, amp_rewritten=4.0,
                        sigma_rewritten=2.0, decay=0.1, threshold=0.05)
    n = 1000
    resident = np.zeros(n, np.float32)
    resident[np.arange(20) * 50 + 25] = 1.0          # isolated cached blocks, always resident
    state = heat.new_state(n)
    held = np.zeros(n, bool)
    changes = 0
    for cycle in range(24):                          # two minutes of 5 s cycles
        state = heat.step(state, resident, held, np.zeros(n, bool), 5.0, p)
        targets = select(state.total, state.heat_rewritten, p.threshold, 25, held)
        new = np.zeros(n, bool)
        for a, b in targets:
            new[a:b] = True
        if cycle > 2 and (new & ~held).any():
            changes += 1
        held = new
    assert held.sum() == 25
    # A lone cached block's region cools below the hold level in ~20 s (4 cycles): a lease.
    # Without incumbency and the whole-run hold level the holds moved in 20 of 21 cycles.
    assert changes <= 6, f"the holds moved in {changes} of 21 cycles"


def test_segment_sums_of_sparse_and_dense_runs_agree_with_plain_sums():
    # Few candidate blocks in a large map take the gathering path, many take reduceat.
    rng = np.random.default_rng(3)
    for n, runs in ((100_000, 40), (2_000, 300)):
        values = rng.random(n).astype(np.float32)
        mask = np.zeros(n, dtype=bool)
        for s in rng.choice(n - 10, runs, replace=False):
            mask[s:s + int(rng.integers(1, 8))] = True
        mask[-1] = True                                   # a run that ends at the map's end
        edges = regions.mask_edges(mask)
        want = [values[a:b].sum(dtype=np.float64) for a, b in zip(edges[0::2], edges[1::2])]
        np.testing.assert_allclose(regions._segment_sums(values, edges), want, rtol=1e-12)


def test_a_precomputed_candidate_mask_selects_the_same_runs():
    rng = np.random.default_rng(5)
    heat = (rng.random(5000) * (rng.random(5000) < 0.2)).astype(np.float32)
    held = np.zeros(5000, dtype=bool)
    held[100:140] = True
    cand = candidate_mask(heat, 0.3, held)
    assert select(heat, None, 0.3, 200, held, candidates=cand) == select(heat, None, 0.3, 200, held)
    assert select(heat, None, 0.3, 200, held, candidates=np.zeros(5000, bool)) == []
