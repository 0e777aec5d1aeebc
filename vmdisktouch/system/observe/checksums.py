"""Per-block checksums of the held blocks: how the daemon sees the guest's writes.

A block the daemon holds is resident, so the guest's reads of it never show
up as residency changes; its writes are the one thing left to observe. Each
cycle the daemon passes the held block indices to ``update``, which hashes
a rotating share of them, each block as ``PARTS`` (16) equal parts (xxh3-64
each), and reports, per block hashed, the fraction of its parts whose hash
differs from the one stored when that block was last hashed: 0 for an
unwritten block, 1 for one written all over.

Why parts. A 1 MiB block takes the guest's hot writes and a stray write
alike; as a yes/no per block, the stray writes that land on a held zone the
guest has left look like the hot zone's writes, and the daemon kept the old
zone. In parts the two differ many times over, as residency differs between
a hot and a cold unheld block (docs/benchmarks.md, why-checksums).

Rotation: the cost is bounded. Hashing every held block every cycle costs
a read and a hash of every held byte, whatever the guest does
(docs/benchmarks.md, why-checksums). ``update(..., share=s)`` hashes
only ``k = ceil(s * n)`` of the ``n`` blocks given (at least one): the next
ones in block order from a cursor, which then moves past the last block
hashed and wraps at the end. So the cost is ``s`` × the held bytes per
cycle, plus a fixed cost per call (``benchmarks/bench_checksums.py``;
docs/benchmarks.md, why-checksums), and
while the held set is stable every held block is hashed at least once
within ``ceil(1 / s)`` consecutive passes (``k`` consecutive blocks a pass
cover the ``n`` in ``ceil(n / k) <= ceil(1 / s)``). A cursor rather than a
random sample, so that the bound is certain; a cursor over block numbers
rather than positions, so that blocks joining or leaving the held set do
not shift the others' turns (a block joining behind the cursor waits for
the wrap). The blocks of a pass are consecutive held blocks, so they are
read as whole runs.

A block given but not hashed keeps its stored hashes: a write to it is
found on its turn, as a change since its last hash, and reported once,
since the comparison stores the new hashes. A write is therefore never
lost, only reported up to ``ceil(1 / s) - 1`` cycles late, and the fraction
reported covers every write since the block's last hash (up to
``ceil(1 / s)`` cycles of them), not one cycle's. A write is lost only if a
stored hash is replaced without comparison, which ``update`` never does for
a block it was given. ``share=1`` hashes every given block every pass, as
before rotation.

- Data is read with ``preadv`` (``files.pread_into``) into one reusable buffer, never through
  the holding mapping: a truncated image would raise SIGBUS there, while a
  read just comes back short. The reads go through a descriptor of their
  own (the same file, reopened through ``/proc/self/fd``: ``files.reopen_random``) advised
  ``POSIX_FADV_RANDOM``: otherwise the kernel's readahead would cache up to
  8 MiB past every held region, the next cycle would take those pages for
  the guest's, and the holds would creep outwards cycle after cycle
  (docs/benchmarks.md, why-holder). Contiguous blocks are read together, up to
  ``READ_BYTES`` (8 MiB) per call, and hashed per block over slices of a
  memoryview: no system call per block.
- A block seen for the first time, or not passed to the previous
  ``update``, is not "changed": its stored hash is from before a gap, or
  there is none; its first hash, on its turn, is its reference.
  ``baseline`` hashes blocks the moment they are taken into hold (outside
  the rotation), so that a write between the load and the block's turn is
  a change. ``update`` forgets every block it was not given, so a block
  released and held again starts fresh (``forget`` does it explicitly).
- Blocks at or beyond ``size`` are forgotten. When the size changes, the
  block holding the old end and the block holding the new end start fresh
  too: their length changed, not their content.
- A short read (the file was truncated between the size check and the
  read) forgets the blocks it did not cover completely and carries on.

Skipping when nothing was written. For a regular file every write(2)
updates its mtime (and ctime). Each hashing pass first takes the file's
stamp (mtime, ctime, size, and "now" from the injected ``clock``: wall-clock
ns, ``time.time_ns`` by default, as file times are). Timestamps may be
coarse (one jiffy) on kernels without multigrain timestamps: a write in the
same tick as our stat could leave mtime unchanged. So a stamp proves
something only when settled, its mtime and ctime more than ``SETTLED_NS``
(1 s) older than the moment it was taken: any later write then sets a newer
time. If the stamps of passes q, q+1, …, and the stamp now are equal and
pass q's is settled, nothing was written since pass q began, and every hash
taken in pass q or later is the file's content now ("current").

With rotation that is not enough to skip: the last pass hashed only some
blocks, and another one may hold a write from before the proof began that
its turn has not reached yet. ``update(..., skip_unwritten=True)`` skips its
pass (no change reported, the stored hashes kept, the cursor not moved)
only when every block given with stored hashes is current. Each stored
block remembers the pass whose stamp preceded its hash; after a write the
passes go on, one share at a time, until every held block has been hashed
since the file settled, and only then stop. A write is thus never hidden by
a skip, and an idle image costs one sweep (the held bytes once), then
nothing. Block devices (``Image.is_regular`` False: their node's times do
not follow writes) are always hashed.

Storage is kept for the blocks with stored hashes only (the held blocks):
their sorted numbers, a ``(blocks, PARTS)`` uint64 array and the pass of
each hash, 136 bytes per held block (4.25 MiB for 32 GiB held at 1 MiB
blocks), whatever the image size.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import numpy as np
import xxhash

from vmdisktouch.core.runs import blocks_of, consecutive_runs
from vmdisktouch.errors import SyscallError
from vmdisktouch.system import files
from vmdisktouch.system.image import Image

READ_BYTES = 8 << 20   # largest single read
PARTS = 16             # hashes per block; a block's rewritten fraction is in 1/PARTS steps
SETTLED_NS = 1_000_000_000   # a stamp this much older than its stat cannot hide a write

Stamp = tuple[int, int, int, int]   # (mtime, ctime, size, now) in ns


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
        self._pass_of = np.zeros(0, dtype=np.int64)             # the pass before each hash
        self._size: int | None = None
        self._stamp: Stamp | None = None     # taken before the last hashing pass
        self._passes = 0                     # hashing passes so far (skips not counted)
        self._quiet_since: int | None = None  # nothing written since this pass began
        self._cursor = 0                     # the rotation's next block number
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
        self._pass_of = self._pass_of[which]

    def _store(self, blocks: np.ndarray, sums: np.ndarray, got: np.ndarray) -> None:
        """Replace the stored hashes of sorted ``blocks`` by ``sums`` where ``got``, else forget."""
        self._keep(~_find(blocks, self._blocks)[1])
        all_blocks = np.concatenate((self._blocks, blocks[got]))
        order = np.argsort(all_blocks, kind="stable")
        self._blocks = all_blocks[order]
        self._sums = np.concatenate((self._sums, sums[got]))[order]
        passes = np.full(int(got.sum()), self._passes, dtype=np.int64)
        self._pass_of = np.concatenate((self._pass_of, passes))[order]

    # -- the file's stamp ------------------------------------------------------

    def _file_stamp(self) -> Stamp | None:
        """(mtime, ctime, size, now) of a regular file, in ns; None for anything else."""
        if not self.regular:
            return None
        try:
            st = files.fstat(self.fd)
        except SyscallError:
            return None
        return st.st_mtime_ns, st.st_ctime_ns, st.st_size, self.clock()

    def _current_since(self) -> int | None:
        """The first pass whose hashes are provably still the file's content, or None."""
        prev, now = self._stamp, self._file_stamp()
        if prev is None or now is None or now[:3] != prev[:3]:
            return None
        return self._quiet_since

    def _new_pass(self) -> None:
        """Count a hashing pass and take its stamp; follow the chain of equal stamps."""
        prev, stamp = self._stamp, self._file_stamp()
        self._passes += 1
        if prev is None or stamp is None or stamp[:3] != prev[:3]:
            self._quiet_since = None
        if self._quiet_since is None and stamp is not None and \
                stamp[3] - max(stamp[0], stamp[1]) > SETTLED_NS:
            self._quiet_since = self._passes
        self._stamp = stamp

    def unwritten(self) -> bool:
        """True when the file was provably not written since the last hashing pass began."""
        return self._current_since() is not None

    # -- the cycle -------------------------------------------------------------

    def update(self, block_indices, size: int, *, skip_unwritten: bool = False,
               share: float = 1.0) -> np.ndarray:
        """Hash the given blocks' next share; per block, the fraction of its parts changed.

        ``block_indices``: the held block numbers (any order; duplicates are
        hashed once). ``size``: the image size now. ``share`` (0 < share <= 1):
        hash ``ceil(share * n)`` of the ``n`` valid blocks given (at least one),
        the next ones from the rotation's cursor; the others keep their stored
        hashes. Returns a float32 array in [0, 1] aligned with
        ``block_indices``: for a block hashed now, the fraction of its parts
        changed since its stored hash; 0 for a block not hashed now or with no
        stored hash. Blocks not given are forgotten.
        ``skip_unwritten``: hash nothing, report no change and keep the stored
        hashes and the cursor when every given block's stored hash is provably
        still the file's content (see the module docstring).
        """
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share!r}")
        size = int(size)
        idx = np.asarray(block_indices, dtype=np.int64).ravel()
        self.skipped = skip_unwritten and size == self._size and self._all_current(idx)
        if self.skipped:
            return np.zeros(idx.size, dtype=np.float32)
        self._new_pass()
        self._follow_size(size)

        blocks = np.unique(idx[(idx >= 0) & (idx < self._nblocks)])
        self._keep(_find(blocks, self._blocks)[1])      # everything not given is forgotten
        turn = self._turn(blocks, share)
        sums, got = self._hash_blocks(turn, size)
        pos, known = _find(self._blocks, turn)
        compared = known & got
        fraction = np.zeros(turn.size, dtype=np.float32)
        if compared.any():
            fraction[compared] = (sums[compared] != self._sums[pos[compared]]).mean(axis=1)
        self._store(turn, sums, got)                    # a short read forgets what it missed

        out = np.zeros(idx.size, dtype=np.float32)
        pos, hit = _find(turn, idx)
        out[hit] = fraction[pos[hit]]
        return out

    def _all_current(self, idx: np.ndarray) -> bool:
        """Every given block with stored hashes was hashed since the file was last written."""
        since = self._current_since()
        if since is None:
            return False
        pos, known = _find(self._blocks, idx)
        return bool((self._pass_of[pos[known]] >= since).all())

    def _turn(self, blocks: np.ndarray, share: float) -> np.ndarray:
        """This pass's blocks, sorted: the next ``ceil(share * n)`` from the cursor, wrapping."""
        n = blocks.size
        if not n:
            return blocks
        k = min(n, max(1, math.ceil(share * n)))
        first = int(np.searchsorted(blocks, self._cursor))
        pick = blocks[(first + np.arange(k)) % n]
        self._cursor = int(pick[-1]) + 1
        return np.sort(pick)

    def baseline(self, block_indices, size: int) -> None:
        """Hash blocks that were just taken into hold, as the reference for their next turn.

        Without it a newly held block's first hash would be taken on its turn
        in ``update``, and a guest write landing in between would be that
        block's reference instead of a change. Other blocks' hashes are kept;
        the rotation's cursor does not move.

        A block whose stored hashes are provably still the file's content (a
        skipped ``update`` keeps the hashes of blocks released since the last
        pass) is not read again: see ``_current_since``. A region released
        and taken again on an idle image (a lease renewed, see ``heat``) then
        costs no read and no hash. A stored hash that might predate a write
        (its block's turn had not come) is not reused: the block starts fresh.
        """
        size = int(size)
        since = self._current_since() if size == self._size else None
        self._follow_size(size)
        idx = np.asarray(block_indices, dtype=np.int64).ravel()
        blocks = np.unique(idx[(idx >= 0) & (idx < self._nblocks)])
        if since is not None:            # hashes taken since the file was last written: keep
            pos, known = _find(self._blocks, blocks)
            current = known.copy()
            current[known] = self._pass_of[pos[known]] >= since
            blocks = blocks[~current]
        sums, got = self._hash_blocks(blocks, size)
        self._store(blocks, sums, got)

    # -- helpers -------------------------------------------------------------

    def _follow_size(self, size: int) -> None:
        bs = self.block_size
        self.resize(blocks_of(size, bs))             # forgets the blocks past the end
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
