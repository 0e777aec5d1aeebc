"""Holes: the blocks of a sparse image known to hold no data, cut out of the heat.

Theory of operation
-------------------
Pure core (numpy only). Holding a hole would spend the budget on zeros.
Every candidate block whose state is not known yet is probed before the
selection (``probe``: the image's SEEK_DATA/SEEK_HOLE, a few ``lseek``
calls per candidate run, once). Learning the holes only from what the
holder was given leaves most of a thin image's budget empty: each region
selected is an extent of data and the hole the smoothing adds around it
(docs/benchmarks.md, why-holes).

What is known holds while the file's allocated size is unchanged. When it
grows (the guest filled a hole) the known holes are probed again as they
become candidates; when it shrinks (something was punched), everything is
forgotten.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from vmdisktouch.core import regions
from vmdisktouch.core.runs import Run

Probe = Callable[[Run], list[Run]]   # the data runs of a block run (SEEK_DATA/SEEK_HOLE)


class KnownHoles:
    """What is known of one image's holes, and the allocated size it holds for."""

    def __init__(self, nblocks: int):
        self.holes = np.zeros(int(nblocks), dtype=bool)     # known holes
        self.probed = np.zeros(int(nblocks), dtype=bool)    # data or hole known
        self.allocation: int | None = None

    def met(self, runs: list[Run]) -> None:
        """Holes the holder met."""
        for a, b in runs:
            self.holes[a:b] = True

    def cut(self, maps: tuple, allocation: int | None, candidates, probe: Probe):
        """``maps`` with the known holes set to 0, after probing the ``candidates`` (a
        mask, or None when nothing is to be probed) not known yet. ``allocation``: the
        file's allocated size now."""
        if allocation != self.allocation:
            if allocation is None or self.allocation is None or allocation < self.allocation:
                self.probed[:] = False
            else:
                self.probed &= ~self.holes
            self.holes[:] = False
            self.allocation = allocation
        if candidates is not None:
            unknown = candidates & ~self.probed
            for a, b in (regions.mask_runs(unknown) if unknown.any() else []):
                self.probed[a:b] = True
                pos = a
                for s, e in probe((a, b)) + [(b, b)]:
                    self.holes[pos:s] = True
                    pos = e
        if not self.holes.any():
            return maps
        keep = ~self.holes
        return tuple(m * keep for m in maps)
