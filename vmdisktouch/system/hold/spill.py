"""The spiller: reads the spill's runs into the page cache, unlocked, into free memory only.

Theory of operation
-------------------
``warm`` gets the runs ``core.spill.beyond`` named, highest priority first,
and walks them in chunks of ``CHUNK_BYTES`` (whole blocks). A chunk that the
cycle's residency (the access source's, given by the caller) says is all
cached costs nothing more; the others are read with ``POSIX_FADV_WILLNEED``
over their blocks not wholly cached (``files.read_ahead``, as the holder
reads before it locks). Without a residency, ``cachestat(2)`` looks (a
chunk's cached halves skipped, halving down to 128 KiB). They are never
locked or mapped: the pages
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

Backing off what reclaim keeps taking. The spill's pages are the first the
kernel reclaims, and proactive reclaim (DAMON ``pageout``, ``memory.reclaim``)
takes any the guest leaves idle for a minute, free memory or not. Reading
them back every time is CPU, I/O and a ``cachestat`` walk spent on pages the
kernel has judged not worth memory (docs/benchmarks/busy-cost.md: a third of
three busy disks' time). So a chunk this spiller read that is found short of
pages again is not read: it is skipped for the next 2, 4, 8 ... up to
``MAX_BACKOFF`` calls, then read once more. Its level stays while it stays
in the runs (a chunk taken once a minute backs off to once in five minutes);
a chunk that leaves them is forgotten. Skipped chunks are not reported
cached, and ``backed_off_bytes`` says how much was skipped.

The trace source does not see these reads: its filters leave out the
daemon's loading thread (``trace_reader``), the thread that calls ``warm``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from vmdisktouch.core.runs import Run, mask_edges
from vmdisktouch.system import files, libc
from vmdisktouch.system.hold.pacing import Pacer

MiB = 1 << 20
CHUNK_BYTES = 32 * MiB
MAX_BACKOFF = 64                # calls a chunk reclaim keeps taking is skipped, at most


@dataclass(frozen=True)
class SpillResult:
    target_bytes: int = 0       # the spill's runs, in bytes
    read_bytes: int = 0         # read from disk by this call (what cachestat found missing)
    stopped: str | None = None  # why reading stopped short: "memory", "group", "stopping"
    cached: tuple = ()          # block runs found cached or read whole (data only, in order)
    backed_off_bytes: int = 0   # of the runs, skipped: reclaim kept taking them (see above)


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
        self._calls = 0
        self._read: set[int] = set()         # chunks (``_chunks``) read since their backoff
        self._level: dict[int, int] = {}     # chunk -> times reclaim took it after a read
        self._resume: dict[int, int] = {}    # chunk -> the call it is looked at again

    def warm(self, runs: Iterable[Run], min_free: int,
             resident: np.ndarray | None = None) -> SpillResult:
        """Read what is not cached of ``runs`` (block runs, priority order), within the guards.
        ``resident`` (per block, the fraction cached, or None): the cycle's residency, as
        the access source observed it (the trace source's is kept from every page the
        kernel adds and deletes); a chunk's uncached bytes are read from it, not looked up
        (a ``cachestat`` of 32 MiB walks its 8,192 pages: 0.6 ms, each cycle, for each
        chunk of every disk's spill, a third of the spill's time with three busy disks),
        and only its blocks not wholly cached are read. The chunk that holds the image's
        last, partial block is looked up (the residency counts its missing tail)."""
        runs = list(runs)
        self._calls += 1
        data = self._data(runs)
        self._forget_all_but(data)
        if not runs:
            return SpillResult()
        bs, size = self.block_size, self.image.size
        target = sum(max(0, min(b * bs, size) - a * bs) for a, b in runs)
        pace = Pacer(self.load_rate, self.sleep, self.clock)
        free = room = None
        read = skipped = 0
        done: list[Run] = []
        fresh: set[int] = set()             # chunks read in this call (a chunk's other pieces)

        def result(stopped: str | None = None) -> SpillResult:
            return SpillResult(target, read, stopped, tuple(done), skipped)
        for c, pos, end in self._chunks(data):
            off = pos * bs
            length = min(end * bs, size) - off
            if self._resume.get(c, 0) > self._calls:
                skipped += length
                continue
            frac = (resident[pos:end] if resident is not None and end <= resident.size
                    and end * bs <= size else None)
            cold = (self._cachestat.uncached_bytes(off, length) if frac is None
                    else min(length, int(np.ceil(float((1.0 - frac).sum(dtype=np.float64))
                                                 * bs))))
            if not cold:
                done.append((pos, end))
                continue
            if c in self._read and c not in fresh:     # read before, taken since: back off
                self._read.discard(c)
                level = self._level[c] = min(self._level.get(c, 0) + 1,
                                             MAX_BACKOFF.bit_length() - 1)
                self._resume[c] = self._calls + (1 << level)
                skipped += length
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
            if frac is None:
                self._read_cold(off, length, cold)
            else:
                self._read_blocks(pos, frac < 1.0)
            self._read.add(c)
            fresh.add(c)
            read += cold
            done.append((pos, end))
        return result()

    def _chunks(self, data: list[Run]) -> Iterable[tuple[int, int, int]]:
        """(chunk, first block, end block): the runs cut at every ``chunk_blocks``-th block
        of the image, so a chunk keeps its number (and its backoff) when a run's ends move."""
        cb, nblocks = self.chunk_blocks, -(-self.image.size // self.block_size)
        for a, b in data:
            b = min(b, nblocks)
            for c in range(a // cb, -(-b // cb)):
                yield c, max(a, c * cb), min(b, (c + 1) * cb)

    def _forget_all_but(self, data: list[Run]) -> None:
        """Drop the backoff of chunks no longer in the runs (a chunk that comes back starts
        afresh)."""
        keep = {c for c, _, _ in self._chunks(data)}
        for d in (self._level, self._resume):
            for pos in [p for p in d if p not in keep]:
                del d[pos]
        self._read &= keep

    def _read_blocks(self, pos: int, cold: np.ndarray) -> None:
        """``WILLNEED`` over each run of the ``cold`` blocks (a mask from block ``pos``)."""
        bs = self.block_size
        edges = mask_edges(cold)
        for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist()):
            files.read_ahead(self.image.fd, (pos + a) * bs, (b - a) * bs)

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
