"""Per-block checksums of the held blocks: how the daemon sees the guest's writes.

A block the daemon holds is resident, so the guest's reads of it never show
up as residency changes; its writes are the one thing left to observe. Each
cycle the daemon passes the held block indices to ``update``, which hashes
each block (xxh3-64) and reports the blocks whose hash differs from the one
stored for the same block in the previous ``update``.

- Data is read with ``os.preadv`` into one reusable buffer, never through
  the holding mapping: a truncated image would raise SIGBUS there, while a
  read just comes back short. The reads go through a descriptor of their
  own (the same file, reopened through ``/proc/self/fd``) advised
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
then sets a newer time. Block devices (whose node's times do not follow
writes) are always hashed.

Storage is two numpy arrays: uint64 hashes and a bool valid flag per block
(9 MiB for the 1 M blocks of a 1 TiB image at 1 MiB blocks).
"""

from __future__ import annotations

import errno
import os
import stat
import time

import numpy as np
import xxhash

from vmdisktouch.errors import SyscallError

READ_BYTES = 8 << 20   # largest single read
SETTLED_NS = 1_000_000_000   # a stamp this much older than its stat cannot hide a write


class BlockChecksums:
    def __init__(self, fd: int, block_size: int, *, read_bytes: int = READ_BYTES):
        if block_size <= 0:
            raise ValueError("block size must be positive")
        self.fd = _reopen_random(fd)
        self.block_size = int(block_size)
        self.read_blocks = max(1, int(read_bytes) // self.block_size)
        self._buf = bytearray(self.read_blocks * self.block_size)
        self._view = memoryview(self._buf)
        self._sums = np.zeros(0, dtype=np.uint64)
        self._valid = np.zeros(0, dtype=bool)
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
        nblocks = int(nblocks)
        old = self._sums.size
        if nblocks == old:
            return
        sums = np.zeros(nblocks, dtype=np.uint64)
        valid = np.zeros(nblocks, dtype=bool)
        keep = min(old, nblocks)
        sums[:keep] = self._sums[:keep]
        valid[:keep] = self._valid[:keep]
        self._sums, self._valid = sums, valid

    def forget(self, block_indices) -> None:
        """Drop the stored hashes of these blocks (e.g. released ones)."""
        idx = np.asarray(block_indices, dtype=np.int64)
        idx = idx[(idx >= 0) & (idx < self._valid.size)]
        self._valid[idx] = False

    def known(self) -> np.ndarray:
        """Indices of the blocks with a stored hash."""
        return np.flatnonzero(self._valid)

    # -- the cycle -------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int, int, int] | None:
        """(mtime, ctime, size, now) of a regular file, in ns; None for anything else."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return st.st_mtime_ns, st.st_ctime_ns, st.st_size, time.time_ns()

    def unwritten(self) -> bool:
        """True when the file was provably not written since the last hashing pass began."""
        prev, now = self._stamp, self._file_stamp()
        if prev is None or now is None:
            return False
        return now[:3] == prev[:3] and prev[3] - max(prev[0], prev[1]) > SETTLED_NS

    def update(self, block_indices, size: int, *, skip_unwritten: bool = False) -> np.ndarray:
        """Hash the given blocks; True where a block's hash changed since the last update.

        ``block_indices``: block numbers (any order; duplicates are hashed once).
        ``size``: the image size now. Returns a bool array aligned with
        ``block_indices``. ``skip_unwritten``: report no change, and keep the
        stored hashes, when ``unwritten()`` says nothing was written since the
        last pass.
        """
        bs = self.block_size
        size = int(size)
        idx = np.asarray(block_indices, dtype=np.int64).ravel()
        self.skipped = skip_unwritten and size == self._size and self.unwritten()
        if self.skipped:
            return np.zeros(idx.size, dtype=bool)
        self._stamp = self._file_stamp()
        nblocks = -(-size // bs)
        if nblocks > self._sums.size:
            self.resize(nblocks)
        if self._size is not None and self._size != size:
            for end in (self._size, size):           # their blocks changed length
                if end % bs:
                    self.forget([end // bs])
        self._size = size

        blocks = np.unique(idx[(idx >= 0) & (idx < nblocks)])
        previous_valid = self._valid
        previous_sums = self._sums
        new_sums = np.zeros_like(previous_sums)
        new_valid = np.zeros_like(previous_valid)

        for start, stop in _runs(blocks):
            self._hash_run(start, stop, size, new_sums, new_valid)

        changed_block = np.zeros(new_valid.size, dtype=bool)
        both = new_valid & previous_valid
        changed_block[both] = new_sums[both] != previous_sums[both]
        self._sums, self._valid = new_sums, new_valid   # everything not given is forgotten

        out = np.zeros(idx.size, dtype=bool)
        inside = (idx >= 0) & (idx < changed_block.size)
        out[inside] = changed_block[idx[inside]]
        return out

    def baseline(self, block_indices, size: int) -> None:
        """Hash blocks that were just taken into hold, as the reference for the next ``update``.

        Without it a newly held block's first hash would be taken one cycle
        later, and a guest write landing in between would be that block's
        reference instead of a change. Other blocks' hashes are kept.
        """
        size = int(size)
        nblocks = -(-size // self.block_size)
        if nblocks > self._sums.size:
            self.resize(nblocks)
        idx = np.asarray(block_indices, dtype=np.int64).ravel()
        blocks = np.unique(idx[(idx >= 0) & (idx < nblocks)])
        self._valid[blocks] = False
        for start, stop in _runs(blocks):
            self._hash_run(start, stop, size, self._sums, self._valid)

    def _hash_run(self, start: int, stop: int, size: int, sums: np.ndarray,
                  valid: np.ndarray) -> None:
        bs = self.block_size
        view = self._view
        block = start
        while block < stop:
            n = min(self.read_blocks, stop - block)
            offset = block * bs
            want = min(n * bs, size - offset)
            if want <= 0:
                return
            try:
                got = _preadv_full(self.fd, view[:want], offset)
            except OSError as exc:
                raise SyscallError("pread", exc.errno or errno.EIO,
                                   f"offset {offset}, length {want}") from None
            for k in range(n):
                lo = k * bs
                hi = min(lo + bs, want)
                if hi > got:                 # short read: the file shrank under us
                    return
                sums[block + k] = xxhash.xxh3_64_intdigest(view[lo:hi])
                valid[block + k] = True
            if got < want:
                return
            block += n


def _reopen_random(fd: int) -> int:
    """The same open file, read-only, on a new descriptor with readahead off."""
    try:
        new = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SyscallError("open", exc.errno or errno.EIO, f"/proc/self/fd/{fd}") from None
    try:
        os.posix_fadvise(new, 0, 0, os.POSIX_FADV_RANDOM)
    except OSError:
        pass   # advice only
    return new


def _preadv_full(fd: int, buf: memoryview, offset: int) -> int:
    """Read into ``buf`` until it is full or the file ends; returns the bytes read."""
    done = 0
    while done < len(buf):
        got = os.preadv(fd, [buf[done:]], offset + done)   # EINTR is retried (PEP 475)
        if got == 0:
            break
        done += got
    return done


def _runs(sorted_blocks: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive block numbers in a sorted unique array."""
    if not sorted_blocks.size:
        return []
    breaks = np.flatnonzero(np.diff(sorted_blocks) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [sorted_blocks.size]))
    return [(int(sorted_blocks[s]), int(sorted_blocks[e - 1]) + 1) for s, e in zip(starts, stops)]
