"""The daemon's miss cost beside the guest's own: a real ``vmdisktouch run`` serving an
image that fio reads at queue depth 1 with ``O_DIRECT`` (every read a miss), fio's own
per-read completion latency log (``--write_lat_log``, ``log_avg_msec=0``) over the
daemon's probe window, and, for part of that window, a burst: a sequential reader of
the same device (``dd iflag=direct bs=1M``), the host's other work the probe meets.

    with device("fast" | "throttled", tmp_path) as dev:
        r = measure(tmp_path, dev, burst=True)
        r.daemon_us, r.fio_median_us, r.fio_mean_us, r.fio_burst_us

One wrapper for the e2e test (tests/e2e/test_miss_cost_follows_fio.py) and the
benchmark (benchmarks/bench_miss_cost.py). ``device("throttled")`` is a loop device
with direct I/O over a file on this machine's disk, its reads capped by the blkio
throttle of this process's group (``tests.support.blockdev``): a loaded array.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import subprocess
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from tests.support.blockdev import loop_device, read_throttle
from tests.support.cgroup import MemoryCgroup
from tests.support.common import MiB, require_tool, stop_process
from tests.support.daemon_proc import DaemonProc
from tests.support.images import evict, make_image

INTERVAL = 0.5            # the daemon's cycle: PROBES probe reads each
THROTTLE_IOPS = 400       # the loaded array's reads a second (fio's and the probe's)
IMAGE_BYTES = 512 * MiB
TENANT_DEPTH = 4          # the loaded disk's other tenant: random reads this many at once
GUEST_MEMORY = 64 * MiB   # a buffered guest's memory group: most of its reads miss
HIT_US = 10.0             # a buffered read faster than this came from memory, not a miss


@dataclass
class Reading:
    kind: str
    burst: bool
    daemon_us: float          # the status file's miss_cost.seconds
    probes: int
    fio_median_us: float      # fio's clat over the probe window
    fio_mean_us: float
    fio_burst_us: float       # fio's mean clat while the burst ran (nan without one)
    fio_quiet_mean_us: float  # fio's mean clat over the window but the burst
    fio_cpu_wait_us: float    # fio's run delay over the window, a read (its wait for a CPU)
    fio_reads: int
    window_s: float
    buffered: bool = False    # fio read through the page cache: its misses only are counted
    misses: int = 0           # the guest's misses the daemon's figure was taken over
    fio_hits: int = 0         # buffered: fio's reads from memory, left out

    def ratio(self) -> float:
        return self.daemon_us / self.fio_median_us

    @property
    def fio_device_us(self) -> float:
        """fio's mean clat less its wait for a CPU: what the daemon's figure counts."""
        return self.fio_mean_us - self.fio_cpu_wait_us

    @property
    def fio_quiet_device_us(self) -> float:
        return self.fio_quiet_mean_us - self.fio_cpu_wait_us


@contextlib.contextmanager
def device(kind: str, tmp_path):
    """The image to serve: a file on this machine's disk ("fast"), or a throttled loop
    device over one ("throttled"); its data written and evicted."""
    path = make_image(tmp_path / f"{kind}.raw", IMAGE_BYTES, sparse=False)
    evict(path)
    if kind == "fast":
        yield str(path)
        return
    with loop_device(str(path), direct_io=True) as dev:
        if kind == "throttled":
            with read_throttle(dev, THROTTLE_IOPS):
                yield dev
            return
        # "loaded": another tenant's random reads always queued on the same device
        load = subprocess.Popen(
            [require_tool("fio"), "--name=tenant", f"--filename={dev}", "--rw=randread",
             "--bs=4k", "--ioengine=libaio", "--direct=1", f"--iodepth={TENANT_DEPTH}",
             "--norandommap", "--time_based", "--runtime=3600", "--output=/dev/null"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield dev
        finally:
            stop_process(load)


def clat_log(prefix: str) -> np.ndarray:
    """fio's per-read completion latency log: rows of (ms since the job started, ns)."""
    rows = []
    for name in glob.glob(f"{prefix}_clat.*.log"):
        with open(name) as f:
            for line in f:
                parts = line.split(",")
                if len(parts) >= 3 and parts[2].strip() == "0":        # reads
                    rows.append((float(parts[0]), float(parts[1])))
    return np.array(sorted(rows), dtype=float).reshape(-1, 2)


