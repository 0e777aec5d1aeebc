"""Regions and the budget: the heat map cut at a threshold, ranked, and one budget spent over
every disk's regions by benefit per byte.

Theory of operation
-------------------
Pure core: numpy and heapq. Blocks are the unit; a *run* is a
half-open block interval ``(start, stop)``.

Candidates. A block is a candidate when its heat is at or above the
threshold. A run of blocks the daemon already holds stays a candidate, as a
whole, while its mean heat is at least ``threshold * hold_fraction``
(hysteresis, ``HOLD_FRACTION``): a held block's heat decays under feedback
suppression (see ``heat``), and a region at the threshold would otherwise
be released and reloaded on alternate cycles; the mean, so its shoulders do
not fall off one by one (docs/rationale.md#hold-fraction). Maximal runs of
candidate blocks are the *regions* (found with ``np.diff``/``flatnonzero``,
with no Python loop per block).

Ranking. Regions go into one priority queue (the budget, below), highest first:

1. regions the guest is rewriting *now*: ``recent_rewrites`` is, per
   block, the fraction of it rewritten in this cycle or the one before (the
   daemon's checksums, in sixteenths of a block), and a region is in this
   class when its mean is at least ``rewritten_density``
   (``REWRITTEN_DENSITY``). They rank among themselves by their
   ``rewritten_heat`` per block. Data the guest writes through the host cache
   is data it is working on right now; recency and density, not the size of
   the rewritten heat, decide, since the rewritten sum outlasts the guest's
   move by minutes (docs/rationale.md#rewritten-density).
   The polling source only (``Rules.rewritten_first``): with the trace
   source there is no first class, since holding a page the guest writes
   saves no write with ``cache=writethrough`` and the reads, seen on held
   blocks too, rank the regions (docs/rationale.md#rewritten-density);
2. all other regions, ranked by their ranking heat per block: the reads a
   held byte saves (benefit per byte, below).

Incumbency. In both classes the *resident* heat of a held block counts
``incumbent_weight`` times (``INCUMBENT_WEIGHT``, ``TRACED_INCUMBENT``) in the
sums that rank regions and place windows (not in the cut at the threshold):
feedback suppression makes a held block's resident heat decay while an
equally used unheld block keeps its heat, and without the weight a full
budget would swap its holds for equal candidates every cycle
(docs/rationale.md#incumbent-weight). A hold so keeps its place until
hysteresis releases it (its lease, see ``heat``) or until a challenger
carries that many times its current heat. The rewritten heat is not
weighted: it is observed *only* on held blocks, so it needs no
compensation.

Ties go to the region with more total heat, then to the lower block number.

The budget (``allocate``). Every disk's regions (``DiskMap``: its heat
and its regions ranked, ``Ranked``) go into one queue, and one budget is
spent over them; it says what each disk got and why it got no more. The
sum of the lengths returned never exceeds the budget.

Benefit per byte. A region is ranked by its *density*: its summed ranking
heat over its length. With the trace source the ranking heat is the heat
times the read intensity (``core.intensity``), the reads a held block would
serve per second; with the polling source it is the residency evidence.
So each next block of the budget goes where a block saves the most reads.
A sum, as the queue had before, grows with a region's size: a lukewarm
region the smoothing had spread over a whole image outranked a smaller,
hotter one on another disk, and one of two identical VMs got twice its hot
zone and the other nothing (docs/benchmarks.md, why-budget). The first class
(regions rewritten now) still comes first; within each class
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
3. Split (``Rules.split_contrast``, below; ``cuts``).
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
   Each cut shortens the window, so this ends, and the budget is used
   entirely whenever the candidates cover it; the holder loads and
   releases only the blocks a moved window adds or leaves.

What each disk got (``Allocation``): its runs; the blocks it wanted (its
candidates); its *share*, the blocks it was given plus the part of the
budget left free that it could still take (its cap allowing); and when it
got less than it wanted, why: its ``cap``, or the ``budget`` (the disk given
the most of it is ``top``, when that one got more than it).

Split (``Rules.split_contrast``; the trace source's rules only). A region
at least twice what is left (``Rules.split_min_ratio``) is first split,
once, when its ranking heat is not flat, into its hot zones and the
background between them (``core.cuts``); its pieces go into the queue as
regions of their own, and a piece that does not fit is windowed as above.
The whole image of a guest that reads everywhere now and then is one region,
and without the split its hottest window took one zone and the background
around it, never two zones; residency has no such contrast inside a region,
so the polling source's rules do not split
(docs/rationale.md#split-contrast). Pieces of one region may be taken side
by side; touching runs are merged in the output, at the place of the first
taken.

Stay (``Rules.stay_unless_better``; the trace source's rules only). When
the held candidate blocks fill as many blocks as the pick and carry at
least its ranking heat, they are returned instead of the pick (hottest run
first), unless the guest writes where the pick goes: its unheld blocks'
mean recent rewrites at the first class's density *and* at least
``STAY_WRITE_CONTRAST`` times those of the held blocks it gives up. A budget
under a region read and written evenly all over would otherwise take a new
hottest window each cycle, moved by the noise, and reload most of itself
(docs/rationale.md#stay-write-contrast).

Cost: O(n) numpy passes (candidate mask, run edges, ``np.add.reduceat``
region sums) plus O(R) Python for R regions to build the queue; the
pathological case is a noise map cut into hundreds of thousands of regions
(docs/benchmarks.md, why-regions).

The output runs are disjoint and not adjacent (regions are separated by at
least one non-candidate block, windows lie inside their region) and come
in priority order: the holder loads them in that order and sheds from the
end under memory pressure.

The constants (``Rules``) are the policy's; ``policy`` passes them from
``core.rules``, which states their values and meanings (their reasons:
docs/rationale.md).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from vmdisktouch.core import cuts
from vmdisktouch.core.rules import (FAIR_BAND, OWN_TRIM_MIN, STAY_WRITE_CONTRAST, TRIM_CONTRAST,
                                    WINDOW_MARGIN)
from vmdisktouch.core.runs import Run, mask_edges, run_indices, runs_to_mask


@dataclass(frozen=True)
class Rules:
    """The selection's constants, as ``policy`` passes them (their values, meanings and
    reasons: ``core.rules``, docs/rationale.md)."""
    hold_fraction: float       # held runs stay candidates while mean heat >= threshold * this
    incumbent_weight: float    # a held block's resident heat counts this many times
    rewritten_density: float   # first class: mean recent rewritten fraction at least this
    split_contrast: float | None = None  # split a region too large when peak >= this x mean
    split_min_blocks: int = 1          # pieces of a split are at least this long (core.cuts)
    split_min_ratio: float = 1.0       # split only a region at least this x what is left
    stay_unless_better: bool = False   # keep the held candidates unless the pick carries more
    rewritten_first: bool = True       # regions rewritten now rank first (the polling source)
    spill: bool = False                # the next-ranked regions past the budget are spilled

def mask_runs(mask: np.ndarray) -> list[Run]:
    """Maximal runs of True in a 1-D boolean mask."""
    edges = mask_edges(mask)
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def candidate_mask(heat: np.ndarray, threshold: float, held_mask, rules: Rules) -> np.ndarray:
    """Blocks at or above the threshold, and whole held runs whose mean heat is at or above
    ``threshold * rules.hold_fraction``."""
    heat = np.asarray(heat)
    cand = heat >= threshold
    if held_mask is not None:
        held = np.asarray(held_mask, dtype=bool)
        if held.shape != heat.shape:
            raise ValueError(f"held_mask has shape {held.shape}, expected {heat.shape}")
        edges = mask_edges(held)
        if edges.size:
            starts, stops = edges[0::2], edges[1::2]
            means = _segment_sums(heat, edges) / (stops - starts)
            keep = means >= threshold * rules.hold_fraction
            for a, b in zip(starts[keep].tolist(), stops[keep].tolist()):
                cand[a:b] = True
    return cand


@dataclass(frozen=True)
class DiskMap:
    """One disk's part of a selection (``select_many``); the fields are ``select``'s."""
    total_heat: np.ndarray
    threshold: float
    rewritten_heat: np.ndarray | None = None
    held_mask: np.ndarray | None = None
    recent_rewrites: np.ndarray | None = None
    candidates: np.ndarray | None = None
    boost: np.ndarray | None = None
    cap_blocks: int | None = None      # most this disk may take of the budget; None: all
    rules: Rules | None = None         # this disk's (its access source's); None: the call's

    def candidate_blocks(self) -> int:
        """The blocks its heat would hold: its candidates, every block when none are given."""
        return (self.total_heat.size if self.candidates is None
                else int(np.count_nonzero(self.candidates)))


class Ranked:
    """One disk's candidate regions and the heat that ranks them."""

    def __init__(self, m: DiskMap, rules: Rules):
        heat = np.asarray(m.total_heat)
        if heat.ndim != 1:
            raise ValueError("total_heat must be 1-D")
        if not m.threshold > 0:
            raise ValueError(f"threshold must be > 0, not {m.threshold!r}")
        self.rules = rules
        candidates = m.candidates
        if candidates is None and heat.size:
            candidates = candidate_mask(heat, m.threshold, m.held_mask, rules)
        self.edges = (mask_edges(_same_shape(candidates, heat, "candidates")) if heat.size
                      else np.zeros(0, dtype=np.intp))
        w = None if m.rewritten_heat is None else _same_shape(m.rewritten_heat, heat,
                                                              "rewritten_heat")
        recent = (None if m.recent_rewrites is None
                  else _same_shape(m.recent_rewrites, heat, "recent_rewrites").astype(np.float32))
        self.w = w
        self.recent = recent if recent is not None and recent.any() else None
        # Ranking heat: the resident part of held blocks counts rules.incumbent_weight times.
        rank_heat = heat
        if m.held_mask is not None and np.any(m.held_mask):
            resident = heat if w is None else heat - w
            rank_heat = heat + np.where(np.asarray(m.held_mask, dtype=bool),
                                        resident * np.float32(rules.incumbent_weight - 1),
                                        np.float32(0))
        if m.boost is not None:
            rank_heat = rank_heat * _same_shape(m.boost, heat, "boost")
        self.rank_heat = rank_heat
        self.held = (np.asarray(m.held_mask, dtype=bool)
                     if m.held_mask is not None and heat.size else None)
        self.stay = (np.asarray(m.held_mask, dtype=bool) & np.asarray(candidates, dtype=bool)
                     if rules.stay_unless_better and m.held_mask is not None and heat.size
                     else None)

    def entries(self, d: int, edges: np.ndarray | None = None) -> list[tuple]:
        """Queue entries of the regions (``edges``; None: all candidate regions):
        (class, -score, -total, disk, start, stop, region start, region stop); class
        -1 = rewritten now, 0 = other; the score is a density (the budget, above): the
        rewritten heat per block in class -1 (``Rules.rewritten_first`` only), the ranking
        heat per block in class 0; ties go to the larger total."""
        edges = self.edges if edges is None else edges
        if not edges.size:
            return []
        starts, stops = edges[0::2], edges[1::2]
        totals = _segment_sums(self.rank_heat, edges)
        if self.recent is None or not self.rules.rewritten_first:
            is_rew = np.zeros(totals.size, dtype=bool)
            score = totals
        else:
            is_rew = (_segment_sums(self.recent, edges)
                      >= self.rules.rewritten_density * (stops - starts))
            rewritten = (np.zeros_like(totals) if self.w is None
                         else _segment_sums(self.w, edges))
            score = np.where(is_rew, rewritten, totals)
        score = score / (stops - starts)            # per block: the benefit of a byte
        s_list, e_list = starts.tolist(), stops.tolist()
        return list(zip((-is_rew.astype(np.int8)).tolist(), (-score).tolist(),
                        (-totals).tolist(), [d] * len(s_list), s_list, e_list, s_list, e_list))

    def stay_or(self, picked: list[Run]) -> list[Run]:
        """``picked``, or the held candidate blocks (``Rules.stay_unless_better``) when they
        are as many blocks and carry at least as much ranking heat; hottest runs first."""
        if self.stay is None or not picked:
            return picked
        edges = mask_edges(self.stay)
        lengths = edges[1::2] - edges[0::2]
        if int(lengths.sum()) != sum(b - a for a, b in picked):
            return picked
        picked_edges = np.asarray(sorted(picked), dtype=np.intp).ravel()
        if self.recent is not None and self._writes_favour(runs_to_mask(picked, self.stay.size)):
            return picked
        sums = _segment_sums(self.rank_heat, edges)
        if float(_segment_sums(self.rank_heat, picked_edges).sum()) > float(sums.sum()):
            return picked
        order = np.argsort(-sums, kind="stable")
        return list(zip(edges[0::2][order].tolist(), edges[1::2][order].tolist()))

    def _writes_favour(self, picked: np.ndarray) -> bool:
        """The guest writes the pick's new blocks at the first class's density and at least
        ``STAY_WRITE_CONTRAST`` times as densely as the held blocks the pick gives up."""
        fresh, gone = picked & ~self.stay, self.stay & ~picked
        if not fresh.any():
            return False
        new = float(self.recent[fresh].mean())
        old = float(self.recent[gone].mean()) if gone.any() else 0.0
        return new >= self.rules.rewritten_density and new >= STAY_WRITE_CONTRAST * old

    def split(self, start: int, stop: int) -> np.ndarray | None:
        """The pieces of region ``[start, stop)`` (edges), or None (``core.cuts``)."""
        if self.rules.split_contrast is None:
            return None
        return cuts.split_pieces(self.rank_heat, start, stop, self.rules.split_contrast,
                                 self.rules.split_min_blocks)

    def window_entry(self, d: int, start: int, stop: int, rstart: int, rstop: int) -> tuple:
        total = float(self.rank_heat[start:stop].sum(dtype=np.float64))
        recent = self.recent
        if recent is not None and self.rules.rewritten_first and recent[start:stop].sum(
                dtype=np.float64) >= self.rules.rewritten_density * (stop - start):
            rew = 0.0 if self.w is None else float(self.w[start:stop].sum(dtype=np.float64))
            return (-1, -rew / (stop - start), -total, d, start, stop, rstart, rstop)
        return (0, -total / (stop - start), -total, d, start, stop, rstart, rstop)


