"""The pure heat map on synthetic maps: smoothing, suppression, decay."""

import math

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter1d

from vmdisktouch.core import heat
from vmdisktouch.core.heat import HeatParams

# The settings defaults, spelled here only to make the arithmetic readable.
P = HeatParams(amp_resident=1.0, sigma_resident=2.0, amp_rewritten=4.0, sigma_rewritten=2.0,
               decay=0.01, threshold=0.2)


def params(**kw):
    base = dict(amp_resident=1.0, sigma_resident=2.0, amp_rewritten=4.0, sigma_rewritten=2.0,
                decay=0.01, threshold=0.2)
    base.update(kw)
    return HeatParams(**base)


def zeros(n, dtype=np.float32):
    return np.zeros(n, dtype=dtype)


# -- parameters and state ------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("amp_resident", -1.0), ("sigma_resident", -0.5), ("amp_rewritten", float("nan")),
    ("sigma_rewritten", float("inf")), ("decay", -0.01), ("threshold", 0.0),
    ("threshold", -1.0), ("decay", "fast"), ("amp_resident", True),
])
def test_params_validate_themselves(field, value):
    with pytest.raises(ValueError, match=field):
        params(**{field: value})


def test_params_are_frozen():
    with pytest.raises(Exception):
        P.decay = 1.0


def test_new_state_is_cold_float32():
    s = heat.new_state(10)
    assert s.nblocks == 10
    assert s.heat_resident.dtype == np.float32 and s.heat_rewritten.dtype == np.float32
    assert not s.total.any()
    with pytest.raises(ValueError):
        heat.new_state(-1)


def test_total_is_the_sum_of_the_components():
    s = heat.HeatState(np.array([1, 2, 3], np.float32), np.array([0.5, 0, 1], np.float32))
    np.testing.assert_allclose(s.total, [1.5, 2, 4])


def test_resize_keeps_the_common_prefix_and_zeroes_new_blocks():
    s = heat.HeatState(np.arange(1, 6, dtype=np.float32), np.arange(6, 11, dtype=np.float32))
    grown = heat.resize_state(s, 8)
    np.testing.assert_array_equal(grown.heat_resident, [1, 2, 3, 4, 5, 0, 0, 0])
    np.testing.assert_array_equal(grown.heat_rewritten, [6, 7, 8, 9, 10, 0, 0, 0])
    shrunk = heat.resize_state(s, 2)
    np.testing.assert_array_equal(shrunk.heat_resident, [1, 2])
    np.testing.assert_array_equal(shrunk.heat_rewritten, [6, 7])
    assert heat.resize_state(s, 0).nblocks == 0
    # the input state is untouched and not shared
    grown.heat_resident[0] = 99
    assert s.heat_resident[0] == 1


# -- smoothing -----------------------------------------------------------

@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0, 2.0, 3.7, 10.0, 40.0])
def test_smooth_equals_gaussian_filter1d_constant_mode(sigma):
    rng = np.random.default_rng(1)
    for n in (1, 7, 50, 5000):
        x = (rng.random(n) * (rng.random(n) < 0.3)).astype(np.float32)
        want = 2.5 * gaussian_filter1d(x, sigma, mode="constant")
        np.testing.assert_allclose(heat.smooth(x, sigma, 2.5), want, atol=1e-6)


@pytest.mark.parametrize("sigma", [0.5, 2.0, 3.7])
def test_sparse_evidence_is_smoothed_exactly_as_the_full_map(sigma):
    # Sparse evidence takes the path that smooths only its reach: blocks at
    # both ends of the image, clusters closer than the kernel's radius, and
    # lone blocks far apart must all come out as scipy computes them.
    rng = np.random.default_rng(7)
    n = 200_000
    for trial in range(5):
        x = np.zeros(n, np.float32)
        idx = rng.choice(n, 300, replace=False)
        x[idx] = rng.random(300).astype(np.float32) + 0.01
        x[[0, 1, n - 1]] = 1.0
        x[1000:1003] = 0.5
        x[1000 + int(3 * sigma) + 2] = 0.25          # a neighbour just within reach
        assert np.count_nonzero(x) * (2 * int(4 * sigma + 0.5) + 1) * heat.SPARSE_RATIO <= n
        want = 2.5 * gaussian_filter1d(x, sigma, mode="constant")
        got = heat.smooth(x, sigma, 2.5)
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert np.array_equal(got != 0, want > 1e-30)   # exactly 0 beyond the reach


