"""How much of the host budget each disk gets: by what memory buys it, read from its curve.

Theory of operation
-------------------
Each disk ``d`` has its miss-ratio curve ``h_d(S)`` (``core.mrc``: the share
of its reads an LRU cache of S bytes serves), the pages its guest reads a
second ``r_d``, the time a miss costs ``c_d`` (``observe.miss_cost``: timed
reads past the cache; every disk's is 1 when one's is not measured)
and its weight ``w_d`` (the config file's). S bytes held on ``d`` save
about ``h_d(S) r_d c_d w_d`` of read time a second, but never more than
the guest's queue depth ``q_d`` allows (``saved_per_second``: a guest with
one read in flight waits at most a second a second; ``q_d`` is Little's law
on its misses, at least 1), and the split of the budget maximises the sum. The budget is cut in ``SLICES`` slices, and each
next slice goes to the disk where it saves the most, looking ahead past a
flat stretch (UCP's lookahead, Qureshi and Patt, MICRO 2006): a disk offers
its best average saving per slice over any number of next slices, so a zone
that pays only once it is whole (a curve that jumps at 600 MiB) is seen.
The slices no disk gains from (a curve flat past its zone: reuse not seen
yet) are split too, not left for every disk to take by heat: by the time
its reads would save (read rate x miss cost),
each disk's part no more than its heat wants (its candidate blocks), what
one cannot use going to the others. Left to every disk, equal disks took
and gave back hundreds of MiB a cycle at the edge of the budget
(docs/benchmarks/side-by-side.md#issue-43).

Equal disks offer the same, and ties go to the disk given less: they end
within a slice of each other. The split of the last cycle stays unless the
new one saves more than ``KEEP_GAIN`` more under the current curves: curves
move a little every cycle, and each moved slice is memory unlocked on one
disk and loaded on another (docs/benchmarks/busy-cost.md: three equal disks
traded hundreds of MiB a cycle). The split of what no curve gains from
stays too while every disk's new part is within ``FILL_BAND`` of its last
one: read rates move by a few percent a cycle, and a cap that moves by tens
of MiB each cycle is a load and a release each cycle, and a held set never
the same length as the pick, so the selection's Stay rule never applied
(a window of a flat background moved by 500 MiB once in every few cycles).

A disk whose curve is still young (its reads have not come back yet:
``DiskWatcher._curve_seen``) takes part with the curve its heat implies
(``heat_curve``): the share of its heat on its hottest S bytes, which is
what ranking by heat assumes (every read comes back where it landed). Left
out, one young disk gave the whole budget back to the heat: a zone read
block by block, each block once every 20 s, held nothing beside a disk read
uniformly whose curve was young, since the heat sees each block of the zone
in one cycle of four (docs/benchmarks/host-budget.md#host-budget-loop).

The curve decides *how much* a disk holds; its heat map still decides
*which* blocks (``regions``): the split is each disk's cap in the one
selection.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

SLICES = 64          # the budget's slices
KEEP_GAIN = 0.05     # a new split must save this much more than the last one to replace it
FILL_BAND = 0.125    # the last fill stays while every new part is within this share of it


@dataclass(frozen=True)
class Demand:
    """What one disk's curve says memory buys it."""
    hit_ratio: Callable[[np.ndarray], np.ndarray]   # bytes -> the curve's hit ratio
    pages_per_second: float
    miss_cost: float | None = 1.0     # seconds a miss waits; None: not measured
    weight: float = 1.0
    seen: bool = True                 # its own curve; False: the one its heat implies
    depth: float = float("inf")       # the guest's reads in flight (``saved_per_second``);
                                      # inf: no bound (the daemon gives its guest's)


def saved_per_second(reads_per_second, miss_cost: float, depth: float = 1.0):
    """Seconds of waiting a second that ``reads_per_second`` reads served from memory save
    a guest whose misses wait ``miss_cost``: each read's wait, but no more than the
    ``depth`` reads it keeps in flight can wait in a second (at least one: a guest at
    queue depth 1 waits at most one second a second). The one place a saving is
    computed: the status's "s of reads saved a second" and the split below.
    ``depth`` inf: no bound (costs that are not seconds, ``comparable``).
    ``reads_per_second`` may be an array: the saving at each."""
    saved = np.minimum(np.maximum(0.0, reads_per_second) * max(0.0, miss_cost),
                       max(1.0, depth))
    return float(saved) if np.ndim(saved) == 0 else saved


