"""The guest-like workload under memory pressure: shared by the demo, the benchmarks and tests.

What a VM disk attached with ``cache=writethrough`` does on the host is
buffered 4 KiB random I/O on the image file: reads, and writes opened with
``O_DSYNC``. We reproduce it with fio (``ioengine=psync``, ``direct=0``,
``sync=dsync``, iodepth 1, one job) with most accesses falling in a hot zone
(``random_distribution=zoned_abs``). Host memory pressure comes from a
memory-limited cgroup v1 group (``/sys/fs/cgroup/memory``, as libvirt's
``machine.slice`` confines a VM) that holds the workload and a "noisy
neighbour" streaming another file: the page cache they fault in is charged to
the group and reclaimed by LRU at its limit, so without help the hot zone's
pages keep getting evicted.

Pieces (each usable alone):

* ``MemoryCgroup``: create a group with a limit, start processes inside it,
  read usage / failcnt / OOM kills / unevictable bytes, tear it down.
* ``make_image`` (non-sparse, data really on disk), ``make_sparse``, ``evict``.
* ``FioJob``: the guest-like job (hot zones, hot share, read mix, runtime,
  per-second IOPS log) -> fio argv; ``FioRun``: runs it, parsing fio's
  per-second JSON status from its stdout into live per-interval IOPS;
  ``parse_iops_log``: fio's ``write_iops_log`` file -> per-interval IOPS.
* ``start_neighbour``: the noisy neighbour (a rate-limited sequential fio
  reader of a large file, in the group).
* ``VmtouchLock``: ``vmtouch -l`` of a byte range (the oracle), outside the group.
* ``Daemon``: ``vmdisktouch run`` as a child process, with its status file.
* ``vmlck``: the ``VmLck`` of a process, ``steady_median`` and friends.

Hazard: pages are charged to the cgroup of the process that first faults them.
Hot-zone pages the workload faulted in are charged to the workload's group;
when the daemon (or vmtouch) mlocks them they stay charged there and become
*unevictable* inside the group. If the held bytes charged to the group
approach its limit, the group can no longer reclaim and the kernel OOM-kills
the workload. Pages the holder faults in itself are charged to the holder's
own group (here the root). So a scenario must keep
``budget + the workload's and neighbour's working memory < limit`` with a
margin; ``check_budget_vs_limit`` enforces it, and ``MemoryCgroup.oom_kills``
and ``MemoryCgroup.unevictable_bytes`` report what happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from vmdisktouch.errors import VmdtError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")
CGROUP_MEMORY_ROOT = "/sys/fs/cgroup/memory"


class WorkloadError(VmdtError):
    """The workload harness cannot run (no cgroup v1 memory controller, no fio...)."""


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise WorkloadError(f"{name} is not installed (Debian package: {name}; `make deps` installs it)")
    return path


# --------------------------------------------------------------------------
# cgroup v1 memory group

class MemoryCgroup:
    """A cgroup v1 memory group with a limit, as a context manager.

    >>> with MemoryCgroup("demo", 768 * MiB) as cg:
    ...     p = cg.popen(["fio", ...])        # the child joins the group before exec
    ...     cg.usage(), cg.failcnt(), cg.oom_kills()

    On exit every process still in the group is killed (they are ours: only
    processes we started were put in it), and the group is removed with
    ``rmdir``; the page cache still charged to it moves to the parent.
    """

    def __init__(self, tag: str, limit_bytes: int, root: str = CGROUP_MEMORY_ROOT):
        self.root = root
        self.limit_bytes = int(limit_bytes)
        self.name = f"vmdt-{tag}-{os.getpid()}"
        self.path = os.path.join(root, self.name)
        self._created = False

    # -- life cycle --
    def create(self) -> "MemoryCgroup":
        if not os.path.exists(os.path.join(self.root, "memory.limit_in_bytes")):
            raise WorkloadError(
                f"no cgroup v1 memory controller at {self.root} (memory.limit_in_bytes missing); "
                "the pressure scenario needs it (mount -t cgroup -o memory memory " f"{self.root})")
        try:
            os.mkdir(self.path)
        except FileExistsError:
            pass
        except OSError as exc:
            raise WorkloadError(f"cannot create cgroup {self.path}: {exc.strerror} (run as root)") from None
        self._created = True
        self._write("memory.limit_in_bytes", str(self.limit_bytes))
        got = int(self._read("memory.limit_in_bytes"))
        if abs(got - self.limit_bytes) > PAGE:
            raise WorkloadError(f"cgroup {self.path}: limit {self.limit_bytes} not accepted (got {got})")
        return self

    def __enter__(self) -> "MemoryCgroup":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def cleanup(self, timeout: float = 10.0) -> None:
        """Kill what is still in the group (ours), then rmdir it. Idempotent."""
        if not self._created or not os.path.isdir(self.path):
            self._created = False
            return
        deadline = time.monotonic() + timeout
        sig = signal.SIGTERM
        while True:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
            if time.monotonic() > deadline - timeout / 2:
                sig = signal.SIGKILL
            if time.monotonic() > deadline:
                break
        for _ in range(50):
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            print(f"warning: could not remove cgroup {self.path}", file=sys.stderr)
        self._created = False

    # -- processes --
    def wrap(self, argv: list[str]) -> list[str]:
        """argv that joins this group, then execs ``argv`` (so every page it faults is charged here)."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.wrap(argv), **kw)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self._read("cgroup.procs").split()]
        except FileNotFoundError:
            return []

    # -- counters --
    def usage(self) -> int:
        return int(self._read("memory.usage_in_bytes"))

    def max_usage(self) -> int:
        return int(self._read("memory.max_usage_in_bytes"))

    def failcnt(self) -> int:
        """How often usage hit the limit (normal under pressure: that is reclaim)."""
        return int(self._read("memory.failcnt"))

    def oom_kills(self) -> int:
        """Processes OOM-killed in this group (``oom_kill`` of memory.oom_control)."""
        for line in self._read("memory.oom_control").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def stat(self) -> dict[str, int]:
        out = {}
        for line in self._read("memory.stat").splitlines():
            k, _, v = line.partition(" ")
            try:
                out[k] = int(v)
            except ValueError:
                pass
        return out

    def unevictable_bytes(self) -> int:
        """Page cache charged to this group that someone mlocked (the hazard above)."""
        return self.stat().get("unevictable", 0)

    def counters(self) -> dict[str, int]:
        s = self.stat()
        return {"usage": self.usage(), "max_usage": self.max_usage(), "failcnt": self.failcnt(),
                "oom_kills": self.oom_kills(), "unevictable": s.get("unevictable", 0),
                "cache": s.get("cache", 0)}

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def _write(self, name: str, value: str) -> None:
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError as exc:
            raise WorkloadError(f"cannot write {value} to {self.path}/{name}: {exc.strerror}") from None