def test_all_zero_evidence_smooths_to_zero():
    assert not heat.smooth(np.zeros(10_000, np.float32), 2.0, 1.0).any()


def test_smooth_normalisation_wide_region_reaches_amp_isolated_block_gets_w0():
    x = zeros(200)
    x[50:150] = 1.0
    s = heat.smooth(x, 2.0, 3.0)
    np.testing.assert_allclose(s[60:140], 3.0, rtol=1e-6)       # interior: exactly amp
    one = zeros(101)
    one[50] = 1.0
    s1 = heat.smooth(one, 2.0, 1.0)
    w0 = 1.0 / sum(math.exp(-x * x / 8.0) for x in range(-8, 9))
    assert s1.argmax() == 50
    assert s1[50] == pytest.approx(w0, rel=1e-6)
    assert w0 == pytest.approx(0.1995, abs=1e-4)
    assert s1.sum() == pytest.approx(1.0, rel=1e-6)              # mass preserved


def test_smooth_does_not_reflect_at_the_image_edges():
    x = np.ones(100, np.float32)
    s = heat.smooth(x, 2.0, 1.0)
    assert s[0] < 0.6 and s[-1] < 0.6                             # the outside is cold
    assert s[50] == pytest.approx(1.0, rel=1e-6)


def test_sigma_zero_means_no_smoothing():
    x = np.array([0, 1, 0, 0.5, 0], np.float32)
    np.testing.assert_array_equal(heat.smooth(x, 0.0, 2.0), [0, 2, 0, 1, 0])
    p = params(sigma_resident=0.0, decay=1.0)
    s = heat.step(heat.new_state(5), x, None, None, 1.0, p)
    np.testing.assert_allclose(s.heat_resident, x * (1 - math.exp(-1)), rtol=1e-6)


# -- step: EMA, decay, suppression --------------------------------------

def test_step_is_an_ema_with_the_analytic_factor():
    n = 100
    frac = zeros(n)
    frac[30:70] = 1.0
    s = heat.new_state(n)
    dt = 5.0
    k = math.exp(-P.decay * dt)
    for i in range(1, 21):
        s = heat.step(s, frac, None, None, dt, P)
        assert s.heat_resident[50] == pytest.approx(1.0 - k ** i, rel=1e-5)
    # continuous time: the same total time in one step or many gives the same heat
    one = heat.step(heat.new_state(n), frac, None, None, 100.0, P)
    assert one.heat_resident[50] == pytest.approx(s.heat_resident[50], rel=1e-5)


def test_heat_decays_exponentially_without_input():
    n = 64
    s = heat.HeatState(np.full(n, 2.0, np.float32), np.full(n, 4.0, np.float32))
    for t in (1.0, 10.0, 100.0):
        out = heat.step(s, zeros(n), None, np.zeros(n, bool), t, P)
        np.testing.assert_allclose(out.heat_resident, 2.0 * math.exp(-P.decay * t), rtol=1e-6)
        np.testing.assert_allclose(out.heat_rewritten, 4.0 * math.exp(-P.decay * t), rtol=1e-6)


def test_dt_zero_changes_nothing_and_negative_dt_is_refused():
    s = heat.HeatState(np.full(4, 0.5, np.float32), zeros(4))
    out = heat.step(s, np.ones(4, np.float32), None, None, 0.0, P)
    np.testing.assert_array_equal(out.heat_resident, s.heat_resident)
    with pytest.raises(ValueError):
        heat.step(s, np.ones(4, np.float32), None, None, -1.0, P)
    with pytest.raises(ValueError):
        heat.step(s, np.ones(5, np.float32), None, None, 1.0, P)


def test_a_held_region_decays_when_there_are_no_writes():
    """Feedback suppression: held blocks are all resident because we hold them."""
    n = 200
    frac = zeros(n)
    frac[50:150] = 1.0                       # the held region is fully resident
    held = np.zeros(n, bool)
    held[50:150] = True
    s = heat.HeatState(np.where(held, 1.0, 0.0).astype(np.float32), zeros(n))
    k = math.exp(-P.decay * 5.0)
    prev = s.total.copy()
    for i in range(1, 50):
        s = heat.step(s, frac, held, np.zeros(n, bool), 5.0, P)
        tot = s.total
        assert (tot[50:150] < prev[50:150]).all()
        assert tot[100] == pytest.approx(k ** i, rel=1e-5)       # pure decay inside
        assert tot.max() <= prev.max()
        prev = tot.copy()
    assert s.total[60:140].max() < P.threshold                   # it would be released