def guest_depth(misses_per_second: float, miss_cost: float | None) -> float:
    """The reads a guest keeps in flight, as its misses show (Little's law: their rate
    times their wait), at least one."""
    if not miss_cost or not misses_per_second:
        return 1.0
    return max(1.0, misses_per_second * miss_cost)


def heat_curve(heat: np.ndarray, candidates: np.ndarray | None,
               block_size: int) -> Callable[[np.ndarray], np.ndarray]:
    """Bytes -> the share of the disk's heat (``heat``, per block) on its hottest
    ``candidates`` (every block when None) that fit: the curve ranking by heat assumes."""
    table: list = []              # sorted once, when the split first asks (not every cycle)

    def hit(s):
        if not table:
            h = np.asarray(heat, dtype=float)
            top = h if candidates is None else h[np.asarray(candidates, dtype=bool)]
            cum = np.concatenate(([0.0], np.cumsum(np.sort(top)[::-1])))
            total = float(h.sum())
            table.extend((np.arange(cum.size, dtype=float) * block_size,
                          cum / total if total > 0 else np.zeros_like(cum)))
        return np.interp(np.asarray(s, dtype=float), *table)
    return hit


def comparable(demands: list[Demand]) -> list[Demand]:
    """``demands`` with every miss cost 1 when one of them is not measured: a measured
    cost (seconds) and a missing one have no common scale, and equal costs leave the
    split to the curves and read rates alone."""
    if all(d.miss_cost is not None for d in demands):
        return demands
    return [replace(d, miss_cost=1.0, depth=float("inf")) for d in demands]


