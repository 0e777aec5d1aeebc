"""Cuts: a region too large for what is left of the budget, split or windowed.

Theory of operation
-------------------
Pure core (numpy only); ``regions`` calls these when the region it popped
does not fit. Both work on the ranking heat (``regions``: heat, the held
blocks' incumbency, the read intensity and the thrash).

Split (``split_pieces``; the trace source's rules only). A region whose
ranking heat is not flat (peak at least ``contrast`` times its mean,
``SPLIT_CONTRAST``) is cut where the heat crosses halfway from the mean to
the peak: the runs above that level are its hot zones, the runs between
them its background, and each becomes a region of its own in the queue.
``regions`` splits only a region at least ``split_min_ratio`` times what is
left of the budget (``SPLIT_MIN_RATIO``): in a region that nearly fits, the
contrast is the noise of its reads and writes, and its pieces would be
loaded and released every cycle (docs/rationale.md#split-min-ratio). Runs of
either kind shorter than ``min_blocks`` (``SPLIT_MIN_BLOCKS``) are not
pieces either: an above-level run that short is dropped (a bump of the
noise, not a zone), then a gap that short between zones is filled (a dip
inside one zone) (docs/rationale.md#split-min-blocks). When nothing is left
above the level, the region is flat and is windowed instead.

Window (``hottest_window``). The window of exactly the length left with the
largest summed ranking heat: a cumulative-sum sliding window, the first on
ties. The incumbency weight in the ranking heat keeps it on the held blocks
(``regions``).

Steady window (``steady_window``). The length left changes from cycle to
cycle on a host: the other disks' regions grow and shrink by a block or two
at their edges, so the remainder a region is windowed to does too, and the
hottest window of a new length may sit a few blocks further along. Each such
shift released blocks at one end and relocked as many, still cached, at the
other, nearly every cycle (docs/rationale.md#window-margin). So of the
windows that keep the most held blocks the hottest is taken, unless the
hottest of all carries more than ``WINDOW_MARGIN`` (``budget``) times its
heat: the window grows or shrinks at its edges and moves only when the
guest did.
"""

from __future__ import annotations

import numpy as np

from vmdisktouch.core.runs import mask_edges, run_indices


def split_pieces(rank_heat: np.ndarray, start: int, stop: int, contrast: float,
                 min_blocks: int = 1) -> np.ndarray | None:
    """The pieces of region ``[start, stop)`` as interleaved edges ``[s0, e0, s1, e1, ...]``,
    or None when its ranking heat is flat (peak below ``contrast`` x mean, or no run
    above the halfway level at least ``min_blocks`` long)."""
    if stop - start < 2:
        return None
    h = rank_heat[start:stop]
    mean, peak = float(h.mean(dtype=np.float64)), float(h.max())
    if not peak >= contrast * mean or mean <= 0:
        return None
    above = h >= (mean + peak) / 2
    if min_blocks > 1:
        above = _without_short_runs(above, True, min_blocks)
        if above.any():
            above = _without_short_runs(above, False, min_blocks)
    if above.all() or not above.any():
        return None
    change = np.flatnonzero(above[1:] != above[:-1]) + 1
    bounds = np.concatenate(([0], change, [stop - start])) + start
    return np.column_stack((bounds[:-1], bounds[1:])).ravel()


def hottest_window(heat: np.ndarray, start: int, stop: int, length: int) -> int:
    """Start of the window of ``length`` blocks in ``[start, stop)`` with the largest sum."""
    return start + int(np.argmax(_window_sums(heat, start, stop, length)))


def steady_window(heat: np.ndarray, held: np.ndarray | None, start: int, stop: int,
                  length: int, margin: float) -> int:
    """Start of a window of ``length`` blocks in ``[start, stop)``: of the windows that keep
    the most held blocks, the hottest, unless the hottest of all carries more than
    ``margin`` times its heat (``hottest_window``)."""
    sums = _window_sums(heat, start, stop, length)
    best = int(np.argmax(sums))
    if held is None:
        return start + best
    overlap = _window_sums(held, start, stop, length)
    top = overlap.max() if overlap.size else 0
    if top == 0 or overlap[best] == top:
        return start + best
    stay = int(np.argmax(np.where(overlap == top, sums, -np.inf)))
    return start + (stay if sums[stay] * margin >= sums[best] else best)


def _window_sums(values: np.ndarray, start: int, stop: int, length: int) -> np.ndarray:
    """The sum of every window of ``length`` blocks in ``[start, stop)`` (cumulative sums,
    in float64), by its offset from ``start``."""
    csum = np.zeros(stop - start + 1, dtype=np.float64)
    np.cumsum(values[start:stop], dtype=np.float64, out=csum[1:])
    return csum[length:] - csum[:-length]


def _without_short_runs(mask: np.ndarray, value: bool, min_blocks: int) -> np.ndarray:
    """``mask`` with each run of ``value`` shorter than ``min_blocks`` flipped."""
    edges = mask_edges(mask if value else ~mask)
    starts, stops = edges[0::2], edges[1::2]
    short = (stops - starts) < min_blocks
    if not short.any():
        return mask
    out = mask.copy()
    out[run_indices(starts[short], stops[short])] = not value
    return out
