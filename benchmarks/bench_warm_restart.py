"""Restarting the daemon in the middle of the hot-zone run: warm (saved heat) against cold.

Scenario: the hot-zone guest of bench_hotzone (``tools.fio.FioJob``: fio 4
KiB random I/O, 80 % reads, O_DSYNC writes, iodepth 1, 90 % of the accesses
in a hot zone of ``--hot`` (409 MiB, a tenth of the image) at 1 GiB of a
``--image-size`` (4 GiB) non-sparse image), in a cgroup v1 memory group
limited to the budget + 256 MiB, for ``--duration`` s (120). The daemon
(``vmdisktouch run IMG --max-hold 1.25 x hot --interval 5 --uri ''``, its
defaults otherwise) starts with the guest and is restarted (SIGTERM, then
the same command) at half time. Two modes, one after the other on the same
image, its cache dropped before each: ``warm``, with ``--state-dir`` (the
heat saved at the stop is restored at the start), and ``cold``, without.

Reported per mode: the seconds from the new start until the status holds
90 % of the hot zone again (warm target: within 2 s; cold: ~15 s), and the
guest's IOPS over the 30 s after the restart against the 30 s before it
(target: at least 95 %).

``--reboot``: the image is evicted from the page cache while the daemon is
down, as after a host reboot (section "warm-restart-reboot"): without it,
the zone is still cached at the new start and a cold daemon finds it there.

``--quick``: a 2 GiB image, 60 s. ``--doc`` writes section "warm-restart"
of docs/benchmarks.md.

    .venv/bin/python benchmarks/bench_warm_restart.py [--quick] [--reboot] [--doc]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    ensure_image, exit_on_sigterm, fmt, machine, overlap, publish, remove_quietly)
from tools.cgroup import MemoryCgroup  # noqa: E402
from tools.common import GiB, MiB  # noqa: E402
from tools.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tools.fio import FioJob, FioRun  # noqa: E402
from tools.images import evict  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

HELD_LEVEL = 0.9
WINDOW = 30.0


def one_mode(mode: str, img: str, args, tmp: str) -> dict:
    evict(img)
    zone = (GiB, args.hot)
    budget = int(args.hot * 1.25) // MiB * MiB
    state = os.path.join(tmp, f"state-{mode}")
    extra = ["--state-dir", state] if mode == "warm" else []
    cg = MemoryCgroup(f"warm-{mode}", budget + 256 * MiB).create()
    job = FioJob(img, args.image_size, [zone], runtime=args.duration, seed=20241122,
                 name=f"guest-{mode}")
    fio = FioRun(job, cg, stderr_path=os.path.join(tmp, f"fio-{mode}.err"))

    def daemon(k: int) -> DaemonProc:
        return DaemonProc(tmp, img, "--uri", "", *extra, max_hold=budget,
                          interval=args.interval, status=f"status-{mode}-{k}.json",
                          log=f"daemon-{mode}-{k}.log", env=env_without_systemd())

    d = None
    try:
        fio.start()
        d = daemon(0)
        half = args.duration / 2
        while time.monotonic() - fio.t0 < half:
            time.sleep(0.2)
        held_before = overlap((d.read_status() or {}).get("regions"), *zone)
        assert d.stop() == 0, d.output()[-2000:]
        if args.reboot:
            evict(img)          # the cache is gone too, as after a host reboot
        restart = time.monotonic() - fio.t0
        d = daemon(1)
        started = time.monotonic()
        back = None
        while fio.proc.poll() is None:
            st = d.read_status() or {}
            if back is None and overlap(st.get("regions"), *zone) >= HELD_LEVEL * zone[1]:
                back = time.monotonic() - started
            time.sleep(0.1)
        fio.wait(30)
    finally:
        if d is not None:
            d.stop()
        fio.stop()
        cg.cleanup()
    ivs = fio.intervals

    def mean_iops(a: float, b: float) -> float:
        v = [iv.iops for iv in ivs if a <= iv.t < b]
        return sum(v) / len(v) if v else float("nan")

    before = mean_iops(restart - WINDOW, restart)
    after = mean_iops(restart, restart + WINDOW)
    r = {"mode": mode, "held_before": held_before, "back": back, "restart": restart,
         "iops_before": before, "iops_after": after, "ratio": after / before}
    print(f"  {mode}: zone held {fmt(held_before)} before the restart; 90 % again "
          f"{'never' if back is None else f'{back:.1f} s'} after it; IOPS {before:,.0f} "
          f"before, {after:,.0f} after ({r['ratio']:.3f})", flush=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-size", type=parse_size, default=None, help="(4G)")
    ap.add_argument("--hot", type=parse_size, default=None, help="(a tenth of the image)")
    ap.add_argument("--duration", type=float, default=None, help="(120)")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--image")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--reboot", action="store_true",
                    help="evict the image from the cache while the daemon is down")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    q = args.quick
    args.image_size = args.image_size or (2 * GiB if q else 4 * GiB)
    args.duration = args.duration or (60.0 if q else 120.0)
    args.hot = args.hot or args.image_size // 10 // MiB * MiB
    exit_on_sigterm("bench_warm_restart")
    print(f"{machine()}; hot zone {fmt(args.hot)} at 1G of {fmt(args.image_size)}, "
          f"{args.duration:g} s per mode, restart at half time", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-warm-restart-", dir="/tmp")
    img, created, results = None, False, []
    try:
        img, created = ensure_image(args.image, args.image_size, args.dir)
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            results.append(one_mode(mode, img, args, tmp))
    finally:
        if created:
            remove_quietly(img)
        shutil.rmtree(tmp, ignore_errors=True)
    lines = ["| mode | zone held before the restart | 90 % of the zone held again after | "
             "IOPS, 30 s before | 30 s after | after ÷ before |", "|---|---|---|---|---|---|"]
    for r in results:
        back = "never" if r["back"] is None else f"{r['back']:.1f} s"
        lines.append(f"| {r['mode']} | {fmt(r['held_before'])} | {back} | "
                     f"{r['iops_before']:,.0f} | {r['iops_after']:,.0f} | {r['ratio']:.3f} |")
    warm = [r for r in results if r["mode"] == "warm"]
    if warm:
        w = warm[0]
        ok_t = w["back"] is not None and w["back"] <= 2.0
        lines += ["", f"Targets (warm): the hot zone held again within 2 s of the new start: "
                      f"**{'met' if ok_t else 'MISSED'}**; IOPS in the 30 s after ≥ 95 % of "
                      f"those before: **{w['ratio']:.3f}**, "
                      f"{'met' if w['ratio'] >= 0.95 else 'MISSED'}."]
    body = (f"A {fmt(args.image_size)} non-sparse image on {args.dir}; the hot-zone guest "
            f"(fio 4 KiB random, 80 % reads, O_DSYNC writes, 90 % of the accesses in "
            f"{fmt(args.hot)} at 1G) in a memory group limited to the budget + 256M; "
            f"`vmdisktouch run IMG --max-hold 1.25 x hot --interval {args.interval:g} --uri ''` "
            f"started with the guest and restarted (SIGTERM, start) at half time"
            + (", the image evicted from the page cache between the stop and the start "
               "(as after a host reboot)" if args.reboot else "")
            + f", {args.duration:g} s per mode; warm: with `--state-dir`, cold: without.\n\n"
            + "\n".join(lines))
    if args.reboot:
        publish(body, results, args, "warm-restart-reboot",
                "Warm restart after the cache is gone (a host reboot)")
    else:
        publish(body, results, args, "warm-restart", "Warm restart: the heat saved and restored")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
