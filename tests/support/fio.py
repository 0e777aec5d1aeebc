"""fio as the guest and as the noisy neighbour.

What a VM disk attached with ``cache=writethrough`` does on the host is
buffered 4 KiB random I/O on the image file: reads, and writes opened with
``O_DSYNC``. ``FioJob`` reproduces it (``ioengine=psync``, ``direct=0``,
``sync=dsync``, iodepth 1, one job) with most accesses falling in hot zones
(``random_distribution=zoned_abs``). With ``nbd_uri`` the same job goes
through QEMU's block layer instead (``tests.support.nbd``: ``qemu-nbd
--cache=writethrough``, fio's ``nbd`` engine); ``FioRun`` runs it and parses fio's
per-second JSON status into live per-interval IOPS (and cumulative latency per
direction: ``mean_latency_us`` of a window); ``parse_iops_log`` reads
fio's ``write_iops_log``, ``iolog_pages`` the reads of its ``write_iolog``.
``start_neighbour`` is the noisy neighbour, a rate-limited fio reader of another
file in the same cgroup.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from tests.support.cgroup import MemoryCgroup
from tests.support.common import KiB, WorkloadError, require_tool, stop_process


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
    nbd_uri: str | None = None       # through qemu-nbd (ioengine=nbd) instead of the file
    nbd_fsync: int = 1               # with nbd_uri: fio's fsync=N (0: no NBD flushes)

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

    def nbd_options(self) -> list[str]:
        """The same job through qemu-nbd: ``ioengine=nbd``, ``uri``, ``fsync=N``.

        fio's ``nbd`` engine opens no file, so it knows no ``O_DSYNC``, and it
        refuses ``fdatasync=N`` (EINVAL); ``fsync=N`` sends an NBD flush once N
        writes were issued since the last flush, which with ``randrw`` means
        after every I/O, reads included. qemu-nbd with ``--cache=writethrough``
        already runs ``fdatasync`` after each write and skips a flush with
        nothing written since its last one, so those flushes reach no disk;
        each costs a round trip.
        """
        return ["--ioengine=nbd", f"--uri={self.nbd_uri}", f"--bs={self.block_size}",
                "--rw=randrw", f"--rwmixread={self.read_mix}", "--iodepth=1", "--numjobs=1",
                "--norandommap"] + ([f"--fsync={self.nbd_fsync}"] if self.nbd_fsync else [])

    def argv(self, fio: str = "fio") -> list[str]:
        dist = "zoned_abs:" + ":".join(f"{p}/{n}" for p, n in self.zones())
        if self.nbd_uri:
            engine = self.nbd_options()
        else:
            engine = ["--ioengine=psync", f"--bs={self.block_size}", "--rw=randrw",
                      f"--rwmixread={self.read_mix}", f"--sync={self.sync}", "--direct=0",
                      "--iodepth=1", "--numjobs=1", "--invalidate=0", "--norandommap",
                      "--fadvise_hint=0"]  # as QEMU: no POSIX_FADV_RANDOM, the kernel's readahead decides
        a = [fio, f"--name={self.name}", f"--filename={self.filename}", f"--size={self.size}",
             *engine, f"--random_distribution={dist}", "--time_based", f"--runtime={self.runtime:g}",
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
    # fio's cumulative lat_ns (submission to completion) since the job started, per
    # direction: its sample count and mean; ``mean_latency_us`` takes a window's mean
    read_lat_n: int = 0
    read_lat_mean_ns: float = 0.0
    write_lat_n: int = 0
    write_lat_mean_ns: float = 0.0


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
                          read_iops=(r - last[1]) / dt, write_iops=(w - last[2]) / dt,
                          **_cumulative_latency(j))
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


def _cumulative_latency(job: dict) -> dict:
    """``Interval``'s latency fields from one job of fio's JSON (zeros where missing)."""
    out = {}
    for d in ("read", "write"):
        lat = (job.get(d) or {}).get("lat_ns") or {}
        try:
            out[f"{d}_lat_n"] = int(lat.get("N", job[d]["total_ios"]))
            out[f"{d}_lat_mean_ns"] = float(lat.get("mean", 0.0))
        except (KeyError, TypeError, ValueError):
            pass
    return out


def mean_latency_us(intervals: list[Interval], start: float = 0.0, ddir: str = "read") -> float:
    """Mean latency (fio's ``lat_ns``) in µs of the ``ddir`` I/Os completed from ``start`` s
    (``Interval.t``) to the last interval: from the cumulative means and counts at the
    last interval before ``start`` and at the end. NaN when there were none."""
    base, last = (0, 0.0), None
    for iv in intervals:
        cur = (getattr(iv, f"{ddir}_lat_n"), getattr(iv, f"{ddir}_lat_mean_ns"))
        if iv.t < start:
            base = cur
        last = cur
    if last is None or last[0] <= base[0]:
        return float("nan")
    return (last[0] * last[1] - base[0] * base[1]) / (last[0] - base[0]) / 1000.0


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



def iolog_pages(path: str, page: int = 4096) -> np.ndarray:
    """The pages of the reads fio's ``--write_iolog`` recorded, in order (iolog v2: FILE
    read OFF LEN; v3: TIME FILE read OFF LEN)."""
    pages = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[-3] == "read":
                pages.append(int(parts[-2]) // page)
    return np.array(pages, dtype=np.int64)
