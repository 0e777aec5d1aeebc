"""Intensity: how often the guest reads each block, as a ranking factor (trace source).

Theory of operation
-------------------
Pure core (numpy only). The heat's read evidence is 0 or 1 per block and
cycle: a block read once in a cycle counts as much as one read a thousand
times. That is what keeps a lukewarm working set (a 16 GiB set read at
0.12 reads/s per MiB) above the threshold, and it must stay so. But it makes
the guest's scattered background reads (the hot-zone guest's 10 % of
accesses spread over the image: 0.5 reads/s per MiB, a read in most blocks
every 5 s cycle) as hot as its hot zones (40 reads/s per MiB): the whole
image is one region above the threshold, larger than the budget, and its
hottest window is one zone and background, never two zones
(docs/benchmarks.md, why-regions).

So the trace source keeps, beside the heat, ``rate``: the read events per
second of each block, smoothed like the heat's resident evidence (its
sigma), as an exponential average over ``RATE_SECONDS`` (2.5 s) of the
events' own times (``core.access``'s ``read_recent``), not of the cycle's
counts. After the hot zones move, the new zones' rate passes the old ones'
``RATE_SECONDS * ln 2`` = 1.7 s after the move, and their factor passes the
held zones' by the policy's margin (``TRACED_INCUMBENT``, 1.25) about 3 s
after it, so the first cycle after that holds them. An average of the
cycle's counts instead would make a cycle that ends soon after the move
still see mostly the old zones (docs/rationale.md#rate-seconds). The
hot zones' rate is tens of events per second and block, so the short
constant adds little noise where it decides;
the background's noise is compressed by the logarithm below (0.5 reads/s
per block: a factor 1.6, give or take 0.15). The ranking multiplies a block's
heat by ``multiplier = 1 + log2(1 + rate)``: 1 for a block not read, 1.6
for the background above, 6.4 for the hot zone. Logarithmic, so a region
read 10 times as often does not outrank one 3 times as wide (the sum over a
region still measures how much of the guest's I/O it serves), and
bounded by the rate, so a burst of reads does not take the whole budget.
The threshold cut is not changed: candidacy is still the heat's.
``regions`` uses the contrast this gives inside a region larger than the
budget to split it (``Rules.split_contrast``).
"""

from __future__ import annotations

import numpy as np

from vmdisktouch.core import heat
from vmdisktouch.core.rules import RATE_SECONDS
from vmdisktouch.core.sparse import Sparse


class Intensity:
    """Per block: the decaying, smoothed read rate (events per second)."""

    def __init__(self, nblocks: int):
        self.rate = np.zeros(int(nblocks), dtype=np.float32)

    def resize(self, nblocks: int) -> None:
        new = np.zeros(int(nblocks), dtype=np.float32)
        k = min(new.size, self.rate.size)
        new[:k] = self.rate[:k]
        self.rate = new

    def fold(self, counts: Sparse, dt: float, sigma: float, recent: Sparse | None = None) -> None:
        """One cycle of ``dt`` seconds, ``sigma`` the smoothing width (blocks).

        ``recent``: per block, its read events weighted ``exp(-age / RATE_SECONDS)``
        (``core.access``): the exact exponential average of the event train, ``rate
        = k * rate + sum(weights) / RATE_SECONDS``, so a zone the guest moved to two
        seconds before the cycle's end already weighs as two seconds of reads, not as
        two fifths of the cycle's count. Without it, ``counts`` (read events per block)
        stand for a steady rate over the cycle."""
        n = self.rate.size
        k = heat.decay_factor(1 / RATE_SECONDS, dt)
        source = recent if recent is not None else counts
        if not source.blocks.size or dt <= 0:
            self.rate = heat.fold(self.rate, None, sigma, 1.0, k)
            return
        # recent: k * rate + smooth(weights) / RATE_SECONDS (the fold's amplitude undoes
        # its 1 - k); counts: k * rate + (1 - k) * smooth(counts / dt).
        per_second = np.zeros(n, dtype=np.float32)
        per_second[source.blocks] = np.asarray(source.values, dtype=np.float32) / np.float32(
            RATE_SECONDS if recent is not None else dt)
        amp = 1.0 / (1.0 - k) if recent is not None else 1.0
        self.rate = heat.fold(self.rate, per_second, sigma, amp, k)

    def multiplier(self) -> np.ndarray | None:
        """The ranking's factor per block, ``1 + log2(1 + rate)``; None while nothing is
        read. Computed on the blocks read lately only (a few in a large image)."""
        idx = np.flatnonzero(self.rate)
        if not idx.size:
            return None
        out = np.ones(self.rate.size, dtype=np.float32)
        out[idx] += np.log2(np.float32(1) + self.rate[idx])
        return out
