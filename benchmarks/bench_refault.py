"""A hot set twice the budget, an LRU that thrashes: is the thrash seen, and held where it is worst?

The trace source counts a page added to the cache soon after the kernel
deleted it as a refault, and a block's thrash share raises its rank
(``core.policy``). This scenario makes the guest's cache thrash and asks
three things: does the status (``thrashing_ranges``) and the block map
(yellow) show it, does the daemon hold the part of the hot set that
refaults most, and what does that do to the guest's reads, against no
daemon and the mincore source (which cannot see refaults) in the same run.

Scenario: a non-sparse image (``--image-size``, 2 GiB, on ``--dir``
/var/tmp); a hot set of ``--hot`` (512 MiB) at ``--hot-offset`` (256 MiB),
twice the budget (``--max-hold``, default half the hot set). fio reads it
at random as fast as it can (4 KiB ``randread``, ``psync``, buffered) with
``random_distribution=zoned:75/50:25/50``: three reads in four go to the
first half (A), one in four to the second (B). fio runs in a cgroup v1
memory group limited to ``--limit`` (default 3/8 of the hot set), so its
cache cannot hold even the half the daemon leaves it, and the LRU thrashes
all along; the daemon runs outside
it, ``vmdisktouch run IMG --max-hold BUDGET --interval 5 --uri ''
--access-source SOURCE --map-png …``. Scenarios ``none``, ``trace``,
``mincore``, ``trace-nospill`` (``--scenarios``) one after the other for
``--duration`` s (120) each, the image's cache dropped before each; ``--rounds 2`` runs them
again in reverse order (A B B A). ``trace-nospill`` is the trace source
with ``--spill 0``: the spill keeps B cached outside the group, so the LRU
thrashes only without it, and the targets are judged there when it runs.

Reported per scenario: fio's read IOPS; the kernel's own count of refaults
in the group (``workingset_refault_file`` of ``memory.stat``, an
independent witness); the share of A and of B held at the end, and when A
was first 90 % held; and for the trace source the most bytes the status
listed as thrashing and the yellow pixels of the block map at that moment
(the PNG is kept with ``--keep``). Targets: the thrash is shown (status and
map), and A, the part that refaults most, is the part held.

``--quick``: a 1 GiB image, a 256 MiB hot set, 60 s. ``--doc`` writes
section "refault" of docs/benchmarks/refault.md.

    .venv/bin/python benchmarks/bench_refault.py [--quick] [--rounds 2] [--doc]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    add_run_options, cycle_figures, DaemonDied, exit_on_sigterm, fmt, machine, median,
    overlap, publish, RateGuest, round_orders, scratch_image, spread_text, watch)
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.images import evict  # noqa: E402
from vmdisktouch.adapters.pictures import figure, render  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

SKEW = "zoned:75/50:25/50"     # fio: 75 % of reads on the first half of the hot set
HELD_LEVEL = 0.9
SCENARIO_ARGS = {"trace-nospill": ("--spill", "0")}   # more daemon options per scenario


def yellow_pixels(png: str, size: int, block_size: int) -> int:
    """Map pixels drawn in the thrashing colour (thrashing, not held): the grid only,
    read with the daemon's default geometry, so the legend's swatch does not count."""
    layout = render.Layout.fit(-(-size // block_size))
    scale = figure.fit_scale(layout.width, None)
    try:
        with Image.open(png) as im:
            rgb = figure.grid_pixels(im, layout.width, layout.height, scale)
    except (OSError, ValueError):
        return 0
    # the thrashing colour at any of render's shades (half to full brightness)
    k = rgb[:, 0] / render.THRASHING[0]
    want = k[:, None] * np.asarray(render.THRASHING, dtype=np.float64)
    return int(((k >= 0.45) & np.all(np.abs(rgb - want) <= 1.0, axis=1)).sum())


def thrash_bytes(st: dict | None) -> int:
    return sum(n for _, n in (st or {}).get("thrashing_ranges") or [])


def one_scenario(name: str, img: str, args, tmp: str, k: int) -> dict:
    evict(img)
    half = args.hot // 2
    a, b = (args.hot_offset, half), (args.hot_offset + half, args.hot - half)
    cg = MemoryCgroup(f"refault-{name}", args.limit).create()
    guest = RateGuest(img, args.hot_offset, args.hot, [("randread", args.read_iops)],
                      log_dir=tmp)
    guest.argv = cg.wrap(guest.argv + [f"--random_distribution={SKEW}"])
    d = hcg = None
    try:
        refaults0 = cg.stat().get("workingset_refault_file", 0)
        guest.start()
        if name == "none":
            sleep_alive_guest(guest, args.duration)
            w, series, best = None, [], {}
        else:
            map_png = os.path.join(tmp, f"map-{name}-{k}.png")
            if args.holder_limit:
                hcg = MemoryCgroup(f"refault-holder-{name}", args.holder_limit).create()
            d = DaemonProc(tmp, img, "--uri", "", "--access-source", name.split("-")[0],
                           "--map-png", map_png, *SCENARIO_ARGS.get(name, ()),
                           *args.daemon_args.split(), max_hold=args.max_hold,
                           interval=args.interval, status=f"status-{name}-{k}.json",
                           log=f"daemon-{name}-{k}.log", env=env_without_systemd(),
                           prefix=hcg.wrap([]) if hcg else ())
            series, best = [], {"bytes": -1}

            def on_second(t, vmlck, st):
                regions = (st or {}).get("regions")
                tb = thrash_bytes(st)
                series.append((t, overlap(regions, *a) / a[1], overlap(regions, *b) / b[1], tb))
                if st and tb > best["bytes"] and os.path.exists(map_png):
                    shutil.copyfile(map_png, best_png := os.path.join(
                        tmp, f"map-{name}-{k}-most-thrash.png"))
                    best.update(bytes=tb, t=t, png=best_png, yellow=yellow_pixels(
                        best_png, st["size_bytes"], st["block_size"]))
                if int(t) % 30 == 0 and t > 1:
                    print(f"    t={t:4.0f} s: A held {series[-1][1]:.0%}, B {series[-1][2]:.0%}, "
                          f"thrashing {fmt(tb)}, VmLck {fmt(vmlck)}", flush=True)

            w = watch(d, args.duration, on_second=on_second)
            rc = d.stop()
            if rc != 0:
                raise DaemonDied(f"{name}: the daemon exited {rc} on SIGTERM:\n{d.log_tail(20)}")
        refaults = cg.stat().get("workingset_refault_file", 0) - refaults0
    finally:
        if d is not None:
            d.stop()
        rates = guest.stop()
        cg.cleanup()
        if hcg:
            hcg.cleanup()
    iops = sum(v[0] for v in rates.values())
    r = {"scenario": name, "round": k, "iops": iops, "refaults": refaults,
         "refaults_per_s": refaults / args.duration}
    if w is not None:
        last = series[-1] if series else (0, math.nan, math.nan, 0)
        a_at = next((t for t, sa, _, _ in series if sa >= HELD_LEVEL), math.nan)
        trace_refaulted = sum((c.get("trace") or {}).get("refaulted_pages", 0)
                              for c in w["cycles"])
        r.update(cycle_figures(w), a_held=last[1], b_held=last[2], a_at=a_at,
                 a_median=median([s for _, s, _, _ in series[len(series) // 2:]]),
                 b_median=median([s for _, _, s, _ in series[len(series) // 2:]]),
                 thrash_max=max(best["bytes"], 0), thrash_at=best.get("t", math.nan),
                 yellow=best.get("yellow", 0), png=best.get("png"),
                 traced_refaults=trace_refaulted, cpu=w["cpu"])
    print(f"  {name:<8} (round {k + 1}): fio {iops:,.0f} reads/s; group refaults "
          f"{r['refaults_per_s']:,.0f}/s"
          + (f"; A held {r['a_held']:.0%} (90 % at {r['a_at']:.0f} s), B {r['b_held']:.0%}; "
             f"most thrashing listed {fmt(r['thrash_max'])} at {r['thrash_at']:.0f} s, "
             f"{r['yellow']} yellow px; traced refaults {r['traced_refaults']:,} pages; "
             f"source {r['access_source']}" if w is not None else ""), flush=True)
    return r


def sleep_alive_guest(guest: RateGuest, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not guest.alive():
            raise RuntimeError("fio exited early:\n" + open(guest.out_path).read()[-1000:])
        time.sleep(0.5)


def table(results: list[dict], scenarios: list[str]) -> str:
    lines = ["| scenario | fio reads/s | vs none | group refaults/s | A held (end / median of "
             "2nd half) | B held | A 90 % held at | most listed thrashing | yellow px then |",
             "|---|---|---|---|---|---|---|---|---|"]
    none = {r["round"]: r["iops"] for r in results if r["scenario"] == "none"}
    for name in scenarios:
        rs = [r for r in results if r["scenario"] == name]
        if not rs:
            continue
        iops = [r["iops"] for r in rs]
        ratio = [r["iops"] / none[r["round"]] for r in rs if none.get(r["round"])]
        cells = [f"{median(iops):,.0f} ({spread_text(iops, ',.0f')})",
                 f"{median(ratio):.2f}×" if ratio else "—",
                 f"{median([r['refaults_per_s'] for r in rs]):,.0f}"]
        if name == "none":
            cells += ["—"] * 5
        else:
            cells += [" · ".join(f"{r['a_held']:.0%} / {r['a_median']:.0%}" for r in rs),
                      " · ".join(f"{r['b_held']:.0%}" for r in rs),
                      " · ".join(f"{r['a_at']:.0f} s" for r in rs),
                      " · ".join(fmt(r["thrash_max"]) for r in rs),
                      " · ".join(str(r["yellow"]) for r in rs)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    # The signal is judged where the LRU is left to thrash: without the spill when that ran.
    signal = "trace-nospill" if any(r["scenario"] == "trace-nospill" for r in results) \
        else "trace"
    tr = [r for r in results if r["scenario"] == signal]
    if tr:
        shown = all(r["thrash_max"] > 0 and r["yellow"] > 0 for r in tr)
        held_a = all(r["a_held"] >= HELD_LEVEL and r["a_held"] > r["b_held"] for r in tr)
        lines += ["", f"Targets, {signal}, every round: the thrash shown in the status and "
                      f"on the map: **{'met' if shown else 'MISSED'}**; A (the part that "
                      f"refaults most) held at ≥ {HELD_LEVEL:.0%} at the end, more than B: "
                      f"**{'met' if held_a else 'MISSED'}**."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-size", type=parse_size, default=None, help="(2G)")
    ap.add_argument("--hot", type=parse_size, default=None, help="hot set (512M)")
    ap.add_argument("--hot-offset", type=parse_size, default=None, help="(256M)")
    ap.add_argument("--max-hold", type=parse_size, default=None, help="(half the hot set)")
    ap.add_argument("--limit", type=parse_size, default=None,
                    help="the guest's cgroup limit (3/8 of the hot set)")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--read-iops", type=int, default=0, help="fio's rate_iops (0: no limit)")
    ap.add_argument("--duration", type=float, default=None, help="per scenario, s (120)")
    ap.add_argument("--scenarios", default="none,trace,mincore,trace-nospill",
                    help="trace-nospill: the trace source with --spill 0")
    ap.add_argument("--rounds", type=int, default=1, help="A B C, C B A, ...")
    ap.add_argument("--daemon-args", default="", help="more `vmdisktouch run` options")
    ap.add_argument("--holder-limit", type=parse_size, default=None, metavar="SIZE",
                    help="the daemon in a cgroup v1 memory group of its own limited to SIZE, "
                         "as on a host short of memory: what it loads and no longer locks is "
                         "reclaimed there (section refault-holder-limit; default: no group)")
    add_run_options(ap, "1G image, 256M hot set, 60 s", "keep the logs and maps (printed path)")
    args = ap.parse_args()
    q = args.quick
    for key, full, quick in (("image_size", 2 * GiB, GiB), ("hot", 512 * MiB, 256 * MiB),
                             ("hot_offset", 256 * MiB, 128 * MiB), ("duration", 120.0, 60.0)):
        if getattr(args, key) is None:
            setattr(args, key, quick if q else full)
    args.max_hold = args.max_hold or args.hot // 2
    args.limit = args.limit or args.hot * 3 // 8
    if args.hot_offset + args.hot > args.image_size:
        ap.error("the hot set does not fit in the image")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    exit_on_sigterm("bench_refault")
    print(f"{machine()}; hot set {fmt(args.hot)} at {fmt(args.hot_offset)}, --max-hold "
          f"{fmt(args.max_hold)}, cgroup limit {fmt(args.limit)}, {args.duration:g} s per "
          f"scenario; rounds: {' | '.join(' '.join(o) for o in round_orders(scenarios, args.rounds))}",
          flush=True)
    results = []
    with scratch_image(args, "bench-refault-") as (img, tmp):
        for k, order in enumerate(round_orders(scenarios, args.rounds)):
            for name in order:
                results.append(one_scenario(name, img, args, tmp, k))
    body = (f"A {fmt(args.image_size)} non-sparse image on {args.dir}; a hot set of "
            f"{fmt(args.hot)} at {fmt(args.hot_offset)}, twice the budget, read at random by "
            f"fio as fast as it can (4 KiB, psync, buffered, `random_distribution={SKEW}`: "
            f"A = the first half gets 75 % of the reads) in a cgroup v1 memory group limited "
            f"to {fmt(args.limit)}, so the LRU thrashes; `vmdisktouch run IMG --max-hold "
            f"{fmt(args.max_hold)} --interval {args.interval:g} --uri '' --access-source "
            f"SOURCE` outside the group"
            + (f", in a group of its own limited to {fmt(args.holder_limit)}" if args.holder_limit
               else "") + f"; {args.duration:g} s per scenario, one after the other, "
            f"the cache dropped before each; {args.rounds} round(s), reversed every other "
            f"round. Group refaults: `workingset_refault_file` of the group's memory.stat. "
            f"Held shares from the status's regions, every second; per round, separated by "
            f"·.\n\n" + table(results, scenarios))
    publish(body, results, args, "refault-holder-limit" if args.holder_limit else "refault",
            "Refaults: a hot set twice the budget, an LRU that thrashes"
            + (f"; the daemon's own group limited to {fmt(args.holder_limit)}"
               if args.holder_limit else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
