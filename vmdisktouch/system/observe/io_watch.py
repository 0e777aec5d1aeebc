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
device); through the page cache, ``MissCost``'s timed ``O_DIRECT`` reads of
pages nobody has cached, a few a second. A read the page cache serves
waits ``page_cache_read_time``: timed 4 KiB reads of a page of an anonymous
memory file (``memfd``: the same page-cache read path, no device), so
nothing of the image is read through the cache. That is the copy only: a
read through QEMU's buffered path (``aio=threads``: a worker thread, its
wake-up and the completion's) takes more than through its direct path
(``aio=native``) besides the wait at the device. ``qemu_path_cost``
measures the difference through QEMU itself: ``qemu-img bench`` (4 KiB
reads at queue depth 1) through ``qemu-nbd`` serving a 1 MiB file in memory
(tmpfs, which takes ``O_DIRECT`` since Linux 6.6) with
``--cache=writethrough --aio=threads`` and with ``--cache=none
--aio=native`` (one server each), ``EXTRA_RUNS`` pairs of runs back to back
(A B, B A, ...), the median of the pairs' differences, at least 0. Not
steady on a loaded machine: on this shared one (load 4 to 7 on 2 cores)
single runs' differences went from -20 to 60 µs, and the median of five
pairs from 0 to 60 µs. The least of each path instead was steadier (5-13
µs for a read) but is wrong for writes: it picks the luckiest flushes (48-72
µs, where the benchmark's writes took about 130 µs more, as the median said).
On this project's test machine: 10-20 µs an I/O; issue 55 found reads 7-13
µs faster after a switch where a free hit promised 21-28 µs. It is measured
before the watch, while nothing of advise's own runs besides.

What a write would pay after a switch to ``cache=writethrough`` (a flush per
write): the same, 4 KiB writes through ``qemu-nbd`` both ways, of a scratch
file on the image's file system (``O_TMPFILE`` in its directory: no name,
gone at close; never the image itself). Timing ``pwrite`` + ``fdatasync``
from Python gave 60 µs here where QEMU's writethrough write took 160 µs more
than its direct one: QEMU flushes through its thread pool too, a second hop.
A block device gets no write cost (``write`` None: said as not measured).

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
from vmdisktouch.core.mrc import MissRatioCurve, batch_ends, pages_read
from vmdisktouch.core.what_if import Watched, cache_hit_ratio
from vmdisktouch.errors import VmdtError
from vmdisktouch.system import files, image_lock, libc
from vmdisktouch.system.image import first_page_cached
from vmdisktouch.system.observe import residency
from vmdisktouch.system.observe.miss_cost import MissCost

PROBE_EVERY = 1.0          # s between miss-cost probes of a buffered disk
HIT_SAMPLES = 2000         # timed reads of ``page_cache_read_time``
BLOCK = 1 << 20            # the unit the daemon holds: reads counted per block of it
PATHS = ("threads", "native")   # QEMU's buffered path, its direct path
EXTRA_READS = 2000         # reads of each ``qemu_path_extra`` run
EXTRA_WRITES = 500         # writes of each run (on the image's file system)
EXTRA_RUNS = 5             # pairs of runs, one of each path (A B, B A, ...)
SCRATCH = 1 << 20          # bytes of each scratch file
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
    is ``O_DIRECT`` (from ``/proc/PID/fdinfo``); the caller's own and the serving
    daemon's are left out (``scan_openers``)."""
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
        else:
            out[pid] = direct
    return Openers(out, daemon)


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
    """What QEMU's buffered path (``cache=writethrough``, ``aio=threads``) costs beyond its
    direct one (``cache=none``, ``aio=native``), seconds an I/O at queue depth 1: ``read``
    of a page in memory, ``write`` of a page on the image's file system (None: not
    measured)."""
    read: float | None
    write: float | None


