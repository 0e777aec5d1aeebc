"""A disk's miss-ratio curve against the kernel: what a memory group of S served, and what
the curve said it would.

Scenario: one ``--image-size`` (2 GiB) raw image of random data served by
``qemu-nbd --cache=writethrough --aio=threads`` in a memory cgroup limited to S,
fio through it (``ioengine=nbd``): 4 KiB random reads only (a write adds a page
too, and the kernel's figure below counts adds), half of them in the first
``--hot`` (256 MiB) and the rest over the whole image, ``--rate`` (3,000) a
second. The daemon only observes: ``vmdisktouch run IMG --max-hold 1M --spill
0 --uri '' --min-free 0 --access-source trace``. For each S of ``--limits``
(192M, 384M, 768M), from a cold cache, for ``--warmup`` + ``--duration`` s
(60 + 60), are read:

* the kernel's answer: the share of the pages the guest read that needed no
  page added to the cache (the status's ``gain.cache_hit_ratio``, weighed by
  the cycle's pages read), over every cycle from the start: the same reads the
  curve saw, first reads included. Readahead adds pages too, so it is a lower
  bound;
* the image's pages in the cache (the status's ``resident_bytes``, from the
  trace's adds and deletes), the mean over the last
  ``--duration`` s, once the group is full: the LRU size the kernel gave the
  image (the group's page cache holds qemu-nbd's own file pages too);
* the curve at that size: the status's ``curve`` of the last cycle, linear
  between its points;
* an exact LRU of that size over the same reads (fio's ``write_iolog``
  replayed through ``MissRatioCurve(rate=1)``, every page, no decay): what
  the curve estimates, so the rows tell the sampling's error from the
  kernel's distance to an LRU; and over the whole curve (its 12 points), the
  mean and the largest distance to that exact curve (target 0.02 and 0.03).

The image is read through a loop device (``losetup --direct-io=on``: its
backing file is not cached twice) whose readahead is off (``read_ahead_kb``
0), as ``blockdev --setra 0`` would set on an LVM volume: with readahead, a
random read next to cached pages brings up to 32 pages in (the kernel takes
it for a stream), so the adds overstate the misses (at 371M the kernel's
share read 0.130 against 0.36 for an exact LRU of the same reads) and the
pages read ahead take the cache the reads would have used. ``--readahead``
keeps the device's default, to see it.

Target (issue 43): the curve within 5 points of the kernel at each S. The
kernel's reclaim is not an exact LRU (active and inactive lists), and the
group's page cache holds qemu-nbd's own file pages too; the rows say by how
much each S missed.

    .venv/bin/python benchmarks/bench_curve_accuracy.py [--quick] [--doc]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    exit_on_sigterm, fill_defaults, fmt, machine, publish)
from tests.support.blockdev import loop_device  # noqa: E402
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.fio import FioJob, FioRun, iolog_pages  # noqa: E402
from tests.support.images import evict  # noqa: E402
from tests.support.nbd import QemuNbd  # noqa: E402
from tests.support.pagecache import data_image  # noqa: E402
from vmdisktouch.core.mrc import MissRatioCurve  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

TARGET = 0.05                     # points of the reads, at each size
PAGE = 4096


def curve_at(curve: list, size: float) -> float:
    """The status's curve (``[[bytes, hit_ratio], ...]``) at ``size``, linear between points."""
    pts = np.array(sorted(curve), dtype=float)
    return float(np.interp(size, pts[:, 0], pts[:, 1]))


def exact_curve(iolog: str) -> MissRatioCurve:
    """The exact curve (every page, no decay) of the reads of fio's iolog."""
    exact = MissRatioCurve(rate=1.0, max_pages=None, half_life=0)
    exact.feed(iolog_pages(iolog, PAGE))
    return exact


