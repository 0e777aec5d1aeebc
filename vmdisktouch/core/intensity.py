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
(docs/benchmarks.md, hotzone-move).

So the trace source keeps, beside the heat, ``rate``: the read events per
second of each block, smoothed like the heat's resident evidence (its
sigma) and decaying with a time constant of ``RATE_SECONDS`` (5 s, a
default cycle). Shorter than the heat's (10 s at the defaults): after the
hot zones move, the new zones' rate passes the old ones' when
``exp(-t / RATE_SECONDS) < 1/2``, 3.5 s after the move (7 s with the heat's
constant, one cycle later). The hot zones' rate is hundreds of events per
cycle, so the short constant adds little noise where it decides. The ranking multiplies a block's
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
from vmdisktouch.core.sparse import Sparse

RATE_SECONDS = 5.0


class Intensity:
    """Per block: the decaying, smoothed read rate (events per second)."""

    def __init__(self, nblocks: int):
        self.rate = np.zeros(int(nblocks), dtype=np.float32)

    def resize(self, nblocks: int) -> None:
        new = np.zeros(int(nblocks), dtype=np.float32)
        k = min(new.size, self.rate.size)
        new[:k] = self.rate[:k]
        self.rate = new

    def fold(self, counts: Sparse, dt: float, sigma: float) -> None:
        """One cycle of ``dt`` seconds: ``counts`` read events per block, ``sigma`` the
        smoothing width (blocks)."""
        n = self.rate.size
        k = heat.decay_factor(1 / RATE_SECONDS, dt)
        if counts.blocks.size and dt > 0:
            per_second = np.zeros(n, dtype=np.float32)
            per_second[counts.blocks] = np.asarray(counts.values, dtype=np.float32) / np.float32(dt)
            self.rate = heat._fold(self.rate, per_second, sigma, 1.0, k)
        else:
            self.rate = heat._fold(self.rate, None, sigma, 1.0, k)

    def multiplier(self) -> np.ndarray | None:
        """The ranking's factor per block, ``1 + log2(1 + rate)``; None while nothing is
        read. Computed on the blocks read lately only (a few in a large image)."""
        idx = np.flatnonzero(self.rate)
        if not idx.size:
            return None
        out = np.ones(self.rate.size, dtype=np.float32)
        out[idx] += np.log2(np.float32(1) + self.rate[idx])
        return out
