"""Page-cache residency of a disk image, reduced to a per-block map.

Theory of operation
-------------------
The question "which pages of this file are in the page cache" has two kernel
answers:

* ``mincore(2)`` on a shared mapping of the file: one byte per page. It is
  exact but costs one page-cache lookup per page, resident or not, so a
  1 TiB image (268 M pages) costs seconds and, done naively, a 256 MiB vector.
* ``cachestat(2)`` (Linux >= 6.5): the number of cached pages in a byte range.
  It walks only the populated part of the page-cache xarray, so an empty
  gigabyte costs about as much as an empty page.

The scanner descends a tree of block-aligned ranges. Each range is asked
``cachestat``: no cached page means the whole range is skipped; all pages
cached means the whole range is filled without looking further; otherwise
the range is split in ``FANOUT`` parts. Ranges at or below ``LEAF_BYTES`` are
read with one ``mincore`` call, whose bytes are reduced to per-block counts
(and, on request, to merged byte ranges) at once. The cost is thus
proportional to the number of cached extents, not to the image size, and the
working memory is one leaf-sized mincore vector plus the per-block count
array (4 bytes per block: 4 MiB for 1 TiB at the default 1 MiB block).

Without ``cachestat`` (older kernel, or EPERM on a file the caller may not
write) the scanner falls back to ``mincore`` over the whole image in
``CHUNK_BYTES`` windows: same result, slower, same bounded memory.

Caveat (Linux >= 5.2, mm/mincore.c ``can_do_mincore``): to a process that
neither owns the file (``inode_owner_or_capable``: its fsuid is the file's
owner, or it has CAP_FOWNER) nor may open it for writing
(``file_permission(MAY_WRITE)``: the mode bits and ACLs, or
CAP_DAC_OVERRIDE), mincore reports **every** page as resident, cached or
not, and cachestat refuses the file (EPERM, which falls back to mincore).
The counts are then too high (100 %), not too low. ``residency_hidden``
applies that rule; ``scan`` sets ``Residency.partial_view`` from it, so a
caller refuses the numbers (``vmdisktouch snapshot`` refuses the image).

Why 1 MiB blocks by default: a block is the unit of heat, hold and checksum.
1 MiB is the extent size guest filesystems allocate in (ext4/XFS groups
files in runs of this order), it keeps 1 TiB down to 1 M blocks (a few MiB
per map, milliseconds to filter), its 256 pages fit mincore reductions in
one vector row, and holding regions of whole MiBs keeps the number of
mappings (VMAs) far below ``vm.max_map_count``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from vmdisktouch.core.runs import blocks_of
from vmdisktouch.system import libc

log = logging.getLogger("vmdisktouch")

DEFAULT_BLOCK_SIZE = 1 << 20
FANOUT = 16
LEAF_BYTES = 1 << 20          # mincore instead of descending below this (one default block:
                              # an aligned cached MiB costs a cachestat, not a 4 MiB mincore)
CHUNK_BYTES = 1 << 30         # mincore window when cachestat is unavailable
TOP_BYTES = 16 << 30          # first level of the cachestat descent
DENSE_CALLS_PER_PAGE = 1 / 16 # a range with a cached page per 16 of its blocks is counted
                              # block by block: a call costs ~0.7 us from Python, walking a
                              # cached page ~0.03 us, and a descent walks each page per level


@dataclass
class Residency:
    """Residency of one image at one moment."""

    size_bytes: int
    page_size: int
    block_size: int
    counts: np.ndarray                      # resident pages per block (uint32)
    ranges: list[tuple[int, int]] | None = None   # merged [offset, length] byte ranges
    used_cachestat: bool = False
    partial_view: bool = False              # the kernel hid residency: counts are all 1s

    @property
    def nblocks(self) -> int:
        return int(self.counts.size)

    @property
    def total_pages(self) -> int:
        return -(-self.size_bytes // self.page_size)

    @property
    def resident_pages(self) -> int:
        return int(self.counts.sum(dtype=np.int64))

    def block_pages(self) -> np.ndarray:
        """Pages in each block (the last block may be short)."""
        return block_page_totals(self.size_bytes, self.block_size, self.page_size)

    def fraction(self) -> np.ndarray:
        """Resident fraction of each block, float32 in [0, 1]."""
        return (self.counts / self.block_pages()).astype(np.float32)


def block_page_totals(size: int, block_size: int, page_size: int = libc.PAGE_SIZE) -> np.ndarray:
    nblocks = blocks_of(size, block_size)
    totals = np.full(nblocks, block_size // page_size, dtype=np.uint32)
    if nblocks:
        tail = size - (nblocks - 1) * block_size
        totals[-1] = -(-tail // page_size)
    return totals


def validate_block_size(block_size: int, page_size: int = libc.PAGE_SIZE) -> None:
    if block_size < page_size or block_size % page_size:
        raise ValueError(f"block size must be a multiple of the page size ({page_size})")


class Collector:
    """Accumulates per-block counts and merged resident byte ranges."""

    def __init__(self, size: int, block_size: int, page_size: int, want_ranges: bool,
                 counts: np.ndarray | None = None):
        self.size = size
        self.block_size = block_size
        self.page_size = page_size
        self.ppb = block_size // page_size
        self.counts = np.zeros(blocks_of(size, block_size), dtype=np.uint32) if counts is None \
            else counts
        self.totals = block_page_totals(size, block_size, page_size)
        self.ranges: list[list[int]] | None = [] if want_ranges else None

    def add_range(self, start: int, end: int) -> None:
        end = min(end, self.size)
        if self.ranges is None or end <= start:
            return
        if self.ranges and self.ranges[-1][0] + self.ranges[-1][1] == start:
            self.ranges[-1][1] += end - start
        else:
            self.ranges.append([start, end - start])

    def fill(self, off: int, length: int) -> None:
        """Every page of the block-aligned range [off, off+length) is resident."""
        b0 = off // self.block_size
        b1 = -(-(off + length) // self.block_size)
        self.counts[b0:b1] = self.totals[b0:b1]
        self.add_range(off, off + length)

    def add_bits(self, off: int, bits: np.ndarray) -> None:
        """``bits``: 0/1 per page starting at block-aligned ``off``."""
        b0 = off // self.block_size
        n = bits.size
        whole = n - n % self.ppb
        if whole:
            self.counts[b0:b0 + whole // self.ppb] = bits[:whole].reshape(-1, self.ppb).sum(
                axis=1, dtype=np.uint32)
        if n % self.ppb:
            self.counts[b0 + whole // self.ppb] = int(bits[whole:].sum())
        if self.ranges is not None and n:
            edges = np.flatnonzero(np.diff(bits, prepend=0, append=0))
            for s, e in zip(edges[0::2], edges[1::2]):
                self.add_range(off + int(s) * self.page_size, off + int(e) * self.page_size)

    def result(self, **kw) -> Residency:
        ranges = [tuple(r) for r in self.ranges] if self.ranges is not None else None
        return Residency(self.size, self.page_size, self.block_size, self.counts, ranges, **kw)


class _MincoreWindow:
    """mmap + mincore + munmap of one window, with a reused vector."""

    def __init__(self, fd: int, max_bytes: int, page_size: int):
        self.fd = fd
        self.page_size = page_size
        self.vec = np.empty(max_bytes // page_size + 1, dtype=np.uint8)

    def bits(self, off: int, length: int) -> np.ndarray:
        addr = libc.mmap_file(self.fd, off, length)
        try:
            vec = libc.mincore(addr, length, self.vec)
        finally:
            libc.munmap(addr, length)
        return vec & 1


CAP_FOWNER = 3                  # linux/capability.h


def _has_capability(bit: int) -> bool:
    """Whether this process has capability ``bit`` in its effective set (/proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def residency_hidden(fd: int) -> bool:
    """True when Linux (>= 5.2) hides the page cache of ``fd``'s file from this process:
    mincore then says every page is resident, cachestat says EPERM.

    The kernel's rule (``can_do_mincore``; ``can_do_cachestat`` where the kernel has it,
    as 6.18 does, so cachestat is EPERM and the scan falls back to mincore): the
    answers are true when the caller owns the file (its fsuid, here its euid, is the
    owner) or has CAP_FOWNER, or may open the file for writing. The last is asked of
    the kernel, ``access(W_OK)`` with the effective ids through /proc/self/fd, so mode
    bits, ACLs and CAP_DAC_OVERRIDE count as the kernel counts them. One difference,
    on the safe side: access(2) also says no on a read-only mount of a writable file
    system, where mincore would answer truly; such a file is called hidden.
    """
    try:
        if os.fstat(fd).st_uid == os.geteuid() or _has_capability(CAP_FOWNER):
            return False
        effective = os.access in os.supports_effective_ids
        return not os.access(f"/proc/self/fd/{fd}", os.W_OK, effective_ids=effective)
    except OSError:
        return True


is_partial_view = residency_hidden       # the name ``residency_tracker`` uses


NO_CACHESTAT_ENV = "VMDISKTOUCH_NO_CACHESTAT"   # "1": scan as on a kernel before 6.5


def scan(fd: int, size: int, block_size: int = DEFAULT_BLOCK_SIZE, *,
         want_ranges: bool = False, use_cachestat: bool | None = None) -> Residency:
    """Scan residency of the first ``size`` bytes of ``fd``. ``use_cachestat`` None: unless
    ``VMDISKTOUCH_NO_CACHESTAT=1`` (the fallback's benchmark, ``bench_scan``)."""
    if use_cachestat is None:
        use_cachestat = os.environ.get(NO_CACHESTAT_ENV) != "1"
    page = libc.PAGE_SIZE
    validate_block_size(block_size, page)
    col = Collector(size, block_size, page, want_ranges)
    partial_view = residency_hidden(fd)
    if size <= 0:
        return col.result(partial_view=partial_view)

    cs = libc.CacheStatCaller(fd) if use_cachestat else None
    if cs is not None and cs.available:
        _scan_cachestat(fd, size, block_size, cs, col)
        return col.result(used_cachestat=True, partial_view=partial_view)
    if cs is not None:
        _say_fallback_once(cs.unavailable)
    _scan_mincore(fd, size, col)
    return col.result(partial_view=partial_view)


_FALLBACK_SAID: set[str] = set()


def _say_fallback_once(why: str) -> None:
    """One log line per process and reason when cachestat(2) cannot serve: every scan is
    then a mincore(2) of the whole image, which an operator on an older kernel should
    know once, not each cycle."""
    if why in _FALLBACK_SAID:
        return
    _FALLBACK_SAID.add(why)
    detail = {"ENOSYS": f"this kernel ({os.uname().release}) has no cachestat(2), added in "
                        "Linux 6.5",
              "EPERM": "cachestat(2) refused the image (EPERM: the caller may not write it)"}
    log.info("residency: %s; scanning with mincore(2) instead",
             detail.get(why, f"cachestat(2) is unavailable ({why})"))


def _scan_mincore(fd: int, size: int, col: Collector) -> None:
    window = max(CHUNK_BYTES - CHUNK_BYTES % col.block_size, col.block_size)
    win = _MincoreWindow(fd, window, col.page_size)
    for off in range(0, size, window):
        col.add_bits(off, win.bits(off, min(window, size - off)))


def _scan_cachestat(fd: int, size: int, block_size: int, cs: libc.CacheStatCaller,
                    col: Collector) -> None:
    top = max(TOP_BYTES - TOP_BYTES % block_size, block_size)
    scan_ranges(fd, [(off, min(top, size - off)) for off in range(0, size, top)],
                block_size, cs, col)


def scan_ranges(fd: int, ranges: list[tuple[int, int]], block_size: int,
                cs: libc.CacheStatCaller, col: Collector) -> None:
    """Descend the block-aligned byte ranges ``(offset, length)`` (ascending) into ``col``."""
    page = col.page_size
    leaf = max(LEAF_BYTES - LEAF_BYTES % block_size, block_size)
    win = _MincoreWindow(fd, leaf, page)
    nr_cache = cs.nr_cache
    # Depth-first, ascending offsets: the stack holds ranges in reverse order.
    stack = list(reversed(ranges))
    while stack:
        off, length = stack.pop()
        n = nr_cache(off, length)
        if n == 0:
            continue
        if n >= -(-length // page):
            col.fill(off, length)
        elif length <= leaf:
            if col.ranges is None and length <= block_size:
                col.counts[off // block_size] = n      # the count is the answer
            else:
                col.add_bits(off, win.bits(off, length))
        else:
            if length <= block_size * DENSE_CALLS_PER_PAGE * n:
                # Dense: split straight into blocks (leaves), which walks these
                # pages once more, where descending would walk them once per level.
                step = block_size
            else:
                step = -(-length // FANOUT)
                step = -(-step // block_size) * block_size
            parts = [(o, min(step, off + length - o)) for o in range(off, off + length, step)]
            stack.extend(reversed(parts))