def check_budget_vs_limit(budget: int, limit: int, margin: int = 192 * MiB) -> None:
    """Refuse scenarios where held pages charged to the group could OOM it.

    In the worst case every byte the daemon holds was first faulted by the
    workload and stays charged, unevictable, to the workload's group.
    """
    if budget + margin > limit:
        raise WorkloadError(
            f"budget {budget >> 20} MiB + margin {margin >> 20} MiB exceeds the cgroup limit "
            f"{limit >> 20} MiB: held pages charged to the group would OOM the workload")


# --------------------------------------------------------------------------
# files

def make_image(path: str, size: int, chunk: int = 16 * MiB, progress=None) -> str:
    """Write a non-sparse image of ``size`` bytes with distinct pseudo-random pages.

    Every byte is really written and fsynced (``fallocate`` alone would leave
    unwritten extents that read as zeroes without disk I/O). A random 16 MiB
    buffer is written over and over with each 4 KiB page stamped with its
    page number, so no two pages are equal. The image is evicted from the page
    cache at the end. ``progress(done, size)`` is called now and then.
    """
    import numpy as np
    rng = np.random.default_rng(0x5EED)
    base = rng.integers(0, 2**63, size=chunk // 8, dtype=np.uint64)
    per_page = PAGE // 8
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        last = 0.0
        while done < size:
            n = min(chunk, size - done)
            buf = base.copy()
            pages = buf.reshape(-1, per_page)
            pages[:, 0] = np.arange(done // PAGE, done // PAGE + pages.shape[0], dtype=np.uint64)
            mv = memoryview(buf).cast("B")[:n]
            while mv:
                w = os.write(fd, mv)
                mv = mv[w:]
            done += n
            if done % (256 * MiB) == 0 or done == size:
                # keep dirty pages bounded and the image out of the cache as we go
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, done, os.POSIX_FADV_DONTNEED)
            if progress and (time.monotonic() - last > 1 or done == size):
                last = time.monotonic()
                progress(done, size)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_blocks * 512 < size:
        raise WorkloadError(f"{path}: only {st.st_blocks * 512} of {size} bytes allocated")
    return path


def make_sparse(path: str, size: int) -> str:
    """A sparse file: reading it fills the page cache (charged to the reader's cgroup) without disk I/O."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def evict(path: str) -> None:
    """Drop a file's clean page cache (fsync first: dirty pages are not dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            os.fsync(fd)
        except OSError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path: str, offset: int = 0, length: int | None = None) -> int:
    """Resident bytes of a file range, at 1 MiB granularity (``offset`` and
    ``length`` are rounded out to whole MiB). Uses ``residency.scan``."""
    from vmdisktouch.system import residency
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        r = residency.scan(fd, size, MiB)
        end = size if length is None else min(size, offset + length)
        return int(r.counts[offset // MiB: -(-end // MiB)].sum(dtype="int64")) * r.page_size
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# fio: the guest-like job

@dataclass
class FioJob:
    """The guest-like job: buffered 4k random I/O, O_DSYNC writes, most accesses in hot zones.

    ``hot_zones`` are ``(offset, length)`` byte ranges sharing ``hot_share``
    percent of the accesses equally; the rest fall uniformly on the remainder
    of the file. fio's ``zoned_abs`` takes integer percentages laid out as
    consecutive zones from the start of the file; ``zones()`` computes them.
    """

    filename: str
    size: int
    hot_zones: list[tuple[int, int]]
    hot_share: int = 90              # percent of accesses in the hot zones
    read_mix: int = 80               # percent reads (rwmixread)
    runtime: float = 60.0            # seconds
    block_size: int = 4096
    sync: str = "dsync"              # O_DSYNC writes, as QEMU cache=writethrough
    iops_log: str | None = None      # prefix for write_iops_log (per-second averages)
    status_interval: int = 1         # seconds between JSON status dumps on stdout
    name: str = "guest"
    seed: int | None = None          # randseed: same sequence in every scenario
    extra: list[str] = field(default_factory=list)
    zone_shares: list[float] | None = None   # percent per hot zone (same order); None: equal

    def zones(self) -> list[tuple[int, int]]:
        """[(percent, bytes)] consecutive zones covering the file, integer percents summing to 100."""
        if self.zone_shares is not None and len(self.zone_shares) != len(self.hot_zones):
            raise WorkloadError("zone_shares needs one share per hot zone")
        shares = dict(zip(self.hot_zones, self.zone_shares or [None] * len(self.hot_zones)))
        zones = sorted(self.hot_zones)
        cuts, prev = [], 0
        for off, length in zones:
            if off < prev or off + length > self.size or length <= 0:
                raise WorkloadError(f"bad hot zone {off}+{length} in a {self.size}-byte file")
            if off > prev:
                cuts.append(("cold", off - prev, None))
            cuts.append(("hot", length, shares[(off, length)]))
            prev = off + length
        if prev < self.size:
            cuts.append(("cold", self.size - prev, None))
        cold_total = sum(n for k, n, _ in cuts if k == "cold")
        hot_share = self.hot_share if cold_total else 100
        if self.zone_shares is not None:
            hot_share = sum(self.zone_shares) if cold_total else 100
            scale = hot_share / sum(self.zone_shares)
        nhot = len(zones)
        # integer percents, largest remainder so they sum to exactly 100
        raw = [((share * scale if share is not None else hot_share / nhot) if k == "hot"
                else (100 - hot_share) * n / cold_total) for k, n, share in cuts]
        pct = [int(x) for x in raw]
        for i in sorted(range(len(raw)), key=lambda i: raw[i] - pct[i], reverse=True)[:100 - sum(pct)]:
            pct[i] += 1
        return [(p, n) for p, (_, n, _s) in zip(pct, cuts)]

    def argv(self, fio: str = "fio") -> list[str]:
        dist = "zoned_abs:" + ":".join(f"{p}/{n}" for p, n in self.zones())
        a = [fio, f"--name={self.name}", f"--filename={self.filename}", f"--size={self.size}",
             "--ioengine=psync", f"--bs={self.block_size}", "--rw=randrw",
             f"--rwmixread={self.read_mix}", f"--sync={self.sync}", "--direct=0",
             "--iodepth=1", "--numjobs=1", "--invalidate=0", "--norandommap",
             "--fadvise_hint=0",  # as QEMU: no POSIX_FADV_RANDOM, the kernel's readahead decides
             f"--random_distribution={dist}", "--time_based", f"--runtime={self.runtime:g}",
             f"--status-interval={self.status_interval}", "--output-format=json"]
        if self.seed is not None:
            a.append(f"--randseed={self.seed}")
        if self.iops_log:
            a += [f"--write_iops_log={self.iops_log}", "--log_avg_msec=1000"]
        return a + list(self.extra)


@dataclass
class Interval:
    """One status interval of a running fio job."""
    t: float          # seconds since the run started (end of the interval, monotonic clock)
    runtime_s: float  # fio's job runtime at the end of the interval
    iops: float       # total (read + write) IOPS over the interval
    read_iops: float
    write_iops: float


class FioRun:
    """Run a ``FioJob`` (optionally inside a cgroup) and parse its status stream live.

    fio prints a full JSON document every ``status_interval`` seconds; the
    difference of cumulative ``total_ios`` over the difference of
    ``job_runtime`` gives the IOPS of each interval. ``on_interval(iv)`` is
    called from the reader thread for each one.
    """

    def __init__(self, job: FioJob, cgroup: MemoryCgroup | None = None, on_interval=None,
                 stderr_path: str | None = None):
        self.job = job
        self.cgroup = cgroup
        self.on_interval = on_interval
        self.intervals: list[Interval] = []
        self.final: dict | None = None
        self.t0 = 0.0
        self._stderr = open(stderr_path, "wb") if stderr_path else subprocess.DEVNULL
        self.proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "FioRun":
        argv = self.job.argv(require_tool("fio"))
        if self.cgroup:
            argv = self.cgroup.wrap(argv)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        dec = json.JSONDecoder()
        buf = ""
        last = (0.0, 0, 0)
        for line in iter(self.proc.stdout.readline, b""):
            buf += line.decode(errors="replace")
            if not line.startswith(b"}"):
                continue
            start = buf.find("{")
            try:
                doc, _ = dec.raw_decode(buf, start)
            except ValueError:
                continue
            buf = ""
            self.final = doc
            try:
                j = doc["jobs"][0]
                rt = j["job_runtime"] / 1000.0
                r, w = j["read"]["total_ios"], j["write"]["total_ios"]
            except (KeyError, IndexError, TypeError):
                continue
            dt = rt - last[0]
            if dt < 0.5:          # the short tail fio reports when it stops: too noisy
                continue
            iv = Interval(t=time.monotonic() - self.t0, runtime_s=rt,
                          iops=(r + w - last[1] - last[2]) / dt,
                          read_iops=(r - last[1]) / dt, write_iops=(w - last[2]) / dt)
            last = (rt, r, w)
            self.intervals.append(iv)
            if self.on_interval:
                self.on_interval(iv)

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout)
        self._thread.join(5)
        return rc

    def stop(self) -> None:
        """SIGTERM (fio stops cleanly and writes its logs), then SIGKILL."""
        stop_process(self.proc, signal.SIGTERM, 10)
        if self._thread:
            self._thread.join(5)
        if self._stderr is not subprocess.DEVNULL:
            self._stderr.close()


def parse_iops_log(path: str, avg_msec: int = 1000) -> list[tuple[float, float, float, float]]:
    """fio's ``write_iops_log`` file -> ``[(t_seconds, total, read, write)]`` per interval.

    Lines are ``time_ms, iops, ddir, bs, offset[, prio]``; with
    ``log_avg_msec`` each line is the average IOPS of one direction over one
    window, so the windows are summed over directions (0 read, 1 write).
    ``path`` may be the prefix given to fio (``PREFIX_iops.1.log`` is read).
    """
    if not os.path.exists(path) and os.path.exists(f"{path}_iops.1.log"):
        path = f"{path}_iops.1.log"
    buckets: dict[int, list[float]] = {}
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 3:
                continue
            t_ms, value, ddir = int(parts[0]), float(parts[1]), int(parts[2])
            b = buckets.setdefault(round(t_ms / avg_msec), [0.0, 0.0])
            if ddir in (0, 1):
                b[ddir] += value
    return [(k * avg_msec / 1000.0, r + w, r, w) for k, (r, w) in sorted(buckets.items())]


# --------------------------------------------------------------------------
# the noisy neighbour

def neighbour_job(path: str, rate: int, runtime: float = 3600.0, size: int | None = None,
                  pattern: str = "randread", block_size: int = 64 * KiB) -> list[str]:
    """fio argv of the noisy neighbour: reads ``path`` at ``rate`` bytes/s until stopped.

    The default is another VM with a busy working set: buffered random
    ``block_size`` reads spread uniformly over ``size`` bytes of ``path``
    (``pattern="read"`` streams it sequentially instead). A neighbour whose
    pages are re-read sooner than the guest's hot pages wins the kernel's LRU
    (its pages get activated), which is what evicts the guest's hot zone; a
    pure sequential stream mostly does not, because the hot zone's pages are
    on the active list and a stream only churns the inactive one.

    With a sparse ``path`` the page cache is filled (and charged to the
    group) without disk I/O: the neighbour then competes for memory only, not
    for the disk, so the comparison measures caching alone.
    """
    if pattern not in ("randread", "read"):
        raise WorkloadError(f"neighbour pattern must be randread or read, not {pattern!r}")
    a = [require_tool("fio"), "--name=neighbour", f"--filename={path}", "--ioengine=psync",
         f"--rw={pattern}", f"--bs={block_size}", "--direct=0", "--invalidate=0",
         "--norandommap", "--fadvise_hint=0", "--time_based", f"--runtime={runtime:g}",
         "--output-format=terse"]
    if size:
        a.append(f"--size={size}")
    if rate:
        a.append(f"--rate={rate}")
    return a


def start_neighbour(cgroup: MemoryCgroup, path: str, rate: int, runtime: float = 3600.0,
                    size: int | None = None, pattern: str = "randread",
                    block_size: int = 64 * KiB) -> subprocess.Popen:
    """Start the noisy neighbour inside ``cgroup``; stop it with ``stop_process``."""
    return cgroup.popen(neighbour_job(path, rate, runtime, size, pattern, block_size),
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        stdin=subprocess.DEVNULL)


# --------------------------------------------------------------------------
# holders: vmtouch -l (oracle / whole image) and the daemon

ZONE_READER = ("import os, sys, time\n"
               "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
               "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)\n"
               "off, n, pause = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])\n"
               "while True:\n"
               "    for o in range(off, off + n, 1 << 20): os.pread(fd, 1 << 20, o)\n"
               "    time.sleep(pause)\n")


def zone_reader_argv(path: str, offset: int, length: int, pause: float = 0.1) -> list[str]:
    """A guest that reads ``[offset, offset+length)`` of ``path`` over and over (no readahead)."""
    return [sys.executable, "-c", ZONE_READER, path, str(offset), str(length), str(pause)]


def vmlck(pid: int) -> int:
    """Bytes mlocked by a process (``VmLck`` of /proc/PID/status); 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmLck:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def stop_process(proc: subprocess.Popen | None, sig=signal.SIGTERM, timeout: float = 10.0) -> int | None:
    """Signal one child we started, wait, SIGKILL it if it does not exit."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return None


class VmtouchLock:
    """``vmtouch -l`` of ``[offset, offset+length)`` of a file, in the foreground, until stopped.

    ``vmtouch -l`` mlocks the mapping (faulting the pages in) and then blocks
    until killed. ``-m`` is raised above the file size (its default, 500M,
    would skip big images). Run outside the workload's cgroup, the pages it
    faults in are charged to our own group.
    """

    def __init__(self, path: str, offset: int = 0, length: int | None = None):
        self.path = path
        size = os.path.getsize(path)
        self.offset = offset
        self.length = size - offset if length is None else length
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        size = os.path.getsize(self.path)
        rng = f"{self.offset}-{self.offset + self.length}"
        return [require_tool("vmtouch"), "-l", "-q", "-m", str(size + PAGE), "-p", rng, self.path]

    def start(self, timeout: float = 300.0) -> float:
        """Start and wait until the range is locked; returns the seconds it took."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # VmLck counts the range as soon as mlock marks the mapping, before the
        # pages are read in; so also wait until the range is resident.
        want = self.length - 2 * PAGE
        while vmlck(self.proc.pid) < want or resident_bytes(self.path, self.offset,
                                                            self.length) < want:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace").strip()
                raise WorkloadError(f"vmtouch -l exited ({self.proc.returncode}): {err}")
            if time.monotonic() - t0 > timeout:
                raise WorkloadError(f"vmtouch -l did not lock {self.length} bytes in {timeout:.0f} s")
            time.sleep(0.1)
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def held_bytes(self) -> int:
        return vmlck(self.pid) if self.proc else 0

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None


class Daemon:
    """``vmdisktouch run IMAGE --max-hold BUDGET ...`` as a child (outside the cgroup)."""

    def __init__(self, image: str, budget: int, interval: float = 2.0, status: str | None = None,
                 heat_png: str | None = None, map_png: str | None = None,
                 log_path: str | None = None, extra: list[str] | None = None):
        hold = f"{budget >> 20}M" if budget % (1 << 20) == 0 else str(budget)
        self.argv = [sys.executable, "-m", "vmdisktouch", "run", image, "--max-hold", hold,
                     "--interval", f"{interval:g}"]
        if status:
            self.argv += ["--status", status]
        if heat_png:
            self.argv += ["--heat-png", heat_png]
        if map_png:
            self.argv += ["--map-png", map_png]
        self.argv += list(extra or [])
        self.status_path = status
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> "Daemon":
        self._log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def held_bytes(self) -> int:
        return vmlck(self.pid) if self.alive() else 0

    def status(self) -> dict | None:
        if not self.status_path:
            return None
        try:
            with open(self.status_path) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None

    def log_tail(self, n: int = 5) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:]).strip()

    def stop(self, timeout: float = 10.0) -> int | None:
        rc = stop_process(self.proc, signal.SIGTERM, timeout)
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
            self._log = None
        return rc


# --------------------------------------------------------------------------
# statistics

def steady_median(values: list[float], skip: int) -> float:
    """Median after dropping the first ``skip`` values (warm-up); nan if nothing is left."""
    rest = list(values[skip:])
    return statistics.median(rest) if rest else float("nan")


def first_time_at_or_above(series: list[tuple[float, float]], level: float, hold: int = 3) -> float | None:
    """First t of ``[(t, v)]`` from which ``hold`` consecutive values are all >= level."""
    for i in range(len(series) - hold + 1):
        if all(v >= level for _, v in series[i:i + hold]):
            return series[i][0]
    return None


def fmt_bytes(n: float) -> str:
    return f"{n / MiB:.0f} MiB" if n < 10 * GiB else f"{n / GiB:.1f} GiB"

