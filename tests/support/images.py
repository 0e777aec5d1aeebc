"""Image files for the workload: a non-sparse image of distinct pages, eviction, residency."""

from __future__ import annotations

import os
import time

from tests.support.common import MiB, PAGE, WorkloadError


def make_image(path: str, size: int, chunk: int = 16 * MiB, progress=None) -> str:
    """Write a non-sparse image of ``size`` bytes with distinct pseudo-random pages.

    Every byte is really written and fsynced (``fallocate`` alone would leave
    unwritten extents that read as zeroes without disk I/O). A random 16 MiB
    buffer is written over and over with each 4 KiB page stamped with its
    page number, so no two pages are equal. The image is evicted from the page
    cache at the end. ``progress(done, size)`` is called now and then.
    """
    import numpy as np
    rng = np.random.default_rng(0x5EED)
    base = rng.integers(0, 2**63, size=chunk // 8, dtype=np.uint64)
    per_page = PAGE // 8
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        last = 0.0
        while done < size:
            n = min(chunk, size - done)
            buf = base.copy()
            pages = buf.reshape(-1, per_page)
            pages[:, 0] = np.arange(done // PAGE, done // PAGE + pages.shape[0], dtype=np.uint64)
            mv = memoryview(buf).cast("B")[:n]
            while mv:
                w = os.write(fd, mv)
                mv = mv[w:]
            done += n
            if done % (256 * MiB) == 0 or done == size:
                # keep dirty pages bounded and the image out of the cache as we go
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, done, os.POSIX_FADV_DONTNEED)
            if progress and (time.monotonic() - last > 1 or done == size):
                last = time.monotonic()
                progress(done, size)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_blocks * 512 < size:
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

