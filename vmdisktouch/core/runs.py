"""Arithmetic on block runs ``(start, stop)``, half-open: pure, shared by the
core (``regions``) and the holder.

Lists of runs are kept sorted and disjoint where a function says so;
``intersect`` and ``subtract`` bisect into them instead of scanning, so
thousands of regions cost milliseconds. ``priority_pieces`` and
``diff_runs`` turn the holder's targets and what it holds into what to
release and what to load.
"""

from __future__ import annotations

import bisect
from typing import Iterable

import numpy as np

Run = tuple[int, int]


def clip_runs(runs: Iterable[Run], nblocks: int) -> list[Run]:
    """Runs clipped to ``[0, nblocks)``, empty ones dropped, order kept."""
    out = []
    for start, stop in runs:
        start, stop = max(int(start), 0), min(int(stop), nblocks)
        if stop > start:
            out.append((start, stop))
    return out


def merge_runs(runs: Iterable[Run]) -> list[Run]:
    """Sorted union of runs; touching runs are joined."""
    out: list[list[int]] = []
    for start, stop in sorted((int(s), int(e)) for s, e in runs if e > s):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], stop)
        else:
            out.append([start, stop])
    return [(s, e) for s, e in out]


def intersect(run: Run, runs: list[Run]) -> list[Run]:
    """Parts of the sorted, disjoint ``runs`` inside ``run`` (bisection, no full scan)."""
    a, b = run
    i = max(bisect.bisect_right(runs, (a, a)) - 1, 0)
    out = []
    while i < len(runs) and runs[i][0] < b:
        s, e = runs[i]
        if min(b, e) > max(a, s):
            out.append((max(a, s), min(b, e)))
        i += 1
    return out


def subtract(run: Run, runs: list[Run]) -> list[Run]:
    """``run`` minus the sorted, disjoint ``runs``."""
    a, b = run
    pieces, pos = [], a
    for s, e in intersect(run, runs):
        if s > pos:
            pieces.append((pos, s))
        pos = e
    if pos < b:
        pieces.append((pos, b))
    return pieces


def consecutive_runs(sorted_blocks: np.ndarray) -> list[Run]:
    """Maximal runs of consecutive block numbers in a sorted unique array."""
    starts, stops = consecutive_edges(sorted_blocks)
    return list(zip(starts.tolist(), stops.tolist()))


def consecutive_edges(sorted_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``consecutive_runs`` as two arrays, starts and stops (no Python tuples)."""
    b = np.asarray(sorted_blocks, dtype=np.int64)
    if not b.size:
        return b, b
    breaks = np.flatnonzero(b[1:] != b[:-1] + 1) + 1
    return (b[np.concatenate(([0], breaks))],
            b[np.concatenate((breaks - 1, [b.size - 1]))] + 1)


def byte_ranges(starts: np.ndarray, stops: np.ndarray, block_size: int,
                size: int) -> list[list[int]]:
    """Block runs as ``[offset, length]`` byte pairs, the last clipped to ``size``: the
    status file's form. Computed in numpy: a guest writing all over a large image
    leaves thousands of rewritten runs a cycle (docs/benchmarks.md, why-regions)."""
    off = np.asarray(starts, dtype=np.int64) * block_size
    end = np.minimum(np.asarray(stops, dtype=np.int64) * block_size, size)
    return np.column_stack((off, end - off)).tolist()


def mask_edges(mask: np.ndarray) -> np.ndarray:
    """Interleaved ``[start0, stop0, start1, stop1, ...]`` of the runs of True.

    A run starts or stops wherever a block differs from the one before it
    (with False beyond both ends). Compared as booleans, with no ``np.diff``:
    ``diff`` with ``prepend``/``append`` copies the mask twice and subtracts
    in int8, much slower (docs/benchmarks.md, why-regions).
    """
    m = np.asarray(mask, dtype=bool)
    if m.ndim != 1:
        raise ValueError("mask must be 1-D")
    if not m.size:
        return np.zeros(0, dtype=np.intp)
    change = np.empty(m.size + 1, dtype=bool)
    change[0], change[-1] = m[0], m[-1]
    np.not_equal(m[1:], m[:-1], out=change[1:-1])
    return np.flatnonzero(change)


def run_indices(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The numbers of the blocks of the runs ``[starts[i], stops[i])``, laid end to end.

    One array, no Python loop: each run's first block is offset by the
    blocks of the runs before it, and ``repeat`` + ``arange`` fill the rest.
    """
    starts = np.asarray(starts, dtype=np.intp)
    lengths = np.asarray(stops, dtype=np.intp) - starts
    if not lengths.size:
        return np.zeros(0, dtype=np.intp)
    offsets = np.concatenate(([0], np.cumsum(lengths[:-1])))
    return np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()), dtype=np.intp)


def runs_to_mask(runs: Iterable[Run], nblocks: int) -> np.ndarray:
    """A bool per block: True on the blocks of ``runs`` (clipped to ``nblocks``)."""
    mask = np.zeros(nblocks, dtype=bool)
    for start, stop in runs:
        mask[start:min(stop, nblocks)] = True
    return mask


def page_round(n: int, page: int) -> int:
    """``n`` rounded up to a multiple of ``page``."""
    return -(-n // page) * page


def blocks_of(size: int, block_size: int) -> int:
    """How many blocks ``size`` bytes make: the last one may be short (the one home of
    the rounding; ``Image.block_count`` asks it)."""
    return -(-int(size) // int(block_size))


def priority_pieces(target_runs: Iterable[Run], nblocks: int) -> list[Run]:
    """Disjoint pieces of the targets in priority order.

    Each target run, clipped to ``[0, nblocks)``, minus everything an earlier
    (higher-priority) target already covers. A target overlapped by an
    earlier one can become several pieces; they keep its rank. Targets
    from ``budget.allocate`` are disjoint already and come back unchanged.
    """
    runs = clip_runs(target_runs, nblocks)
    ordered = sorted(runs)
    if all(ordered[i][1] <= ordered[i + 1][0] for i in range(len(ordered) - 1)):
        return runs
    covered: list[Run] = []      # sorted, disjoint union of the targets so far
    out: list[Run] = []
    for a, b in runs:
        out.extend(subtract((a, b), covered))
        i = bisect.bisect_left(covered, (a, a))
        if i and covered[i - 1][1] >= a:
            i -= 1
        j = i
        lo, hi = a, b
        while j < len(covered) and covered[j][0] <= b:
            lo, hi = min(lo, covered[j][0]), max(hi, covered[j][1])
            j += 1
        covered[i:j] = [(lo, hi)]
    return out


def diff_runs(held: list[Run], pieces: list[Run]) -> tuple[list[Run], list[Run]]:
    """(to release, to load): ``held`` (sorted, disjoint) parts outside ``pieces``, sorted;
    ``pieces`` (disjoint, priority order) parts not held, in priority order."""
    union = merge_runs(pieces)
    to_release = [p for run in held for p in subtract(run, union)]
    to_load = [p for run in pieces for p in subtract(run, held)]
    return to_release, to_load


def lowest_first(order: list[Run], held: list[Run]) -> list[Run]:
    """The ``held`` runs in shedding order: lowest priority first, highest blocks first.

    ``order``: the target pieces in priority order; held blocks outside every
    target come first of all.
    """
    ranked = [piece for run in reversed(order) for piece in reversed(intersect(run, held))]
    covered = merge_runs(ranked)
    stray = [p for run in held for p in subtract(run, covered)]
    return sorted(stray, reverse=True) + ranked
