"""A read-only hot zone held continuously? The trace source against the mincore source.

With the mincore source, the daemon's own hold hides the guest's use: a held
block is resident because the daemon holds it, so its residency is no
evidence of use and is suppressed; with no writes either, the zone cools,
is released, turns up again in the guest's residency and is taken again.
In the past the daemon let the whole zone go about every 35 s. The trace
source sees every read of a held block, so the zone should stay held.

Scenario: a non-sparse image (``--image-size``, 4 GiB, on ``--dir``
/var/tmp); a hot zone of ``--zone`` (512 MiB) at ``--zone-offset`` (1 GiB)
read at random by fio (4 KiB ``randread``, ``psync``, buffered,
``--invalidate=0``, ``rate_iops`` ``--read-iops`` 2000; no writes); the
daemon ``vmdisktouch run IMG --max-hold 640M --interval 5 --uri ''
--access-source SOURCE`` started with the guest, for ``--duration`` s
(300). The sources run one after the other on the same image, its cache
dropped (fsync + ``POSIX_FADV_DONTNEED``) before each.

Every second: the bytes of the zone held (the status's ``regions``
intersected with the zone, as of the last cycle) and the daemon's
``VmLck`` (the moment's truth, which also counts what it holds outside the
zone). After the first ``--settle`` s (30): the minimum held share of the
zone, how many times it dropped below 90 % (from at or above), the seconds
below 90 %, and what the daemon released and loaded. Target: the trace
source never below 90 % of the zone.

``--quick``: a 1 GiB image, a 128 MiB zone at 256 MiB, ``--max-hold 160M``,
90 s. ``--doc`` writes section "readonly-hold" of docs/benchmarks/readonly-hold.md.

    .venv/bin/python benchmarks/bench_readonly_hold.py [--quick] [--duration 300] [--doc]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    add_run_options, cycle_figures, DaemonDied, exit_on_sigterm, fmt, machine, median,
    overlap, publish, RateGuest, scratch_image, watch)
from tests.support.common import GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.images import evict  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

LEVEL = 0.9
BUCKET = 10          # seconds per column of the timeline


def drops(shares: list[float], level: float = LEVEL) -> tuple[int, int]:
    """(times the series went from >= level to < level, samples below level)."""
    n, below, prev = 0, 0, None
    for s in shares:
        if s < level:
            below += 1
            if prev is not None and prev >= level:
                n += 1
        prev = s
    return n, below


def one_source(source: str, img: str, args, tmp: str) -> dict:
    evict(img)
    zone = (args.zone_offset, args.zone)
    guest = RateGuest(img, args.zone_offset, args.zone, [("randread", args.read_iops)],
                      log_dir=tmp).start()
    d = DaemonProc(tmp, img, "--uri", "", "--access-source", source, *args.daemon_args.split(),
                   max_hold=args.max_hold, interval=args.interval, status=f"status-{source}.json",
                   log=f"daemon-{source}.log", env=env_without_systemd())
    series: list[tuple[float, float, float]] = []
    wall0 = time.time()

    def on_second(t, vmlck, st):
        share = overlap((st or {}).get("regions"), *zone) / args.zone
        series.append((t, share, vmlck / args.zone))
        if int(t) % 30 == 0 and t > 1:
            print(f"    t={t:4.0f} s: zone held {share:.0%} (cycle "
                  f"{(st or {}).get('cycle', 0)}), VmLck {fmt(vmlck)}", flush=True)

    try:
        w = watch(d, args.duration, on_second=on_second, cpu_from=args.settle)
        rc = d.stop()
        if rc != 0:
            raise DaemonDied(f"{source}: the daemon exited {rc} on SIGTERM:\n{d.log_tail(20)}")
    finally:
        d.stop()
        rates = guest.stop()
    warnings = [ln for ln in d.output().splitlines() if " WARNING " in ln]
    late = [x for x in series if x[0] >= args.settle]
    status_sh = [s for _, s, _ in late]
    lck_sh = [v for _, _, v in late]
    n_drop, n_below = drops(status_sh)
    l_drop, l_below = drops(lck_sh)
    late_cycles = [c for c in w["cycles"] if c.get("time", 0) - wall0 >= args.settle]
    r = {**cycle_figures(w), "source": source,
         "min_share": min(status_sh) if status_sh else math.nan,
         "median_share": median(status_sh), "drops": n_drop, "below_s": n_below,
         "min_lck_share": min(lck_sh) if lck_sh else math.nan, "lck_drops": l_drop,
         "lck_below_s": l_below, "seconds": len(late),
         "released": sum(c.get("released_bytes", 0) for c in late_cycles),
         "loaded": sum(c.get("loaded_bytes", 0) for c in late_cycles),
         "drop_times": [round(t) for (t, s, _), (_, p, _) in zip(late[1:], late)
                        if s < LEVEL <= p],
         "cpu": w["cpu_late"], "rates": rates, "warnings": warnings[:5],
         "n_warnings": len(warnings),
         "series": series}
    print(f"  {source:<8}: zone held min {r['min_share']:.0%} (VmLck {r['min_lck_share']:.0%}), "
          f"median {r['median_share']:.0%}; below {LEVEL:.0%}: {n_drop} drops, {n_below} s "
          f"(VmLck: {l_drop} drops, {l_below} s) at t = {r['drop_times'][:8]}; released "
          f"{fmt(r['released'])}, loaded {fmt(r['loaded'])} after {args.settle:g} s; events "
          f"lost {r['events_lost_total']}; CPU {r['cpu']:.2f} % after {args.settle:g} s; source "
          f"{r['access_source']}; fio {sum(v[0] for v in rates.values()):,.0f} reads/s; "
          f"{len(warnings)} warnings", flush=True)
    for ln in warnings[:3]:
        print(f"    daemon: {ln}", flush=True)
    return r


def table(results: list[dict], args) -> str:
    lines = [f"| source | zone held, min (status / VmLck) | median | drops below {LEVEL:.0%} "
             f"(status / VmLck) | seconds below {LEVEL:.0%} | drops at t (s) | released / "
             "loaded | events lost | CPU % after settling |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['source']} | {r['min_share']:.0%} / {r['min_lck_share']:.0%} "
                     f"| {r['median_share']:.0%} | {r['drops']} / {r['lck_drops']} "
                     f"| {r['below_s']} / {r['lck_below_s']} of {r['seconds']} "
                     f"| {' '.join(map(str, r['drop_times'][:12])) or '—'} "
                     f"| {fmt(r['released'])} / {fmt(r['loaded'])} | {r['events_lost_total']} "
                     f"| {r['cpu']:.2f} |")
    tr = [r for r in results if r["source"] == "trace"]
    if tr:
        t = tr[0]
        ok = t["min_share"] >= LEVEL and t["min_lck_share"] >= LEVEL
        lines += ["", f"Target: the trace source never below {LEVEL:.0%} of the zone after "
                      f"{args.settle:g} s: min {t['min_share']:.0%} (VmLck "
                      f"{t['min_lck_share']:.0%}), **{'met' if ok else 'MISSED'}**."]
    lines += ["", f"Zone held (status), the minimum of each {BUCKET} s:", "",
              "| t (s) | " + " | ".join(r["source"] for r in results) + " |",
              "|---|" + "---|" * len(results)]
    span = max((r["series"][-1][0] for r in results if r["series"]), default=0)
    for b in range(0, int(span) + 1, BUCKET):
        cells = []
        for r in results:
            v = [s for t, s, _ in r["series"] if b <= t < b + BUCKET]
            cells.append(f"{min(v):.0%}" if v else "—")
        lines.append(f"| {b}–{b + BUCKET} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-size", type=parse_size, default=None, help="(4G)")
    ap.add_argument("--zone", type=parse_size, default=None, help="hot zone size (512M)")
    ap.add_argument("--zone-offset", type=parse_size, default=None, help="(1G)")
    ap.add_argument("--max-hold", type=parse_size, default=None, help="(640M)")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--read-iops", type=int, default=2000)
    ap.add_argument("--duration", type=float, default=None, help="per source, s (300)")
    ap.add_argument("--settle", type=float, default=30.0, help="first seconds left out")
    ap.add_argument("--sources", default="trace,mincore")
    ap.add_argument("--daemon-args", default="", help="more `vmdisktouch run` options")
    add_run_options(ap, "1G image, 128M zone, 90 s")
    args = ap.parse_args()
    q = args.quick
    for k, full, quick in (("image_size", 4 * GiB, GiB), ("zone", 512 * MiB, 128 * MiB),
                           ("zone_offset", GiB, 256 * MiB), ("max_hold", 640 * MiB, 160 * MiB),
                           ("duration", 300.0, 90.0)):
        if getattr(args, k) is None:
            setattr(args, k, quick if q else full)
    if args.zone_offset + args.zone > args.image_size:
        ap.error("the zone does not fit in the image")
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    exit_on_sigterm("bench_readonly_hold")
    print(f"{machine()}; zone {fmt(args.zone)} at {fmt(args.zone_offset)}, --max-hold "
          f"{fmt(args.max_hold)}, {args.duration:g} s per source: {', '.join(sources)}",
          flush=True)
    results = []
    with scratch_image(args, "bench-readonly-hold-") as (img, tmp):
        for s in sources:
            print(f"{s}:", flush=True)
            results.append(one_source(s, img, args, tmp))
    body = (f"A {fmt(args.image_size)} non-sparse image on {args.dir}; a hot zone of "
            f"{fmt(args.zone)} at {fmt(args.zone_offset)} read at random by fio "
            f"({args.read_iops} 4 KiB reads/s, psync, buffered, no writes); `vmdisktouch run "
            f"IMG --max-hold {fmt(args.max_hold)} --interval {args.interval:g} --uri '' "
            f"--access-source SOURCE` started with the guest, {args.duration:g} s per source, "
            f"one after the other, the image's cache dropped before each. Zone held = the "
            f"status's regions ∩ the zone, sampled every second, with the daemon's VmLck ÷ the "
            f"zone beside it; figures after the first {args.settle:g} s.\n\n"
            + table(results, args))
    publish(body, results, args, "readonly-hold",
            "A read-only hot zone held continuously: trace vs mincore")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
