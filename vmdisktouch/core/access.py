"""The guest's accesses, per block, from kernel trace events.

Theory of operation
-------------------
Pure core (numpy only). The trace source (``system.trace.trace_reader``) hands
over, each time it is drained, arrays of events of one image: their kind
(a read, a write, a page added to the cache, a page deleted from it), their
time (CLOCK_MONOTONIC ns) and their page range. ``AccessLog.feed`` folds
them in as they come; ``AccessLog.take`` returns one cycle's evidence and
starts the next:

* ``read_counts``: per block, how many read events touched it: how hot it
  is, which the 0/1 ``reads`` cannot tell once every block is read every
  cycle (the policy weighs a held block's thrash by it).
* ``read_recent``: per block, its read events weighted by how recent they
  are, ``exp(-age / RATE_SECONDS)`` with the age from the end of the cycle
  (``core.intensity``'s time constant): the read rate as a continuous
  exponential average, which the cycle's counts are only in steps of a
  cycle (only with ``take``'s ``now_ns``).
* ``reads``: per block, 1 when the guest read any page of it in the cycle
  (cache hits included: a held block that is read is seen), else absent.
  It is the trace source's counterpart of residency (the fraction of a
  block cached): a block the guest reads every cycle gives 1 each cycle,
  as a block it keeps cached does, and one read every fifth cycle heats to
  about a fifth, so the operator's threshold keeps its meaning.
* ``writes``: per block, the share of its ``PARTS`` (16) equal parts that
  a write dirtied: the same unit as the checksums of the polling source
  (``system.observe.checksums``: parts of ``ceil(block_size / 16)`` bytes), so the
  policy's rewritten-density rule holds for both. Every block is seen, held
  or not. A dirtied page counts for every part it overlaps: in a block of
  16 pages or a multiple, its one part; in a smaller block (any multiple of
  the page size is a block size) several, so the share is that of the
  block's pages written, rounded up to sixteenths (one page of an 8 KiB
  block: 8/16; of a 60 KiB block: 2/16).
* ``refaults``: per block, the share of its pages that came back into the
  cache less than ``REFAULT_SECONDS`` after the kernel deleted them: the
  guest needed pages the cache had just lost, which residency never shows
  (docs/rationale.md#refault-seconds).
  A share, not a 0/1 flag: when a hot set twice the cache thrashes, every
  block of it refaults every cycle, and only how many of its pages did
  tells the hotter part (three reads in four) from the rest.
  Deletions are remembered (page, time) in a sorted array, at most
  ``MAX_DELETIONS`` of them (the oldest are dropped first).

The exact pages are kept too (``Access.write_pages``, ``Access.read_events``)
for the status and the tests: every page a write dirtied in the cycle.

Reads may come counted instead (``feed``'s ``counted``: per block, by the
kernel, since the last drain; ``system.trace.bpf_reads``): they fold into the
same per-block evidence, each block's count weighted by the drain's time for
``read_recent``. ``read_events`` then counts a read across a block boundary
once per block it touched.

Events name pages by index, in the host's pages: ``page_size`` bytes (the
system layer's ``libc.PAGE_SIZE``, 4 KiB on x86_64, often 64 KiB on arm64 and
ppc64le), given to ``AccessLog`` and ``EventResidency``, never assumed here;
page ``i`` is bytes ``[i*page_size, (i+1)*page_size)`` and a block is
``block_size // page_size`` pages. A read range that crosses a block
boundary counts for every block it touches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vmdisktouch.core.rules import RATE_SECONDS, REFAULT_SECONDS
from vmdisktouch.core.sparse import Sparse

READ, WRITE, ADD, DELETE = 0, 1, 2, 3
PARTS = 16
MAX_DELETIONS = 1 << 22          # 64 MiB of (page, time) pairs at most


@dataclass(frozen=True)
class Access:
    """One cycle of the guest's accesses to one image."""
    reads: Sparse            # blocks read (value 1)
    writes: Sparse           # blocks written: the share of their parts dirtied
    refaults: Sparse         # blocks with pages refaulted: the share of their pages
    read_counts: Sparse      # blocks read: how many read events touched each
    read_recent: Sparse | None  # blocks read: their events weighted by recency (or None)
    read_events: int
    write_pages: np.ndarray  # every page dirtied, sorted, unique (int64)
    refault_pages: int
    lost: int                # events the kernel lost in the cycle


