"""Shared by the benchmarks: put exact byte ranges of a file in the page cache and keep them.

The kernel here pages out page cache it judges idle on its own (DAMON, see
FIELD-NOTES), so a benchmark that needs the same cached state for minutes
reads its ranges with buffered reads and no readahead (``POSIX_FADV_RANDOM``)
and mlocks them in its own process until the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import os

from vmdisktouch.system import libc

MiB = 1 << 20


@contextlib.contextmanager
def cached(path: str, runs: list[tuple[int, int]], *, pin: bool = True, write: bool = False):
    """Cache exactly the byte ``runs`` of ``path``; with ``pin``, mlock them until the block ends.

    ``write``: first write random data over the runs (and fsync), as a guest
    writes a thin image: the daemon never holds the holes of a sparse file.
    """
    if write:
        wfd = os.open(path, os.O_WRONLY)
        try:
            for off, n in runs:
                os.pwrite(wfd, os.urandom(n), off)
            os.fsync(wfd)
        finally:
            os.close(wfd)
    fd = os.open(path, os.O_RDONLY)
    maps = []
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for off, n in runs:
            for o in range(off, off + n, 8 * MiB):
                os.pread(fd, min(8 * MiB, off + n - o), o)
            if pin:
                addr = libc.mmap_file(fd, off, n)
                maps.append((addr, n))
                libc.madvise(addr, n, libc.MADV_RANDOM)
                libc.mlock(addr, n)
        yield
    finally:
        for addr, n in maps:
            libc.munmap(addr, n)
        os.close(fd)