def test_a_held_region_does_not_heat_its_neighbours():
    n = 200
    frac = zeros(n)
    frac[50:150] = 1.0
    held = np.zeros(n, bool)
    held[50:150] = True
    s = heat.new_state(n)
    for _ in range(100):
        s = heat.step(s, frac, held, None, 5.0, P)
    assert not s.total.any()


def test_rewrites_keep_a_held_region_hot():
    n = 200
    held = np.zeros(n, bool)
    held[50:150] = True
    s = heat.HeatState(np.where(held, 1.0, 0.0).astype(np.float32), zeros(n))
    for _ in range(200):
        s = heat.step(s, held.astype(np.float32), held, held, 5.0, P)
    assert s.heat_resident[100] < 0.01
    assert s.total[60:140].min() > 3.9 and s.heat_rewritten[100] == pytest.approx(4.0, rel=1e-3)


def test_rewritten_component_uses_its_own_amplitude_and_width():
    n = 101
    rw = np.zeros(n, bool)
    rw[50] = True
    p = params(amp_rewritten=4.0, sigma_rewritten=1.0, decay=1.0)
    s = heat.step(heat.new_state(n), zeros(n), None, rw, 1.0, p)
    want = (1 - math.exp(-1.0)) * 4.0 * gaussian_filter1d(rw.astype(np.float32), 1.0,
                                                           mode="constant")
    np.testing.assert_allclose(s.heat_rewritten, want, atol=1e-6)
    assert not s.heat_resident.any()


def test_step_never_mutates_its_inputs():
    rng = np.random.default_rng(2)
    n = 500
    s = heat.HeatState(rng.random(n).astype(np.float32), rng.random(n).astype(np.float32))
    frac = rng.random(n).astype(np.float32)
    held = rng.random(n) < 0.3
    rw = rng.random(n) < 0.1
    copies = [a.copy() for a in (s.heat_resident, s.heat_rewritten, frac, held, rw)]
    out = heat.step(s, frac, held, rw, 5.0, P)
    for a, b in zip((s.heat_resident, s.heat_rewritten, frac, held, rw), copies):
        np.testing.assert_array_equal(a, b)
    assert out.heat_resident is not s.heat_resident
    assert out.heat_resident.dtype == np.float32 and out.heat_rewritten.dtype == np.float32


def test_bad_inputs_are_clipped_not_propagated():
    frac = np.array([np.nan, 2.0, -1.0, np.inf, 0.5], np.float64)
    s = heat.step(heat.new_state(5), frac, None, None, 1.0, params(sigma_resident=0.0))
    assert np.isfinite(s.total).all()
    k = math.exp(-0.01)
    np.testing.assert_allclose(s.heat_resident, np.array([0, 1, 0, 1, 0.5]) * (1 - k), rtol=1e-5)


def test_long_cold_heat_flushes_to_zero_not_subnormal():
    s = heat.HeatState(np.full(8, 1.0, np.float32), zeros(8))
    for _ in range(300):
        s = heat.step(s, zeros(8), None, None, 5.0, params(decay=0.1))
    assert not s.total.any()


def test_threshold_crossing_time_matches_the_analytic_curve():
    """A wide resident region crosses the threshold after ln(1/(1-thr/A))/decay seconds."""
    n = 100
    frac = zeros(n)
    frac[20:80] = 1.0
    s = heat.new_state(n)
    t, dt = 0.0, 1.0
    while s.total[50] < P.threshold:
        s = heat.step(s, frac, None, None, dt, P)
        t += dt
    assert t == pytest.approx(math.log(1 / (1 - P.threshold)) / P.decay, abs=dt)


def test_a_million_block_step_runs():
    n = 1 << 20
    rng = np.random.default_rng(3)
    frac = (rng.random(n) < 0.2).astype(np.float32)
    held = np.zeros(n, bool)
    held[1000:200000] = True
    rw = np.zeros(n, bool)
    rw[5000:6000] = True
    s = heat.new_state(n)
    for _ in range(3):
        s = heat.step(s, frac, held, rw, 5.0, P)
    assert s.nblocks == n and np.isfinite(s.total).all()
    assert s.heat_rewritten[5500] > 0