# -- helpers ---------------------------------------------------------------

def _same_shape(values, like: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(values)
    if a.shape != like.shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {like.shape}")
    return a


def _segment_sums(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over each run ``edges[2i]:edges[2i+1]``, in float64.

    The runs' blocks are gathered first when they are a small part of the
    map (the usual case: a few thousand candidate blocks in a million), so
    the sum reads only them, not the gaps between them (a ``reduceat`` over
    the whole map costs more: docs/benchmarks.md, why-regions).
    """
    starts, stops = edges[0::2], edges[1::2]
    lengths = stops - starts
    if int(lengths.sum()) * 8 < values.size:
        firsts = np.concatenate(([0], np.cumsum(lengths[:-1])))
        return np.add.reduceat(values[run_indices(starts, stops)], firsts, dtype=np.float64)
    idx = edges[:-1] if edges[-1] == values.size else edges   # reduceat: indices < size
    return np.add.reduceat(values, idx, dtype=np.float64)[0::2]


def coalesced(runs: list[Run]) -> list[Run]:
    """``runs`` with each run that touches an earlier one merged into it (the pieces of a
    split region may be taken next to each other), in the order of their first piece."""
    if len(runs) < 2:
        return runs
    order = sorted(range(len(runs)), key=lambda i: runs[i])
    merged: list[list[int]] = []         # [start, stop, priority]
    for i in order:
        a, b = runs[i]
        if merged and merged[-1][1] == a:
            merged[-1][1] = b
            merged[-1][2] = min(merged[-1][2], i)
        else:
            merged.append([a, b, i])
    if len(merged) == len(runs):
        return runs
    return [(a, b) for a, b, _ in sorted(merged, key=lambda m: m[2])]


# -- the budget: every disk's regions in one queue ----------------------------------------

@dataclass(frozen=True)
class Allocation:
    """What ``allocate`` gave each disk (lists indexed like its ``maps``)."""
    runs: list[list[Run]]        # highest priority first
    wanted: list[int]            # candidate blocks (all it would hold)
    share: list[int]             # blocks given, plus the free budget it could still take
    limit: list[str | None]      # "cap" or "budget" when given < wanted, else None
    top: list[int | None]        # limited by the budget: the disk given the most (if more)


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
        # The disk given the most, when it was given more than ``d``: the disk with the
        # largest share names none (two disks each naming the other read as a contradiction).
        top = [next((o for o in order if o != d and given[o] > given[d]), None)
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
