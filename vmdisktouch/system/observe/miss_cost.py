"""What a miss costs on one disk: timed O_DIRECT reads of pages nobody has cached.

Theory of operation
-------------------
A guest read the page cache misses waits for the device under the image, and
a byte held saves that wait each time it is read. The wait differs by disk: an
image on an idle NVMe answers in tens of microseconds, one on a loaded array or
a network volume in milliseconds, and the host budget should know it
(``core.shares``: saved time is hit ratio x reads x this cost, at most the
guest's queue depth).

It is measured, not configured. Each cycle ``probe`` makes up to ``PROBES``
timed reads of one 4 KiB page each, one at a time (queue depth 1, as a
guest's sync read), with ``O_DIRECT`` on a descriptor of its own (the
verified image's reopened, ``Image.reopen_direct``: the file the daemon
checked, whatever its path names now, and ``O_NOATIME`` where permitted):
past the page cache, so they cache nothing and evict nothing, and never a
write. The pages are drawn at random from the blocks the cycle's residency
says are not cached at all, and from data only (a hole of a sparse file
reads as zeros without the device). Before the first, ``WARMUP`` untimed
reads of other pages of its block: the first reads after the daemon slept
wait for the host to wake up, not for the device (here 186 us, then 47,
36, 33, where a reader that never idles waits 29), and a guest busy with
its reads does not pay that. Each timed read counts less the time its
thread waited on a run queue meanwhile (``/proc/thread-self/schedstat``'s
run delay): on a busy host the daemon, woken by its read's completion, waits
for a CPU (under a load of 7 on 2 cores: fio's reads 45 us on average, the
probe's 76, 52 without its run delay), and a hit waits for a CPU as well:
that is not what a hit saves.

The figure is the median of the means of ``GROUP`` probes in turn (two
cycles') over the last ``WINDOW`` probes: a median of means, which is the
mean where the waits are steady and passes by a burst that fills less
than half of the window's cycles. The time a hit saves is the sum of the
waits, so each cycle's figure is a mean: a loaded device's waits come in
bursts (a loop device capped at 50 reads a second let half the reads
through at once, 0.1 ms, and held the rest for its next 100 ms slice: the
median of the probes was either). But the plain mean of the window followed
each slow probe: the host's other work (a sequential reader, writeback, a
wake-up) once in 64 probes at 40 ms beside 30 us moves it to 0.7 ms, and
status said "a miss costs 719 us, 8.77 s of reads saved a second" for a
guest at queue depth 1 whose own misses took 29 us. A load that
lasts half the window is the disk's cost now, and the figure follows it
within ``WINDOW / PROBES / 2 + GROUP / PROBES`` cycles. At a 5 s interval that is
about two reads a second. A cycle's ``PROBES``, a window of ``WINDOW`` and
groups of ``GROUP`` (not 4, 64 and 4): the waits of a loaded device are
skewed (another tenant's queue: a mean 1.8 x the median), and a median of
means of few reads leans to the median read (0.71 x the guest's mean on the
loaded disk with groups of 4).

Measured beside fio's own completion latency at queue depth 1 with
``O_DIRECT`` (every read a miss), less fio's own wait for a CPU, the same
seconds (docs/benchmarks/miss-cost.md): 1.02-1.57 x on this machine's disk,
0.72-1.00 x with another tenant's reads always queued on it (a heavy tail:
the median of means leans to the median read), where the plain mean of the
window was 1.6-21 x and 2.6-18 x.
Behind a throttle that lets reads through in slices the guest that fills
them waits its share (2.5 ms a read at 400 a second) where a probe waits
for the open slice only (0.1 ms after its untimed reads, half a slice
without them): no probe times that; the figure is then the device's, and
the saving too low.

Why the probe and not the guest's own waits: the trace source's events say
that a read needed a page added (``mm_filemap_add_to_page_cache``), not when
that page's read came back; that wait is the block layer's
(``block_rq_issue`` to ``block_rq_complete``), whose events name a device
and a sector, not the image's file, and a guest whose hot pages are held
leaves few misses to time. The probe times the same kind of read (one
page, queue depth 1, the same file) whether the guest misses or not.

The probe runs in the daemon's own I/O context, not the guest's: a guest whose
cgroup throttles its I/O waits longer than the probe does.

Where the image cannot be opened with ``O_DIRECT`` (tmpfs, some FUSE file
systems), a read fails, or every block is cached, there is no figure: ``seconds``
is None, ``reason`` says why, and the split then takes every disk's cost as equal.
"""

from __future__ import annotations

import collections
import errno
import mmap
import os
import time

import numpy as np

from vmdisktouch.errors import SyscallError

PROBES = 8              # timed probe reads per cycle, at most
WARMUP = 3              # untimed reads before them each cycle (the host waking up)
WINDOW = 128            # the probes the figure is taken over (16 cycles)
GROUP = 2 * PROBES      # probes in turn per mean (two cycles'); the figure is their median
PROBE_BYTES = 4096      # one page, aligned for any logical block size up to it


