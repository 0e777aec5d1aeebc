"""The cost of one process serving many disks: CPU and memory of `run IMG x 32`.

Scenario (issue 16's cost target): ``--images`` (32) sparse images of
``--image-size`` (64 GiB) each on ``--dir`` (/var/tmp), each with
``--extents`` (8) extents of ``--extent`` (4 MiB) of data spread over it (a
thin guest disk); a guest process reads 4 KiB at random inside every
image's extents, ``--reads`` (50) reads a second per image, buffered. One
daemon serves them all: ``vmdisktouch run IMG... --max-hold 1G --interval 5
--uri '' --min-free 0`` (its defaults otherwise: the trace source here).
After the warm-up (``--warmup`` s, 30, and until 90 % of the extents or of
the budget is held), a ``--duration`` (60) s window: the daemon's CPU
(utime + stime of /proc/PID/stat over the wall time) and, every second, its
memory besides the held pages (VmRSS - VmLck of /proc/PID/status). Targets:
CPU at most 2 % of a core, memory besides held pages at most 256 MiB.

``--compare-rev REV``: then the same with the daemon of commit REV
(``python -m vmdisktouch run`` with its cwd a temporary git worktree of REV,
removed afterwards), on the same images, with the same guest still reading;
the images' page cache is dropped before each daemon starts, so both warm up
alike. Reported: each headline figure now, at REV and current ÷ REV.

``--quick``: 4 images of 4 GiB, 10 s warm-up, 20 s window. ``--doc`` writes
section "host-cost" of docs/benchmarks/host-cost.md.

    .venv/bin/python benchmarks/bench_host_cost.py [--quick] [--doc] [--compare-rev REV]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    CLK_TCK, add_cost_options, cpu_ticks, exit_on_sigterm, fill_defaults, fmt, machine, median,
    publish, side_by_side)
from tests.support.common import ROOT as CHECKOUT, GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.images import evict  # noqa: E402
from tests.support.procfs import memory_fields  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

TARGET_CPU = 2.0
TARGET_RSS = 256 * MiB

GUEST = """
import os, random, sys, time
rate, ext, paths = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
fds = [(os.open(p, os.O_RDONLY), [int(x) for x in os.environ['EXTENTS_' + str(i)].split(',')])
       for i, p in enumerate(paths)]
