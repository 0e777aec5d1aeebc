"""The budget: every disk's candidate regions in one queue, filled by benefit per byte.

Theory of operation
-------------------
Pure core (numpy and heapq). ``regions`` finds each disk's candidate regions
and the heat that ranks them (``regions.Ranked``); ``allocate`` spends one
budget over them and says what each disk got and why it got no more.

Benefit per byte. A region is ranked by its *density*: its summed ranking
heat over its length. With the trace source the ranking heat is the heat
times the read intensity (``core.intensity``), the reads a held block would
serve per second; with the polling source it is the residency evidence.
So each next block of the budget goes where a block saves the most reads.
A sum, as the queue had before, grows with a region's size: a lukewarm
region the smoothing had spread over a whole image outranked a smaller,
hotter one on another disk, and one of two identical VMs got twice its hot
zone and the other nothing (docs/benchmarks.md, why-budget). The first class
(regions rewritten now, ``regions``) still comes first; within each class
the density ranks.

1. Trim. Before the queue is filled, each region of ``OWN_TRIM_MIN``
   blocks or more is cut into its core and the ends below half the core's
   density (the core: its blocks above its mean), each queued on its own
   density: the lukewarm background a guest's zone spread into does not
   dilute the zone's rank (docs/rationale.md#own-trim-min). Then, a whole
   region popped while another region of its class waits is held only as
   far as its density pays: the blocks at either end whose ranking heat is
   below ``1 / TRIM_CONTRAST`` of the waiting region's density (the
   shoulders the smoothing added, a lukewarm background the region spread
   into) are cut off and queued as regions of their own, ranked by their
   own density; the core goes back in the queue. So they are still held
   when the budget reaches them, after the hotter region. Only the ends: a
   dip inside a zone stays held with it (docs/rationale.md#trim-contrast).
2. Take. A region that fits in what is left (and in its disk's cap) is
   taken whole.
3. Split (``Rules.split_contrast``). As before (``regions``, ``cuts``).
4. Share. When the region popped and the waiting regions of *other*
   disks of nearly its density (at least ``1 / FAIR_BAND`` of it) do not all
   fit in what is left, they share it in proportion to what each can take:
   each gets the hottest window of its part, and the rest of each goes back
   in the queue for what the parts leave (a part cut by its disk's cap). Two
   identical VMs at the edge of the budget so get the same share
   (docs/rationale.md#fair-band). Once per allocation: that is the edge of
   the budget.
5. Window. Otherwise its hottest window of what is left goes back in the
   queue; of the windows that keep the most held blocks, unless the hottest
   carries ``WINDOW_MARGIN`` times more (``cuts.steady_window``): a window
   that changes length with the others' edges does not move
   (docs/rationale.md#window-margin).

What each disk got (``Allocation``): its runs; the blocks it wanted (its
candidates); its *share*, the blocks it was given plus the part of the
budget left free that it could still take (its cap allowing); and when it
got less than it wanted, why: its ``cap``, or the ``budget`` (the disk given
the most of it is ``top``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from vmdisktouch.core import cuts
from vmdisktouch.core.regions import DiskMap, Rules, coalesced, Ranked
from vmdisktouch.core.rules import FAIR_BAND, OWN_TRIM_MIN, TRIM_CONTRAST, WINDOW_MARGIN
from vmdisktouch.core.runs import Run


@dataclass(frozen=True)
class Allocation:
    """What ``allocate`` gave each disk (lists indexed like its ``maps``)."""
    runs: list[list[Run]]        # highest priority first
    wanted: list[int]            # candidate blocks (all it would hold)
    share: list[int]             # blocks given, plus the free budget it could still take
    limit: list[str | None]      # "cap" or "budget" when given < wanted, else None
    top: list[int | None]        # limited by the budget: the disk given the most


def select_many(maps: list[DiskMap], budget_blocks: int, rules: Rules) -> list[list[Run]]:
    """Each disk's runs of ``allocate``."""
    return allocate(maps, budget_blocks, rules).runs


def allocate(maps: list[DiskMap], budget_blocks: int, rules: Rules) -> Allocation:
    """One budget over the regions of every disk (see the module docstring); each disk
    within its ``cap_blocks``; ``rules``: for a map without its own."""
    budget = int(budget_blocks)
    if budget < 0:
        raise ValueError(f"budget_blocks must be >= 0, not {budget_blocks!r}")
    fill = _Fill(maps, budget, rules)
    fill.run()
    return fill.result()


