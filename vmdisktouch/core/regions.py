"""Regions: the heat map cut at a threshold and ranked; ``budget`` fits them into the budget.

Theory of operation
-------------------
Pure core: numpy only. Blocks are the unit; a *run* is a
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

Ranking. Regions go into one priority queue (``core.budget``), highest first:

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
   held byte saves (``core.budget``, benefit per byte).

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

Budget (``core.budget``). Regions are popped in order and taken whole while
they fit, trimmed of ends that do not pay first; the sum of the lengths
returned never exceeds ``budget_blocks``. When the region popped does not
fit in what is left (``m`` blocks), its hottest contiguous window of exactly
``m`` blocks (largest summed ranking heat: ``cuts.hottest_window``)
replaces it and goes back into the queue, ranked by its own density. So a
smaller, denser region further down can still come first; when the window
is popped it either fits or is cut again to the new remainder. Each cut
shortens the window, so this ends, and the budget is used entirely whenever
the candidates cover it. A cut window may move by a block or two between
cycles as the heat shifts; the holder then loads and releases only those
blocks.

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

from dataclasses import dataclass

import numpy as np

from vmdisktouch.core import cuts
from vmdisktouch.core.rules import STAY_WRITE_CONTRAST
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
        -1 = rewritten now, 0 = other; the score is a density (``core.budget``): the
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