for fd, _ in fds:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
rng = random.Random(1)
step = 1.0 / (rate * len(fds))
t = time.monotonic()
while True:
    for fd, offs in fds:
        off = rng.choice(offs) + rng.randrange(ext // 4096) * 4096
        os.pread(fd, 4096, off)
        t += step
        d = t - time.monotonic()
        if d > 0:
            time.sleep(d)
"""


def make_images(args, tmp: str) -> list[tuple[str, list[int]]]:
    out = []
    for i in range(args.images):
        path = os.path.join(args.dir, f"vmdt-host-cost-{os.getpid()}-{i}.raw")
        with open(path, "wb") as f:
            f.truncate(args.image_size)
        gap = args.image_size // args.extents
        offs = [k * gap + (i * 7 + k * 13) % 64 * MiB for k in range(args.extents)]
        fd = os.open(path, os.O_WRONLY)
        try:
            for off in offs:
                os.pwrite(fd, os.urandom(args.extent), off)
            os.fsync(fd)
        finally:
            os.close(fd)
        out.append((path, offs))
    return out


def mem(pid: int) -> int:
    f = memory_fields(pid, ("VmRSS", "VmLck"))
    return f.get("VmRSS", 0) - f.get("VmLck", 0)


def run_daemon(images, args, tmp: str, tag: str, cwd) -> dict:
    """One daemon over every image: warm-up, then the window; its figures."""
    d = DaemonProc(tmp, [p for p, _ in images], "--uri", "", "--min-free", "0",
                   *args.daemon_args.split(), max_hold=args.max_hold,
                   interval=args.interval, status=f"host-{tag}.json", log=f"daemon-{tag}.log",
                   env=env_without_systemd(), cwd=cwd)
    try:
        print(f"  {tag}: pid {d.pid}, cwd {d.proc_cwd()}", flush=True)
        want = 0.9 * min(parse_size(args.max_hold), args.images * args.extents * args.extent)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.warmup or \
                ((d.read_status() or {}).get("host", {}).get("held_bytes", 0) < want
                 and time.monotonic() - t0 < 300):
            if not d.alive():
                raise RuntimeError("the daemon died:\n" + d.log_tail(20))
            time.sleep(0.5)
        warm = time.monotonic() - t0
        ticks0, w0 = cpu_ticks(d.pid), time.monotonic()
        rss, held = [], []
        while time.monotonic() - w0 < args.duration:
            rss.append(mem(d.pid))
            held.append((d.read_status() or {}).get("host", {}).get("held_bytes", 0))
            time.sleep(1.0)
        ticks1, wall = cpu_ticks(d.pid), time.monotonic() - w0
        cpu = 100.0 * (sum(ticks1) - sum(ticks0)) / CLK_TCK / wall
        st = d.read_status() or {}
        cycles = [x.get("cycle_seconds", 0) for x in st.get("disks", [])]
        host_cycle = st.get("host", {}).get("cycle_seconds", 0)
        rc = d.stop()
        if rc != 0:
            raise RuntimeError(f"the daemon exited {rc}:\n{d.log_tail(20)}")
    finally:
        d.stop()
    r = {"daemon": tag, "cpu": cpu, "rss_max": max(rss), "rss_median": median(rss),
         "held_median": median(held), "warm": warm, "disks": len(st.get("disks", [])),
         "host_cycle": host_cycle, "disk_cycle_max": max(cycles) if cycles else 0}
    print(f"  {tag}: CPU {cpu:.2f} % of a core, memory besides held pages {fmt(r['rss_max'])} "
          f"max / {fmt(r['rss_median'])} median, held {fmt(r['held_median'])}, warm-up "
          f"{warm:.0f} s, last cycle {host_cycle * 1000:.0f} ms", flush=True)
    return r


def compare_lines(cur: dict, old: dict, rev: str, sha: str) -> list[str]:
    """--compare-rev: the headline figures now and at REV, and current ÷ REV."""
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    rows = [("CPU, % of a core", cur["cpu"], old["cpu"], ".2f"),
            ("memory besides held pages, max", cur["rss_max"], old["rss_max"], fmt),
            ("memory besides held pages, median", cur["rss_median"], old["rss_median"], fmt),
            ("held (median)", cur["held_median"], old["held_median"], fmt),
            ("last cycle, the host's", cur["host_cycle"], old["host_cycle"], ms),
            ("last cycle, the slowest disk's", cur["disk_cycle_max"], old["disk_cycle_max"], ms),
            ("warm-up", cur["warm"], old["warm"], lambda v: f"{v:.0f} s")]
    return side_by_side(rev, sha, rows, "the same images and guest, the daemon of "
                        f"{rev} (`python -m vmdisktouch run` in a git worktree of it) right "
                        "after the current one, each from a dropped page cache")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=None, help="(32)")
    ap.add_argument("--image-size", type=parse_size, default=None, help="(64G)")
    ap.add_argument("--extents", type=int, default=8)
    ap.add_argument("--extent", type=parse_size, default=4 * MiB)
    ap.add_argument("--reads", type=float, default=50.0, help="per image per second")
    ap.add_argument("--max-hold", default="1G")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--daemon-args", default="")
    add_cost_options(ap, warmup=30, duration=60)
    args = ap.parse_args()
    fill_defaults(args, (("images", 32, 4), ("image_size", 64 * GiB, 4 * GiB),
                         ("warmup", 30.0, 10.0), ("duration", 60.0, 20.0)))
    exit_on_sigterm("bench_host_cost")
    print(f"{machine()}; {args.images} sparse images of {fmt(args.image_size)}, "
          f"{args.extents} x {fmt(args.extent)} of data each, {args.reads:g} reads/s each",
          flush=True)
    stack = contextlib.ExitStack()
    tmp = tempfile.mkdtemp(prefix="bench-host-cost-", dir="/tmp")
    images, guest, tree = [], None, None
    try:
        if args.compare_rev:
            tree = enter_rev_worktree(stack, args.compare_rev)
        images = make_images(args, tmp)
        env = dict(os.environ, **{f"EXTENTS_{i}": ",".join(map(str, offs))
                                  for i, (_, offs) in enumerate(images)})
        guest = subprocess.Popen([sys.executable, "-c", GUEST, str(args.reads), str(args.extent),
                                  *[p for p, _ in images]], env=env)
        runs = [("current", CHECKOUT)] + ([(f"@{tree.rev}", tree.path)] if tree else [])
        out = []
        for tag, cwd in runs:
            if tree:            # both from the same page cache: none of the images
                for p, _ in images:
                    evict(p)
            out.append(run_daemon(images, args, tmp, tag, cwd))
    finally:
        if guest is not None:
            guest.kill()
            guest.wait()
        for p, _ in images:
            os.unlink(p)
        shutil.rmtree(tmp, ignore_errors=True)
        stack.close()
    r = out[0]
    cpu = r["cpu"]
    head = "| disks served | held (median) | CPU, % of a core | memory besides held pages " \
           "(VmRSS - VmLck), max / median | last cycle: the host's (every disk) / the slowest disk's own |"
    rows = [f"| {x['disks']} | {fmt(x['held_median'])} | {x['cpu']:.2f} | {fmt(x['rss_max'])} / "
            f"{fmt(x['rss_median'])} | {x['host_cycle'] * 1000:.0f} ms / "
            f"{x['disk_cycle_max'] * 1000:.0f} ms |" for x in out]
    if tree:                    # a first column: whose daemon
        head = "| daemon " + head
        rows = [f"| {x['daemon']} " + row for x, row in zip(out, rows)]
    table = "\n".join([head, "|---" * head.count(" | ") + "|---|", *rows])
    body = (f"{args.images} sparse images of {fmt(args.image_size)} on {args.dir}, each with "
            f"{args.extents} extents of {fmt(args.extent)} of data; a guest process reads 4 KiB "
            f"at random in every image's extents, {args.reads:g} reads/s per image; one daemon "
            f"`vmdisktouch run IMG... --max-hold {args.max_hold} --interval {args.interval:g} "
            f"--uri '' --min-free 0` (trace source). After {r['warm']:.0f} s of warm-up, a "
            f"{args.duration:g} s window."
            + (f" Then the same with the daemon of `{tree.rev}` ({tree.sha[:10]}), after "
               f"{out[1]['warm']:.0f} s of warm-up; the images' cache dropped before each."
               if tree else "") + "\n\n"
            + table + "\n\n"
            f"Targets: CPU ≤ {TARGET_CPU:g} % of a core: **{cpu:.2f} %**, "
            f"{'met' if cpu <= TARGET_CPU else 'MISSED'}; memory besides held pages ≤ "
            f"{fmt(TARGET_RSS)}: **{fmt(r['rss_max'])}**, "
            f"{'met' if r['rss_max'] <= TARGET_RSS else 'MISSED'}."
            + ("\n\n" + "\n".join(compare_lines(out[0], out[1], tree.rev, tree.sha))
               if tree else ""))
    results = r if not tree else {"current": out[0], "rev": dict(out[1], rev=tree.rev,
                                                                  sha=tree.sha)}
    publish(body, results, args, "host-cost", "Many disks, one process: CPU and memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
