"""The holder's mappings of one image: map, lock, merge, split and unmap block runs.

Every held piece is its own mapping (``mmap`` ``MAP_SHARED``, ``PROT_READ``
of the image, advised ``MADV_RANDOM``: a fault the holder's read-ahead
missed stays on its own page), locked with ``mlock`` a chunk at a time by
the holder. A ``Segment`` is one mapping holding blocks ``[start, stop)``
with its locked prefix of ``length`` bytes; the segments are kept sorted
by start and disjoint, and ``locked`` is the sum of their lengths: exactly
what is locked, and what ``VmLck`` shows for these mappings.

Sizes. A mapping covers its block run clipped to the file size, rounded up
to whole pages (block sizes are page multiples, so only the file's last
block can be partial).

Releasing part of a segment unlocks and unmaps exactly those pages and
splits it in two; what stays keeps its address.

Merging. A fully locked mapping is one VMA, and ``vm.max_map_count`` is
65530 by default. When a target run ends up made of more than
``max_pieces`` adjacent mappings (a region that grew or drifted a few
blocks per cycle), they are replaced by one mapping of the whole run. The
merge moves each piece's lock, one piece at a time, with ``munlock`` of the
old mapping, then ``mlock`` of the same pages in the new mapping, then
``munmap`` of the old: the pages are resident, so this reads nothing from
disk, and the locked total never counts a page twice. A mapping larger
than ``MERGE_MAX_BYTES`` (256 MiB) is never moved; only the smaller ones
beside it are merged with each other. Moving a lock walks every page of
it, and a large hold whose window drifts by a block at its ends would have
its whole lock moved each time (docs/benchmarks.md, why-holder); so a long
run is a few large mappings and at most one small one between each two.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

from vmdisktouch.core.runs import Run, merge_runs
from vmdisktouch.errors import SyscallError
from vmdisktouch.system import libc

log = logging.getLogger("vmdisktouch")

MERGE_MAX_BYTES = 256 << 20     # a mapping larger than this keeps its own lock


@dataclass(eq=False)
class Segment:
    """One mapping holding blocks ``[start, stop)``; ``addr`` maps block ``start``."""
    start: int
    stop: int
    addr: int
    length: int   # bytes mapped and locked (page-rounded, clipped to the file)


def _bisect(segs: list, block: int, *, right: bool) -> int:
    """``bisect.bisect_right`` (or ``_left``) of ``block`` among the segments' starts
    (``bisect``'s ``key=`` needs Python 3.10)."""
    lo, hi = 0, len(segs)
    while lo < hi:
        mid = (lo + hi) // 2
        s = segs[mid].start
        if s < block or (right and s == block):
            lo = mid + 1
        else:
            hi = mid
    return lo


class Mappings:
    """The sorted, disjoint segments of one image's fd, and the bytes they lock."""

    def __init__(self, fd: int, block_size: int):
        self.fd = fd
        self.block_size = block_size
        self.segs: list[Segment] = []
        self.locked = 0

    def __len__(self) -> int:
        return len(self.segs)

    def runs(self) -> list[Run]:
        """Sorted block runs held (adjacent mappings reported as one run)."""
        return merge_runs((s.start, s.stop) for s in self.segs)

    def offset_in(self, start: int, k: int, length: int) -> int:
        """Byte offset of block ``k`` in a mapping of ``length`` bytes starting at block ``start``."""
        return min((k - start) * self.block_size, length)

    def _first(self, block: int) -> int:
        """Index of the segment that holds ``block`` or the first after it."""
        return max(_bisect(self.segs, block, right=True) - 1, 0)

    def parts(self, runs: Iterable[Run]) -> list[tuple[int, int, int, int]]:
        """``(start, stop, address, length)`` of the held parts of ``runs``, block-aligned."""
        out = []
        for a, b in runs:
            i = self._first(a)
            while i < len(self.segs) and self.segs[i].start < b:
                seg = self.segs[i]
                lo, hi = max(a, seg.start), min(b, seg.stop)
                if lo < hi:
                    off = self.offset_in(seg.start, lo, seg.length)
                    end = self.offset_in(seg.start, hi, seg.length) if hi < seg.stop \
                        else seg.length
                    out.append((lo, hi, seg.addr + off, end - off))
                i += 1
        return out

    # -- mapping and locking ---------------------------------------------------

    def map(self, start: int, stop: int, length: int) -> Segment | None:
        """A new mapping of blocks ``[start, stop)`` (``length`` bytes), nothing locked yet."""
        try:
            addr = libc.mmap_file(self.fd, start * self.block_size, length)
        except SyscallError as exc:
            log.warning("holder: cannot map blocks %d-%d: %s; skipped", start, stop, exc)
            return None
        try:
            libc.madvise(addr, length, libc.MADV_RANDOM)
        except SyscallError:
            pass   # advice only
        seg = Segment(start, start, addr, 0)
        self._insert(seg)
        return seg

    def lock(self, seg: Segment, stop: int, nbytes: int) -> None:
        """``mlock`` the next ``nbytes`` of ``seg``, which then holds blocks up to ``stop``.

        A failed ``mlock`` raises (``LockLimitError`` or ``SyscallError``) and
        leaves ``seg`` as it was.
        """
        libc.mlock(seg.addr + seg.length, nbytes)
        seg.stop, seg.length = stop, seg.length + nbytes
        self.locked += nbytes

    def trim_tail(self, seg: Segment, mapped: int) -> None:
        """Unmap the part of a new mapping past its locked prefix (or all of it)."""
        if seg.length < mapped:
            libc.munmap(seg.addr + seg.length, mapped - seg.length)
        if seg.length == 0:
            self.segs.remove(seg)

    def drop(self, seg: Segment, mapped: int, why: str) -> None:
        """Unmap a whole new mapping: a failed mlock may leave part of it marked locked."""
        log.warning("holder: cannot lock %s; region released", why)
        self.segs.remove(seg)
        self.locked -= seg.length
        self._unmap(seg.addr, mapped)

    # -- releasing -------------------------------------------------------------

    def _insert(self, seg: Segment) -> None:
        self.segs.insert(_bisect(self.segs, seg.start, right=True), seg)

    def _unmap(self, addr: int, length: int) -> None:
        try:
            libc.munlock(addr, length)
        except SyscallError as exc:   # munmap unlocks anyway
            log.debug("holder: munlock failed: %s", exc)
        libc.munmap(addr, length)

    def release(self, a: int, b: int) -> int:
        """Unlock and unmap held blocks in ``[a, b)``, splitting mappings. Returns bytes."""
        segs = self.segs
        first = self._first(a)
        last = first
        kept: list[Segment] = []
        released = 0
        while last < len(segs) and segs[last].start < b:
            seg = segs[last]
            last += 1
            lo, hi = max(a, seg.start), min(b, seg.stop)
            if hi <= lo:
                kept.append(seg)
                continue
            off_lo = self.offset_in(seg.start, lo, seg.length)
            off_hi = self.offset_in(seg.start, hi, seg.length) if hi < seg.stop else seg.length
            self._unmap(seg.addr + off_lo, off_hi - off_lo)
            released += off_hi - off_lo
            if lo > seg.start:
                kept.append(Segment(seg.start, lo, seg.addr, off_lo))
            if hi < seg.stop:
                kept.append(Segment(hi, seg.stop, seg.addr + off_hi, seg.length - off_hi))
        segs[first:last] = kept
        self.locked -= released
        return released

    def release_all(self) -> int:
        """Unlock and unmap everything. Returns bytes released."""
        released = 0
        while self.segs:
            seg = self.segs.pop()
            self._unmap(seg.addr, seg.length)
            self.locked -= seg.length
            released += seg.length
        return released

    # -- merging ---------------------------------------------------------------

    def coalesce(self, run: Run, max_pieces: int) -> None:
        """Merge the adjacent mappings inside ``run`` when there are more than ``max_pieces``."""
        i = _bisect(self.segs, run[0], right=False)
        segs = []
        while i < len(self.segs) and self.segs[i].start < run[1]:
            if self.segs[i].stop <= run[1]:
                segs.append(self.segs[i])
            i += 1
        if len(segs) <= max_pieces:
            return
        group: list[Segment] = []
        for seg in segs + [None]:
            small = seg is not None and seg.length <= MERGE_MAX_BYTES
            if small and group and group[-1].stop == seg.start:
                group.append(seg)
                continue
            if len(group) > 1:
                self._merge(group)
            group = [seg] if small else []

    def _merge(self, group: list[Segment]) -> None:
        """Replace adjacent mappings by one; move the locks piece by piece (munlock first)."""
        start, stop = group[0].start, group[-1].stop
        length = sum(s.length for s in group)
        try:
            new = libc.mmap_file(self.fd, start * self.block_size, length)
        except SyscallError as exc:
            log.warning("holder: cannot merge blocks %d-%d: %s", start, stop, exc)
            return
        merged = Segment(start, start, new, 0)
        self._insert(merged)
        for seg in group:
            off = merged.length
            libc.munlock(seg.addr, seg.length)
            try:
                libc.mlock(new + off, seg.length)
            except SyscallError as exc:
                log.warning("holder: cannot move the lock of blocks %d-%d: %s; released",
                            seg.start, seg.stop, exc)
                self.segs.remove(seg)
                libc.munmap(seg.addr, seg.length)
                self.locked -= seg.length
                self.trim_tail(merged, length)
                return
            libc.munmap(seg.addr, seg.length)
            self.segs.remove(seg)
            merged.stop, merged.length = seg.stop, merged.length + seg.length
