"""Request streams of a reader re-reading a zone, as the kernel reports them, and the
daemon's curve fed from them as each trace path feeds it (issue 55): the model shared by
tests/unit/test_curve_request_sizes.py and benchmarks/bench_curve_exact.py.

A request of pages ``[a, b]`` is read in batches of at most 31 folios, one READ event per
batch, each from the batch's first page to the request's end; the file's folios are
1 MiB (a written image's, seen here: a 64 MiB read was three events, 31 MiB apart).
Drains come a second apart, one of them in the middle of a 64 MiB request's batches.

- the ring buffer's path (``ring_path``): the drain's READ events through
  ``mrc.Batches`` into ``feed_ranges``;
- the eBPF path (``bpf_path``): the program's output (a thread's batch up to its next
  one; a range of up to ``SAMPLE_SPAN`` pages sampled there page by page, a longer one
  whole as two marked ring entries; the pending range taken at a take that saw it
  pending before), through ``bpf_reads.decode_ring`` into ``feed_ranges``.
"""

from __future__ import annotations

import numpy as np

from vmdisktouch.core.mrc import Batches, MissRatioCurve, page_hash, pages_read
from vmdisktouch.system.trace.bpf_reads import (RANGE_FIRST, RANGE_LAST, SAMPLE_SPAN,
                                                decode_ring)

PAGE = 4096
MiB = 1 << 20
IMAGE = 256 * MiB
ZONE = 64 * MiB                       # at 64 MiB into the image
FOLIO = MiB // PAGE                   # pages of a folio
BATCH = 31 * FOLIO                    # pages of the kernel's batch, at most
PASSES = 6                            # the zone's reads, one each half second
SIZES = {"4K": 4096, "64K": 64 << 10, "1M": MiB, "4M": 4 * MiB, "64M": 64 * MiB}


def requests(size: int, kind: str) -> list[tuple[float, int, int]]:
    """(time, first page, last page) of the reader's requests: the zone read ``PASSES``
    times a half second apart, in order (``seq``) or at random request-aligned places of
    twice the zone (``rand``, as many pages)."""
    n = ZONE // size
    rng = np.random.default_rng(size)
    out = []
    for k in range(PASSES):
        if kind == "seq":
            offs = ZONE + np.arange(n) * size
        else:
            offs = ZONE + rng.integers(0, 2 * n, n) * size
        for i, off in enumerate(offs):
            out.append((0.5 * k + 0.4 * i / n, int(off) // PAGE, (int(off) + size) // PAGE - 1))
    return out


def events(reqs):
    """The kernel's READ events of the requests: (time, first, last, request)."""
    out = []
    for r, (t, a, b) in enumerate(reqs):
        for k, first in enumerate(range(a, b + 1, BATCH)):
            out.append((t + 0.001 * k, first, b, r))
    return out


def drains(evs):
    """The events in drains a second apart (one of them within a 64 MiB request's)."""
    cut = [1.0015 + k for k in range(PASSES)]
    out, cur, i = [], [], 0
    for e in evs:
        while i < len(cut) and e[0] >= cut[i]:
            out.append(cur)
            cur, i = [], i + 1
        cur.append(e)
    return out + [cur]


def ring_path(evs) -> MissRatioCurve:
    m = MissRatioCurve.for_image(IMAGE // PAGE)
    b = Batches()
    for d in drains(evs) + [[]]:              # the last: what is held, taken
        first = np.array([e[1] for e in d], dtype=np.int64)
        last = np.array([e[2] for e in d], dtype=np.int64)
        f, l = b.ranges(first, last, np.array([e[0] * 1e9 for e in d], dtype=np.int64))
        m.feed_ranges(f, l, seconds=1.0)
        m.decay(1.0)
    return m


def bpf_path(evs) -> MissRatioCurve:
    """The eBPF program's output (the module's docstring), one thread, taken each drain."""
    m = MissRatioCurve.for_image(IMAGE // PAGE)
    pending, seen = None, None
    for d in drains(evs) + [[], []]:          # the last two: what is pending, taken
        ring, total = [], 0
        threshold = m.threshold                       # the daemon's ``sample_below``

        def take(first, last):
            nonlocal total
            total += last - first + 1
            if last - first + 1 > SAMPLE_SPAN:
                ring.extend([(first + 1) | RANGE_FIRST, (last + 1) | RANGE_LAST])
            else:
                p = np.arange(first, last + 1)
                ring.extend((p[page_hash(p) < threshold] + 1).tolist())
        for _, first, last, _r in d:
            if pending is not None:
                pf, pl = pending
                continued = pl == last and pf < first <= pl
                take(pf, first - 1 if continued else pl)
            pending = (first, last)
        ranges = decode_ring(np.array(ring, dtype=np.uint64))
        if pending is not None and pending == seen:    # pending at the take before too
            ranges = np.concatenate((ranges, [pending]))
            total += pending[1] - pending[0] + 1
            pending = None
        seen = pending
        m.feed_ranges(ranges[:, 0], ranges[:, 1], total, 0, 1.0)
        m.decay(1.0)
    return m


def exact_of(reqs) -> MissRatioCurve:
    m = MissRatioCurve(rate=1.0, max_pages=None, half_life=0)
    m.feed(pages_read([a for _, a, _ in reqs], [b for _, _, b in reqs]))
    return m


