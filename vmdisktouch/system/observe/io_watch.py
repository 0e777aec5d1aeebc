"""Watching one disk's I/O for a while, changing nothing: what ``vmdisktouch advise`` reads.

Theory of operation
-------------------
A disk reaches the host in one of two ways, and each has its own tracepoints:

* through the page cache (QEMU ``cache=writethrough``, ``writeback``): the
  page-cache events of ``trace_reader`` (a READ per batch of pages read, an
  ADD per page the cache had to bring in, a WRITE per page dirtied);
* past it, with ``O_DIRECT`` (``cache=none``, ``directsync``): the direct I/O
  events of ``direct_io`` (each read and write with its offset, length and
  wait, from submission to completion).

Which one a disk uses is read from the processes that have it open
(``openers``: ``/proc/PID/fdinfo`` flags, ``O_DIRECT`` or not), or told by
the caller (libvirt's cache mode); when nobody has it open both are watched.
vmdisktouch's own descriptors are not a guest's: the caller's, and those of
the daemon that serves the image (``scan_openers``: the process that holds
the image's lock, ``image_lock``, as the ``lock:`` line of its lock file's
fdinfo shows) are left out. The daemon keeps an ``O_DIRECT`` descriptor of
every image it serves for its miss probe (``MissCost``), which made a disk
a guest read through the page cache at 40 MB/s look ``cache=none`` and
unread.

Every read's pages feed a miss-ratio curve (``core.mrc``, the daemon's own
code, without decay: the window is the evidence; ``steady``: the first
reads of the window are not taken for misses a cache would never serve). A read's wait when it
misses: for direct I/O, its own measured wait (every direct read goes to the
device); through the page cache, ``MissCost``'s: the guest's own misses as
the page-cache tracer pairs them, or where it missed too little timed
``O_DIRECT`` reads of pages nobody has cached, a few a second. A read the
page cache serves
waits ``page_cache_read_time``: timed 4 KiB reads of a page of an anonymous
memory file (``memfd``: the same page-cache read path, no device), so
nothing of the image is read through the cache. That is the copy only.

What a switch from ``cache=none`` to ``cache=writethrough`` costs
(``switch_cost``). QEMU's direct path (``aio=native``) submits to the kernel
and is woken by the completion; its buffered path (``aio=threads``) hands
each request to a worker thread, a wake-up more, which a read pays hit or
miss; a writethrough write is the write and then a flush, each through the
pool. Measured on this host, before the watch:

* a hit's: one wake-up, half the round trip of a byte between this process
  and a forked child over two pipes (the median of ``WAKE_TRIPS``);
* a miss's: through QEMU itself, ``qemu-img bench`` (4 KiB reads at queue
  depth 1) through two ``qemu-nbd`` past the cache, ``aio=threads`` and
  ``aio=native``, as the writes' below (``EXTRA_READS`` reads a run). A miss
  through the pool blocks its worker, which is woken and wakes the main loop:
  fio through qemu-nbd paid 11-14 µs more a miss there, and about 3 µs a hit
  (2026-11-29: 79 µs a read against 65-68, every read a miss, and 41-46
  through ``cache=writethrough`` with every read a hit);
* a write's: through QEMU itself, ``qemu-img bench`` (4 KiB writes at queue
  depth 1) through two ``qemu-nbd``, ``cache=writethrough`` and ``cache=none``
  with ``aio=native``, each of its own unnamed scratch file (``O_TMPFILE`` in
  the image's directory: its file system, gone at close; never the image);
  ``EXTRA_RUNS`` pairs of runs back to back (A B, B A, ...), the median of the
  pairs' differences (a pair shares the load of its moment), at least 0. A
  block device gets no write cost (None: said as not measured): nothing
  writes to it.

Why these two, from bench_advise's cases (docs/benchmarks/advise.md#advise-cases),
where the guests' cycles gave a read's extra of about 4 µs and a write's of
86-105 µs: the same ``qemu-img bench`` for reads (``aio=threads`` against
``aio=native`` on the device) said 18-24 µs, and on a file in memory more
(native completes inside ``io_submit`` there); ``pwrite`` with ``fdatasync``
against ``O_DIRECT`` timed in-process said 37 µs a write, where QEMU's own
flush path costs more.

Read-only: the image is opened read-only, nothing is locked or evicted. The
page-cache tracer's start reads page 0 through the cache to confirm its filter;
when page 0 was not cached before, it is dropped again
(``POSIX_FADV_DONTNEED`` of that one clean page), so the cache is left as found.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from vmdisktouch.core.access import ADD, READ, WRITE
from vmdisktouch.core.mrc import Batches, MissRatioCurve, pages_read
from vmdisktouch.core.what_if import Watched, cache_hit_ratio
from vmdisktouch.errors import VmdtError
from vmdisktouch.system import files, image_lock, libc
from vmdisktouch.system.image import first_page_cached
from vmdisktouch.system.observe import residency
from vmdisktouch.system.observe.miss_cost import PROBES, GuestMisses, MissCost

PROBE_EVERY = 1.0          # s between miss-cost probes of a buffered disk
HIT_SAMPLES = 2000         # timed reads of ``page_cache_read_time``
BLOCK = 1 << 20            # the unit the daemon holds: reads counted per block of it
WAKE_TRIPS = 2000          # round trips timed for a wake-up (``wake_time``)
EXTRA_WRITES = 500         # writes of each ``switch_extras`` run
EXTRA_RUNS = 5             # pairs of runs, one of each path (A B, B A, ...)
SCRATCH = 1 << 20          # bytes of each scratch file
SERVE_WAIT = 5.0           # s a qemu-nbd may take to come up
SAMPLED_PER_SECOND = 100   # the curve's reads a second, at most (a minute: 7,000 with
                           # the first ten seconds' burst)


@dataclass
class Tally:
    """What one disk did in the window."""
    direct_reads: int = 0          # read requests past the page cache
    direct_writes: int = 0
    direct_read_bytes: int = 0
    direct_write_bytes: int = 0
    read_wait_ns: int = 0          # summed over the direct reads timed
    write_wait_ns: int = 0         # and writes
    timed_reads: int = 0           # the direct reads whose wait was measured
    timed_writes: int = 0
    paged_reads: int = 0           # read events through the page cache
    paged_writes: int = 0          # pages dirtied
    pages_read: int = 0
    pages_added: int = 0           # pages the cache brought in (misses, readahead)
    lost: int = 0                  # events the kernel lost
    seconds: float = 0.0
    waits: list = field(default_factory=list)   # direct read waits (ns arrays)
    write_waits: list = field(default_factory=list)   # and writes'

    @property
    def reads(self) -> int:
        return self.direct_reads + self.paged_reads

    @property
    def writes(self) -> int:
        return self.direct_writes + self.paged_writes

    @property
    def read_bytes(self) -> int:
        return self.direct_read_bytes + self.pages_read * libc.PAGE_SIZE


@dataclass(frozen=True)
class Openers:
    """Who has an image open: ``pids``, pid -> whether any of its descriptors of it is
    ``O_DIRECT``, vmdisktouch's own left out; ``daemon``, the pid of the daemon that serves
    it (it holds the image's lock), or None."""
    pids: dict
    daemon: int | None = None


def openers(path: str) -> dict[int, bool]:
    """The processes that have ``path`` open: pid -> whether any of its descriptors of it
    is ``O_DIRECT`` (from ``/proc/PID/fdinfo``); the caller's own, the serving
    daemon's and any other vmdisktouch process's are left out (``scan_openers``)."""
    return scan_openers(path).pids


def scan_openers(path: str) -> Openers:
    """Who has ``path`` open (``Openers``), from ``/proc/PID/fd`` and ``fdinfo``."""
    try:
        target = os.stat(path)
    except OSError:
        return Openers({})
    key = (target.st_rdev, 0) if stat.S_ISBLK(target.st_mode) else (target.st_dev,
                                                                      target.st_ino)
    lock = image_lock.lock_name(target)
    out: dict[int, bool] = {}
    daemon = None
    me = os.getpid()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        direct, files_open = None, []
        for fd in fds:
            try:
                st = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            mine = ((st.st_rdev, 0) if stat.S_ISBLK(st.st_mode) else (st.st_dev, st.st_ino))
            if mine != key or (stat.S_ISBLK(st.st_mode) != stat.S_ISBLK(target.st_mode)):
                if stat.S_ISREG(st.st_mode):
                    files_open.append(fd)
                continue
            info = _fdinfo(pid, fd)
            if info is None:
                continue
            m = re.search(r"^flags:\s*([0-7]+)", info, re.M)
            direct = bool(direct) or bool(m and int(m.group(1), 8) & os.O_DIRECT)
        if direct is None:
            continue
        if any(_holds_lock(pid, fd, lock) for fd in files_open):
            daemon = pid
        elif not is_vmdisktouch(pid):     # another advise's probe: not a guest's either
            out[pid] = direct
    return Openers(out, daemon)


def process_name(pid: int) -> str:
    """``/proc/PID/comm`` (``qemu-nbd``, ``qemu-system-x86``), ``?`` when it is gone."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def is_vmdisktouch(pid: int) -> bool:
    """Whether ``pid`` runs vmdisktouch (``vmdisktouch ...`` or ``python -m vmdisktouch
    ...``, from ``/proc/PID/cmdline``): its O_DIRECT reads (a daemon's miss probe,
    ``advise``'s) are not a guest's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(a) == b"vmdisktouch" for a in argv[:3])


def _fdinfo(pid: int, fd: str) -> str | None:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            return f.read()
    except OSError:
        return None


def _holds_lock(pid: int, fd: str, name: str) -> bool:
    """Whether descriptor ``fd`` of ``pid`` is an image lock file ``name`` it holds locked
    (its fdinfo lists the ``flock``: this open file's own locks, granted ones only)."""
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    if os.path.basename(link.removesuffix(" (deleted)")) != name:
        return False
    info = _fdinfo(pid, fd)
    return bool(info and re.search(r"^lock:\s*\d+: FLOCK\s+ADVISORY\s+WRITE ", info, re.M))


def paged_tracer(image, name: str):
    """A ``TraceReader`` of ``image``'s page cache that leaves the cache as it found it: its
    start reads page 0 through the cache, dropped again if it was not cached before."""
    from vmdisktouch.system.trace.trace_reader import TraceReader
    try:
        was_cached = first_page_cached(image.fd, image.size)
    except (OSError, VmdtError):
        was_cached = True              # cannot tell: leave the cache alone
    reader = TraceReader(image.fd, name=name)
    if not was_cached:
        files.drop_cache(image.fd, 0, libc.PAGE_SIZE)
    return reader


def page_cache_read_time(samples: int = HIT_SAMPLES) -> float:
    """Seconds a 4 KiB read the page cache serves takes here: the median of ``samples``
    timed ``pread`` of a cached page of an anonymous memory file."""
    fd = os.memfd_create("vmdisktouch-hit", os.MFD_CLOEXEC)
    try:
        os.pwrite(fd, b"\0" * libc.PAGE_SIZE, 0)
        times = np.empty(samples)
        for k in range(samples):
            t0 = time.perf_counter_ns()
            os.pread(fd, 4096, 0)
            times[k] = time.perf_counter_ns() - t0
        return float(np.median(times)) / 1e9
    finally:
        os.close(fd)


@dataclass(frozen=True)
class PathCost:
    """What a switch from ``cache=none`` to ``cache=writethrough`` costs (module
    docstring), seconds an I/O at queue depth 1: ``read`` a wake-up, which a hit pays,
    ``miss`` what a read the device serves pays through the thread pool, and ``write`` a
    write's whole extra (None: not measured)."""
    read: float | None
    write: float | None
    miss: float | None = None


# (aio, cache) of each server: the direct path, the writethrough path, the thread pool's
# path past the cache
DIRECT, WRITETHROUGH, POOLED = ("native", "none"), ("threads", "writethrough"), \
    ("threads", "none")
EXTRA_READS = 2000         # reads of each run that times the pool's extra on a miss


def switch_cost(image_paths: list[str], stop=lambda: False) -> dict[str, PathCost]:
    """Each image's ``PathCost`` (module docstring): one wake-up for the host, a write per
    directory of a regular file. ``stop()`` true ends it early: what is left is not
    measured."""
    nbd, img = shutil.which("qemu-nbd"), shutil.which("qemu-img")
    wake = None if stop() else wake_time()
    measured: dict = {}
    out = {}
    for path in image_paths:
        write = miss = None
        if _regular(path) and nbd and img:
            where = os.path.dirname(os.path.abspath(path))
            if where not in measured:
                measured[where] = ((None, None) if stop()
                                   else switch_extras(nbd, img, where, stop))
            write, miss = measured[where]
        out[path] = PathCost(wake, write, miss)
    return out


def wake_time(trips: int = WAKE_TRIPS) -> float | None:
    """Seconds one task takes to wake another here: half a byte's round trip between this
    process and a forked child over two pipes, the median of ``trips``."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (a_r, a_w, b_r, b_w):
            os.close(fd)
        return None
    if pid == 0:                                  # the child: echo each byte, until EOF
        try:
            os.close(a_w)
            os.close(b_r)
            while os.read(a_r, 1):
                os.write(b_w, b"x")
        finally:
            os._exit(0)
    os.close(a_r)
    os.close(b_w)
    times = np.empty(trips)
    try:
        for k in range(trips):
            t = time.perf_counter_ns()
            os.write(a_w, b"x")
            os.read(b_r, 1)
            times[k] = time.perf_counter_ns() - t
    finally:
        os.close(a_w)
        os.close(b_r)
        os.waitpid(pid, 0)
    return float(np.median(times)) / 2e9


def switch_extras(nbd: str, img: str, where: str, stop) -> tuple[float | None, float | None]:
    """Seconds a 4 KiB write through QEMU's writethrough path takes beyond one through its
    direct path, and a 4 KiB read through its thread pool past the cache beyond one through
    its direct path, on the file system of the directory ``where`` (module docstring);
    None where no scratch file can be made there, or a server or a run failed."""
    tmp = tempfile.mkdtemp(prefix="vmdisktouch-switch-")
    fds: dict = {}
    servers: dict = {}
    try:
        for way in (DIRECT, WRITETHROUGH, POOLED):
            fds[way] = _scratch(where)
            if fds[way] is None:
                return None, None
            servers[way] = _serve(nbd, f"/proc/{os.getpid()}/fd/{fds[way]}", tmp, *way)
            if servers[way][1] is None:
                return None, None
        write = _pairs(img, servers[WRITETHROUGH][1], servers[DIRECT][1], EXTRA_WRITES,
                       ("-w",), stop)
        miss = _pairs(img, servers[POOLED][1], servers[DIRECT][1], EXTRA_READS, (), stop)
        return write, miss
    finally:
        for process, _ in servers.values():
            _stop(process)
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)


def _pairs(img: str, slow: str, fast: str, count: int, extra: tuple, stop) -> float | None:
    """What an I/O through the server at ``slow`` takes beyond one through ``fast``:
    ``EXTRA_RUNS`` pairs of runs back to back, their order alternating; the median of the
    pairs' differences, at least 0 (None: stopped, or a run failed)."""
    diffs = []
    for k in range(EXTRA_RUNS):
        t = {}
        for sock in ((slow, fast), (fast, slow))[k % 2]:
            if stop():
                return None
            t[sock] = _bench(img, sock, count, extra)
            if t[sock] is None:
                return None
        diffs.append(t[slow] - t[fast])
    return max(0.0, float(np.median(diffs)))


def _serve(nbd: str, data: str, tmp: str, aio: str, cache: str):
    """``(process, socket)``: a qemu-nbd of ``data`` through one path, its socket None
    when it did not come up within ``SERVE_WAIT`` s."""
    sock = os.path.join(tmp, f"{aio}-{cache}.sock")
    p = subprocess.Popen([nbd, "--persistent", "-f", "raw", f"--cache={cache}",
                          f"--aio={aio}", "-k", sock, data],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + SERVE_WAIT
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > end:
            return p, None
        time.sleep(0.02)
    return p, sock


def _stop(p) -> None:
    """Stop a qemu-nbd this started, by its pid."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _bench(img: str, sock: str, count: int, extra: tuple) -> float | None:
    """Seconds an I/O took (the mean of ``count``, 4 KiB, queue depth 1) through the
    qemu-nbd at ``sock``; None when the run failed."""
    try:
        r = subprocess.run([img, "bench", "-f", "raw", *extra, "-c", str(count), "-d", "1",
                            "-s", "4096", f"nbd+unix:///?socket={sock}"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"Run completed in ([0-9.]+) seconds", r.stdout)
    return float(m.group(1)) / count if m and r.returncode == 0 else None


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _scratch(directory: str) -> int | None:
    """An unnamed file of ``SCRATCH`` bytes, written and synced, in ``directory``
    (``O_TMPFILE``: gone at close); None where none can be made (a read-only or full file
    system, one without ``O_TMPFILE``)."""
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        os.pwrite(fd, b"\1" * SCRATCH, 0)
        os.fsync(fd)
        return fd
    except OSError:
        os.close(fd)
        return None


def _median_s(chunks: list) -> float | None:
    """The median of waits kept in ``chunks`` (ns arrays), seconds; None without any."""
    waits = np.concatenate(chunks) if chunks else np.zeros(0)
    return float(np.median(waits)) / 1e9 if waits.size else None


class IOWatch:
    """The reads and writes of one image over a window (see the module's theory).

    ``direct`` and ``paged`` are the tracers (``DirectIOTracer``, ``TraceReader``),
    either None where that path is not watched; ``probe`` a ``MissCost`` for a disk
    through the page cache (None for direct I/O)."""

    def __init__(self, image, *, direct=None, paged=None, probe: MissCost | None = None,
                 clock=time.monotonic):
        self.image, self.direct, self.paged, self.probe = image, direct, paged, probe
        self.page_size = libc.PAGE_SIZE
        self.mrc = MissRatioCurve.for_image(max(1, image.size // self.page_size),
                                            half_life=0.0, steady=True,
                                            max_per_second=SAMPLED_PER_SECOND)
        self.tally = Tally()
        self._misses = GuestMisses()        # the guest's misses timed since the last probe
        self._batches = Batches()           # the page cache's READ events -> ranges read
        self.block_reads = np.zeros(max(1, -(-image.size // BLOCK)), dtype=np.int64)
        self.clock = clock
        self._start = self._last_fed = self._last_probe = clock()

    @property
    def buffered(self) -> bool:
        """Through the page cache: watched there, and more of its reads were seen there."""
        t = self.tally
        return self.paged is not None and (self.direct is None
                                           or 0 < t.paged_reads >= t.direct_reads)

    def drain(self) -> None:
        """Take what the tracers hold into the tally and the curve; probe a miss now and then."""
        now = self.clock()
        seconds, self._last_fed = now - self._last_fed, now
        t = self.tally
        pages = []
        if self.direct is not None:
            ev = self.direct.drain()
            r = ~ev.write
            t.direct_reads += int(r.sum())
            t.direct_writes += int(ev.write.sum())
            t.direct_read_bytes += int(ev.length[r].sum())
            t.direct_write_bytes += int(ev.length[ev.write].sum())
            timed = ev.latency >= 0                 # 1 in 16 offsets: submission traced
            t.read_wait_ns += int(ev.latency[r & timed].sum())
            t.write_wait_ns += int(ev.latency[ev.write & timed].sum())
            t.timed_reads += int((r & timed).sum())
            t.timed_writes += int((ev.write & timed).sum())
            t.waits.append(ev.latency[r & timed])
            t.write_waits.append(ev.latency[ev.write & timed])
            t.lost += ev.lost
            first = ev.offset[r] // self.page_size
            last = (ev.offset[r] + np.maximum(ev.length[r], 1) - 1) // self.page_size
            pages.append((first, last))
        if self.paged is not None:
            ev = self.paged.drain()
            reads = ev.kind == READ
            first, last = self._batches.ranges(ev.first[reads], ev.last[reads], ev.ts[reads])
            pages.append((first, last))
            t.pages_read += int((last - first + 1).sum())
            t.pages_added += int((ev.last[ev.kind == ADD] - ev.first[ev.kind == ADD] + 1).sum())
            t.paged_writes += int((ev.kind == WRITE).sum())
            t.paged_reads += int(reads.sum())
            t.lost += ev.lost
            self._misses.add(ev)
        if pages:
            first = np.concatenate([f for f, _ in pages])
            last = np.concatenate([l for _, l in pages])
            self.mrc.feed_ranges(first, last, seconds=seconds)
            blocks = pages_read(first, last) * self.page_size // BLOCK
            self.block_reads += np.bincount(blocks[blocks < self.block_reads.size],
                                            minlength=self.block_reads.size)
        self.mrc.decay(seconds)           # no half-life: it only ages, the window's length
        t.seconds = now - self._start
        # probe only a disk seen through the page cache: a direct tracer of the same image
        # would take the probes' own O_DIRECT reads for the guest's
        if self.probe is not None and self.buffered and now - self._last_probe >= PROBE_EVERY:
            self._last_probe = now
            misses = self._misses.take()
            if misses[1] >= PROBES:             # the guest's own: no residency to probe
                res = np.zeros(0, np.float32)
            else:
                res = residency.scan(self.image.fd, self.image.size,
                                     self.probe.block_size).fraction()
            self.probe.cycle(res, self.image.size, misses)

    def watched(self, hit: float, path: PathCost | None = None) -> Watched:
        """The window's measures, for ``what_if.forecast``; ``hit``: a cached read's wait;
        ``path`` (``switch_cost``): what a switch to ``cache=writethrough`` costs."""
        t = self.tally
        secs = max(t.seconds, 1e-9)
        buffered = self.buffered
        miss = read_wait = write_wait = None
        typical = write_typical = None
        if t.timed_reads:
            read_wait = miss = t.read_wait_ns / t.timed_reads / 1e9
            typical = _median_s(t.waits)
        if t.timed_writes:
            write_wait = t.write_wait_ns / t.timed_writes / 1e9
            write_typical = _median_s(t.write_waits)
        if buffered:
            miss = self.probe.seconds if self.probe is not None else None
            now = cache_hit_ratio(t.pages_read, t.pages_added) or 0.0
            read_wait = None if miss is None else now * hit + (1 - now) * miss
            typical = write_typical = None
        return Watched(image_bytes=self.image.size, page_size=self.page_size,
                       reads_per_second=(t.paged_reads if buffered else t.direct_reads) / secs,
                       writes_per_second=(t.paged_writes if buffered else t.direct_writes)
                       / secs,
                       read_wait=read_wait, write_wait=write_wait, miss=miss, hit=hit,
                       miss_typical=typical, write_typical=write_typical,
                       pages_read=self.mrc.reads,
                       hit_ratio_now=(cache_hit_ratio(t.pages_read, t.pages_added) or 0.0)
                       if buffered else 0.0, buffered=buffered,
                       path_extra=None if path is None else path.read,
                       write_extra=None if path is None else path.write,
                       miss_extra=None if path is None else path.miss)

    def read_waits_ns(self) -> np.ndarray:
        """Every direct read's wait in the window, ns."""
        t = self.tally
        return np.concatenate(t.waits) if t.waits else np.zeros(0, dtype=np.int64)

    def close(self) -> None:
        for x in (self.direct, self.paged, self.probe):
            if x is not None:
                x.close()
