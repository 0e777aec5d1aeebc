"""Image files: ``make_image`` (sparse, with data ranges, or all data), ``evict``, ``resident_bytes``."""

from __future__ import annotations

import mmap
import os
import time

from tests.support.common import MiB, PAGE, WorkloadError


def make_image(path, size: int, *, sparse: bool = True, data=(), chunk: int = 16 * MiB,
               progress=None, seed: int | None = None) -> str:
    """An image file of ``size`` bytes at ``path``; returns the path (a ``str``).

    * ``sparse`` (the default): a hole throughout (nothing allocated), but for
      the ``data`` ranges (``(offset, length)`` pairs), which are written;
    * ``sparse=False``: every byte written (``fallocate`` alone would leave
      unwritten extents that read as zeroes without disk I/O) and found
      allocated at the end.

    What is written is a pseudo-random ``chunk`` (16 MiB; ``seed``: none, a
    fresh one per image) over and over, each page stamped with its page number
    so no two pages of the image are equal; then fsynced and evicted from the
    page cache. ``progress(done, total)`` is called now and then.
    """
    path = str(path)
    ranges = [(0, size)] if not sparse else [(o, n) for o, n in data if n > 0]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        if ranges:
            import numpy as np
            rng = np.random.default_rng(seed)
            base = rng.integers(0, 2**63, size=chunk // 8, dtype=np.uint64)
            total, done, last = sum(n for _, n in ranges), 0, 0.0
            for offset, length in ranges:
                at = offset
                while at < offset + length:
                    n = min(chunk, offset + length - at)
                    buf = base.copy()
                    pages = buf.reshape(-1, PAGE // 8)
                    pages[:, 0] = np.arange(at // PAGE, at // PAGE + pages.shape[0],
                                            dtype=np.uint64)
                    mv = memoryview(buf).cast("B")[:n]
                    while mv:
                        w = os.pwrite(fd, mv, at)
                        mv, at, done = mv[w:], at + w, done + w
                    if done % (256 * MiB) == 0 or done == total:
                        # keep dirty pages bounded and the image out of the cache as we go
                        os.fdatasync(fd)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    if progress and (time.monotonic() - last > 1 or done == total):
                        last = time.monotonic()
                        progress(done, total)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not sparse and st.st_blocks * 512 < size:
        raise WorkloadError(f"{path}: only {st.st_blocks * 512} of {size} bytes allocated")
    return path


def evict(path) -> None:
    """Drop a file's clean page cache (fsync first: dirty pages are not dropped)."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        try:
            os.fsync(fd)
        except OSError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path: str, offset: int = 0, length: int | None = None) -> int:
    """Resident bytes of a file range, at 1 MiB granularity (``offset`` and
    ``length`` are rounded out to whole MiB). Uses ``residency.scan``."""
    from vmdisktouch.system.observe import residency
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        r = residency.scan(fd, size, MiB)
        end = size if length is None else min(size, offset + length)
        return int(r.counts[offset // MiB: -(-end // MiB)].sum(dtype="int64")) * r.page_size
    finally:
        os.close(fd)


def direct_read(path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, length)
        os.preadv(fd, [buf], offset)
        return bytes(buf)
    finally:
        os.close(fd)