def run_one(limit: int, backing: str, args, tmp: str) -> dict:
    evict(backing)
    with contextlib.ExitStack() as stack:
        image = stack.enter_context(loop_device(backing, direct_io=True))
        if not args.readahead:
            with open(f"/sys/block/{os.path.basename(image)}/queue/read_ahead_kb", "w") as f:
                f.write("0")
        cg = MemoryCgroup(f"curve-{limit >> 20}M-{os.getpid()}", limit).create()
        stack.callback(cg.cleanup)
        iolog = os.path.join(tmp, f"io-{limit >> 20}.log")
        nbd = QemuNbd(image, cgroup=cg, log=os.path.join(tmp, "nbd.log")).start()
        stack.callback(nbd.stop)
        job = FioJob(image, args.image_size, [(0, args.hot)], hot_share=50, read_mix=100,
                     runtime=args.warmup + args.duration + 60, seed=20261127, name="g",
                     extra=[f"--rate_iops={args.rate}", f"--write_iolog={iolog}"],
                     nbd_uri=nbd.uri)
        run = FioRun(job, cg, stderr_path=os.path.join(tmp, "fio.err")).start()
        stack.callback(run.stop)
        d = DaemonProc(tmp, image, "--uri", "", "--min-free", "0", "--access-source", "trace",
                       "--spill", "0", max_hold="1M", interval=args.interval,
                       status=f"status-{limit >> 20}.json", log=f"daemon-{limit >> 20}.log",
                       env=env_without_systemd())
        stack.callback(d.stop)
        seen: dict[int, tuple[float, float]] = {}     # cycle -> (pages read, hit ratio)
        cache: list[int] = []
        st = None
        start = time.monotonic()
        end = start + args.warmup + args.duration
        while time.monotonic() < end:
            st = d.read_status() or st
            g = (st or {}).get("gain") or {}
            if g.get("cache_hit_ratio") is not None:
                seen[st["cycle"]] = (g["pages_read_per_second"], g["cache_hit_ratio"])
            if time.monotonic() >= start + args.warmup and st and "resident_bytes" in st:
                cache.append(st["resident_bytes"])
            if not d.alive():
                raise RuntimeError(f"the daemon died:\n{d.log_tail(20)}")
            time.sleep(0.5)
        if not seen or not cache or not st or not st.get("curve"):
            raise RuntimeError(f"S={fmt(limit)}: no cycle with reads in the window")
        w = np.array([p for p, _ in seen.values()])
        kernel = float(np.average([h for _, h in seen.values()], weights=w)) if w.sum() else 0.0
        size = float(np.mean(cache))
        said = curve_at(st["curve"], size)
        run.stop()
        exact = exact_curve(iolog)
        lru = exact.hit_ratio(size / PAGE)
        err = [abs(h - exact.hit_ratio(b / PAGE)) for b, h in st["curve"]]
        r = {"limit": limit, "cache": size, "kernel": kernel, "curve": said, "lru": lru,
             "cycles": len(seen), "mrc": st.get("mrc"), "points": st["curve"],
             "mae": float(np.mean(err)), "max_error": float(np.max(err))}
        print(f"  S {fmt(limit)}: the image's cached pages {fmt(size)}, kernel {kernel:.3f}, curve "
              f"{said:.3f} ({100 * (said - kernel):+.1f} points), exact LRU {lru:.3f} (the "
              f"whole curve: mean error {r['mae']:.3f}, at most {r['max_error']:.3f}) over "
              f"{len(seen)} cycles; "
              f"sample {st['mrc']['sampled_pages']} pages at rate "
              f"{st['mrc']['sample_rate']:.4f}, lost {st['mrc']['samples_lost']}", flush=True)
        return r


def report(results: list[dict]) -> str:
    lines = ["| memory group | the image's cached pages | kernel: reads from memory | the curve there | "
             "difference | target | exact LRU there | curve − LRU | whole curve: mean "
             "error (max) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        diff = r["curve"] - r["kernel"]
        ok = "✓" if abs(diff) <= TARGET else "✗"
        lines.append(f"| {fmt(r['limit'])} | {fmt(r['cache'])} | {r['kernel']:.3f} | "
                     f"{r['curve']:.3f} | **{100 * diff:+.1f}** points | 5 points {ok} | "
                     f"{r['lru']:.3f} | {100 * (r['curve'] - r['lru']):+.1f} points | "
                     f"{r['mae']:.3f} ({r['max_error']:.3f}) |")
    head = ("The share of the pages read that needed no page added to the group's cache (the "
            "kernel, every cycle from a cold start), and the curve at the image's cached "
            "pages (their mean once the group is full), same run, one run per size")
    return head + ".\n\n" + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limits", default="192M,384M,768M")
    ap.add_argument("--image-size", type=parse_size, default=None, help="(2G)")
    ap.add_argument("--hot", type=parse_size, default=256 * MiB)
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=None, help="(60)")
    ap.add_argument("--duration", type=float, default=None, help="(60)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--readahead", action="store_true",
                    help="keep the loop device's readahead (the kernel's default)")
    ap.add_argument("--quick", action="store_true", help="1G image, 30 s + 30 s")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    fill_defaults(args, (("image_size", 2 * GiB, GiB), ("warmup", 60.0, 30.0),
                         ("duration", 60.0, 30.0)))
    limits = [parse_size(x) for x in args.limits.split(",") if x.strip()]
    exit_on_sigterm("bench_curve_accuracy")
    print(f"{machine()}; an image of {fmt(args.image_size)}, {args.rate:,} reads/s, "
          f"groups of {', '.join(fmt(x) for x in limits)}", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-curve-", dir="/tmp")
    image = os.path.join(args.dir, f"vmdt-curve-{os.getpid()}.raw")
    try:
        data_image(image, args.image_size)
        results = [run_one(limit, image, args, tmp) for limit in limits]
        publish(report(results), results, args, "curve-accuracy",
                "The curve against the kernel")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(image)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