def grid(budget: int, unit: int = 1) -> np.ndarray:
    """The sizes a split looks at: 0, one slice, two ... up to the budget (whole ``unit``s
    each, at least one; ``SLICES`` of them at most). A curve is needed at these only
    (what the recorder writes)."""
    if budget < unit:
        return np.zeros(1)
    piece = max(unit, budget // SLICES // unit * unit)
    return np.arange(budget // piece + 1) * float(piece)


def savings(d: Demand, sizes: np.ndarray) -> np.ndarray:
    """Read time saved a second with each of ``sizes`` bytes held (``saved_per_second``
    of the reads the curve serves at each, times the disk's weight)."""
    served = np.asarray(d.hit_ratio(np.asarray(sizes, dtype=float))) * d.pages_per_second
    return np.asarray(saved_per_second(served, d.miss_cost, d.depth)) * d.weight


def split(demands: list[Demand], budget: int, last: list[int] | None = None,
          unit: int = 1) -> tuple[list[int], int]:
    """Bytes of ``budget`` for each disk, and the bytes no curve gains from (left to the
    heat). Slices are whole ``unit``s (blocks), at least one. ``last``: the last cycle's
    split of the same disks, kept unless the new one saves ``KEEP_GAIN`` more."""
    n = len(demands)
    sizes = grid(budget, unit)
    if n == 0 or sizes.size == 1:
        return [0] * n, max(0, int(budget))
    piece, slices = int(sizes[1]), sizes.size - 1
    gain = [savings(d, sizes) for d in demands]
    given = [0] * n
    left = slices

    def offer(k: int) -> tuple | None:
        """Disk k's best saving per slice over its next slices (None: none left)."""
        ahead = gain[k][given[k] + 1:given[k] + left + 1] - gain[k][given[k]]
        if ahead.size == 0:
            return None
        per = ahead / np.arange(1, ahead.size + 1)
        # the fewest slices of the best offer (rounding makes a straight curve's offers
        # differ in the last digit: equal disks would take turns of many)
        j = int(np.flatnonzero(per >= per.max() * (1 - 1e-9))[0])
        return (float(f"{per[j]:.9g}"), -given[k], -k, j + 1)   # ties: the disk given less

    # An offer changes only when its disk is given slices, or when fewer slices are left
    # than it takes: the others are kept (a pass over every disk for each slice given was
    # 8 times the split's time with 32 disks).
    offers = [offer(k) for k in range(n)]
    while left > 0:
        best = max((o for o in offers if o is not None), default=None)
        if best is None or best[0] <= 0:
            break
        k, j = -best[2], best[3]
        given[k] += j
        left -= j
        offers = [offer(m) if m == k or (o is not None and o[3] > left) else o
                  for m, o in enumerate(offers)]
    shares = [g * piece for g in given]
    if last is not None and len(last) == n and sum(last) <= budget:
        def total(split_bytes):
            return sum(float(savings(d, [s])[0]) for d, s in zip(demands, split_bytes))
        if total(shares) <= total(last) * (1 + KEEP_GAIN):
            return list(last), budget - sum(last)
    return shares, budget - sum(shares)


class Splitter:
    """The split cycle after cycle, as the host and the replay of its record make it: the
    caps of the selection's maps, and the last split kept for ``split``'s hysteresis."""

    def __init__(self):
        self._last: tuple | None = None       # (the disks and the budget, their shares)
        self._fill: tuple | None = None       # (the disks and the blocks filled, their parts)

    def caps(self, keys: list, maps: list, demands: list, budget_blocks: int,
             block_size: int) -> tuple[list, list[bool]]:
        """``maps`` (``regions.DiskMap``) with each cap cut to its share plus what no curve
        gains from, and which of them the cut limits, when there are several disks,
        every one has a ``Demand`` and one of them is its own curve (evidence:
        ``DiskWatcher.demand``); else ``maps`` as they are (the heat alone decides).
        ``keys`` name the disks (the hysteresis holds while they and the budget stay)."""
        if len(maps) < 2 or any(d is None for d in demands) or \
                not any(d.seen for d in demands):
            self._last = self._fill = None
            return maps, [False] * len(maps)
        demands = comparable(demands)
        key = (tuple(keys), budget_blocks)
        last = self._last[1] if self._last is not None and self._last[0] == key else None
        shares, left = split(demands, budget_blocks * block_size, last, unit=block_size)
        self._last = (key, shares)
        given = [s // block_size for s in shares]
        room = [max(0, m.candidate_blocks() - g) for m, g in zip(maps, given)]
        total = left // block_size
        extra = fill(total, [saved_per_second(d.pages_per_second, d.miss_cost, d.depth)
                             * d.weight for d in demands], room)
        fill_key = (key, total)
        if self._fill is not None and self._fill[0] == fill_key and \
                kept_fill(self._fill[1], extra, room):
            extra = self._fill[1]
        self._fill = (fill_key, extra)
        out, cut = [], []
        for m, g, e in zip(maps, given, extra):
            cap = g + e
            cut.append(m.cap_blocks is None or cap < m.cap_blocks)
            out.append(replace(m, cap_blocks=cap) if cut[-1] else m)
        return out, cut


def kept_fill(last: list[int], new: list[int], room: list[int]) -> bool:
    """The last fill still serves: each of its parts fits its disk's room and lies within
    ``FILL_BAND`` of the new part (see the module's theory)."""
    return all(o <= r and abs(n - o) <= FILL_BAND * max(n, 1)
               for o, n, r in zip(last, new, room))


def fill(total: int, weights: list[float], room: list[int]) -> list[int]:
    """``total`` units in proportion to ``weights``, each at most its ``room``; what one
    cannot take goes to the others (water-filling). Equal weights: equal parts."""
    out = [0] * len(weights)
    left = int(total)
    open_ = [k for k in range(len(weights)) if room[k] > 0]
    while left > 0 and open_:
        w = [max(weights[k], 0.0) for k in open_]
        tw = sum(w) or float(len(open_))
        parts = [int(left * (x if sum(w) else 1.0) / tw) for x in w]
        parts[0] += left - sum(parts)                    # the rounding, to the first
        for k, p in zip(open_, parts):
            take = min(p, room[k] - out[k])
            out[k] += take
            left -= take
        open_ = [k for k in open_ if out[k] < room[k]]
        if all(p == 0 for p in parts):
            break
    return out
