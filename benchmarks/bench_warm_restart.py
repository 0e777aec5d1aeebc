"""Restarting the daemon in the middle of the hot-zone run: warm (saved heat) against cold.

Scenario: ``--disks`` (3) images served by one daemon, each with the hot-zone guest of bench_hotzone (``tests.support.fio.FioJob``: fio 4
KiB random I/O, 80 % reads, O_DSYNC writes, iodepth 1, 90 % of the accesses
in a hot zone at 1 GiB of a ``--image-size`` (2 GiB) non-sparse image; the
zones together ``--hot``, 160 MiB), all in one cgroup v1 memory group
limited to the budget + 256 MiB, for ``--duration`` s (120). The daemon
(``vmdisktouch run IMG... --max-hold 1.25 x hot --interval 5 --uri ''``, its
defaults otherwise) starts with the guest and is restarted (SIGTERM, then
the same command) at half time. Two modes, one after the other on the same
image, its cache dropped before each: ``warm``, with ``--state-dir`` (the
heat saved at the stop is restored at the start), and ``cold``, without.

Reported per mode: the seconds from the new start until the status holds
90 % of the hot set again (warm target: within 2 s; cold: ~15 s), and the
guest's IOPS over the 30 s after the restart against the 30 s before it
(target: at least 95 %).

``--reboot``: the image is evicted from the page cache while the daemon is
down, as after a host reboot (section "warm-restart-reboot"): without it,
the zone is still cached at the new start and a cold daemon finds it there.

``--compare-rev REV``: the warm mode also with REV's daemon (a git worktree,
``tests.support.worktree``), mode ``rev``, and its time to 90 % side by side.

``--quick``: 60 s. ``--doc`` writes section "warm-restart"
of docs/benchmarks/warm-restart.md.

    .venv/bin/python benchmarks/bench_warm_restart.py [--quick] [--reboot] [--doc]
        [--disks N] [--compare-rev REV]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    add_compare_rev, exit_on_sigterm, fmt, machine, overlap, publish,
    ratio_text, remove_quietly)
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.fio import FioJob, FioRun  # noqa: E402
from tests.support.images import evict, make_image  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

HELD_LEVEL = 0.9
WINDOW = 30.0


def one_mode(mode: str, imgs: list, args, tmp: str, tree=None) -> dict:
    for img in imgs:
        evict(img)
    each = args.hot // len(imgs) // MiB * MiB
    zone = (GiB, each)
    budget = int(args.hot * 1.25) // MiB * MiB
    state = os.path.join(tmp, f"state-{mode}")
    extra = ["--state-dir", state] if mode != "cold" else []
    cg = MemoryCgroup(f"warm-{mode}", budget + 256 * MiB).create()
    fios = [FioRun(FioJob(img, args.image_size, [zone], runtime=args.duration, seed=20241122 + i,
                          name=f"guest-{mode}-{i}"), cg,
                   stderr_path=os.path.join(tmp, f"fio-{mode}-{i}.err"))
            for i, img in enumerate(imgs)]
    fio = fios[0]

    def held(st: dict) -> int:
        return sum(overlap(d.get("regions"), *zone) for d in st.get("disks", [st]))

    def daemon(k: int) -> DaemonProc:
        return DaemonProc(tmp, imgs, "--uri", "", *extra, max_hold=budget,
                          interval=args.interval, status=f"status-{mode}-{k}.json",
                          log=f"daemon-{mode}-{k}.log", env=env_without_systemd(),
                          **({"cwd": tree.path} if tree is not None else {}))

    d = None
    try:
        for f in fios:
            f.start()
        d = daemon(0)
        half = args.duration / 2
        while time.monotonic() - fio.t0 < half:
            time.sleep(0.2)
        held_before = held(d.read_status() or {})
        assert d.stop() == 0, d.output()[-2000:]
        if args.reboot:
            for img in imgs:
                evict(img)      # the cache is gone too, as after a host reboot
        restart = time.monotonic() - fio.t0
        d = daemon(1)
        started = time.monotonic()
        back = None
        while fio.proc.poll() is None:
            st = d.read_status() or {}
            if back is None and held(st) >= HELD_LEVEL * each * len(imgs):
                back = time.monotonic() - started
            time.sleep(0.05)
        for f in fios:
            f.wait(30)
    finally:
        if d is not None:
            d.stop()
        for f in fios:
            f.stop()
        cg.cleanup()

    def mean_iops(a: float, b: float) -> float:
        v = [sum(iv.iops for iv in f.intervals if a <= iv.t < b) / max(1, sum(
            1 for iv in f.intervals if a <= iv.t < b)) for f in fios]
        return sum(v) if any(v) else float("nan")

    before = mean_iops(restart - WINDOW, restart)
    after = mean_iops(restart, restart + WINDOW)
    r = {"mode": mode, "held_before": held_before, "back": back, "restart": restart,
         "iops_before": before, "iops_after": after, "ratio": after / before}
    print(f"  {mode}: hot set held {fmt(held_before)} before the restart; 90 % again "
          f"{'never' if back is None else f'{back:.1f} s'} after it; IOPS {before:,.0f} "
          f"before, {after:,.0f} after ({r['ratio']:.3f})", flush=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-size", type=parse_size, default=None, help="(4G)")
    ap.add_argument("--hot", type=parse_size, default=160 * MiB,
                    help="the hot set, split evenly over the disks (160M)")
    ap.add_argument("--disks", type=int, default=3)
    ap.add_argument("--duration", type=float, default=None, help="(120)")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--reboot", action="store_true",
                    help="evict the image from the cache while the daemon is down")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--doc", action="store_true")
    add_compare_rev(ap)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    q = args.quick
    args.image_size = args.image_size or 2 * GiB
    args.duration = args.duration or (60.0 if q else 120.0)
    exit_on_sigterm("bench_warm_restart")
    print(f"{machine()}; {args.disks} disks, hot set {fmt(args.hot)} (at 1G of each "
          f"{fmt(args.image_size)}), "
          f"{args.duration:g} s per mode, restart at half time", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-warm-restart-", dir="/tmp")
    imgs, made, results = [], [], []
    try:
        with contextlib.ExitStack() as stack:
            tree = enter_rev_worktree(stack, args.compare_rev) if args.compare_rev else None
            for i in range(args.disks):
                img = os.path.join(args.dir, f"vmdt-warm-{os.getpid()}-{i}.raw")
                made.append(img)
                print(f"writing a {fmt(args.image_size)} non-sparse image {img} ...", flush=True)
                imgs.append(make_image(img, args.image_size, sparse=False))
            modes = [m.strip() for m in args.modes.split(",") if m.strip()]
            for mode in modes + (["rev"] if tree is not None else []):
                results.append(one_mode(mode, imgs, args, tmp,
                                        tree if mode == "rev" else None))
    finally:
        for img in made:
            remove_quietly(img)
        shutil.rmtree(tmp, ignore_errors=True)
    lines = ["| mode | hot set held before the restart | 90 % of it held again after | "
             "IOPS, 30 s before | 30 s after | after ÷ before |", "|---|---|---|---|---|---|"]
    for r in results:
        back = "never" if r["back"] is None else f"{r['back']:.1f} s"
        lines.append(f"| {r['mode']} | {fmt(r['held_before'])} | {back} | "
                     f"{r['iops_before']:,.0f} | {r['iops_after']:,.0f} | {r['ratio']:.3f} |")
    warm = [r for r in results if r["mode"] == "warm"]
    if warm:
        w = warm[0]
        ok_t = w["back"] is not None and w["back"] <= 2.0
        rev = [r for r in results if r["mode"] == "rev"]
        if rev and w["back"] is not None and rev[0]["back"] is not None:
            lines += ["", f"Time to 90 %, warm: current {w['back']:.1f} s, {args.compare_rev} "
                          f"{rev[0]['back']:.1f} s (current ÷ {args.compare_rev} "
                          f"{ratio_text(w['back'], rev[0]['back'])} ×)."]
        lines += ["", f"Targets (warm): the hot set held again within 2 s of the new start: "
                      f"**{'met' if ok_t else 'MISSED'}**; IOPS in the 30 s after ≥ 95 % of "
                      f"those before: **{w['ratio']:.3f}**, "
                      f"{'met' if w['ratio'] >= 0.95 else 'MISSED'}."]
    body = (f"{args.disks} {fmt(args.image_size)} non-sparse images on {args.dir}, each with "
            f"the hot-zone guest (fio 4 KiB random, 80 % reads, O_DSYNC writes, 90 % of the "
            f"accesses in {fmt(args.hot // args.disks)} at 1G; the hot set {fmt(args.hot)}), "
            f"all in one memory group limited to the budget + 256M; "
            f"`vmdisktouch run IMG... --max-hold 1.25 x hot --interval {args.interval:g} --uri ''` "
            f"started with the guest and restarted (SIGTERM, start) at half time"
            + (", the image evicted from the page cache between the stop and the start "
               "(as after a host reboot)" if args.reboot else "")
            + f", {args.duration:g} s per mode; warm: with `--state-dir`, cold: without"
            + (f", rev: warm with {args.compare_rev}'s daemon" if args.compare_rev else "")
            + ".\n\n"
            + "\n".join(lines))
    if args.reboot:
        publish(body, results, args, "warm-restart-reboot",
                "Warm restart after the cache is gone (a host reboot)")
    else:
        publish(body, results, args, "warm-restart", "Warm restart: the heat saved and restored")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
