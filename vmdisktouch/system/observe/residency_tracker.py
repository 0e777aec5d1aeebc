"""Residency for the daemon, cycle after cycle: re-read only the ranges that changed.

Theory of operation
-------------------
``residency.scan`` answers "which blocks are cached" from nothing, and its
cost is that of walking every cached page once per level of its descent
(docs/benchmarks.md, why-residency-tracker). The daemon
asks the same question every few seconds about an image whose cache
changes only where the guest is working.

The image is cut into ranges of ``RANGE_BYTES`` (1 GiB, whole blocks). Each
cycle every range is asked ``cachestat(2)`` once, and its whole record
(cached, dirty, writeback, evicted and recently evicted pages) is its
signature: 1024 calls and one walk of the cached pages for 1 TiB. A range
whose signature equals the previous cycle's keeps its
per-block counts; a changed range (or every range, on the first cycle and
after a size change) is zeroed and descended as ``residency.scan`` does.

A page that arrives changes the cached count; a page that reclaim takes
changes the cached count and leaves a shadow entry (the evicted count). An
unchanged signature therefore means unchanged residency except for a swap
within one range in one cycle: as many pages dropped without a shadow entry
(``POSIX_FADV_DONTNEED``, truncation, invalidation by a direct write) or
refaulted over their shadows as arrived elsewhere in the range. The count
of cached pages is right even then, only their place in the range is
stale; to bound how long, every scan also checks one ``REFRESH_EVERY``-th
(12th) of the ranges that hold cached pages, in turn, so each is checked at
least every 12 scans (60 s at 5 s cycles). Spreading the refresh keeps every
cycle equally cheap: re-reading all ranges at once every 6th cycle (the first
design) made that cycle a large share of the daemon's CPU
(docs/benchmarks.md, why-residency-tracker). The check itself is one ``cachestat``
per block known to hold cached pages (at most ``VERIFY_BLOCKS``): when each
still holds exactly its count and the counts add up to the range's, no page
can lie elsewhere, and the range is not descended; anything else re-reads
the range.
The signature is taken before the descent, so a change during the descent
shows as a changed signature next cycle.

A caller that knows some blocks are wholly cached (the daemon's own held
blocks, mlocked) passes them as ``known``: they are filled, not descended, so
the guest's writes to held data (which change a range's dirty count every
cycle) do not make the scan walk what the daemon holds.

Without ``cachestat`` (kernel < 6.5, or EPERM) every scan is a full
``residency.scan``.
"""

from __future__ import annotations

import numpy as np

from vmdisktouch.core.runs import blocks_of
from vmdisktouch.system import libc
from vmdisktouch.system.observe import residency
from vmdisktouch.system.image import Image

RANGE_BYTES = 1 << 30
REFRESH_EVERY = 12
VERIFY_BLOCKS = 32    # a refreshed range with more cached blocks than this is re-read


class ResidencyTracker:
    """Scans one open image each cycle, re-reading only the ranges whose cachestat changed."""

    def __init__(self, image: Image, block_size: int, *, range_bytes: int = RANGE_BYTES,
                 refresh_every: int = REFRESH_EVERY):
        residency.validate_block_size(block_size)
        self.fd = fd = image.fd
        self.block_size = int(block_size)
        self.range_bytes = max(range_bytes - range_bytes % block_size, block_size)
        self.refresh_every = max(1, int(refresh_every))
        self.cs = libc.CacheStatCaller(fd)
        self.partial_view = residency.is_partial_view(fd)
        self._size: int | None = None
        self._counts = np.zeros(0, dtype=np.uint32)
        self._sigs: list[tuple] = []
        self._turn = 0                # which share of the ranges this scan refreshes
        self.last_reread = 0          # ranges descended by the last scan (for tests and logs)
        self.last_checked = 0         # unchanged ranges the last scan's refresh checked

    def scan(self, size: int, known: np.ndarray | None = None) -> residency.Residency:
        """Residency of the first ``size`` bytes; ``known``: blocks known wholly cached."""
        size = int(size)
        if not self.cs.available:
            self.last_reread = -1
            return residency.scan(self.fd, size, self.block_size)
        rb, bs = self.range_bytes, self.block_size
        ranges = [(off, min(rb, size - off)) for off in range(0, size, rb)]
        record = self.cs.record
        sigs = [record(off, length) for off, length in ranges]
        if size != self._size:
            self._counts = np.zeros(blocks_of(size, bs), dtype=np.uint32)
            changed = [r for r, sig in zip(ranges, sigs) if sig[0]]
            self._turn = 0
            self.last_checked = 0
        else:
            # Changed ranges, and this scan's share of the refresh (see above).
            turn, every = self._turn, self.refresh_every
            refresh = [sig[0] and i % every == turn and sig == old
                       for i, (sig, old) in enumerate(zip(sigs, self._sigs))]
            self.last_checked = sum(refresh)
            changed = [r for r, sig, old, check in zip(ranges, sigs, self._sigs, refresh)
                       if sig != old or (check and not self._still_placed(r, sig[0]))]
            self._turn = (turn + 1) % every
            for off, length in changed:
                self._counts[off // bs:-(-(off + length) // bs)] = 0
        col = residency.Collector(size, bs, libc.PAGE_SIZE, False, counts=self._counts)
        if known is not None and known.any():
            known = known[:col.counts.size]
            col.counts[:known.size][known] = col.totals[:known.size][known]
            changed = _outside(changed, known, bs)
        residency.scan_ranges(self.fd, changed, bs, self.cs, col)
        self._size, self._sigs = size, sigs
        self.last_reread = len(changed)
        return residency.Residency(size, libc.PAGE_SIZE, bs, self._counts.copy(),
                                   used_cachestat=True, partial_view=self.partial_view)

    def _still_placed(self, rng: tuple[int, int], cached: int) -> bool:
        """Whether the stored counts of a range with an unchanged record are still right.

        True when the range's cached pages all lie in the blocks already
        known to hold them, as many in each: one ``cachestat`` per such
        block, and their sum is the range's. A range with more than
        ``VERIFY_BLOCKS`` such blocks is re-read instead.
        """
        off, length = rng
        bs = self.block_size
        b0 = off // bs
        counts = self._counts[b0:-(-(off + length) // bs)]
        known = np.flatnonzero(counts)
        if known.size > VERIFY_BLOCKS or int(counts.sum(dtype=np.int64)) != cached:
            return False
        end = off + length
        nr_cache = self.cs.nr_cache
        for k in known.tolist():
            start = (b0 + k) * bs
            if nr_cache(start, min(bs, end - start)) != counts[k]:
                return False
        return True


def _outside(ranges: list[tuple[int, int]], known: np.ndarray,
             block_size: int) -> list[tuple[int, int]]:
    """The parts of the block-aligned byte ranges (ascending) outside the ``known`` blocks."""
    out = []
    for off, length in ranges:
        b0, b1 = off // block_size, -(-(off + length) // block_size)
        part = known[b0:b1]
        if not part.any():
            out.append((off, length))
            continue
        edges = np.flatnonzero(np.diff(~part, prepend=False, append=False))
        end = off + length
        for s, e in zip(edges[0::2].tolist(), edges[1::2].tolist()):
            start = off + s * block_size
            out.append((start, min((b0 + e) * block_size, end) - start))
    return out