class _Fill:
    """One allocation's queue and what each disk was given so far."""

    def __init__(self, maps: list[DiskMap], budget: int, rules: Rules):
        self.ranked = [Ranked(m, m.rules or rules) for m in maps]
        self.room = [budget if m.cap_blocks is None else max(0, min(budget, int(m.cap_blocks)))
                     for m in maps]
        self.capped = [m.cap_blocks is not None for m in maps]
        self.out: list[list[Run]] = [[] for _ in maps]
        self.left = budget
        self.trimmed: list[set] = [set() for _ in maps]  # starts of regions trimmed already
        self.split: list[set] = [set() for _ in maps]    # starts of the pieces of a split
        self.queue = [e for d, r in enumerate(self.ranked) if self.room[d]
                      for e in r.entries(d, self._own_trim(d, r.edges))]
        heapq.heapify(self.queue)
        self.shared = False

    def run(self) -> None:
        queue = self.queue
        while queue and self.left > 0:
            e = heapq.heappop(queue)
            cls, d, start, stop, rstart, rstop = e[0], e[3], e[4], e[5], e[6], e[7]
            fit = min(self.left, self.room[d])
            if not fit:
                continue
            whole = (start, stop) == (rstart, rstop)
            if whole and queue and start not in self.trimmed[d] and queue[0][0] == cls:
                if self._trim(d, start, stop, _density(queue[0])):
                    continue
            if stop - start > fit and whole and self._split(d, start, stop, fit):
                continue
            if not self.shared and self._share(e):
                continue
            if stop - start <= fit:
                self._take(d, start, stop)
                continue
            s = self._window(d, rstart, rstop, fit)
            heapq.heappush(queue, self.ranked[d].window_entry(d, s, s + fit, rstart, rstop))

    def _own_trim(self, d: int, edges: np.ndarray) -> np.ndarray:
        """``edges`` with each region of ``OWN_TRIM_MIN`` blocks or more cut into its core and
        the ends below ``1 / TRIM_CONTRAST`` of the core's density (see "Trim"); the ends
        are marked so that they are neither trimmed nor split again. Only the long regions
        are looked at one by one (a noise map has hundreds of thousands of short ones)."""
        pieces = edges.reshape(-1, 2).copy()      # (``edges`` are the map's: kept as they are)
        out = [pieces]
        heat = self.ranked[d].rank_heat
        for k in np.flatnonzero(pieces[:, 1] - pieces[:, 0] >= OWN_TRIM_MIN).tolist():
            a, b = pieces[k].tolist()
            h = heat[a:b]
            core = h[h >= h.mean()]
            cut = self._core(d, a, b, float(core.mean())) if core.size else None
            if cut is None:                         # flat, or nothing above its mean
                continue
            lo, hi = cut
            for x, y in ((a, lo), (hi, b)):
                if y > x:
                    self._final(d, x)
            out.append(np.asarray([(a, lo), (hi, b)], dtype=np.intp))
            pieces[k] = (lo, hi)
        if len(out) == 1:
            return edges
        allp = np.concatenate(out)
        allp = allp[allp[:, 1] > allp[:, 0]]
        return allp[np.argsort(allp[:, 0], kind="stable")].ravel()

    def _core(self, d: int, a: int, b: int, level: float) -> tuple[int, int] | None:
        """The run of ``[a, b)`` from its first to its last block at or above ``level /
        TRIM_CONTRAST``; None when no block is, or when that is all of it."""
        above = np.flatnonzero(self.ranked[d].rank_heat[a:b] >= level / TRIM_CONTRAST)
        if not above.size:
            return None
        lo, hi = a + int(above[0]), a + int(above[-1]) + 1
        return None if (lo, hi) == (a, b) else (lo, hi)

    def _final(self, d: int, start: int) -> None:
        """The piece starting at ``start`` is neither trimmed nor split again."""
        self.trimmed[d].add(start)
        self.split[d].add(start)

    def _window(self, d: int, start: int, stop: int, length: int) -> int:
        r = self.ranked[d]
        return cuts.steady_window(r.rank_heat, r.held, start, stop, length, WINDOW_MARGIN)

    def _take(self, d: int, start: int, stop: int) -> None:
        self.out[d].append((start, stop))
        self.left -= stop - start
        self.room[d] -= stop - start

    def _trim(self, d: int, start: int, stop: int, level: float) -> bool:
        """Queue the ends of ``[start, stop)`` below ``level / TRIM_CONTRAST`` apart from its
        core; False when there are none (or nothing is above)."""
        cut = self._core(d, start, stop, level)
        if cut is None:
            return False
        a, b = cut
        edges = np.asarray([x for lo, hi in ((start, a), (a, b), (b, stop)) if hi > lo
                            for x in (lo, hi)], dtype=np.intp)
        for entry in self.ranked[d].entries(d, edges):
            self.trimmed[d].add(entry[4])
            if entry[4] != a:
                self.split[d].add(entry[4])      # an end is neither trimmed nor split again
            heapq.heappush(self.queue, entry)
        return True

    def _split(self, d: int, start: int, stop: int, fit: int) -> bool:
        r = self.ranked[d]
        if start in self.split[d] or stop - start < r.rules.split_min_ratio * fit:
            return False
        pieces = r.split(start, stop)
        if pieces is None:
            return False
        for entry in r.entries(d, pieces):     # too large, and not flat: its pieces go in
            self._final(d, entry[4])
            heapq.heappush(self.queue, entry)
        return True

    def _share(self, e: tuple) -> bool:
        """What is left, shared by ``e`` and the waiting regions of other disks of nearly its
        density (``FAIR_BAND``) in proportion to what each can take, when they do not all
        fit; False when they do, or none wait."""
        floor = _density(e) / FAIR_BAND
        peers = [q for q in self.queue if q[0] == e[0] and q[3] != e[3]
                 and self.room[q[3]] and _density(q) >= floor]
        if not peers:
            return False
        group = [e] + peers
        can = [min(q[5] - q[4], self.room[q[3]]) for q in group]
        if sum(can) <= self.left:
            return False
        self.shared = True
        parts = _proportional(self.left, can)
        gone = {id(p) for p in peers}
        kept = [q for q in self.queue if id(q) not in gone]
        for q, part in zip(group, parts):
            d = q[3]
            if part <= 0:
                if q is not e:
                    kept.append(q)
                continue
            s = self._window(d, q[4], q[5], part)
            kept.append(self.ranked[d].window_entry(d, s, s + part, q[6], q[7]))
            flanks = [x for lo, hi in ((q[4], s), (s + part, q[5])) if hi > lo
                      for x in (lo, hi)]
            for f in self.ranked[d].entries(d, np.asarray(flanks, dtype=np.intp)):
                self._final(d, f[4])               # the rest, for what the parts leave
                kept.append(f)
        self.queue[:] = kept
        heapq.heapify(self.queue)
        return True

    def result(self) -> Allocation:
        runs = [r.stay_or(coalesced(o)) for r, o in zip(self.ranked, self.out)]
        given = [sum(b - a for a, b in o) for o in runs]
        wanted = [int((r.edges[1::2] - r.edges[0::2]).sum()) for r in self.ranked]
        limit: list[str | None] = []
        for d in range(len(runs)):
            if given[d] >= wanted[d]:
                limit.append(None)
            elif self.capped[d] and self.room[d] == 0:
                limit.append("cap")
            else:
                limit.append("budget")
        order = sorted(range(len(runs)), key=lambda d: -given[d])
        top = [next((o for o in order if o != d and given[o]), None)
               if limit[d] == "budget" else None for d in range(len(runs))]
        share = [given[d] + min(self.left, self.room[d]) for d in range(len(runs))]
        return Allocation(runs, wanted, share, limit, top)


def _proportional(total: int, can: list[int]) -> list[int]:
    """``total`` (less than ``sum(can)``) in whole parts proportional to ``can``, none above
    its ``can``, the rounding's remainder to the largest fractions first."""
    whole = sum(can)
    exact = [total * c / whole for c in can]
    parts = [min(c, int(x)) for c, x in zip(can, exact)]
    order = sorted(range(len(can)), key=lambda i: parts[i] - exact[i])
    left = total - sum(parts)
    for i in order:
        if left <= 0:
            break
        if parts[i] < can[i]:
            parts[i] += 1
            left -= 1
    return parts


def _density(entry: tuple) -> float:
    """The ranking heat per block of a queue entry (its summed heat over its length)."""
    return -entry[2] / max(1, entry[5] - entry[4])
