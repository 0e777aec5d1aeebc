"""A loaded heat is capped by one rule (issue 54): the warm-restart state file's, as the
summary a domain carries (``heat.cap_loaded``, applied in ``Watcher.restore``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vmdisktouch.adapters.libvirt import domain_heat as dh
from vmdisktouch.core import heat
from vmdisktouch.core.heat import HeatParams, HeatState


def params(threshold=0.05, amp_resident=1.0, amp_rewritten=1.0, decay=0.1) -> HeatParams:
    return HeatParams(amp_resident, 2.0, amp_rewritten, 2.0, decay, threshold)


def test_3e38_is_capped_to_what_reads_make_and_counted():
    hr = np.zeros(16, np.float32)
    hr[4:12] = 3e38
    hw = np.zeros(16, np.float32)
    hw[10:14] = 3e38                      # blocks 10, 11: the float32 sum is inf
    out, n = heat.cap_loaded(HeatState(hr, hw), params())
    assert n == 10
    total = out.total
    assert np.all(np.isfinite(total)) and total.max() == pytest.approx(2.0)
    assert total[4] == pytest.approx(2.0) and out.heat_rewritten[4] == 0     # split kept
    assert out.heat_resident[10] == pytest.approx(1.0) == out.heat_rewritten[10]
    assert total[0] == 0 and total[15] == 0


def test_what_reads_make_is_left_alone_and_not_counted():
    p = params()
    hr = np.linspace(0, 1.0, 64, dtype=np.float32)
    hw = np.linspace(1.0, 0, 64, dtype=np.float32) + np.float32(1e-7)   # float32 rounding
    state = HeatState(hr, hw)
    out, n = heat.cap_loaded(state, p)
    assert n == 0 and out is state


def test_the_most_is_what_reads_make_or_20_x_the_threshold():
    assert heat.loaded_most(params()) == 2.0
    assert heat.loaded_most(params(threshold=0.5)) == 10.0 == dh.ARRIVAL_MAX * 0.5
    assert dh.ARRIVAL_MAX is heat.ARRIVAL_MAX


@pytest.mark.parametrize("threshold", [1e-4, 0.05, 0.5, 1.9])
def test_a_summary_s_arrival_is_never_capped_again(threshold):
    """The carried heat arrives at most at ARRIVAL_MAX x the threshold: within the rule,
    so a good summary gives no warning."""
    s = dh.DiskHeat("vda", 64 << 20, 1 << 20, "", 1000.0, ((4, 8, 1e5), (20, 2, 0.01)))
    hr = dh.arrival(s, 64, 1 << 20, 0.1, threshold, 1000.0)
    _, n = heat.cap_loaded(HeatState(hr, np.zeros_like(hr)), params(threshold=threshold))
    assert n == 0


def test_a_capped_zone_cools_below_the_threshold_as_a_real_one_does():
    """At the slowest decay, 3e38 took about 10 days; capped, ln(40) / decay."""
    p = params(decay=1e-4)
    out, _ = heat.cap_loaded(HeatState(np.full(4, 3e38, np.float32), np.zeros(4, np.float32)),
                             p)
    seconds = math.log(out.total.max() / p.threshold) / p.decay
    assert seconds < 11 * 3600, seconds
