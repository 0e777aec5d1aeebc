"""Per-block checksums of the held blocks: how the daemon sees the guest's writes.

A block the daemon holds is resident, so the guest's reads of it never show
up as residency changes; its writes are the one thing left to observe. Each
cycle the daemon passes the held block indices to ``update``, which hashes
each block as ``PARTS`` (16) equal parts (xxh3-64 each) and reports, per
block, the fraction of its parts whose hash differs from the one stored in
the previous ``update``: 0 for an unwritten block, 1 for one written all
over.

Why parts. A 1 MiB block takes the guest's hot writes and a stray write
alike; as a yes/no per block, the stray writes that land on a held zone the
guest has left (measured: about 25 % of its blocks per cycle, from the
10 % of accesses spread over the disk in docs/benchmarks.md, hotzone-move)
look like the hot zone's writes, and the daemon kept the old zone. In parts
the two differ by 50 times there (0.015 against 0.75 of the parts), as
residency differs between a hot and a cold unheld block.

- Data is read with ``preadv`` (``files.pread_into``) into one reusable buffer, never through
  the holding mapping: a truncated image would raise SIGBUS there, while a
  read just comes back short. The reads go through a descriptor of their
  own (the same file, reopened through ``/proc/self/fd``: ``files.reopen_random``) advised
  ``POSIX_FADV_RANDOM``: otherwise the kernel's readahead would cache up to
  8 MiB past every held region, the next cycle would take those pages for
  the guest's, and the holds would creep outwards cycle after cycle
  (measured: 9 blocks per cycle per region). Contiguous blocks are read together, up to
  ``READ_BYTES`` (8 MiB) per call, and hashed per block over slices of a
  memoryview: no system call per block.
- A block seen for the first time, or not passed to the previous
  ``update``, is not "changed": its stored hash is from before a gap, or
  there is none. ``baseline`` hashes blocks the moment they are taken into
  hold, so that a write between the load and the next cycle is a change. ``update`` forgets every block it was not given, so a block
  released and held again starts fresh (``forget`` does it explicitly).
- Blocks at or beyond ``size`` are forgotten. When the size changes, the
  block holding the old end and the block holding the new end start fresh
  too: their length changed, not their content.
- A short read (the file was truncated between the size check and the
  read) forgets the blocks it did not cover completely and carries on.

Skipping when nothing was written. For a regular file every write(2)
updates its mtime (and ctime). ``update(..., skip_unwritten=True)`` first
compares the file's (mtime, ctime, size) with those taken just before the
previous hashing pass: unchanged means nothing was written since, and the
pass is skipped (no change reported, the stored hashes kept). Timestamps
may be coarse (one jiffy) on kernels without multigrain timestamps: a write
in the same tick as our stat could leave mtime unchanged. So a skip also
needs the stamp to be settled, its mtime and ctime more than
``SETTLED_NS`` (1 s) older than the moment it was taken: any later write
then sets a newer time. "Now" is the injected ``clock`` (wall-clock ns,
``time.time_ns`` by default: file times are wall-clock times). Block
devices (``Image.is_regular`` False: their node's times do not follow
writes) are always hashed.

Storage is kept for the blocks hashed in the last pass only (the held
blocks): their sorted numbers and a ``(blocks, PARTS)`` uint64 array, 128
bytes per held block (4 MiB for 32 GiB held at 1 MiB blocks), whatever the
image size.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np
import xxhash

from vmdisktouch.core.runs import consecutive_runs
from vmdisktouch.errors import SyscallError
from vmdisktouch.system import files
from vmdisktouch.system.image import Image

READ_BYTES = 8 << 20   # largest single read
PARTS = 16             # hashes per block; a block's rewritten fraction is in 1/PARTS steps
SETTLED_NS = 1_000_000_000   # a stamp this much older than its stat cannot hide a write


class BlockChecksums:
    """Part hashes of the held blocks of one image, read on a descriptor of their own."""

    def __init__(self, image: Image, block_size: int, *, read_bytes: int = READ_BYTES,
                 clock: Callable[[], int] = time.time_ns):
        if block_size <= 0:
            raise ValueError("block size must be positive")
        self.regular = image.is_regular
        self.clock = clock
        self.fd = files.reopen_random(image.fd)
        self.block_size = int(block_size)
        self.part_size = -(-self.block_size // PARTS)
        self.read_blocks = max(1, int(read_bytes) // self.block_size)
        self._buf = bytearray(self.read_blocks * self.block_size)
        self._view = memoryview(self._buf)
        self._nblocks = 0
        self._blocks = np.zeros(0, dtype=np.int64)               # sorted, known blocks
        self._sums = np.zeros((0, PARTS), dtype=np.uint64)      # their part hashes
        self._size: int | None = None
        self._stamp: tuple[int, int, int, int] | None = None   # before the last hashing pass
        self.skipped = False          # the last update skipped its pass (nothing written)

    def close(self) -> None:
        """Close the reading descriptor. Idempotent."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- per-block state -----------------------------------------------------

    def resize(self, nblocks: int) -> None:
        """Keep state for ``nblocks`` blocks (grow with nothing known, or cut)."""
        self._nblocks = int(nblocks)
        self._keep(self._blocks < self._nblocks)

    def forget(self, block_indices) -> None:
        """Drop the stored hashes of these blocks (e.g. released ones)."""
        self._keep(~np.isin(self._blocks, np.asarray(block_indices, dtype=np.int64)))

    def known(self) -> np.ndarray:
        """Indices of the blocks with stored hashes, sorted."""
        return self._blocks.copy()

    def _keep(self, which: np.ndarray) -> None:
        self._blocks, self._sums = self._blocks[which], self._sums[which]

    # -- the cycle -------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int, int, int] | None:
        """(mtime, ctime, size, now) of a regular file, in ns; None for anything else."""
        if not self.regular:
            return None
        try:
            st = files.fstat(self.fd)
        except SyscallError:
            return None
        return st.st_mtime_ns, st.st_ctime_ns, st.st_size, self.clock()

    def unwritten(self) -> bool:
        """True when the file was provably not written since the last hashing pass began."""
        prev, now = self._stamp, self._file_stamp()
        if prev is None or now is None:
            return False
        return now[:3] == prev[:3] and prev[3] - max(prev[0], prev[1]) > SETTLED_NS

    def update(self, block_indices, size: int, *, skip_unwritten: bool = False) -> np.ndarray:
        """Hash the given blocks; per block, the fraction of its parts changed since the last update.

        ``block_indices``: block numbers (any order; duplicates are hashed once).
        ``size``: the image size now. Returns a float32 array in [0, 1]
        aligned with ``block_indices`` (0 for a block with no stored hashes).
        ``skip_unwritten``: report no change, and keep the stored hashes, when
        ``unwritten()`` says nothing was written since the last pass.
        """
        size = int(size)
        idx = np.asarray(block_indices, dtype=np.int64).ravel()
        self.skipped = skip_unwritten and size == self._size and self.unwritten()
        if self.skipped:
            return np.zeros(idx.size, dtype=np.float32)
        self._stamp = self._file_stamp()
        self._follow_size(size)

        blocks = np.unique(idx[(idx >= 0) & (idx < self._nblocks)])
        sums, got = self._hash_blocks(blocks, size)
        blocks, sums = blocks[got], sums[got]
        pos, known = _find(self._blocks, blocks)
        fraction = np.zeros(blocks.size, dtype=np.float32)
        if known.any():
            fraction[known] = (sums[known] != self._sums[pos[known]]).mean(axis=1)
        self._blocks, self._sums = blocks, sums      # everything not given is forgotten

        out = np.zeros(idx.size, dtype=np.float32)
        pos, hit = _find(blocks, idx)
        out[hit] = fraction[pos[hit]]
        return out

    def baseline(self, block_indices, size: int) -> None:
        """Hash blocks that were just taken into hold, as the reference for the next ``update``.

        Without it a newly held block's first hash would be taken one cycle
        later, and a guest write landing in between would be that block's
        reference instead of a change. Other blocks' hashes are kept.

        A block whose hashes are still stored (a skipped ``update`` keeps the
        hashes of blocks released since the last pass) is not read again
        while ``unwritten()`` holds: every stored hash was taken after the
        stamp of the last pass, and nothing was written since that stamp.
        A region released and taken again on an idle image (a lease renewed,
        see ``heat``) then costs no read and no hash.
        """
        size = int(size)
        current = size == self._size and self.unwritten()
        self._follow_size(size)
        idx = np.asarray(block_indices, dtype=np.int64).ravel()
        blocks = np.unique(idx[(idx >= 0) & (idx < self._nblocks)])
        if current:                      # stored hashes are still the file's: keep them
            blocks = blocks[~_find(self._blocks, blocks)[1]]
        sums, got = self._hash_blocks(blocks, size)
        self.forget(blocks)
        all_blocks = np.concatenate((self._blocks, blocks[got]))
        order = np.argsort(all_blocks, kind="stable")
        self._blocks = all_blocks[order]
        self._sums = np.concatenate((self._sums, sums[got]))[order]

    # -- helpers -------------------------------------------------------------

    def _follow_size(self, size: int) -> None:
        bs = self.block_size
        self.resize(-(-size // bs))                  # forgets the blocks past the end
        if self._size is not None and self._size != size:
            for end in (self._size, size):           # their blocks changed length
                if end % bs:
                    self.forget([end // bs])
        self._size = size

    def _hash_blocks(self, blocks: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Part hashes of sorted ``blocks`` (one row each) and a mask of the blocks read whole."""
        sums = np.zeros((blocks.size, PARTS), dtype=np.uint64)
        got = np.zeros(blocks.size, dtype=bool)
        row = 0
        for start, stop in consecutive_runs(blocks):
            end = row + stop - start
            self._hash_run(start, stop, size, sums[row:end], got[row:end])
            row = end
        return sums, got

    def _hash_run(self, start: int, stop: int, size: int, sums: np.ndarray,
                  got: np.ndarray) -> None:
        """Hash blocks ``[start, stop)`` into ``sums``/``got`` (one row per block)."""
        bs, ps = self.block_size, self.part_size
        view = self._view
        digest = xxhash.xxh3_64_intdigest
        block = start
        while block < stop:
            n = min(self.read_blocks, stop - block)
            offset = block * bs
            want = min(n * bs, size - offset)
            if want <= 0:
                return
            read = files.pread_into(self.fd, view[:want], offset)
            for k in range(n):
                lo = k * bs
                hi = min(lo + bs, want)
                if hi > read:                # short read: the file shrank under us
                    return
                row = sums[block - start + k]
                for j, p in enumerate(range(lo, hi, ps)):
                    row[j] = digest(view[p:min(p + ps, hi)])
                got[block - start + k] = True
            if read < want:
                return
            block += n


def _find(sorted_values: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``values`` in ``sorted_values`` and a mask of those present."""
    pos = np.searchsorted(sorted_values, values)
    hit = pos < sorted_values.size
    hit[hit] = sorted_values[pos[hit]] == values[hit]
    return pos, hit