def qemu_path_cost(image_paths: list[str], stop=lambda: False, reads: int = EXTRA_READS,
                   writes: int = EXTRA_WRITES, runs: int = EXTRA_RUNS) -> dict[str, PathCost]:
    """Each image's ``PathCost`` measured through QEMU itself (module docstring):
    ``qemu-img bench`` through ``qemu-nbd`` both ways, reads of files in tmpfs (once),
    writes of unnamed scratch files in each regular file's directory (once per file
    system). ``stop()`` true ends it early: what is left is not measured."""
    nbd, img = shutil.which("qemu-nbd"), shutil.which("qemu-img")
    if not nbd or not img:
        return {p: PathCost(None, None) for p in image_paths}
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    tmp = tempfile.mkdtemp(prefix="vmdisktouch-path-", dir=where)
    try:
        data = {}
        for aio in PATHS:
            data[aio] = os.path.join(tmp, f"{aio}.raw")
            with open(data[aio], "wb") as f:
                f.write(b"\0" * SCRATCH)
        read = _both_ways(nbd, img, data, tmp, reads, runs, (), stop)
        by_dev: dict = {}
        out = {}
        for path in image_paths:
            try:
                dev = os.stat(os.path.dirname(os.path.abspath(path))).st_dev
            except OSError:
                dev = None
            if dev not in by_dev:
                by_dev[dev] = None
                fds = {} if stop() else {aio: _scratch(path) for aio in PATHS}
                try:
                    if fds and None not in fds.values():
                        by_dev[dev] = _both_ways(
                            nbd, img, {aio: f"/proc/{os.getpid()}/fd/{fd}"
                                       for aio, fd in fds.items()},
                            tmp, writes, runs, ("-w",), stop)
                finally:
                    for fd in fds.values():
                        if fd is not None:
                            os.close(fd)
            out[path] = PathCost(read, by_dev[dev] if _regular(path) else None)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _scratch(image_path: str | None) -> int | None:
    """An unnamed file of ``SCRATCH`` bytes, written and synced, in the directory of a
    regular file ``image_path`` (``O_TMPFILE``: gone at close); None where none can be
    made (a block device, a read-only or full file system)."""
    if not image_path:
        return None
    try:
        if not stat.S_ISREG(os.stat(image_path).st_mode):
            return None
        fd = os.open(os.path.dirname(os.path.abspath(image_path)),
                     os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        os.pwrite(fd, b"\1" * SCRATCH, 0)
        os.fsync(fd)
        return fd
    except OSError:
        os.close(fd)
        return None


def _both_ways(nbd: str, img: str, data: dict, tmp: str, count: int, runs: int,
               extra: tuple, stop) -> float | None:
    """What an I/O through the buffered path takes beyond one through the direct path: one
    qemu-nbd each (``data[aio]``, its own file: a second server of one file would not get
    its write lock), ``runs`` pairs of runs back to back, their order alternating; the
    median of the pairs' differences (a pair shares the load of its moment), at least 0."""
    servers: dict = {}
    try:
        for aio in PATHS:
            servers[aio] = _serve(nbd, data[aio], tmp, aio)
            if servers[aio][1] is None:
                return None
        diffs = []
        for k in range(runs):
            t = {}
            for aio in (PATHS, PATHS[::-1])[k % 2]:
                if stop():
                    return None
                t[aio] = _bench(img, servers[aio][1], count, extra)
                if t[aio] is None:
                    return None
            diffs.append(t["threads"] - t["native"])
        return max(0.0, float(np.median(diffs)))
    finally:
        for p, _ in servers.values():
            _stop(p)


def _serve(nbd: str, data: str, tmp: str, aio: str):
    """``(process, socket)``: a qemu-nbd of ``data`` through one path, its socket None
    when it did not come up."""
    sock = os.path.join(tmp, f"{aio}.sock")
    cache = "writethrough" if aio == "threads" else "none"
    p = subprocess.Popen([nbd, "--persistent", "-f", "raw", f"--cache={cache}",
                          f"--aio={aio}", "-k", sock, data],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 5
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
    qemu-nbd at ``sock``."""
    try:
        r = subprocess.run([img, "bench", "-f", "raw", *extra, "-c", str(count), "-d", "1",
                            "-s", "4096", f"nbd+unix:///?socket={sock}"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"Run completed in ([0-9.]+) seconds", r.stdout)
    return float(m.group(1)) / count if m and r.returncode == 0 else None


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
            t.lost += ev.lost
            first = ev.offset[r] // self.page_size
            last = (ev.offset[r] + np.maximum(ev.length[r], 1) - 1) // self.page_size
            pages.append(pages_read(first, last))
        if self.paged is not None:
            ev = self.paged.drain()
            reads = ev.kind == READ
            first = ev.first[reads]
            got = pages_read(first, batch_ends(first, ev.last[reads]))
            pages.append(got)
            t.pages_read += int(got.size)
            t.pages_added += int((ev.last[ev.kind == ADD] - ev.first[ev.kind == ADD] + 1).sum())
            t.paged_writes += int((ev.kind == WRITE).sum())
            t.paged_reads += int(reads.sum())
            t.lost += ev.lost
        if pages:
            read = np.concatenate(pages)
            self.mrc.feed(read, seconds=seconds)
            blocks = read * self.page_size // BLOCK
            self.block_reads += np.bincount(blocks[blocks < self.block_reads.size],
                                            minlength=self.block_reads.size)
        t.seconds = now - self._start
        # probe only a disk seen through the page cache: a direct tracer of the same image
        # would take the probes' own O_DIRECT reads for the guest's
        if self.probe is not None and self.buffered and now - self._last_probe >= PROBE_EVERY:
            self._last_probe = now
            res = residency.scan(self.image.fd, self.image.size, self.probe.block_size)
            self.probe.probe(res.fraction(), self.image.size)

    def watched(self, hit: float, path: PathCost | None = None) -> Watched:
        """The window's measures, for ``what_if.forecast``; ``hit``: a cached read's wait;
        ``path`` (``qemu_path_cost``): what a switch to ``cache=writethrough`` costs."""
        t = self.tally
        secs = max(t.seconds, 1e-9)
        buffered = self.buffered
        miss = read_wait = write_wait = None
        if t.timed_reads:
            read_wait = miss = t.read_wait_ns / t.timed_reads / 1e9
        if t.timed_writes:
            write_wait = t.write_wait_ns / t.timed_writes / 1e9
        if buffered:
            miss = self.probe.seconds if self.probe is not None else None
            now = cache_hit_ratio(t.pages_read, t.pages_added) or 0.0
            read_wait = None if miss is None else now * hit + (1 - now) * miss
        return Watched(image_bytes=self.image.size, page_size=self.page_size,
                       reads_per_second=(t.paged_reads if buffered else t.direct_reads) / secs,
                       writes_per_second=(t.paged_writes if buffered else t.direct_writes)
                       / secs,
                       read_wait=read_wait, write_wait=write_wait, miss=miss, hit=hit,
                       pages_read=self.mrc.reads,
                       hit_ratio_now=(cache_hit_ratio(t.pages_read, t.pages_added) or 0.0)
                       if buffered else 0.0, buffered=buffered, seconds=t.seconds,
                       path_extra=None if path is None else path.read,
                       write_extra=None if path is None else path.write)

    def read_waits_ns(self) -> np.ndarray:
        """Every direct read's wait in the window, ns."""
        t = self.tally
        return np.concatenate(t.waits) if t.waits else np.zeros(0, dtype=np.int64)

    def close(self) -> None:
        for x in (self.direct, self.paged, self.probe):
            if x is not None:
                x.close()
