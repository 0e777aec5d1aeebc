"""Why vmdisktouch beats `vmtouch -l` in the hot-zone benchmark: the cost of a 4 KiB O_DSYNC write
into pages that were brought into the cache in different ways.

In bench_hotzone the gain of vmdisktouch over the oracle (`vmtouch -l` of
exactly the hot zone) is all in the guest's writes (about 140 µs against
180 µs), not in its reads. The hypothesis this measures: the page cache of
this kernel keeps file data in large folios when it reads ahead, and a
write dirties (and ``O_DSYNC`` writes back) its whole folio. ``vmtouch``
faults the region in through its mapping, sequentially, so readahead fills
it with large folios; the holder reads with ``POSIX_FADV_WILLNEED`` in
128 KiB pieces and locks with ``MADV_RANDOM``; the guest's own 4 KiB random
reads (``POSIX_FADV_RANDOM``) cache single pages.

For each way of caching a ``--region`` (256 MiB) of a non-sparse file on a
real disk (evicted before each), the same sequence of ``--writes`` random
4 KiB ``O_DSYNC`` writes (same seed) goes into the region, one at a time,
and the benchmark reports the mean and median write latency and the bytes
written per write: ``write_bytes`` of ``/proc/self/io`` (the kernel counts a
folio's size when a write dirties it) and the sectors the disk wrote
(``/sys/block/DEV/stat``). The ways:

* ``guest``: 4 KiB random reads of every page, readahead off (as QEMU's
  reads for a guest doing random I/O);
* ``vmtouch -l``: ``vmtouch -l -p 0-REGION FILE``, the oracle's holder;
* ``vmdisktouch``: the daemon's ``Holder`` (the same code as ``run``);
* ``sequential read``: buffered 1 MiB reads with the default readahead.

Ratios are to ``guest``, measured in the same run.

    .venv/bin/python benchmarks/bench_write_amplification.py [--region 256M] [--writes 3000]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support.images import evict  # noqa: E402
from tests.support.procfs import vmlck  # noqa: E402
from vmdisktouch.system.hold import holder  # noqa: E402
from vmdisktouch.system import meminfo
from vmdisktouch.system.image import open_image  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

MiB = 1 << 20
PAGE = 4096


def io_write_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise RuntimeError("no write_bytes in /proc/self/io")


def disk_of(path: str) -> str | None:
    """The whole-disk name under /sys/block holding ``path`` (None if not found)."""
    dev = os.stat(path).st_dev
    link = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    try:
        real = os.path.realpath(link)
    except OSError:
        return None
    name = os.path.basename(real)
    parent = os.path.basename(os.path.dirname(real))
    return parent if os.path.exists(f"/sys/block/{parent}") else name


def sectors_written(disk: str | None) -> int:
    if disk is None:
        return 0
    with open(f"/sys/block/{disk}/stat") as f:
        return int(f.read().split()[6])


def cache_guest(path: str, region: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        pages = list(range(0, region, PAGE))
        random.Random(7).shuffle(pages)
        for off in pages:
            os.pread(fd, PAGE, off)
    finally:
        os.close(fd)


def cache_sequential(path: str, region: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in range(0, region, MiB):
            os.pread(fd, MiB, off)
    finally:
        os.close(fd)


def write_round(path: str, region: int, writes: int, disk: str | None) -> dict:
    rng = random.Random(11)
    offsets = [rng.randrange(region // PAGE) * PAGE for _ in range(writes)]
    buf = os.urandom(PAGE)
    fd = os.open(path, os.O_WRONLY | os.O_DSYNC)
    lat = []
    try:
        wb0, s0 = io_write_bytes(), sectors_written(disk)
        for off in offsets:
            t = time.perf_counter()
            os.pwrite(fd, buf, off)
            lat.append(time.perf_counter() - t)
        wb1, s1 = io_write_bytes(), sectors_written(disk)
    finally:
        os.close(fd)
    return {"mean_us": statistics.fmean(lat) * 1e6, "median_us": statistics.median(lat) * 1e6,
            "dirtied_per_write": (wb1 - wb0) / writes,
            "disk_per_write": (s1 - s0) * 512 / writes if disk else None}


def run_case(name: str, path: str, a) -> dict:
    evict(path)
    proc = hold = None
    try:
        t = time.monotonic()
        if name == "guest":
            cache_guest(path, a.region)
        elif name == "sequential read":
            cache_sequential(path, a.region)
        elif name == "vmtouch -l":
            proc = subprocess.Popen(["vmtouch", "-q", "-l", "-p", f"0-{a.region}", path],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            while vmlck(proc.pid) < a.region:
                if proc.poll() is not None:
                    raise RuntimeError(f"vmtouch exited: {proc.stderr.read().decode()}")
                time.sleep(0.05)
        elif name == "vmdisktouch":
            image = open_image(path)
            hold = (image, holder.Holder(image, MiB, a.region, 0,
                                         mem_available=meminfo.mem_available))
            hold[1].apply([(0, a.region // MiB)])
        load = time.monotonic() - t
        r = write_round(path, a.region, a.writes, a.disk)
        r["load_s"] = load
        return r
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        if hold is not None:
            hold[1].close()
            hold[0].close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--region", type=parse_size, default=parse_size("256M"))
    ap.add_argument("--writes", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2, help="each case this many times, in turn")
    ap.add_argument("--dir", default="/var/tmp", help="a directory on a real disk")
    a = ap.parse_args()

    d = tempfile.mkdtemp(prefix="vmdt-wamp-", dir=a.dir)
    path = os.path.join(d, "disk.raw")
    try:
        with open(path, "wb") as f:
            chunk = os.urandom(MiB)
            for _ in range(a.region // MiB):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        a.disk = disk_of(path)
        cases = ["guest", "vmtouch -l", "vmdisktouch", "sequential read"]
        results: dict[str, list[dict]] = {c: [] for c in cases}
        for _ in range(a.rounds):
            for c in cases:
                results[c].append(run_case(c, path, a))
        base = statistics.median(r["mean_us"] for r in results["guest"])
        print(f"{a.writes} random 4 KiB O_DSYNC writes into a {a.region // MiB} MiB region of a "
              f"non-sparse file (disk {a.disk}), {a.rounds} rounds, median of the rounds:")
        print("| cached by | mean write latency | median | ÷ guest | KiB dirtied per write "
              "| KiB the disk wrote per write | load time |")
        print("|---|---|---|---|---|---|---|")
        for c in cases:
            rs = results[c]
            mean = statistics.median(r["mean_us"] for r in rs)
            med = statistics.median(r["median_us"] for r in rs)
            dirt = statistics.median(r["dirtied_per_write"] for r in rs) / 1024
            disk = (statistics.median(r["disk_per_write"] for r in rs) / 1024
                    if rs[0]["disk_per_write"] is not None else float("nan"))
            load = statistics.median(r["load_s"] for r in rs)
            print(f"| {c} | {mean:.0f} µs | {med:.0f} µs | {mean / base:.2f} | {dirt:.1f} "
                  f"| {disk:.1f} | {load:.1f} s |")
    finally:
        os.unlink(path)
        os.rmdir(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