def median_of_means(waits: np.ndarray, group: int = GROUP) -> float:
    """The median of the means of ``waits`` taken ``group`` in turn (a shorter last
    group is one too when it is the only one, else it joins the one before)."""
    n = int(waits.size)
    k = max(1, n // group)
    means = [float(part.mean()) for part in np.array_split(waits, k)]
    return float(np.median(means))


def open_schedstat() -> int | None:
    """A descriptor of this thread's ``/proc/thread-self/schedstat``; None without it."""
    try:
        return os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def thread_run_delay(fd: int) -> int:
    """ns the thread of ``fd`` (``open_schedstat``) has waited on a run queue so far."""
    try:
        return int(os.pread(fd, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class MissCost:
    """Times reads of uncached pages of one image (see the module's theory)."""

    def __init__(self, image, block_size: int, *, seed: int | None = None,
                 clock=time.perf_counter_ns, run_delay=None):
        """``image``: the open, verified ``system.image.Image`` to probe; ``run_delay``:
        ns the probing thread has waited for a CPU so far (None: ``thread_run_delay``)."""
        self.block_size, self.regular = int(block_size), image.is_regular
        self.clock, self.run_delay = clock, run_delay
        self.rng = np.random.default_rng(seed)
        self.samples: collections.deque = collections.deque(maxlen=WINDOW)
        self.reason: str | None = None
        self.fd: int | None = None
        self.buf = mmap.mmap(-1, PROBE_BYTES)          # page-aligned, as O_DIRECT needs
        try:
            self.fd = image.reopen_direct()
        except SyscallError as exc:
            self.reason = (f"the image cannot be opened with O_DIRECT: {os.strerror(exc.errno)}"
                           if exc.errno != errno.ESTALE else
                           f"the image cannot be opened again as the same file: {exc}")

    @property
    def seconds(self) -> float | None:
        """What a miss waits, in seconds (``median_of_means`` of the window's probes);
        None before any probe or without them."""
        if not self.samples:
            return None
        return median_of_means(np.fromiter(self.samples, dtype=np.float64)) / 1e9

    def probe(self, resident: np.ndarray, size: int) -> int:
        """Up to ``PROBES`` timed reads in blocks ``resident`` (per block, the fraction
        cached) says are not cached at all, of an image of ``size`` bytes, the first after
        ``WARMUP`` untimed ones in its block; the number timed."""
        if self.fd is None:
            return 0
        bs = self.block_size
        whole = min(resident.size, size // bs)           # blocks with a full page to read
        cold = np.flatnonzero(resident[:whole] == 0)
        if not cold.size:
            if not self.samples:
                self.reason = "every block is cached: no read goes to the device"
            return 0
        sched = None
        delay = self.run_delay
        if delay is None:
            sched = open_schedstat()
            delay = (lambda: thread_run_delay(sched)) if sched is not None else (lambda: 0)
        try:
            made = self._probe_blocks(cold, delay)
        finally:
            if sched is not None:
                os.close(sched)
        if made:
            self.reason = None
        return made

    def _probe_blocks(self, cold: np.ndarray, delay) -> int:
        """The cycle's reads in blocks of ``cold``; the number timed."""
        made, warmed = 0, False
        for b in self.rng.choice(cold, size=min(PROBES, cold.size), replace=False).tolist():
            off = self._page(b)
            if off is None:
                continue
            try:
                if not warmed:                  # the host waking up, not the device: untimed
                    warmed = True
                    for w in (self._page(b) for _ in range(WARMUP)):
                        if w is not None:
                            self._read(w, delay)
                took = self._read(off, delay)
            except OSError as exc:
                self._give_up(f"an O_DIRECT read fails: {exc.strerror or exc}", exc)
                return made
            if took is None:
                continue                                 # the image shrank: not a miss
            self.samples.append(took)
            made += 1
        return made

    def _page(self, block: int) -> int | None:
        """The offset of a page drawn at random in ``block``; None where it is a hole."""
        off = block * self.block_size + \
            int(self.rng.integers(self.block_size // PROBE_BYTES)) * PROBE_BYTES
        return off if not self.regular or self._is_data(off) else None

    def _read(self, off: int, delay) -> int | None:
        """One timed read of the page at ``off``: its ns less those the thread waited for
        a CPU meanwhile (``delay()``: its run delay so far), or None when short."""
        d0 = delay()
        t0 = self.clock()
        got = os.preadv(self.fd, [self.buf], off)
        took = self.clock() - t0
        waited = delay() - d0
        if got != PROBE_BYTES:
            return None
        return max(0, took - waited)

    def _is_data(self, off: int) -> bool:
        try:
            return os.lseek(self.fd, off, os.SEEK_DATA) == off
        except OSError:                                   # ENXIO: only a hole past it
            return False

    def _give_up(self, why: str, exc: OSError) -> None:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.EIO):
            self.close()
        self.reason = why

    def status(self) -> dict:
        """``seconds`` (the figure, or None), ``probes`` (in it) and, without a
        figure, ``none``: why."""
        s = self.seconds
        out = {"seconds": None if s is None else round(s, 7), "probes": len(self.samples)}
        if s is None and self.reason:
            out["none"] = self.reason
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.buf.close()
