"""The holder: keeps chosen block runs of one image locked in the page cache.

Theory of operation
-------------------
The holder is the only part of vmdisktouch that pins memory. It receives,
each cycle, the *target runs* chosen by the host's selection (``budget``):
half-open block runs ``(start, stop)`` in priority order, highest first.
What it may lock is the host's to say: every holder of a host draws from
one ``ledger.Ledger``, the budget summed over the disks. ``apply`` turns what
is held now into that target:

1. Release first. Every held block outside the target is unlocked and
   unmapped (``munlock`` + ``munmap`` of exactly those pages) before anything
   new is loaded, so the bytes freed are available to the loads that follow
   and the held total never rises above the budget on the way.
2. Load, in priority order. Each missing piece of a target run is mapped
   with its own ``mmap`` (``MAP_SHARED``, ``PROT_READ``) of the file, marked
   ``MADV_RANDOM`` and locked with ``mlock`` in chunks of ``CHUNK_BYTES``
   (32 MiB, always whole blocks). Before its ``mlock`` each chunk is read
   with ``POSIX_FADV_WILLNEED`` over exactly its bytes (``files.read_ahead``,
   in pieces of 128 KiB: the kernel caps one WILLNEED at the device's
   readahead size, and ``read_ahead_kb`` may be as small as that). ``mlock``
   then faults in pages that are already cached or under I/O; the holder
   never touches a page, so each page is read from disk once, in large
   sequential I/O, and nothing past the region is read: the fault path's
   readahead is not bounded by the mapping, and a page cached past a
   region's end would look like the guest's use in the next cycle (the
   holds then crept outwards cycle after cycle; ``policy.self_loaded``).
   ``MADV_RANDOM`` keeps any fault the advice missed to its own page.
   ``MADV_SEQUENTIAL`` without WILLNEED reads megabytes past a region's end
   (docs/benchmarks.md, why-holder).
3. Pace. With ``load_rate`` > 0, chunk ``k+1`` starts no earlier than
   ``chunk_k bytes / load_rate`` after chunk ``k`` started; the wait goes
   through the injected ``sleep``. When ``sleep`` returns True (it is
   ``threading.Event.wait`` of the daemon's stop event) loading stops at once;
   the time is read from the injected ``clock`` (``pacing``). Only what comes from the disk is paced: each chunk is asked
   ``cachestat(2)`` first, its already cached bytes count for nothing, and a
   chunk that is all cached is neither waited for nor read ahead. A lease
   renewed (a region released and taken again while the guest keeps it
   cached, see ``heat``) thus reads nothing and waits for nothing, where
   pacing it as if read would make a renewal cycle wait a second for every
   ``load_rate`` of bytes renewed (docs/benchmarks.md, why-holder). A cold
   disk's first loads (``unpaced``, set by the watcher while its trace source
   is cold) are not paced: what they read is what its guest is waiting for.
   (docs/benchmarks.md, cold-start).
4. Guards before every chunk: ``chunk <= ledger.room()`` (the budget less
   what every holder of the host holds) and
   ``mem_available() - chunk >= min_free``. ``MemAvailable`` is read again
   once a chunk's worth (``CHUNK_BYTES``) has been locked since the last
   read; in between, what was locked is subtracted from it (``pacing``).
   A chunk that does not fit is cut to the whole blocks that fit; if not
   even one fits, loading stops and the rest is ``skipped_bytes``.
   The host's held total therefore never exceeds its budget, not even for
   one chunk in the middle of a cycle, whatever the target asks for.
5. Floor shedding. After loading, while ``mem_available() < min_free``, the
   lowest-priority held blocks are released: the runs of the last ``apply``
   are walked from the lowest priority up, each from its tail (its highest
   blocks), releasing the measured deficit (rounded up to whole blocks) per
   step and measuring again. ``munlock`` puts the pages back on the file LRU,
   so ``MemAvailable`` rises at once. ``Ledger.set_budget`` uses the same
   ordering (``release_lowest``) to cut down to a new, smaller budget at once. What ``apply`` shed is its
   ``shed_bytes``; the holder logs nothing of it: one holder sees one disk, and
   the host says once when shedding starts (``daemon.alerts``).

Mappings. Every held piece is its own mapping (``mappings``), at most
``MAX_SEGMENTS`` (4096, about 6 % of the default ``vm.max_map_count``); a
piece that would need one more is skipped (counted in ``skipped_bytes``).
More than ``MAX_PIECES_PER_RUN`` (4) adjacent mappings of a target run are
merged into one. ``held_bytes`` is what is locked, as ``VmLck`` shows it.

Truncation. Touching a mapping beyond the end of the file raises SIGBUS.
The holder never reads through its mappings (checksums use ``pread``, see
``checksums``), and ``resize`` drops every mapped page at or beyond the new
end (and the old partial last block when the file grows) before the next
cycle can lock anything there. ``mlock`` of a mapping that the file no
longer covers fails with ENOMEM, which ``errors`` reports as a lock-limit
error; the holder asks the image whether it still reaches that far
(``Image.covers``) and treats it as a failure of that one region instead.

Errors. A failed ``mmap``/``mlock`` of one region releases that region and
loading continues with the next (logged). ``LockLimitError`` from ``mlock``
(RLIMIT_MEMLOCK without CAP_IPC_LOCK, lowered under a running daemon, or a
memory cgroup that cannot charge more) keeps what was locked, stops loading
and caps what the holder will try to lock at what it holds then
(``lock_cap``), until the next ``set_floor`` (a reload): retrying every
cycle would read a chunk from disk each time only to be refused again.
``ApplyResult.lock_refused`` carries the message, which says to raise the
limit (systemd: ``LimitMEMLOCK=infinity``) or grant ``CAP_IPC_LOCK``.
``run`` refuses at start a budget that the lock limit could never allow.

Holes. A hole of a sparse regular file (or an unwritten extent) reads as
zeros without any disk I/O, so holding it would spend the budget on
nothing. ``apply`` cuts every target piece to the blocks that hold data
(``Image.data_runs``); a block with any data is held whole. A hole the
guest writes later is data at the next cycle and is loaded then.
``last_holes`` tells the caller which target blocks were holes, so that it
can give their share of the budget to data. On a thin image the shoulders
the smoothing adds around each extent are holes, and zero-filling them for
``mlock`` costs system time (docs/benchmarks.md, why-holder). Block
devices (``Image.is_regular`` False: ``skip_holes`` off) are taken as all
data.

The run arithmetic (priority pieces, the diff of held vs target, the shed
order) is ``core.runs``; the clock and ``sleep`` are passed in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from vmdisktouch.core.runs import (Run, blocks_of, clip_runs, diff_runs, lowest_first,
                                   page_round, priority_pieces, subtract)
from vmdisktouch.errors import ClosedError, LockLimitError, SyscallError
from vmdisktouch.system import files, libc
from vmdisktouch.system.image import Image
from vmdisktouch.system.hold.ledger import Ledger
from vmdisktouch.system.hold.mappings import Mappings
from vmdisktouch.system.hold.pacing import MemGauge, Pacer

log = logging.getLogger("vmdisktouch")

MiB = 1 << 20
CHUNK_BYTES = 32 * MiB       # mlock granularity of a load (whole blocks, at least one)
MAX_SEGMENTS = 4096          # at most this many mappings (vm.max_map_count is 65530 by default)
MAX_PIECES_PER_RUN = 4       # merge a target run's adjacent mappings beyond this many


@dataclass(frozen=True)
class ApplyResult:
    loaded_bytes: int = 0      # newly locked by this call
    released_bytes: int = 0    # unlocked: not in the target, over the budget, or shed to the floor
    skipped_bytes: int = 0     # targeted but not loaded: budget, floor, mapping cap, error, stop
    stopped: bool = False      # loading was cut short because ``sleep`` returned True
    lock_refused: str | None = None   # mlock refused by the lock limit in this call (see Errors)
    shed_bytes: int = 0        # of released_bytes: shed because MemAvailable fell under min_free

    def plus(self, later: "ApplyResult") -> "ApplyResult":
        """Two calls of one cycle as one result."""
        return ApplyResult(self.loaded_bytes + later.loaded_bytes,
                           self.released_bytes + later.released_bytes,
                           later.skipped_bytes, self.stopped or later.stopped,
                           later.lock_refused or self.lock_refused,
                           self.shed_bytes + later.shed_bytes)


class Holder:
    """Holds block runs of one open image with mmap + mlock.

    ``size`` is the image size the holds are fitted to: the image's at the
    start, then what ``resize`` was last given. ``ledger``: the host's budget it draws
    from (a number: a ledger of its own, a host of one).
    """

    def __init__(self, image: Image, block_size: int, ledger: Ledger | int, min_free: int, *,
                 mem_available: Callable[[], int], load_rate: int = 0,
                 sleep: Callable[[float], object] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 chunk_bytes: int = CHUNK_BYTES, max_segments: int = MAX_SEGMENTS,
                 max_pieces_per_run: int = MAX_PIECES_PER_RUN):
        if block_size < libc.PAGE_SIZE or block_size % libc.PAGE_SIZE:
            raise ValueError(f"block size must be a multiple of the page size ({libc.PAGE_SIZE})")
        self.image = image
        self.fd = image.fd
        self.size = int(image.size)
        self.block_size = int(block_size)
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)
        self.min_free = int(min_free)
        self.mem_available = mem_available
        self.load_rate = int(load_rate)
        self.unpaced = False            # a cold disk's first loads (``sources``): at once
        self.sleep = sleep
        self.clock = clock
        self.chunk_blocks = max(1, int(chunk_bytes) // self.block_size)
        self.max_segments = int(max_segments)
        self.max_pieces_per_run = max(1, int(max_pieces_per_run))
        self._maps = Mappings(self.fd, self.block_size)
        self._order: list[Run] = []          # target pieces of the last apply, priority order
        self._closed = False
        self._cap_warned = False
        self.last_holes: list[Run] = []      # target blocks the last apply found to be holes
        self.lock_cap: int | None = None     # bytes: the lock limit refused more (see Errors)
        self._lock_refused: str | None = None
        self._cachestat = libc.CacheStatCaller(self.fd)   # what a load must read (see "Pace")
        self.skip_holes = image.is_regular   # holes of a sparse regular file are never held
        self.ledger.join(self)

    # -- queries -----------------------------------------------------------

    @property
    def nblocks(self) -> int:
        # Of the holder's own ``size``, not the image's: ``resize`` needs the old count
        # after ``Image.refresh_size`` has read the new size (the same rounding, ``blocks_of``).
        return blocks_of(self.size, self.block_size)

    def held_runs(self) -> list[Run]:
        """Sorted block runs held now (adjacent mappings reported as one run)."""
        return self._maps.runs()

    def held_bytes(self) -> int:
        """Bytes locked now: the page-rounded lengths of the held mappings."""
        return self._maps.locked

    def mapping_count(self) -> int:
        """Number of mappings (VMAs) the holder keeps."""
        return len(self._maps)

    def mappings(self, runs: Iterable[Run]) -> list[tuple[int, int, int, int]]:
        """``(start, stop, address, length)`` of the held parts of ``runs``, block-aligned.

        The addresses are the holder's own mappings: what ``memcg`` samples to
        learn whose memory cgroup the held pages are charged to.
        """
        return self._maps.parts(runs)

    # -- the cycle ---------------------------------------------------------

    def apply(self, target_runs: Iterable[Run]) -> ApplyResult:
        """Release what is not in ``target_runs``, then load the rest in priority order."""
        if self._closed:
            raise ClosedError("holder is closed")
        pieces = priority_pieces(target_runs, self.nblocks)
        self.last_holes = []
        if self.skip_holes:
            data = [(piece, self.image.data_runs(piece, self.block_size)) for piece in pieces]
            pieces = [run for _, runs in data for run in runs]
            self.last_holes = [h for piece, runs in data for h in subtract(piece, runs)]
        to_release, to_load = diff_runs(self.held_runs(), pieces)
        released = self.release(to_release)
        self._order = pieces
        over = self.ledger.over()                        # budget lowered behind our back
        if over:
            released += self.release_lowest(min(over, self.held_bytes()))

        self._lock_refused = None
        loaded, skipped, stopped = self._load(to_load)
        if not stopped:
            for run in pieces:
                self._maps.coalesce(run, self.max_pieces_per_run)
        shed = self._shed_to_floor()
        return ApplyResult(loaded, released + shed, skipped, stopped, self._lock_refused, shed)

    def resize(self, new_size: int) -> int:
        """Follow a size change; drop every hold the new size makes stale. Returns bytes released.

        Shrink: blocks that reach beyond the new end (including the new partial
        last block) are unmapped. Grow: the old partial last block, whose
        mapping stops at the old end, is unmapped so that it can be held whole.
        """
        new_size = int(new_size)
        old = self.size
        released = 0
        if new_size < old or (new_size > old and old % self.block_size):
            cut = min(old, new_size) // self.block_size
            released = self._maps.release(cut, max(self.nblocks, cut))
        self.size = new_size
        self._order = clip_runs(self._order, self.nblocks)
        return released

    def set_floor(self, min_free: int) -> int:
        """A new floor (config reload): shed down to it at once, and try the lock limit again.
        Returns bytes released. (The budget is the ledger's: ``Ledger.set_budget``.)"""
        self.min_free = int(min_free)
        self.lock_cap = None            # the limit may have been raised: try again
        return self._shed_to_floor()

    def release(self, runs: Iterable[Run]) -> int:
        """Unlock and unmap the held blocks of ``runs``. Returns bytes released."""
        return sum(self._maps.release(a, b) for a, b in runs)

    def drop(self, runs: Iterable[Run]) -> int:
        """Release these held blocks, drop them from the page cache and read them back.

        ``POSIX_FADV_DONTNEED`` after the unlock: the kernel drops the pages
        that nothing else maps (it skips mapped and dirty ones); the
        ``WILLNEED`` that follows, piece by piece (``files.drop_and_read_back``),
        reads them again in this process's context,
        so they are charged to its memory cgroup, and the next ``apply``
        locks them without waiting (``charges``: recharging). The bytes read
        are the caller's to bound (``charges.to_recharge``'s ``per_cycle``).
        """
        runs = list(runs)
        released = self.release(runs)
        bs = self.block_size
        for a, b in runs:
            files.drop_and_read_back(self.fd, a * bs, min(b * bs, self.size) - a * bs)
        return released

    def release_all(self) -> int:
        """Unlock and unmap everything. Returns bytes released."""
        return self._maps.release_all()

    def close(self) -> None:
        """Release everything and leave the ledger; the holder cannot be used afterwards.
        Idempotent."""
        self.release_all()
        self.ledger.leave(self)
        self._closed = True

    # -- loading -----------------------------------------------------------

    def _span_length(self, start: int, stop: int) -> int:
        bs = self.block_size
        return page_round(min(stop * bs, self.size) - start * bs, libc.PAGE_SIZE)

    def _load(self, to_load: list[Run]) -> tuple[int, int, bool]:
        """Load the pieces in order. Returns (bytes loaded, bytes skipped, stopped)."""
        loaded = 0
        pace = Pacer(0 if self.unpaced else self.load_rate, self.sleep, self.clock)
        gauge = MemGauge(self.mem_available, self.chunk_blocks * self.block_size)
        for a, b in to_load:
            if len(self._maps) >= self.max_segments:
                if not self._cap_warned:
                    log.warning("holder: %d mappings held, the cap; smaller scattered regions "
                                "are skipped", self.max_segments)
                    self._cap_warned = True
                continue
            done, keep_going = self._load_piece(a, b, pace, gauge)
            loaded += done
            if not keep_going:
                break
        wanted = sum(self._span_length(a, b) for a, b in to_load)
        return loaded, wanted - loaded, pace.stopped

    def _load_piece(self, a: int, b: int, pace: Pacer,
                    gauge: MemGauge) -> tuple[int, bool]:
        """Map and lock blocks ``[a, b)`` chunk by chunk.

        Returns (bytes locked, keep going). Keep going is False when a guard
        stopped loading (budget, floor) or the daemon is stopping.
        """
        bs = self.block_size
        maps = self._maps
        length = self._span_length(a, b)
        seg = maps.map(a, b, length)
        if seg is None:
            return 0, True
        pos, keep_going = a, True
        try:
            while pos < b:
                n = min(self.chunk_blocks, b - pos)
                nbytes = maps.offset_in(a, pos + n, length) - seg.length
                cold = self._cachestat.uncached_bytes(a * bs + seg.length, nbytes)
                if cold and not pace.wait():
                    keep_going = False
                    break
                fit = min(self._room(), gauge.get() - self.min_free)
                if nbytes > fit:
                    n = min(n, max(fit, 0) // bs)
                    nbytes = maps.offset_in(a, pos + n, length) - seg.length
                    keep_going = False
                    if n == 0:
                        break
                if cold:
                    pace.start(min(cold, nbytes))
                    files.read_ahead(self.fd, a * bs + seg.length, nbytes)
                try:
                    maps.lock(seg, pos + n, nbytes)
                except LockLimitError as exc:
                    if self.image.covers(min(a * bs + seg.length + nbytes, self.size)):
                        self.lock_cap = self.held_bytes()
                        self._lock_refused = str(exc)
                        keep_going = False
                        break
                    maps.drop(seg, length, f"blocks {a}-{b}: {exc} (file shrank)")
                    return 0, True
                except SyscallError as exc:
                    maps.drop(seg, length, f"blocks {a}-{b}: {exc}")
                    return 0, True
                pos += n
                gauge.took(nbytes)
                if not keep_going:
                    break
        except BaseException:
            maps.trim_tail(seg, length)
            raise
        maps.trim_tail(seg, length)
        return seg.length, keep_going

    def _room(self) -> int:
        """The most the holder may lock more now: the host's room, or less after a lock
        refusal (``lock_cap``)."""
        room = self.ledger.room()
        return room if self.lock_cap is None else min(room, self.lock_cap - self.held_bytes())

    # -- shedding ----------------------------------------------------------

    def release_lowest(self, nbytes: int) -> int:
        """Release at least ``nbytes`` (whole blocks) of the lowest-priority holds."""
        released = 0
        for a, b in lowest_first(self._order, self.held_runs()):
            if released >= nbytes:
                break
            need_blocks = -(-(nbytes - released) // self.block_size)
            released += self._maps.release(max(a, b - need_blocks), b)
        return released

    def _shed_to_floor(self) -> int:
        released = 0
        while len(self._maps):
            deficit = self.min_free - self.mem_available()
            if deficit <= 0:
                break
            released += self.release_lowest(deficit)
        return released
