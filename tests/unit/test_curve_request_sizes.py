"""core.mrc: the daemon's sampled curve is right for every request size, 4 KiB to 64 MiB,
sequential and random, fed as each trace path feeds it, against the exact LRU.

The kernel's events are made as the kernel makes them (tests/support/request_streams.py;
tests/system/test_trace_counted.py holds the real kernel to the same), for the ring
buffer's path and the eBPF path.

The reader re-reads a 64 MiB zone of a 256 MiB image every half second (issue 55): before
the fix its curve in 4 MiB requests wanted 35M, in one 64 MiB request 25M.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.request_streams import (IMAGE, PAGE, SIZES, ZONE, bpf_path, events,
                                           exact_of, requests, ring_path)
from vmdisktouch.core.mrc import CURVE_POINTS

_exact: dict = {}


@pytest.mark.parametrize("path", ["ring", "bpf"])
@pytest.mark.parametrize("kind", ["seq", "rand"])
@pytest.mark.parametrize("size", list(SIZES))
def test_the_curve_is_the_exact_lru_s_for_every_request_size(size, kind, path):
    reqs = requests(SIZES[size], kind)
    key = (size, kind)
    if key not in _exact:
        _exact[key] = exact_of(reqs)
    exact = _exact[key]
    m = (ring_path if path == "ring" else bpf_path)(events(reqs))
    points = np.array([s for s, _ in m.status(IMAGE, PAGE)["curve"]], dtype=float) / PAGE
    err = np.abs(m.curve(points) - exact.curve(points))
    assert len(points) == CURVE_POINTS
    assert err.mean() <= 0.02, (m.curve(points).round(3), exact.curve(points).round(3))
    assert m.reads == pytest.approx(exact.reads, rel=0.05)     # every page read counted
    if kind == "seq":          # 0 below the zone, about 1 from it on: it wants the zone
        assert exact.wants(IMAGE, PAGE) == pytest.approx(ZONE, rel=0.1)
        assert m.wants(IMAGE, PAGE) == pytest.approx(ZONE, rel=0.1)
