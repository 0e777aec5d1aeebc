"""What a miss costs on one disk: the guest's own misses timed, else timed O_DIRECT reads.

Theory of operation
-------------------
A guest read the page cache misses waits for the device under the image, and
a byte held saves that wait each time it is read. The wait differs by disk: an
image on an idle NVMe answers in tens of microseconds, one on a loaded array or
a network volume in milliseconds, and the host budget should know it
(``core.shares``: saved time is hit ratio x reads x this cost, at most the
guest's queue depth).

It is measured, not configured, from the guest's own reads where the trace
source times them: a read that waited for a page its thread added to the
cache waited from that insertion to the read's return
(``mm_filemap_add_to_page_cache`` to ``mm_filemap_get_pages`` of the same
thread and page: in the kernel, ``bpf_reads.added_program``, or from the
ring buffer's events, ``trace_reader.paired_misses``). That is the wait a
hit saves, whatever it waits for: the device, a queue behind another tenant,
a throttle of the guest's own I/O group. A cycle with at least ``PROBES`` of
them is a reading of the guest's misses, and no probe is made.

Otherwise (a guest that reads little, or whose reads are all held; the
polling source) each cycle ``probe`` makes up to ``PROBES``
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

The figure is the median of the means of the last ``CYCLES`` cycles'
readings pooled in turn until a pool has ``GROUP`` reads (two cycles' probes,
one cycle of a guest that misses): a median of means, which is the
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
without them): no probe times that, and the probe runs in the daemon's own
I/O group, not the guest's. The guest's own misses do: 0.92 x fio's mean
there, 0.87 x on this machine's disk (docs/benchmarks/miss-cost.md), where
the probe gave 0.02 x behind the throttle. Why both: a guest whose hot pages
are held, or that reads little, leaves few misses to time, and the probe
times the same kind of read (one page, queue depth 1, the same file)
whether the guest misses or not.

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
CYCLES = WINDOW // PROBES   # the cycles the figure is taken over
GROUP = 2 * PROBES      # timed reads in turn per mean (two cycles' probes); the figure is
                        # their median
PROBE_BYTES = 4096      # one page, aligned for any logical block size up to it


class GuestMisses:
    """The guest's own misses timed since the last ``take`` (the kernel's or the ring
    buffer's pairing: ``miss_wait_ns`` and ``misses_timed`` of what a drain gave), summed
    for ``MissCost.cycle``."""

    def __init__(self):
        self.ns = self.n = 0

    def add(self, timed) -> None:
        self.ns += timed.miss_wait_ns
        self.n += timed.misses_timed

    def take(self) -> tuple[int, int]:
        """ns waited and how many, since the last take; zeroed."""
        out, self.ns, self.n = (self.ns, self.n), 0, 0
        return out


def median_of_means(readings, group: int = GROUP) -> float:
    """The median of the means of ``readings`` (per cycle: ns waited, reads timed) pooled
    in turn until a pool has ``group`` reads (a shorter last pool is one too when it is
    the only one, else it joins the one before)."""
    pools: list[list[float]] = []
    waited = reads = 0.0
    for ns, n in readings:
        waited, reads = waited + ns, reads + n
        if reads >= group:
            pools.append([waited, reads])
            waited = reads = 0.0
    if reads:
        if pools:
            pools[-1][0] += waited
            pools[-1][1] += reads
        else:
            pools.append([waited, reads])
    return float(np.median([w / n for w, n in pools]))


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
        # per cycle: ns waited, reads timed, of them the probe's (the rest the guest's)
        self.readings: collections.deque = collections.deque(maxlen=CYCLES)
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
        """What a miss waits, in seconds (``median_of_means`` of the window's cycles);
        None before any read was timed."""
        if not self.readings:
            return None
        return median_of_means((ns, n) for ns, n, _ in self.readings) / 1e9

    @property
    def probes(self) -> int:
        """The probe's reads in the window."""
        return sum(p for _, _, p in self.readings)

    def cycle(self, resident: np.ndarray, size: int,
              misses: tuple[int, int] | None = None) -> int:
        """One cycle's reading: the guest's own misses (``misses``: ns waited and how
        many, from the trace source; None where not timed) where there are ``PROBES`` or
        more, else ``probe``'s reads with them; the probe's reads made."""
        waited, n = misses if misses else (0, 0)
        if n >= PROBES:
            self.readings.append((waited, n, 0))
            self.reason = None
            return 0
        return self.probe(resident, size, guest=(waited, n))

    def probe(self, resident: np.ndarray, size: int, guest: tuple[int, int] = (0, 0)) -> int:
        """Up to ``PROBES`` timed reads in blocks ``resident`` (per block, the fraction
        cached) says are not cached at all, of an image of ``size`` bytes, the first after
        ``WARMUP`` untimed ones in its block, a cycle's reading with the guest's few misses
        timed (``guest``: ns waited, how many); the number timed."""
        if self.fd is None:
            return 0
        bs = self.block_size
        whole = min(resident.size, size // bs)           # blocks with a full page to read
        cold = np.flatnonzero(resident[:whole] == 0)
        if not cold.size:
            if guest[1]:
                self.readings.append((guest[0], guest[1], 0))
            elif not self.readings:
                self.reason = "every block is cached: no read goes to the device"
            return 0
        sched = None
        delay = self.run_delay
        if delay is None:
            sched = open_schedstat()
            delay = (lambda: thread_run_delay(sched)) if sched is not None else (lambda: 0)
        try:
            waited, made = self._probe_blocks(cold, delay)
        finally:
            if sched is not None:
                os.close(sched)
        if made or guest[1]:
            self.readings.append((waited + guest[0], made + guest[1], made))
            self.reason = None
        return made

    def _probe_blocks(self, cold: np.ndarray, delay) -> tuple[int, int]:
        """The cycle's reads in blocks of ``cold``: ns waited and the number timed."""
        waited, made, warmed = 0, 0, False
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
                return waited, made
            if took is None:
                continue                                 # the image shrank: not a miss
            waited += took
            made += 1
        return waited, made

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
        """``seconds`` (the figure, or None), ``probes`` and ``misses`` (the probe's
        reads and the guest's misses in it) and, without a figure, ``none``: why."""
        s = self.seconds
        probes = self.probes
        out = {"seconds": None if s is None else round(s, 7), "probes": probes,
               "misses": sum(n for _, n, _ in self.readings) - probes}
        if s is None and self.reason:
            out["none"] = self.reason
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.buf.close()