def run_delay_ns(pid: int) -> int:
    """ns the tasks of ``pid`` and of its descendants waited on a run queue so far."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for tid in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else ():
            try:
                with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except (OSError, ValueError, IndexError):
                pass
    return total


def measure(tmp_path, image: str, kind: str = "", *, burst: bool, window_cycles: int = 16,
            burst_s: float = 1.5, cwd=None, args=(), buffered: bool = False,
            prefix=()) -> Reading:
    """Serve ``image``, read it with fio for the probe window and then some, burst in
    its middle (with ``burst``); the status's miss cost against fio's clat of the same
    seconds. ``buffered``: fio reads through the page cache, in a memory group of
    ``GUEST_MEMORY`` (most reads miss, and the daemon times the guest's own); its reads
    under ``HIT_US`` are hits, left out of its figures. ``prefix``: the daemon's command
    line starts with it (``setpriv`` without the eBPF capabilities: the ring buffer's path)."""
    fio = require_tool("fio")
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"mc-{os.path.basename(image)}-{int(burst)}-",
                                         dir=tmp_path))
    window = window_cycles * INTERVAL          # WINDOW / PROBES cycles: the probe's window
    runtime = window + 4.0
    kw = {} if cwd is None else {"cwd": cwd}
    d = DaemonProc(work, image, "--uri", "", *args, max_hold="8M", interval=INTERVAL,
                   prefix=prefix, **kw)
    job = load = None
    group = MemoryCgroup(f"mc-{int(burst)}", GUEST_MEMORY).create() if buffered else None
    try:
        d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
        prefix = str(work / "fio")
        argv = [fio, "--name=guest", f"--filename={image}", "--rw=randread", "--bs=4k",
                "--ioengine=psync", f"--direct={0 if buffered else 1}", "--iodepth=1",
                "--numjobs=1", "--norandommap", "--randrepeat=0", f"--size={IMAGE_BYTES}",
                "--time_based", f"--runtime={runtime:g}", f"--write_lat_log={prefix}",
                "--log_avg_msec=0", "--output=/dev/null"]
        job = subprocess.Popen(group.wrap(argv) if group else argv,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        # The probe window: its last ``window`` seconds before the status is read.
        end = runtime - 1.0
        start = end - window
        b0 = b1 = float("nan")
        time.sleep(max(0.0, t0 + start - time.monotonic()))
        delay0 = run_delay_ns(job.pid)
        if burst:
            b0 = start + (window - burst_s) / 2
            time.sleep(max(0.0, t0 + b0 - time.monotonic()))
            load = subprocess.Popen(["dd", f"if={image}", "of=/dev/null", "bs=1M",
                                     "iflag=direct", f"skip={IMAGE_BYTES // MiB // 2}"],
                                    stderr=subprocess.DEVNULL)
            time.sleep(burst_s)
            stop_process(load)
            b1 = time.monotonic() - t0
            load = None
        time.sleep(max(0.0, t0 + end - time.monotonic()))
        st = d.read_status()
        read_at = time.monotonic() - t0
        delay1 = run_delay_ns(job.pid)
        if job.wait(timeout=runtime + 30) != 0:
            raise RuntimeError(f"fio exited {job.returncode}")
        job = None
    finally:
        if load is not None:
            stop_process(load)
        if job is not None:
            stop_process(job)
        d.stop()
        if group is not None:
            group.cleanup()
    log = clat_log(prefix)
    # fio's times count from its job's start, a little after ``t0``: read_at is late by
    # that, which only widens the window by a fraction of a cycle.
    t_s = log[:, 0] / 1000.0
    inside = (t_s >= read_at - window) & (t_s <= read_at)
    us = log[inside, 1] / 1000.0
    hits = int((us < HIT_US).sum()) if buffered else 0
    if buffered:                                  # the misses only: what a hit would save
        inside = inside.copy()
        inside[inside] = us >= HIT_US
        us = log[inside, 1] / 1000.0
    in_burst = (t_s[inside] >= b0) & (t_s[inside] <= b1) if burst else np.zeros(us.size, bool)
    during = us[in_burst]
    cost = (st or {}).get("miss_cost") or {}
    if not cost.get("seconds"):
        raise RuntimeError(f"no miss cost in the status: {cost}")
    return Reading(kind, burst,
                   cost["seconds"] * 1e6, int(cost.get("probes", 0)),
                   float(np.median(us)), float(np.mean(us)),
                   float(np.mean(during)) if during.size else float("nan"),
                   float(np.mean(us[~in_burst])),
                   (delay1 - delay0) / 1000.0 / max(1, us.size + hits),
                   int(us.size), window, buffered, int(cost.get("misses", 0)), hits)
