"""The spiller: reads the spill's runs into the page cache, unlocked, into free memory only.

Theory of operation
-------------------
``warm`` gets the runs ``core.spill.beyond`` named, highest priority first,
and walks them in chunks of ``CHUNK_BYTES`` (whole blocks). A chunk that
``cachestat(2)`` finds all cached costs nothing more; the others are read
with ``POSIX_FADV_WILLNEED`` over exactly their uncached bytes (``files.read_ahead``,
as the holder reads before it locks; a chunk's cached halves skipped, halving
down to 128 KiB), and never locked or mapped: the pages
go on the inactive file LRU, charged to the daemon's memory cgroup, and
reclaim takes them first. A guest that reads them promotes them like its
own cache. Holes of a sparse regular file are skipped (reading one would
cache zeros).

Guards, before every chunk that must be read:

* Free memory. ``MemFree`` (memory nobody uses, not ``MemAvailable``, which
  counts the page cache as available) minus the chunk stays at or above
  ``min_free``: the spill never makes the kernel reclaim anything. It is
  read once per call; what the call read is subtracted.
* The daemon's own group. When its memory cgroup has a limit, the chunk
  must fit in the group's room (``own_room``: limit minus usage minus a
  sixteenth of the limit): past it, the kernel would reclaim the spill's
  own earlier pages to make room, and each cycle would read them again.
* Pace. The same ``load_rate`` as the holder's loads (``pacing.Pacer``); the
  spill runs after the loads, so the two never read at once.

The trace source does not see these reads: its filters leave out the
daemon's loading thread (``trace_reader``), the thread that calls ``warm``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from vmdisktouch.core.runs import Run
from vmdisktouch.system import files, libc
from vmdisktouch.system.hold.pacing import Pacer

MiB = 1 << 20
CHUNK_BYTES = 32 * MiB


@dataclass(frozen=True)
class SpillResult:
    target_bytes: int = 0       # the spill's runs, in bytes
    read_bytes: int = 0         # read from disk by this call (what cachestat found missing)
    stopped: str | None = None  # why reading stopped short: "memory", "group", "stopping"
    cached: tuple = ()          # block runs found cached or read whole (data only, in order)


class Spiller:
    """Reads runs of one open image into the page cache without locking them."""

    def __init__(self, image, block_size: int, *, mem_free: Callable[[], int],
                 own_room: Callable[[], int | None] = lambda: None, load_rate: int = 0,
                 sleep: Callable[[float], object] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, chunk_bytes: int = CHUNK_BYTES):
        self.image = image
        self.block_size = int(block_size)
        self.mem_free = mem_free
        self.own_room = own_room
        self.load_rate = int(load_rate)
        self.sleep = sleep
        self.clock = clock
        self.chunk_blocks = max(1, int(chunk_bytes) // self.block_size)
        self._cachestat = libc.CacheStatCaller(image.fd)

    def warm(self, runs: Iterable[Run], min_free: int,
             known_cached: np.ndarray | None = None) -> SpillResult:
        """Read what is not cached of ``runs`` (block runs, priority order), within the guards.
        ``known_cached`` (per block, or None): blocks the caller knows to be wholly cached
        (the trace source's residency, kept from every page the kernel adds and deletes); a
        chunk of only such blocks is passed without a look (a ``cachestat`` of 32 MiB walks
        its 8,192 pages: 0.6 ms, each cycle, for each chunk of every disk's spill)."""
        runs = list(runs)
        if not runs:
            return SpillResult()
        bs, size = self.block_size, self.image.size
        target = sum(max(0, min(b * bs, size) - a * bs) for a, b in runs)
        pace = Pacer(self.load_rate, self.sleep, self.clock)
        free = room = None
        read = 0
        done: list[Run] = []

        def result(stopped: str | None = None) -> SpillResult:
            return SpillResult(target, read, stopped, tuple(done))
        for a, b in self._data(runs):
            for pos in range(a, b, self.chunk_blocks):
                end = min(b, pos + self.chunk_blocks)
                off = pos * bs
                length = min(end * bs, size) - off
                if length <= 0:
                    break
                if known_cached is not None and end <= known_cached.size and \
                        known_cached[pos:end].all():
                    done.append((pos, end))
                    continue
                cold = self._cachestat.uncached_bytes(off, length)
                if not cold:
                    done.append((pos, end))
                    continue
                if free is None:
                    free, room = self.mem_free(), self.own_room()
                if free - read - cold < min_free:
                    return result("memory")
                if room is not None and room - read < cold:
                    return result("group")
                if not pace.wait():
                    return result("stopping")
                pace.start(cold)
                self._read_cold(off, length, cold)
                read += cold
                done.append((pos, end))
        return result()

    def _read_cold(self, off: int, length: int, cold: int) -> None:
        """``WILLNEED`` over what is not cached of ``[off, off+length)`` (``cold`` bytes of
        it) only: a half that ``cachestat`` finds all cached is skipped, one all uncached
        is read whole, the rest is halved again, down to ``files.WILLNEED_BYTES``. A chunk
        left with a few holes (reclaim, a guest's cache under its group's limit) costs a
        few calls, not one per 128 KiB of it (docs/benchmarks/busy-cost.md: 225,000 calls
        in a minute and a half of three busy disks)."""
        piece = files.WILLNEED_BYTES
        if cold >= length or length <= piece:
            files.read_ahead(self.image.fd, off, length)
            return
        half = -(-length // 2 // piece) * piece
        for o, n in ((off, half), (off + half, length - half)):
            c = self._cachestat.uncached_bytes(o, n) if n > 0 else 0
            if c:
                self._read_cold(o, n, c)

    def _data(self, runs: list[Run]) -> list[Run]:
        """The runs cut to the blocks that hold data (a sparse regular file's holes out)."""
        if not self.image.is_regular:
            return runs
        return [piece for run in runs for piece in self.image.data_runs(run, self.block_size)]