class AccessLog:
    """Accumulates trace events into per-block evidence, one cycle at a time."""

    def __init__(self, block_size: int, page_size: int):
        self.page_size = int(page_size)
        self.pages_per_block = pages_per_block(block_size, page_size)
        self.part_bytes = -(-int(block_size) // PARTS)     # as system.observe.checksums cuts a block
        self._deleted_pages = np.zeros(0, dtype=np.int64)   # sorted, unique
        self._deleted_at = np.zeros(0, dtype=np.int64)      # ns, aligned
        self._reset()

    def _reset(self) -> None:
        self._read_blocks: list[np.ndarray] = []
        self._read_ts: list[np.ndarray] = []          # aligned with _read_blocks
        self._read_counts: list[np.ndarray] = []      # read events per entry: aligned too
        self._write_pages: list[np.ndarray] = []
        self._refault_pages: list[np.ndarray] = []
        self._reads = 0
        self._lost = 0

    @property
    def empty(self) -> bool:
        """Nothing fed since the last ``take``: no read, write or refault, nothing lost."""
        return not (self._read_blocks or self._write_pages or self._refault_pages
                    or self._reads or self._lost)

    def feed(self, kind, ts, first, last, lost: int = 0, counted=None):
        """Fold in one drain's events (arrays of equal length, in time order), and the
        reads counted per block in the kernel since the last drain (``counted``: blocks,
        counts and the time they were taken, or None). Returns the drain's reads per
        block (blocks, counts): a read event counts for every block it touches."""
        kind = np.asarray(kind)
        ts = np.asarray(ts, dtype=np.int64)
        first = np.asarray(first, dtype=np.int64)
        last = np.asarray(last, dtype=np.int64)
        self._lost += int(lost)
        r = kind == READ
        drained = []
        if r.any():
            self._reads += int(r.sum())
            blocks, which = _blocks_touched(first[r], last[r], self.pages_per_block)
            self._add_reads(blocks, ts[r][which], np.ones(blocks.size, dtype=np.int64))
            drained.append((blocks, np.ones(blocks.size, dtype=np.int64)))
        if counted is not None and counted.blocks.size:
            blocks = np.asarray(counted.blocks, dtype=np.int64)
            counts = np.asarray(counted.counts, dtype=np.int64)
            self._reads += int(counts.sum())
            self._add_reads(blocks, np.full(blocks.size, counted.ts, dtype=np.int64), counts)
            drained.append((blocks, counts))
        w = kind == WRITE
        if w.any():
            self._write_pages.append(_pages(first[w], last[w]))
        d = kind == DELETE
        a = kind == ADD
        if d.any() or a.any():
            self._fold_cache_events(kind[a | d], ts[a | d], first[a | d], last[a | d])
        if not drained:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(drained) == 1:
            return drained[0]
        return (np.concatenate([b for b, _ in drained]), np.concatenate([c for _, c in drained]))

    def _add_reads(self, blocks: np.ndarray, ts: np.ndarray, counts: np.ndarray) -> None:
        self._read_blocks.append(blocks)
        self._read_ts.append(ts)
        self._read_counts.append(counts)

    def take(self, nblocks: int, now_ns: int | None = None) -> Access:
        """This cycle's evidence for an image of ``nblocks`` blocks; starts the next cycle."""
        ppb = self.pages_per_block
        # Counted over the image's blocks (a pass over the reads and one over the blocks, as
        # the heat map's), not sorted: a cycle may bring millions of reads of a few blocks.
        none = np.zeros(0, np.int64)
        touched = np.concatenate(self._read_blocks or [none])
        inside = touched < nblocks
        touched = touched[inside]
        weight = np.concatenate(self._read_counts or [none])[inside]
        per_block = np.bincount(touched, weights=weight, minlength=nblocks)
        blocks = np.flatnonzero(per_block)
        counts = per_block[blocks]
        recent = None
        if now_ns is not None:      # each read weighted by its age at the cycle's end
            age = (now_ns - np.concatenate(self._read_ts or [none])[inside])
            decay = np.exp(-(age / 1e9).clip(0) / RATE_SECONDS)
            weights = np.bincount(touched, weights=weight * decay, minlength=nblocks)
            recent = Sparse(blocks, weights[blocks].astype(np.float32))
        reads = Sparse(blocks, np.ones(blocks.size, dtype=np.float32))
        read_counts = Sparse(blocks, counts.astype(np.float32))
        pages = _unique(self._write_pages)
        pages = pages[pages < nblocks * ppb]
        parts = np.unique(_parts_written(pages, ppb, self.page_size, self.part_bytes))
        wblocks, nparts = np.unique(parts // PARTS, return_counts=True)
        writes = Sparse(wblocks, (nparts / PARTS).astype(np.float32))
        refaulted = _unique(self._refault_pages)
        rblocks, npages = np.unique(refaulted // ppb, return_counts=True)
        keep = rblocks < nblocks
        refaults = Sparse(rblocks[keep], (npages[keep] / ppb).astype(np.float32))
        out = Access(reads, writes, refaults, read_counts, recent, self._reads, pages,
                     int(refaulted.size), self._lost)
        if now_ns is not None:
            self._forget_before(now_ns - int(REFAULT_SECONDS * 1e9))
        self._reset()
        return out

    # -- refaults ------------------------------------------------------------

    def _fold_cache_events(self, kind, ts, first, last) -> None:
        """Match additions against earlier deletions (refaults), then remember deletions.

        Events come in time order; an addition is a refault when the same
        page's latest deletion before it is younger than ``REFAULT_SECONDS``.
        Deletions and additions of this batch are matched in order: a page
        deleted after it was added in the same batch is not a refault.
        """
        pages, idx = _expand(first, last)
        kinds, times = kind[idx], ts[idx]
        # The latest deletion of each page before each addition, in this batch or before.
        order = np.lexsort((times, pages))          # by page, then time
        pages, kinds, times = pages[order], kinds[order], times[order]
        is_del = kinds == DELETE
        # For every event, the time of the last deletion of the same page at or before it.
        last_del = np.where(is_del, times, np.int64(-1))
        same = np.ones(pages.size, dtype=bool)
        same[1:] = pages[1:] == pages[:-1]
        # Running maximum of deletion times within each page's group.
        run_max = _grouped_running_max(last_del, np.cumsum(~same) - 1)
        older = self._lookup(pages)                 # deletions remembered from before
        deleted_at = np.maximum(run_max, older)
        window = int(REFAULT_SECONDS * 1e9)
        refault = (kinds == ADD) & (deleted_at >= 0) & (times - deleted_at <= window)
        if refault.any():
            self._refault_pages.append(pages[refault])
        # Remember each page's latest deletion (added back later: still remembered, a
        # second refault within the window is a refault again).
        if is_del.any():
            dp, dt = pages[is_del], times[is_del]
            keep = np.ones(dp.size, dtype=bool)
            keep[:-1] = dp[1:] != dp[:-1]            # the last (latest) per page
            self._remember(dp[keep], dt[keep])

    def _lookup(self, pages: np.ndarray) -> np.ndarray:
        """The remembered deletion time of each page, or -1."""
        out = np.full(pages.size, -1, dtype=np.int64)
        if not self._deleted_pages.size:
            return out
        i = np.searchsorted(self._deleted_pages, pages)
        i = np.minimum(i, self._deleted_pages.size - 1)
        hit = self._deleted_pages[i] == pages
        out[hit] = self._deleted_at[i[hit]]
        return out

    def _remember(self, pages: np.ndarray, times: np.ndarray) -> None:
        allp = np.concatenate((pages, self._deleted_pages))     # new ones first: they win
        allt = np.concatenate((times, self._deleted_at))
        uniq, first = np.unique(allp, return_index=True)
        self._deleted_pages, self._deleted_at = uniq, allt[first]
        if uniq.size > MAX_DELETIONS:
            keep = np.sort(np.argsort(self._deleted_at)[-MAX_DELETIONS:])
            self._deleted_pages = self._deleted_pages[keep]
            self._deleted_at = self._deleted_at[keep]

    def _forget_before(self, t_ns: int) -> None:
        keep = self._deleted_at >= t_ns
        if not keep.all():
            self._deleted_pages = self._deleted_pages[keep]
            self._deleted_at = self._deleted_at[keep]

    @property
    def remembered_deletions(self) -> int:
        return int(self._deleted_pages.size)


# -- helpers -----------------------------------------------------------------

def pages_per_block(block_size: int, page_size: int) -> int:
    """Pages of ``page_size`` bytes in a block; a block is a whole number of them."""
    if page_size <= 0 or block_size < page_size or block_size % page_size:
        raise ValueError(f"block_size {block_size} is not a multiple of the page size "
                         f"({page_size})")
    return block_size // page_size


def _parts_written(pages: np.ndarray, ppb: int, page_size: int, part_bytes: int) -> np.ndarray:
    """The parts (``block * PARTS + part``) the pages overlap, with repeats."""
    offset = pages % ppb * page_size                 # the page's first byte in its block
    first = offset // part_bytes
    last = np.minimum((offset + page_size - 1) // part_bytes, PARTS - 1)
    base = pages // ppb * PARTS
    if (first == last).all():
        return base + first
    parts, idx = _expand(first, last)
    return base[idx] + parts


def _unique(chunks: list[np.ndarray]) -> np.ndarray:
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate(chunks))


def _expand(first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every page of the ranges ``first..last`` (inclusive), and the index of its range."""
    counts = last - first + 1
    counts = np.maximum(counts, 1)
    idx = np.repeat(np.arange(first.size), counts)
    offsets = np.arange(idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return first[idx] + offsets, idx


def _pages(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    if (last == first).all():
        return first
    return _expand(first, last)[0]


def _pages_per_block(first: np.ndarray, last: np.ndarray, ppb: int, n: int) -> np.ndarray:
    """How many pages of the ranges ``first..last`` lie in each of ``n`` blocks (int32).

    By block, not page: a 2 MiB folio is one or two entries, not 512.
    """
    b0, b1 = first // ppb, last // ppb
    if not (b0 == b1).all():
        blocks, idx = _expand(b0, b1)
        first = np.maximum(first[idx], blocks * ppb)
        last = np.minimum(last[idx], blocks * ppb + ppb - 1)
        b0 = blocks
    keep = b0 < n
    return np.bincount(b0[keep], weights=(last - first + 1)[keep],
                       minlength=n)[:n].astype(np.int32)


def _blocks_touched(first: np.ndarray, last: np.ndarray, ppb: int) -> np.ndarray:
    """Every block the page ranges touch (with repeats), and the index of its range."""
    b0, b1 = first // ppb, last // ppb
    if (b0 == b1).all():
        return b0, np.arange(b0.size)
    return _expand(b0, b1)


def _grouped_running_max(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarting with each group (groups are contiguous,
    numbered 0, 1, ... in order)."""
    if not values.size:
        return values
    # Ranks instead of values, each group lifted above every earlier one, so one
    # running maximum cannot leak across groups and nothing overflows.
    uniq, rank = np.unique(values, return_inverse=True)
    lift = group.astype(np.int64) * (uniq.size + 1)
    return uniq[np.maximum.accumulate(rank.astype(np.int64) + lift) - lift]


class EventResidency:
    """The cached pages per block, kept from ADD and DELETE events between mincore passes.

    ``reconcile`` replaces the counts with a mincore pass's; between passes
    every page added counts +1 and every page deleted -1 (clipped to the
    block). A lost event, or a page the daemon's own thread added (not
    traced), makes a count wrong until the next pass: the trace source
    reconciles every few cycles and whenever events were lost.
    """

    def __init__(self, nblocks: int, block_size: int, page_size: int):
        self.page_size = int(page_size)
        self.pages_per_block = pages_per_block(block_size, page_size)
        self.counts = np.zeros(int(nblocks), dtype=np.int32)

    def reconcile(self, fraction: np.ndarray) -> None:
        self.counts = np.rint(np.asarray(fraction, dtype=np.float64)
                              * self.pages_per_block).astype(np.int32)

    def resize(self, nblocks: int) -> None:
        out = np.zeros(int(nblocks), dtype=np.int32)
        k = min(out.size, self.counts.size)
        out[:k] = self.counts[:k]
        self.counts = out

    def feed(self, kind, first, last) -> None:
        kind = np.asarray(kind)
        first = np.asarray(first, dtype=np.int64)
        last = np.asarray(last, dtype=np.int64)
        n, ppb = self.counts.size, self.pages_per_block
        for k, sign in ((ADD, 1), (DELETE, -1)):
            m = kind == k
            if m.any():
                self.counts += sign * _pages_per_block(first[m], last[m], ppb, n)
        np.clip(self.counts, 0, ppb, out=self.counts)

    def fraction(self) -> np.ndarray:
        return self.counts.astype(np.float32) / np.float32(self.pages_per_block)

    def resident_pages(self) -> int:
        return int(self.counts.sum(dtype=np.int64))
