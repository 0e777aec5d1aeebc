"""Empty this host's page cache of one image, and say what would not go.

Before QEMU reads an image through the page cache again (an adopted ``cache=none``
disk: ``adapters.libvirt.adopt``), no page of it may be in the cache: while QEMU
used O_DIRECT, a cached page was never kept current (another host of shared storage
wrote the device, or a direct write could not invalidate a page someone mapped), and
QEMU's first buffered read would hand it to the guest. ``drop`` asks the kernel to
drop every clean page (``POSIX_FADV_DONTNEED``; a dirty one is written back first, so
it is asked twice) and counts what stays (``residency.scan``: cachestat or mincore);
``mappers`` names the processes that map the image, the usual reason a page stays (a
mapped or mlocked page is not dropped).
"""

from __future__ import annotations

import os
import re
import stat
import time

from vmdisktouch.system.observe import residency

SETTLE_S = 0.2       # between the two asks: a dirty page's writeback, started by the first


def resident_pages(image) -> int | None:
    """The image's pages in the page cache now; None when the kernel hides them from this
    process (``residency.residency_hidden``: not root, not the file's owner)."""
    res = residency.scan(image.fd, image.size)
    return None if res.partial_view else res.resident_pages


def drop(image) -> int | None:
    """Drop ``image``'s pages from the page cache (module docstring); the pages left, None
    when they cannot be counted."""
    for attempt in range(2):
        os.posix_fadvise(image.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        left = resident_pages(image)
        if not left:
            return left
        if attempt == 0:
            time.sleep(SETTLE_S)
    return left


MAPS_LINE = re.compile(r"^\S+\s+\S+\s+\S+\s+([0-9a-f]+):([0-9a-f]+)\s+(\d+)", re.M)


def mappers(path: str) -> list[str]:
    """``PID (comm)`` of each process that maps the file ``path`` (``/proc/PID/maps``:
    its device and inode), for a refusal's message; a block device's mappings are not
    told apart by inode, and not listed."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    if not stat.S_ISREG(st.st_mode):
        return []
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    out = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as f:
                maps = f.read()
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if any((int(a, 16), int(b, 16), int(c)) == want for a, b, c in MAPS_LINE.findall(maps)):
            out.append(f"{pid} ({comm})")
    return out
