"""Test helpers for the real page cache: data images, warm, hold, cross-check.

Eviction uses fsync + POSIX_FADV_DONTNEED (drop_caches is not writable on
these machines; see FIELD-NOTES). Dirty pages are not dropped until written
back, hence the fsync first.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess

from tests.support.common import require_tool
from tests.support.images import evict, make_image
from vmdisktouch.system import libc

PAGE = os.sysconf("SC_PAGE_SIZE")


def data_image(path, size: int) -> str:
    """A non-sparse image of random data, written back and out of the page cache.

    The daemon never holds the holes of a sparse file (they read as zeros
    without disk I/O), so tests that expect holds use data images.
    """
    path = make_image(path, size, sparse=False)
    evict(path)
    return path


def read_range(path, offset: int, length: int, *, direct_readahead: bool = False) -> None:
    """Bring [offset, offset+length) into the page cache by buffered reads.

    Readahead is disabled with POSIX_FADV_RANDOM so exactly these pages are
    cached (FIELD-NOTES: a cold read otherwise pulls in up to read_ahead_kb).
    """
    fd = os.open(str(path), os.O_RDONLY)
    try:
        if not direct_readahead:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        end = offset + length
        while offset < end:
            n = min(1 << 20, end - offset)
            os.pread(fd, n, offset)
            offset += n
    finally:
        os.close(fd)


def fincore_pages(path, prefix=()) -> int:
    """util-linux fincore's count of ``path``'s resident pages; ``prefix`` runs it in
    another mount namespace (``PrivateLibvirtd.prefix``: another host's page cache)."""
    out = subprocess.run([*prefix, require_tool("fincore"), "-n", "-b", "-o", "PAGES",
                          str(path)],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[0])


def vmtouch_pages(path, portion: str | None = None) -> int:
    """The resident pages of ``path`` by vmtouch, of its ``portion`` (``-p``: "56M-64M")
    or the whole file."""
    out = subprocess.run([require_tool("vmtouch"), *(["-p", portion] if portion else []),
                          str(path)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"Resident Pages:\s+(\d+)/(\d+)", out)
    assert m, out
    return int(m.group(1))


MADV_RANDOM = 1


@contextlib.contextmanager
def held(path, reads):
    """Cache exactly the pages of ``reads`` and mlock them until the block ends."""
    fd = os.open(str(path), os.O_RDONLY)
    maps = []
    try:
        for off, n in reads:
            read_range(path, off, n)
            start, end = off - off % PAGE, -(-(off + n) // PAGE) * PAGE
            addr = libc.mmap_file(fd, start, end - start)
            maps.append((addr, end - start))
            libc.madvise(addr, end - start, MADV_RANDOM)
            libc.mlock(addr, end - start)
        yield
    finally:
        for addr, length in maps:
            libc.munmap(addr, length)
        os.close(fd)


def page_ranges(reads, size: int | None = None) -> list[list[int]]:
    """The page-aligned, sorted, merged ``[offset, length]`` ranges a list of reads caches.

    ``reads``: ``(offset, length)`` pairs; ``size``: the file's size, which
    clips the last page's range (as mincore-based tools report it).
    """
    spans = sorted((o - o % PAGE, -(-(o + n) // PAGE) * PAGE) for o, n in reads)
    if size is not None:
        spans = [(s, min(e, size)) for s, e in spans]
    out: list[list[int]] = []
    for s, e in spans:
        if out and s <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], e - out[-1][0])
        else:
            out.append([s, e - s])
    return out


# A guest that keeps a range of an image mapped and touched (``python -c GUEST_MAPPER IMAGE
# OFFSET LENGTH``): its pages stay its own, charged to its memory cgroup.
GUEST_MAPPER = ("import mmap, os, sys, time\n"
                "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                "off, n = int(sys.argv[2]), int(sys.argv[3])\n"
                "m = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ, offset=off)\n"
                "while True:\n"
                "    sum(m[i] for i in range(0, n, 4096))\n"
                "    time.sleep(0.05)\n")
