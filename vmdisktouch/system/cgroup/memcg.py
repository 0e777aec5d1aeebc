"""Which memory cgroup the pages we hold are charged to, and that group's limit and usage.

Theory of operation
-------------------
Page cache is charged to the memory cgroup of the task that first faulted
each page; ``mlock`` by another process does not move the charge. Pages the
daemon locks after QEMU read them stay charged to the VM's group and become
unevictable there. This module is the OS layer that lets the policy see that;
it decides nothing.

Pages. For our own virtual range, ``/proc/self/pagemap`` gives one 64-bit
entry per page: bit 63 present, bits 0-54 the PFN (zeroed without
CAP_SYS_ADMIN since Linux 4.2). ``/proc/kpagecgroup`` gives, per PFN, the
inode of the memory cgroup the page is charged to (0: none), and
``/proc/kpagecount`` how many times the page is mapped (kernel
Documentation/admin-guide/mm/pagemap.rst). ``page_groups`` reads the whole
range's pagemap entries with one ``pread``, then the sampled PFNs in runs,
in virtual order: a PFN above the previous one and at most ``SPAN_GAP`` past
it shares its ``pread`` (folios and readahead allocations make long runs).
A "not present" page is one not mapped in our page tables: a cached page we
never faulted is not present. A PFN is only stable while we map the page:
read it for pages we hold (mlocked), or accept a racy answer.

kpagecgroup semantics seen here (6.18, cgroup v1): the hierarchy root's
directory is inode 1 and pages charged to the root report 1. After ``rmdir``
of a group, its pages still report the removed group's inode until the group
is offlined (asynchronously, well under 0.5 s here), then the nearest online
ancestor's (the kernel walks up to an online memcg); they stay charged to
the zombie group, so they count in the ancestor's hierarchical usage at
once, in its ``total_unevictable`` once statistics are flushed (up to ~2 s),
never in its own v1 ``unevictable``. ``memory.stat`` lags ``usage`` in
general by what is not flushed yet. A page reclaimed before our ``mlock``
faults it in again is charged to us.

Groups. The hierarchy is found in ``/proc/self/mountinfo``: a ``cgroup``
mount with the ``memory`` super option (v1, preferred when both exist) or a
``cgroup2`` mount whose ``cgroup.controllers`` lists ``memory``. Inodes map to
directories by walking the hierarchy (``os.scandir``, ``d_ino`` is the
cgroup's kernfs inode); the index is rebuilt when an unknown inode is asked,
at most once per ``rescan_seconds``. Files (kernel
Documentation/admin-guide/cgroup-v1/memory.rst and cgroup-v2.rst): v1
``memory.limit_in_bytes`` (>= 2**62, e.g. PAGE_COUNTER_MAX*PAGE_SIZE =
9223372036854771712, is unlimited), ``memory.usage_in_bytes``, ``memory.stat``
``unevictable`` (the group's own; ``use_hierarchy`` is assumed 1); v2
``memory.max`` ("max" is unlimited), ``memory.current`` (absent at the root:
usage 0 there), ``memory.stat`` ``unevictable`` (hierarchical). The effective
limit is the minimum over the group and every ancestor up to the mount point.
Values are read fresh on each call; a read failure is a missing value.

Cost: mostly the kernel's lookup per PFN read, and numpy; the PFNs of a
folio are read together (``SPAN_GAP``: at step 16 the samples of one folio
still share a pread), since PFNs read one pread each would cost more
(``.venv/bin/python benchmarks/bench_memcg.py``; docs/benchmarks.md,
why-memcg).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from vmdisktouch.errors import SyscallError
from vmdisktouch.system import files, libc

PAGE_SIZE = libc.PAGE_SIZE
PFN_MASK = (1 << 55) - 1
PRESENT = 1 << 63
UNLIMITED_FROM = 1 << 62     # v1 limits at or above this are "no limit"
SPAN_GAP = 16                # PFNs at most this far apart are read in one pread


@dataclass(frozen=True)
class Group:
    ino: int                  # the group directory's inode: what /proc/kpagecgroup reports
    path: str                 # relative to the hierarchy's root, "/" for the root
    limit: int | None         # effective limit (min over the group and its ancestors); None: none
    usage: int                # bytes charged now (v2 memory.current, v1 memory.usage_in_bytes)
    unevictable: int | None   # memory.stat "unevictable" (v1: the group's own), bytes
    anon: int | None = None   # memory.stat anonymous memory (v1 "rss", THP included; v2 "anon")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _find_hierarchy(procfs: str, override: str | None) -> tuple[int | None, str, str]:
    """(version, mount point, mount root) of the memory controller's hierarchy."""
    v1 = v2 = None
    for line in (_read(os.path.join(procfs, "self", "mountinfo")) or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup" and "memory" in tail[2].split(","):
            if v1 is None or (root == "/" and v1[1] != "/"):
                v1 = (point, root)
        elif tail[0] == "cgroup2" and v2 is None:
            ctl = _read(os.path.join(override or point, "cgroup.controllers")) or ""
            if "memory" in ctl.split():
                v2 = (point, root)
    for version, found in ((1, v1), (2, v2)):
        if found:
            return version, override or found[0], found[1]
    return None, override or "", "/"


class MemcgReader:
    """Reads page charges (pagemap, kpagecgroup, kpagecount) and memory cgroup figures."""

    def __init__(self, procfs: str = "/proc", sysfs_cgroup: str | None = None, *,
                 rescan_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.procfs = procfs
        self.rescan_seconds = rescan_seconds
        self.clock = clock
        self.version, self.mount, self.mount_root = _find_hierarchy(procfs, sysfs_cgroup)
        self._index: dict[int, str] = {}
        self._scanned_at: float | None = None
        self._fds: dict[str, int] = {}
        self.reason = ""
        if self.version is None:
            self.reason = "no memory cgroup controller is mounted (mountinfo)"
        else:
            self.reason = self._open_kpage()
        self.available = not self.reason

    # -- page charges -----------------------------------------------------

    def _open_kpage(self) -> str:
        for name, path in (("pagemap", os.path.join(self.procfs, "self", "pagemap")),
                           ("kpagecgroup", os.path.join(self.procfs, "kpagecgroup")),
                           ("kpagecount", os.path.join(self.procfs, "kpagecount"))):
            try:
                self._fds[name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                self.close()
                return f"cannot open {path}: {exc.strerror or exc}"
        probe = bytearray(b"\1" * 2 * PAGE_SIZE)     # written: its pages are present
        addr = np.frombuffer(probe, np.uint8).ctypes.data
        page = -(-addr // PAGE_SIZE) * PAGE_SIZE
        # A Python int: numpy 1.24 (Debian 12) refuses uint64 & int, numpy 2 does not.
        entry = int(self._pagemap(page, 1)[0])
        del probe
        if not entry & PRESENT:
            self.close()
            return "pagemap reports a written page as not present"
        if not entry & PFN_MASK:
            self.close()
            return ("pagemap hides page frame numbers (PFN 0): reading page charges "
                    "needs root with CAP_SYS_ADMIN")
        return ""

    def _pagemap(self, addr: int, pages: int) -> np.ndarray:
        """The pagemap entries of [addr, addr + pages*PAGE_SIZE); zeros where unreadable."""
        out = np.zeros(pages, dtype=np.uint64)
        fd = self._fds.get("pagemap")
        if fd is None or pages <= 0:
            return out
        try:
            data = files.pread(fd, pages * 8, addr // PAGE_SIZE * 8)
        except SyscallError:
            return out
        got = len(data) // 8
        out[:got] = np.frombuffer(data, dtype="<u8", count=got)
        return out

    def _per_pfn(self, name: str, addr: int, length: int, step_pages: int) -> np.ndarray:
        if addr % PAGE_SIZE:
            raise ValueError(f"address {addr:#x} is not page-aligned")
        if step_pages < 1:
            raise ValueError("step_pages must be >= 1")
        entries = self._pagemap(addr, -(-length // PAGE_SIZE))[::step_pages]
        out = np.zeros(entries.size, dtype=np.uint64)
        fd = self._fds.get(name)
        signed = entries.view(np.int64)                  # bit 63 (present) is the sign
        idx = np.flatnonzero((signed < 0) & ((signed & PFN_MASK) != 0))
        if fd is None or not idx.size:
            return out
        # Runs in virtual order (no sort): the next sampled PFN above the last
        # and at most SPAN_GAP past it continues the run; each run is one pread.
        q = signed[idx] & PFN_MASK
        dq = np.diff(q)
        cut = np.flatnonzero((dq <= 0) | (dq > SPAN_GAP)) + 1
        starts = q[np.concatenate(([0], cut))]
        stops = q[np.concatenate((cut - 1, [q.size - 1]))] + 1
        base = np.concatenate(([0], np.cumsum(stops - starts)[:-1]))
        buf = np.zeros(int((stops - starts).sum()), dtype="<u8")
        view = memoryview(buf).cast("B")
        for start, stop, b in zip(starts.tolist(), stops.tolist(), base.tolist()):
            try:
                files.pread_into(fd, view[b * 8:(b + stop - start) * 8], start * 8)
            except SyscallError:
                pass                    # left 0: unknown
        first = np.zeros(q.size, dtype=np.int64)
        first[cut] = 1
        run = np.cumsum(first)          # the run each sampled PFN is read in
        out[idx] = buf[base[run] + q - starts[run]]
        return out

    def page_groups(self, addr: int, length: int, step_pages: int = 1) -> np.ndarray:
        """Memcg inode per sampled page of our range; 0 when not present or uncharged."""
        return self._per_pfn("kpagecgroup", addr, length, step_pages)

    def page_mapcounts(self, addr: int, length: int, step_pages: int = 1) -> np.ndarray:
        """Mapping count (/proc/kpagecount) per sampled page; 0 when not present."""
        return self._per_pfn("kpagecount", addr, length, step_pages)

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass

    # -- groups -------------------------------------------------------------

    def own(self) -> Group | None:
        """This process's memory cgroup, from <procfs>/self/cgroup."""
        if self.version is None:
            return None
        path = None
        for line in (_read(os.path.join(self.procfs, "self", "cgroup")) or "").splitlines():
            hid, _, rest = line.partition(":")
            ctls, _, cpath = rest.partition(":")
            if (self.version == 1 and "memory" in ctls.split(",")) or \
                    (self.version == 2 and hid == "0" and ctls == ""):
                path = cpath
                break
        if path is None:
            return None
        rel = self._relative(path)
        if ".." in rel.split("/"):      # outside what is mounted (a cgroup namespace)
            return None
        try:
            ino = os.stat(self._dir(rel)).st_ino
        except (OSError, ValueError):
            return None
        self._index[ino] = rel
        return self._group(ino, rel)

    def group(self, ino: int) -> Group | None:
        """The group of kpagecgroup inode ``ino``; None if unknown or removed."""
        if self.version is None or ino <= 0:
            return None
        if ino not in self._index and self._may_scan():
            self._scan()
        rel = self._index.get(ino)
        if rel is None:
            return None
        try:
            same = os.stat(self._dir(rel)).st_ino == ino
        except (OSError, ValueError):
            same = False
        if not same:                    # removed (or replaced by a new directory)
            self._index.pop(ino, None)
            return None
        return self._group(ino, rel)

    def _relative(self, hierarchy_path: str) -> str:
        """A /proc/self/cgroup path relative to the mount point ("" for the mount point)."""
        root = self.mount_root.rstrip("/")
        if root and (hierarchy_path == root or hierarchy_path.startswith(root + "/")):
            hierarchy_path = hierarchy_path[len(root):]
        return hierarchy_path.strip("/")

    def _dir(self, rel: str) -> str:
        return os.path.join(self.mount, rel) if rel else self.mount

    def _may_scan(self) -> bool:
        now = self.clock()
        return self._scanned_at is None or now - self._scanned_at >= self.rescan_seconds

    def _scan(self) -> None:
        self._scanned_at = self.clock()
        index: dict[int, str] = {}
        try:
            index[os.stat(self.mount).st_ino] = ""
        except OSError:
            self._index = {}
            return
        stack = [""]
        while stack:
            rel = stack.pop()
            try:
                with os.scandir(self._dir(rel)) as it:
                    for entry in it:
                        if entry.is_dir(follow_symlinks=False):
                            child = f"{rel}/{entry.name}" if rel else entry.name
                            index[entry.inode()] = child
                            stack.append(child)
            except OSError:
                continue                # removed while walking
        self._index = index

    def _group(self, ino: int, rel: str) -> Group | None:
        v1 = self.version == 1
        usage = _int(_read(os.path.join(self._dir(rel), "memory.usage_in_bytes" if v1
                                        else "memory.current")))
        unevictable = anon = None
        anon_key = "rss" if v1 else "anon"     # v1 "rss" is anonymous memory (THP included)
        for line in (_read(os.path.join(self._dir(rel), "memory.stat")) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "unevictable":
                unevictable = _int(value)
            elif key == anon_key:
                anon = _int(value)
        limit = None
        parts = rel.split("/") if rel else []
        for depth in range(len(parts), -1, -1):
            text = _read(os.path.join(self._dir("/".join(parts[:depth])),
                                      "memory.limit_in_bytes" if v1 else "memory.max"))
            value = _int(text)
            if value is not None and value < UNLIMITED_FROM:
                limit = value if limit is None else min(limit, value)
        if not os.path.isdir(self._dir(rel)):
            return None                 # removed while reading: the figures are stale
        root = self.mount_root.rstrip("/")
        return Group(ino=ino, path=f"{root}/{rel}" if rel else (root or "/"),
                     limit=limit, usage=usage or 0, unevictable=unevictable, anon=anon)

    def __enter__(self) -> MemcgReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
