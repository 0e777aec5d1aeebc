"""The daemon's CPU cost with a guest that writes: the trace source against the mincore source.

Scenario: a non-sparse raw image (``--image-size``, 8 GiB, on a real disk,
``--dir`` /var/tmp) whose first ``--held`` bytes (4 GiB) are cached (read
before each run) and held: ``vmdisktouch run IMG --max-hold HELD --interval 5
--uri '' --access-source ...``. The guest is fio over those first HELD bytes,
4 KiB, ``psync``, buffered, ``--invalidate=0``: a writer at ``--write-iops``
(600) random ``O_DSYNC`` pwrites per second and a reader at ``--read-iops``
(2000) random reads per second. The guest starts, then the daemon; after
``--warmup`` s (20, longer until it holds 90 % of the budget, at most
``--load-timeout``) the daemon is sampled for ``--duration`` s (60): its
CPU, utime + stime of ``/proc/PID/stat`` over the window's wall time (% of
one core; the threads' schedstat run time as a cross-check), and every
cycle's ``cycle_seconds`` from the status file (median, max), with what it
held, loaded, released and lost (``events_lost``) in the window.

Scenarios, interleaved (A B C, C B A, ... for ``--rounds`` rounds, 2: so
trace and mincore run A B B A): ``trace``; ``mincore`` (checksum share 1/16,
the default); ``mincore-all`` (``--checksum-share 1``: every held byte
hashed each cycle, the behaviour before bounded checksums). Each run starts
a fresh guest and daemon on the same image and seeds.

Targets: trace ≤ 1 % of a core and a cycle ≤ 0.1 s; mincore with bounded
checksums ≤ 5 %.

``--curve``: the trace source only, held = 256M, 1G, 4G, 16G
(``--curve-sizes``), the same guest over each held zone, one image for all
sizes (``--image-size``, or the largest HELD + 4 GiB when that is over half
of it: 20 GiB with 16G);
sizes whose held bytes do not fit in MemAvailable (with 3 GiB to spare) or
whose image does not fit on the disk are skipped and named. It shows whether
the cost grows with the held bytes.

``--curve-span SPAN``: the guest works over the first SPAN bytes at every
size (all of them cached before each run), not over the held zone: its
footprint (the distinct blocks it reads and writes per cycle) is the same at
every point, and what changes is the held bytes alone. Section
"source-cost-curve-span".

``--compare-rev REV``: the trace scenario also with the daemon of commit REV
(``trace-rev``, a temporary git worktree, removed afterwards), next to it in
each round; the two side by side, with the memory besides the held pages
(VmRSS - VmLck at the window's end).

``--quick``: a 1 GiB image, 256M held (curve: 64M, 256M), 10 s warm-up,
20 s windows, one round: a smoke run. ``--doc`` writes section
"source-cost" (or "source-cost-curve") of docs/benchmarks/source-cost.md.

    .venv/bin/python benchmarks/bench_source_cost.py [--quick] [--curve] [--doc]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    DaemonDied, RateGuest, add_compare_rev, add_run_options, cache_range, cycle_figures,
    disk_free, exit_on_sigterm, fmt, machine, mem_available, median, publish, rates_text,
    round_orders, scratch_image, side_by_side, sleep_alive, spread_text, wait_first_status,
    watch)
from tests.support.common import GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.procfs import memory_fields  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

REV = "-rev"          # trace-rev: the trace scenario with the daemon of --compare-rev
SCENARIOS = {
    "trace": ("--access-source", "trace"),
    "mincore": ("--access-source", "mincore"),
    "mincore-all": ("--access-source", "mincore", "--checksum-share", "1"),
}
LABELS = {
    "trace": "trace",
    "mincore": "mincore, checksum share 1/16 (default)",
    "mincore-all": "mincore, checksum share 1 (before bounded checksums)",
}
TARGET_TRACE_CPU = 1.0       # % of one core
TARGET_TRACE_CYCLE = 0.1     # s
TARGET_MINCORE_CPU = 5.0     # % of one core
SPARE_MEMORY = 3 * GiB


def warm_up(d, held: int, args, guest) -> float:
    """``--warmup`` s, then on until the daemon holds 90 % of ``held``; the seconds spent."""
    t0 = time.monotonic()
    sleep_alive(d, args.warmup, guest)
    deadline = t0 + max(args.warmup, args.load_timeout)
    while time.monotonic() < deadline:
        st = d.read_status() or {}
        if st.get("held_bytes", 0) >= 0.9 * held:
            break
        sleep_alive(d, 0.5, guest)
    else:
        st = d.read_status() or {}
        print(f"    warning: held {fmt(st.get('held_bytes', 0))} of {fmt(held)} after "
              f"{time.monotonic() - t0:.0f} s; sampling anyway", flush=True)
    return time.monotonic() - t0


def one_run(name: str, extra, img: str, held: int, args, tmp: str, tag: str,
            span: int | None = None, cwd: str | None = None) -> dict:
    """One daemon and guest; the guest over the first ``span`` bytes (None: ``held``);
    ``cwd``: the tree whose daemon runs (``--compare-rev``; None: this one)."""
    span = span or held
    t_cache = cache_range(img, 0, span)
    guest = RateGuest(img, 0, span, [("randwrite", args.write_iops),
                                     ("randread", args.read_iops)], log_dir=tmp).start()
    d = DaemonProc(tmp, img, "--uri", "", *extra, *shlex.split(args.daemon_args),
                   max_hold=held, interval=args.interval, status=f"status-{tag}.json",
                   log=f"daemon-{tag}.log", env=env_without_systemd(),
                   **({"cwd": cwd} if cwd else {}))
    rates = {}
    try:
        wait_first_status(d)
        warm = warm_up(d, held, args, guest)
        w = watch(d, args.duration)
        mem = memory_fields(d.pid, ("VmRSS", "VmLck"))
        rc = d.stop()
        if rc != 0:
            raise DaemonDied(f"{name}: the daemon exited {rc} on SIGTERM:\n{d.log_tail(20)}")
    finally:
        d.stop()
        rates = guest.stop()
    warnings = [ln for ln in d.output().splitlines() if " WARNING " in ln]
    r = {"name": name, "held_target": held, "warmup": warm, "cache_seconds": t_cache,
         "rates": rates, "warnings": warnings[:5], "n_warnings": len(warnings),
         **{k: w[k] for k in ("wall", "cpu", "cpu_user", "cpu_sys", "cpu_schedstat",
                              "cycle_median", "cycle_max")},
         "cycle_seconds": [c["cycle_seconds"] for c in w["cycles"]], **cycle_figures(w),
         "rss_besides_held": mem["VmRSS"] - mem["VmLck"]}
    print(f"  {name:<11} held {fmt(held):>5}: CPU {r['cpu']:.2f} % (user {r['cpu_user']:.2f} "
          f"+ sys {r['cpu_sys']:.2f}; schedstat {r['cpu_schedstat']:.2f}), cycle median "
          f"{r['cycle_median'] * 1000:.0f} ms max {r['cycle_max'] * 1000:.0f} ms over "
          f"{r['n_cycles']} cycles, held {fmt(r['held_median'])} (min {fmt(r['held_min'])}), "
          f"loaded {fmt(r['loaded'])}, released {fmt(r['released'])}, rewritten "
          f"{r['rewritten_median']:.0f} blocks/cycle, events lost "
          f"{r['events_lost']}, source {r['access_source']}, fio {rates_text(rates)}, "
          f"warm-up {warm:.0f} s, memory besides held {fmt(r['rss_besides_held'])}, "
          f"{r['n_warnings']} warnings", flush=True)
    for ln in warnings[:3]:
        print(f"    daemon: {ln}", flush=True)
    return r


def per_run_table(runs: list[dict], key: str) -> str:
    lines = [f"| round | {key} | CPU % (user + sys) | schedstat % | cycles | cycle median / max "
             "| held median (min) | loaded / released | rewritten blocks (median) | events lost "
             "| fio reads / writes per s | warm-up |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        rr = r["rates"]
        reads = sum(v[0] for v in rr.values())
        writes = sum(v[1] for v in rr.values())
        lines.append(
            f"| {r['round']} | {r[key] if key == 'name' else fmt(r['held_target'])} "
            f"| {r['cpu']:.2f} ({r['cpu_user']:.2f} + {r['cpu_sys']:.2f}) "
            f"| {r['cpu_schedstat']:.2f} | {r['n_cycles']} "
            f"| {r['cycle_median'] * 1000:.0f} / {r['cycle_max'] * 1000:.0f} ms "
            f"| {fmt(r['held_median'])} ({fmt(r['held_min'])}) "
            f"| {fmt(r['loaded'])} / {fmt(r['released'])} | {r['rewritten_median']:.0f} "
            f"| {r['events_lost']} "
            f"| {reads:,.0f} / {writes:,.0f} | {r['warmup']:.0f} s |")
    return "\n".join(lines)


def summary(runs: list[dict], groups: list, key) -> dict:
    out = {}
    for g in groups:
        rs = [r for r in runs if key(r) == g]
        if rs:
            out[g] = {"cpu": median([r["cpu"] for r in rs]), "cpus": [r["cpu"] for r in rs],
                      "cycle_median": median([s for r in rs for s in r["cycle_seconds"]]),
                      "cycle_max": max(r["cycle_max"] for r in rs),
                      "held": median([r["held_median"] for r in rs]),
                      "lost": sum(r["events_lost"] for r in rs), "runs": len(rs),
                      "rss": median([r["rss_besides_held"] for r in rs])}
    return out


def rev_lines(s: dict, tree) -> list[str]:
    """The trace source now against the daemon of ``--compare-rev``, side by side."""
    now, old = s.get("trace", {}), s.get("trace" + REV, {})
    return side_by_side(tree.rev, tree.sha, [
        ("CPU, % of one core", now.get("cpu"), old.get("cpu"), ".2f"),
        ("cycle median, ms", 1000 * now.get("cycle_median", math.nan),
         1000 * old.get("cycle_median", math.nan), ".0f"),
        ("memory besides held (VmRSS - VmLck)", now.get("rss"), old.get("rss"), fmt)],
        "the same guest and image, A B B A")


def compare_text(s: dict) -> str:
    lines = ["| scenario | CPU, % of one core (median of the runs) | runs (min–max) "
             "| cycle median (all cycles) | cycle max | held (median) | events lost |",
             "|---|---|---|---|---|---|---|"]
    for n, f in s.items():
        lines.append(f"| {LABELS[n]} | {f['cpu']:.2f} | {spread_text(f['cpus'])} "
                     f"| {f['cycle_median'] * 1000:.0f} ms | {f['cycle_max'] * 1000:.0f} ms "
                     f"| {fmt(f['held'])} | {f['lost']} |")
    lines.append("")
    # only the pairs both run (``--scenarios trace`` has none: no "nan" in the page)
    ratios = [f"{a} ÷ {b} **{s[a]['cpu'] / s[b]['cpu']:.1f} ×**"
              for a, b in (("mincore", "trace"), ("mincore-all", "trace"),
                           ("mincore-all", "mincore")) if a in s and b in s]
    if ratios and all(s[b]["cpu"] > 0 for b in ("trace", "mincore") if b in s):
        lines.append("CPU ratios (medians, same run): " + ", ".join(ratios) + ".")
    elif ratios:
        lines.append("CPU ratios: a source measured 0.")
    lines += ["", "Targets:", ""]
    if "trace" in s:
        tc, cm = s["trace"]["cpu"], s["trace"]["cycle_max"]
        lines.append(f"- trace ≤ {TARGET_TRACE_CPU:g} % of a core: **{tc:.2f} %**, "
                     f"{'met' if tc <= TARGET_TRACE_CPU else 'MISSED'};")
        lines.append(f"- trace cycle ≤ {TARGET_TRACE_CYCLE:g} s: max **{cm:.3f} s** "
                     f"(median {s['trace']['cycle_median']:.3f} s), "
                     f"{'met' if cm <= TARGET_TRACE_CYCLE else 'MISSED'};")
    if "mincore" in s:
        mc = s["mincore"]["cpu"]
        lines.append(f"- mincore with bounded checksums ≤ {TARGET_MINCORE_CPU:g} %: "
                     f"**{mc:.2f} %**, {'met' if mc <= TARGET_MINCORE_CPU else 'MISSED'}.")
    return "\n".join(lines)


def curve_text(s: dict, skipped: list[str]) -> str:
    lines = ["| held | CPU, % of one core (median) | runs (min–max) | cycle median | cycle max "
             "| held (median) | events lost |", "|---|---|---|---|---|---|---|"]
    for h, f in s.items():
        lines.append(f"| {fmt(h)} | {f['cpu']:.2f} | {spread_text(f['cpus'])} "
                     f"| {f['cycle_median'] * 1000:.0f} ms | {f['cycle_max'] * 1000:.0f} ms "
                     f"| {fmt(f['held'])} | {f['lost']} |")
    sizes = list(s)
    lo, hi = s[sizes[0]], s[sizes[-1]]
    if len(sizes) > 1 and lo["cpu"] > 0 and lo["cycle_median"] > 0:
        lines += ["", f"From {fmt(sizes[0])} to {fmt(sizes[-1])} held "
                      f"({sizes[-1] / sizes[0]:.0f} × the bytes): CPU × "
                      f"{hi['cpu'] / lo['cpu']:.2f}, cycle median × "
                      f"{hi['cycle_median'] / lo['cycle_median']:.2f}."]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    return "\n".join(lines)


def plan_curve(args) -> tuple[list[int], int, list[str]]:
    """The held sizes that fit, the image size, and why the others were left out."""
    sizes, skipped = [], []
    avail = mem_available()
    span = args.curve_span or 0
    for h in sorted(parse_size(x) for x in args.curve_sizes.split(",") if x.strip()):
        if max(h, span) + SPARE_MEMORY > avail:
            skipped.append(f"{fmt(h)}: MemAvailable {fmt(avail)} < held + {fmt(SPARE_MEMORY)}")
        else:
            sizes.append(h)
    image = args.image_size
    free = None if args.image else disk_free(args.dir)
    while sizes:
        top = max(sizes[-1], span)
        image = args.image_size if top <= args.image_size // 2 else top + 4 * GiB
        if args.image:
            image = os.path.getsize(args.image)
            if top <= image:
                break
            skipped.append(f"{fmt(sizes.pop())}: --image {args.image} is only {fmt(image)}")
        elif image + 2 * GiB <= free:
            break
        else:
            skipped.append(f"{fmt(sizes.pop())}: a {fmt(image)} image does not fit in "
                           f"{fmt(free)} free on {args.dir}")
    return sizes, image, skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-size", type=parse_size, default=None, help="image size (8G)")
    ap.add_argument("--held", type=parse_size, default=None,
                    help="cached, held and written zone at the image's start (4G)")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=None, help="seconds before sampling (20)")
    ap.add_argument("--load-timeout", type=float, default=180.0,
                    help="longest warm-up waiting for 90 %% of the budget held")
    ap.add_argument("--duration", type=float, default=None, help="sampling window, s (60)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (2)")
    ap.add_argument("--write-iops", type=int, default=600)
    ap.add_argument("--read-iops", type=int, default=2000)
    ap.add_argument("--scenarios", default="trace,mincore,mincore-all")
    ap.add_argument("--daemon-args", default="", help="more `vmdisktouch run` options")
    ap.add_argument("--curve", action="store_true", help="trace only, cost against held bytes")
    ap.add_argument("--curve-sizes", default=None, help="held sizes (256M,1G,4G,16G)")
    ap.add_argument("--curve-span", type=parse_size, default=None,
                    help="with --curve: the guest over the first SPAN bytes at every size")
    add_compare_rev(ap)
    add_run_options(ap, "small and short: a smoke run",
                    image="use this existing non-sparse image (it is written to!)")
    args = ap.parse_args()
    q = args.quick
    defaults = dict(image_size=GiB if q else 8 * GiB, held=256 * MiB if q else 4 * GiB,
                    warmup=10.0 if q else 20.0, duration=20.0 if q else 60.0,
                    rounds=1 if q else 2, curve_sizes="64M,256M" if q else "256M,1G,4G,16G")
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.curve_span and not args.curve:
        ap.error("--curve-span goes with --curve")
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario {bad[0]} (known: {', '.join(SCENARIOS)})")
    if args.compare_rev:
        if args.curve or "trace" not in names:
            ap.error("--compare-rev runs the trace scenario twice; not with --curve")
        names = [x for n in names for x in ((n, n + REV) if n == "trace" else (n,))]
        LABELS["trace" + REV] = f"trace, the daemon of {args.compare_rev}"
    exit_on_sigterm("bench_source_cost")
    stack = contextlib.ExitStack()
    tree = enter_rev_worktree(stack, args.compare_rev) if args.compare_rev else None

    skipped: list[str] = []
    if args.curve:
        sizes, image_size, skipped = plan_curve(args)
        for s in skipped:
            print(f"skipped held {s}", flush=True)
        if not sizes:
            print("no held size fits: nothing to run", flush=True)
            return 1
        orders = round_orders(sizes, args.rounds)
    else:
        if args.held > args.image_size:
            ap.error("--held is larger than --image-size")
        if args.held + SPARE_MEMORY > mem_available():
            ap.error(f"--held {fmt(args.held)} + {fmt(SPARE_MEMORY)} > MemAvailable")
        image_size = args.image_size
        orders = round_orders(names, args.rounds)
    print(f"{machine()}; rounds: " + " | ".join(
        " ".join(fmt(x) if isinstance(x, int) else x for x in o) for o in orders), flush=True)

    runs: list[dict] = []
    args.image_size = image_size
    with scratch_image(args, "bench-source-cost-") as (img, tmp):
        k = 0
        for rnd, order in enumerate(orders, 1):
            print(f"round {rnd}", flush=True)
            for item in order:
                k += 1
                if args.curve:
                    r = one_run("trace", SCENARIOS["trace"], img, item, args, tmp,
                                f"{k}-trace-{item >> 20}M", span=args.curve_span)
                else:
                    base = item[:-len(REV)] if item.endswith(REV) else item
                    r = one_run(item, SCENARIOS[base], img, args.held, args, tmp,
                                f"{k}-{item}", cwd=tree.path if base != item else None)
                r["round"] = rnd
                runs.append(r)

    guest = (f"fio over the zone: {args.write_iops} random 4 KiB O_DSYNC pwrites/s and "
             f"{args.read_iops} random 4 KiB reads/s (psync, buffered, `--invalidate=0`)")
    if args.curve:
        s = summary(runs, sorted({r["held_target"] for r in runs}), lambda r: r["held_target"])
        zone = ("the first HELD bytes cached and held" if not args.curve_span else
                f"its first {fmt(args.curve_span)} cached, HELD bytes of them held")
        where = guest if not args.curve_span else guest.replace(
            "over the zone", f"over the first {fmt(args.curve_span)} at every size")
        head = (f"The trace source only; a {fmt(image_size)} non-sparse image, {zone} "
                f"(`--max-hold HELD --interval {args.interval:g} --uri '' "
                f"--access-source trace`), {where}. Warm-up {args.warmup:g} s (longer until 90 % "
                f"of the budget is held), then a {args.duration:g} s window; "
                f"{args.rounds} round(s), sizes reversed every other round.\n\n")
        body = head + curve_text(s, skipped) + "\n\n" + per_run_table(runs, "held")
        section, title = "source-cost-curve", "Trace source: cost against held bytes"
        if args.curve_span:
            section = "source-cost-curve-span"
            title += f", the guest over {fmt(args.curve_span)} at every size"
    else:
        s = summary(runs, names, lambda r: r["name"])
        head = (f"A {fmt(image_size)} non-sparse image on {args.dir}, its first "
                f"{fmt(args.held)} cached and held (`--max-hold {fmt(args.held)} --interval "
                f"{args.interval:g} --uri ''`), {guest}. Each run: a fresh guest and daemon; "
                f"warm-up {args.warmup:g} s (longer until 90 % of the budget is held), then a "
                f"{args.duration:g} s window: CPU = utime + stime of /proc/PID/stat ÷ wall "
                f"time; cycle times = the status's `cycle_seconds` of each cycle in the "
                f"window. Order: " + "; ".join(", ".join(o) for o in orders) + ".\n\n")
        body = head + compare_text(s) + "\n\nEach run:\n\n" + per_run_table(runs, "name")
        section, title = "source-cost", "Access sources: the daemon's CPU with a guest that writes"
        if tree:
            body += "\n\n" + "\n".join(rev_lines(s, tree))
    stack.close()
    publish(body, runs, args, section, title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
