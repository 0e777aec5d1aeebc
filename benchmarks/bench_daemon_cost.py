"""Daemon cost benchmark: CPU, RSS and cycle time of `vmdisktouch run` from 1 GiB to 1 TiB.

Target 2 of issue #5: `vmdisktouch run` on a 1 TiB image at ``--interval 5``
costs at most 1 % of one core in steady state (``/proc/PID/stat`` over at
least 60 s after the first cycle), at most 128 MiB of RSS besides the held
pages, and at most 0.5 s per cycle; and the growth of cycle time and RSS with
the image size is shown from 1 GiB to 1 TiB.

For each size in ``--sizes`` (default 1G,16G,128G,1T) a sparse image is
created in ``--dir`` and a few scattered 1 MiB extents of it are written with
random data (as a guest fills a thin image; the daemon never holds holes) and
read with buffered reads (POSIX_FADV_RANDOM: no readahead): ``--extents`` (1000) at 1 TiB, scaled down with the square
root of the size for smaller images (31 at 1 GiB). The kernel here pages out
page cache it judges idle on its own (DAMON), so, as in bench_scan, the
benchmark keeps those extents mlocked in its own process for the whole case:
every cycle of the daemon sees the same cached state (checked: the daemon's
``resident_bytes`` is reported). The first page (the header that open_image
reads) is held too.

Then ``python -m vmdisktouch run IMG --max-hold 256M --interval 5 --status
STATUS.json`` starts as a subprocess. Once the status file appears (the first
cycle is done: start-up and imports are excluded) the benchmark samples, for
``--duration`` seconds (60; ``--scale-duration``, 30, for images smaller than
1 TiB):

* CPU: utime + stime of ``/proc/PID/stat`` (all threads) at both ends of the
  window, divided by the wall time (also from the per-thread
  ``schedstat`` run times, in ns, as a cross-check);
* memory, once a second, from ``/proc/PID/status``: VmRSS, RssAnon (the RSS
  besides held pages: held pages are file-backed, so they are in RssFile,
  never in RssAnon), RssFile, VmLck and VmHWM;
* ``cycle_seconds`` of every cycle completed in the window, from the status
  JSON (median and maximum).

Whether the daemon holds anything in these cases depends on its heat
defaults (recorded in the report): at decay 0.01/threshold 0.2 a lone cached
1 MiB block never reaches the threshold (its smoothed heat is 0.1995) and the
budget stays empty; at decay 0.1/threshold 0.05 every extent and a few
neighbouring blocks become regions and the budget fills. The table reports
what was held, in how many regions, and how much was loaded per cycle.
``--held-case`` (off by default) adds one more case at the largest size with
``--hot-regions`` (10) wide cached regions of ``--hot-size`` (32 MiB) besides
the extents, more than the budget, so that the budget fills at any
defaults; its window starts once the budget is full (or after 180 s).

The daemon is stopped with SIGTERM (by PID) and the images are removed at the
end of each case, also on errors and on SIGINT/SIGTERM of the benchmark.
Results: a table on stdout, the chart ``docs/img/daemon_cost.png`` (cycle
time, RSS and CPU against image size, log x axis, drawn with Pillow) and
section "daemon-cost" of docs/benchmarks/daemon-cost.md.

Usage: .venv/bin/python benchmarks/bench_daemon_cost.py [--sizes 1G,16G,128G,1T]
       [--duration 60] [--scale-duration 30] [--no-held-case] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.cached_state import cached as cache_and_pin  # noqa: E402
from benchmarks.report import provenance, update_section  # noqa: E402
from tests.support.daemon_proc import DaemonProc  # noqa: E402
from tests.support.procfs import CLK_TCK, cpu_ns, cpu_ticks, memory_fields  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.system import libc  # noqa: E402
from vmdisktouch.sizes import format_size, parse_size  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
PAGE = libc.PAGE_SIZE
PNG = os.path.join(ROOT, "docs", "img", "daemon_cost.png")

# Targets of issue #5, section 2.
TARGET_CPU = 1.0            # % of one core
TARGET_RSS = 128 * MiB      # besides the held pages
TARGET_CYCLE = 0.5          # seconds


# -- the cached state ---------------------------------------------------------

def scaled_extents(size: int, at_1tib: int) -> int:
    """1 MiB extents for an image of ``size``: ``at_1tib`` scaled by sqrt(size / 1 TiB)."""
    n = round(at_1tib * math.sqrt(size / TiB))
    return max(1, min(n, size // MiB // 4))


def layout(size: int, extents: int, hot_regions: int, hot_size: int,
           seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(scattered 1 MiB extents incl. the header page, wide hot regions), byte runs."""
    rng = random.Random(seed)
    nmib = size // MiB
    hot: list[tuple[int, int]] = []
    taken: set[int] = {0}
    hot_mib = hot_size // MiB
    if hot_regions:
        slots = rng.sample(range(1, nmib // (hot_mib * 4)), hot_regions)
        for s in sorted(slots):
            start = s * hot_mib * 4            # a gap of >= 3 region lengths between regions
            hot.append((start * MiB, hot_mib * MiB))
            taken.update(range(start - 8, start + hot_mib + 8))
    offs: set[int] = set()
    while len(offs) < extents:
        o = rng.randrange(1, nmib)
        if o not in taken:
            offs.add(o)
    runs = [(0, PAGE)] + [(o * MiB, MiB) for o in sorted(offs)]
    return runs, hot


# -- /proc sampling -----------------------------------------------------------

MEM_KEYS = ("VmRSS", "RssAnon", "RssFile", "VmLck", "VmHWM")


def mem_status(pid: int) -> dict[str, int]:
    return memory_fields(pid, MEM_KEYS)


# -- one case -----------------------------------------------------------------

class DaemonFailed(RuntimeError):
    pass


def measure(d: DaemonProc, duration: float, wait_full: int | None, interval: float) -> dict:
    """Wait for the first cycle (and a full budget), then sample for ``duration`` s."""
    pid = d.pid
    read_status = d.read_status

    def check_alive():
        if not d.alive():
            raise DaemonFailed(f"daemon exited with {d.returncode()}:\n{d.log_tail(20)}")

    deadline = time.monotonic() + 120
    st = None
    while st is None:
        check_alive()
        if time.monotonic() > deadline:
            raise DaemonFailed(f"no status file after 120 s:\n{d.log_tail(20)}")
        time.sleep(0.05)
        st = read_status()
    first = st
    if wait_full:
        deadline = time.monotonic() + 180
        while st["held_bytes"] < 0.95 * wait_full:
            check_alive()
            if time.monotonic() > deadline:
                print(f"    warning: budget not full after 180 s (held "
                      f"{format_size(st['held_bytes'])}); sampling anyway", flush=True)
                break
            time.sleep(0.2)
            st = read_status() or st
        else:
            print(f"    budget full at cycle {st['cycle']} (held "
                  f"{format_size(st['held_bytes'])}); sampling", flush=True)

    start_cycle = st["cycle"]
    cycles: dict[int, dict] = {}
    mem: list[dict[str, int]] = []
    t0 = time.monotonic()
    ticks0, ns0 = cpu_ticks(pid), cpu_ns(pid)
    next_mem = t0
    while True:
        now = time.monotonic()
        if now >= t0 + duration:
            break
        check_alive()
        if now >= next_mem:
            mem.append(mem_status(pid))
            next_mem += 1.0
        s = read_status()
        if s and s["cycle"] > start_cycle:
            cycles[s["cycle"]] = s
        time.sleep(min(0.1, max(0.0, t0 + duration - time.monotonic())))
    ticks1, ns1 = cpu_ticks(pid), cpu_ns(pid)
    wall = time.monotonic() - t0
    mem.append(mem_status(pid))
    s = read_status()
    if s and s["cycle"] > start_cycle:
        cycles[s["cycle"]] = s
    n_expected = int(duration // interval)
    if len(cycles) < max(1, n_expected - 1):
        # status polled every 0.1 s, a cycle every `interval` s: none should be missed
        print(f"    warning: saw {len(cycles)} cycles, expected ~{n_expected}", flush=True)
    secs = [c["cycle_seconds"] for c in cycles.values()]
    return {
        "first_cycle_seconds": first["cycle_seconds"],
        "wall": wall,
        "cpu_percent": 100.0 * (sum(ticks1) - sum(ticks0)) / CLK_TCK / wall,
        "cpu_user_percent": 100.0 * (ticks1[0] - ticks0[0]) / CLK_TCK / wall,
        "cpu_sys_percent": 100.0 * (ticks1[1] - ticks0[1]) / CLK_TCK / wall,
        "cpu_percent_schedstat": 100.0 * (ns1 - ns0) / 1e9 / wall,
        "cpu_seconds": (sum(ticks1) - sum(ticks0)) / CLK_TCK,
        "cycles": len(cycles),
        "cycle_seconds": secs,
        "cycle_median": statistics.median(secs) if secs else float("nan"),
        "cycle_max": max(secs) if secs else float("nan"),
        "mem_max": {k: max(m.get(k, 0) for m in mem) for k in MEM_KEYS},
        "mem_last": mem[-1],
        "held": [c["held_bytes"] for c in cycles.values()],
        "regions": [len(c["regions"]) for c in cycles.values()],
        "loaded_per_cycle": [c["loaded_bytes"] for c in cycles.values()],
        "resident": [c["resident_bytes"] for c in cycles.values()],
        "loaded": sum(c["loaded_bytes"] for c in cycles.values()),
        "released": sum(c["released_bytes"] for c in cycles.values()),
    }


def run_case(label: str, size: int, extents: int, hot_regions: int, hot_size: int,
             args, rev_tree=None) -> list[dict]:
    """One case: the current daemon, then (``rev_tree``) the daemon of --compare-rev, on the same
    cached state. One result per daemon."""
    duration = args.duration if size >= TiB or hot_regions else args.scale_duration
    runs, hot = layout(size, extents, hot_regions, hot_size, args.seed)
    cached = sum(n for _, n in runs) + sum(n for _, n in hot)
    tmp = tempfile.mkdtemp(prefix="bench-daemon-cost-", dir=args.dir)
    img = os.path.join(tmp, "disk.raw")
    daemons = [(label, None, ROOT)]
    if rev_tree is not None:
        daemons.append((f"{label}, {rev_tree.label}", rev_tree.rev, rev_tree.path))
    results = []
    try:
        with open(img, "wb") as f:
            f.truncate(size)
        print(f"{label}: {format_size(size)} sparse, {extents} x 1 MiB data extents"
              + (f" + {hot_regions} x {format_size(hot_size)} hot regions" if hot_regions else "")
              + f" cached ({format_size(cached)}), sampling {duration:.0f} s", flush=True)
        with cache_and_pin(img, runs + hot, pin=not args.no_pin, write=True):
            for name, rev, cwd in daemons:
                tag = "rev" if rev else "current"
                d = DaemonProc(tmp, img, *shlex.split(args.daemon_args), max_hold=args.max_hold_text,
                               interval=args.interval, status=f"status-{tag}.json",
                               log=f"daemon-{tag}.log", cwd=cwd)
                try:
                    if rev:
                        print(f"  {rev_tree.label} (cwd {d.proc_cwd()})", flush=True)
                    m = measure(d, duration, args.max_hold if hot_regions else None, args.interval)
                    rc = d.stop()
                    if rc != 0:
                        raise DaemonFailed(f"daemon exited {rc} on SIGTERM:\n{d.log_tail(20)}")
                finally:
                    d.stop()
                m.update(label=name, rev=rev, size=size, extents=extents, hot_regions=hot_regions,
                         hot_size=hot_size, cached=cached, duration=duration)
                print_case(m)
                results.append(m)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def print_case(m: dict) -> None:
    mm = m["mem_max"]
    print(f"    {m['cycles']} cycles: CPU {m['cpu_percent']:.3f} % (user "
          f"{m['cpu_user_percent']:.2f}, sys {m['cpu_sys_percent']:.2f}) "
          f"(schedstat {m['cpu_percent_schedstat']:.3f} %), cycle median "
          f"{m['cycle_median'] * 1000:.1f} ms max {m['cycle_max'] * 1000:.1f} ms "
          f"(first {m['first_cycle_seconds'] * 1000:.0f} ms), VmRSS {mm['VmRSS'] / MiB:.1f} MiB, "
          f"RssAnon {mm['RssAnon'] / MiB:.1f} MiB, VmLck {mm['VmLck'] / MiB:.1f} MiB, "
          f"VmHWM {mm['VmHWM'] / MiB:.1f} MiB, resident seen "
          f"{format_size(statistics.median(m['resident'])) if m['resident'] else '?'}",
          flush=True)


# -- report -------------------------------------------------------------------

def _mib(n: int) -> str:
    return f"{n / MiB:.1f}"


def table(results: list[dict]) -> str:
    lines = ["| case | image | cached (seen by the daemon: first → last cycle) | window | cycles "
             "| CPU, % of one core (user + sys) "
             "| cycle median | cycle max | first cycle | RssAnon max | VmRSS max | RssFile max "
             "| VmLck max | VmHWM | held (median), regions | loaded per cycle (median) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        mm = r["mem_max"]
        seen = (f"{format_size(r['resident'][0])} → {format_size(r['resident'][-1])}"
                if r["resident"] else "?")
        held = (f"{format_size(statistics.median(r['held']))}, "
                f"{statistics.median(r['regions']):.0f}") if r["held"] else "?"
        loaded = format_size(statistics.median(r["loaded_per_cycle"])) if r["held"] else "?"
        lines.append(
            f"| {r['label']} | {format_size(r['size'])} | {format_size(r['cached'])} ({seen}) "
            f"| {r['wall']:.0f} s | {r['cycles']} | {r['cpu_percent']:.2f} "
            f"({r['cpu_user_percent']:.2f} + {r['cpu_sys_percent']:.2f}) "
            f"| {r['cycle_median'] * 1000:.0f} ms | {r['cycle_max'] * 1000:.0f} ms "
            f"| {r['first_cycle_seconds'] * 1000:.0f} ms | {_mib(mm['RssAnon'])} MiB "
            f"| {_mib(mm['VmRSS'])} MiB | {_mib(mm['RssFile'])} MiB | {_mib(mm['VmLck'])} MiB "
            f"| {_mib(mm['VmHWM'])} MiB | {held} | {loaded} |")
    return "\n".join(lines)


def verdicts(r: dict) -> list[tuple[str, bool, str]]:
    cpu, rss, cyc = r["cpu_percent"], r["mem_max"]["RssAnon"], r["cycle_max"]
    return [
        ("steady-state CPU ≤ 1 % of one core", cpu <= TARGET_CPU,
         f"{cpu:.2f} % ({cpu / TARGET_CPU:.2f} × the target)"),
        ("RSS besides held pages (RssAnon) ≤ 128 MiB", rss <= TARGET_RSS,
         f"{rss / MiB:.1f} MiB ({rss / TARGET_RSS:.2f} × the target)"),
        ("one cycle (max) ≤ 0.5 s", cyc <= TARGET_CYCLE,
         f"{cyc:.3f} s ({cyc / TARGET_CYCLE:.2f} × the target)"),
    ]


COMPARED = (("CPU", lambda r: r["cpu_percent"]), ("cycle median", lambda r: r["cycle_median"]),
            ("cycle max", lambda r: r["cycle_max"]),
            ("RssAnon max", lambda r: r["mem_max"]["RssAnon"]),
            ("VmHWM", lambda r: r["mem_max"]["VmHWM"]))


def compare_text(results: list[dict], rev: str, sha: str) -> str:
    """--compare-rev: each case's current figures ÷ those of REV's daemon on the same state."""
    out = [f"Side by side with `{rev}` ({sha[:10]}): the same case, cached state and arguments, "
           f"the daemon of {rev} right after the current one (current ÷ {rev}, < 1 is cheaper now):",
           ""]
    for cur, old in zip(results, results[1:]):
        if cur["rev"] or not old["rev"]:
            continue
        parts = [f"{name} {f(cur) / f(old):.2f}" if f(old) else f"{name} —"
                 for name, f in COMPARED]
        out.append(f"- {cur['label']}: " + ", ".join(parts) + ".")
    return "\n".join(out)


def verdict_text(results: list[dict]) -> str:
    out = []
    for r in results:
        parts = [f"{name}: **{'met' if ok else 'MISSED'}**, {fig}"
                 for name, ok, fig in verdicts(r)]
        out.append(f"- {r['label']}: " + "; ".join(parts) + ".")
    return "\n".join(out)


# -- chart (Pillow: matplotlib is not a dependency) ---------------------------

def draw_chart(results: list[dict], path: str) -> None:
    from PIL import Image, ImageDraw, ImageFont

    results = [r for r in results if not r.get("rev")]     # --compare-rev: in the table only
    scaling = [r for r in results if not r["hot_regions"]]
    held = [r for r in results if r["hot_regions"]]
    if not scaling:
        return
    panels = [
        ("cycle time (ms)", 1000 * TARGET_CYCLE, [
            ("median", (31, 119, 180), lambda r: 1000 * r["cycle_median"]),
            ("max", (214, 39, 40), lambda r: 1000 * r["cycle_max"])]),
        ("RSS (MiB)", TARGET_RSS / MiB, [
            ("RssAnon max (besides held pages)", (31, 119, 180),
             lambda r: r["mem_max"]["RssAnon"] / MiB),
            ("VmRSS max", (44, 160, 44), lambda r: r["mem_max"]["VmRSS"] / MiB)]),
        ("CPU (% of one core)", TARGET_CPU, [
            ("utime+stime / wall", (31, 119, 180), lambda r: r["cpu_percent"])]),
    ]
    S = 2                                   # drawn at 2x for sharp text
    pw, ph = 420 * S, 330 * S
    W, H = pw * len(panels), ph + (62 if held else 36) * S
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=12 * S)
    small = ImageFont.load_default(size=10 * S)
    title = ImageFont.load_default(size=15 * S)
    d.text((W // 2, 8 * S), "vmdisktouch run: cost vs image size "
           f"(--interval {results[0].get('interval', 5):g}, --max-hold "
           f"{results[0].get('max_hold_text', '256M')})", fill="black", font=title, anchor="mt")
    xs = [r["size"] for r in scaling]
    lx0, lx1 = math.log2(min(xs)), math.log2(max(xs))
    if lx1 == lx0:
        lx0, lx1 = lx0 - 1, lx1 + 1
    pad = 0.08 * (lx1 - lx0)
    lx0, lx1 = lx0 - pad, lx1 + pad
    for i, (ylabel, target, series) in enumerate(panels):
        ox = i * pw
        left, right, top, bottom = ox + 60 * S, ox + pw - 15 * S, 55 * S, ph - 10 * S
        vals = [f(r) for _, _, f in series for r in scaling + held]
        ymax = max([target * 1.25] + [v * 1.15 for v in vals if math.isfinite(v)])
        ymax = _nice(ymax)

        def X(size):
            return left + (math.log2(size) - lx0) / (lx1 - lx0) * (right - left)

        def Y(v):
            return bottom - v / ymax * (bottom - top)

        d.rectangle([left, top, right, bottom], outline="black", width=S)
        for k in range(6):
            v = ymax * k / 5
            y = Y(v)
            d.line([left, y, right, y], fill=(225, 225, 225), width=1)
            d.text((left - 5 * S, y), f"{v:g}", fill="black", font=small, anchor="rm")
        for s in xs:
            x = X(s)
            d.line([x, top, x, bottom], fill=(235, 235, 235), width=1)
            d.text((x, bottom + 5 * S), format_size(s) + "iB", fill="black", font=small,
                   anchor="mt")
        # target: dashed grey line
        yt = Y(target)
        x = left
        while x < right:
            d.line([x, yt, min(x + 8 * S, right), yt], fill=(120, 120, 120), width=S)
            x += 14 * S
        d.text((right - 4 * S, yt - 3 * S), f"target {target:g}", fill=(90, 90, 90),
               font=small, anchor="rb")
        d.text(((left + right) // 2, top - 8 * S), ylabel, fill="black", font=font,
               anchor="mb")
        ly = top + 6 * S
        for name, colour, f in series:
            pts = [(X(r["size"]), Y(f(r))) for r in scaling]
            if len(pts) > 1:
                d.line(pts, fill=colour, width=2 * S)
            for px, py in pts:
                d.ellipse([px - 3 * S, py - 3 * S, px + 3 * S, py + 3 * S], fill=colour)
            for r in held:                # the held case: a hollow square at its size
                px, py = X(r["size"]), Y(f(r))
                d.rectangle([px - 5 * S, py - 5 * S, px + 5 * S, py + 5 * S], outline=colour,
                            width=S)
            d.line([left + 8 * S, ly + 6 * S, left + 24 * S, ly + 6 * S], fill=colour,
                   width=2 * S)
            d.text((left + 28 * S, ly), name, fill="black", font=small)
            ly += 14 * S
        d.text(((left + right) // 2, ph + 12 * S), "image size (log scale)", fill="black",
               font=small, anchor="mt")
    if held:
        d.text((W // 2, H - 22 * S), "dots/lines: scattered 1 MiB extents; hollow squares: "
               "the same plus wide hot regions filling the budget (held case)",
               fill=(60, 60, 60), font=small, anchor="mt")
    img = img.resize((W // S, H // S), Image.LANCZOS)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp.png"
    img.save(tmp, format="PNG")
    os.replace(tmp, path)


def _nice(v: float) -> float:
    """The next 'nice' axis maximum (1, 2, 2.5, 5 x 10^k) at or above v."""
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


# -- main ---------------------------------------------------------------------

def daemon_defaults() -> str:
    """The heat and budget defaults of `vmdisktouch run` as installed now."""
    from vmdisktouch.config import settings
    keys = ("block_size", "decay", "threshold", "sigma_resident", "amp_resident",
            "min_free", "load_rate")
    by_key = {st.key: st for st in settings.SETTINGS}
    return ", ".join(f"`--{k.replace('_', '-')} {by_key[k].default_text()}`"
                     for k in keys if k in by_key)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1G,16G,128G,1T",
                    help="image sizes, comma-separated (default 1G,16G,128G,1T)")
    ap.add_argument("--duration", type=float, default=60.0,
                    help="sampling window (s) for 1 TiB and larger, and the held case")
    ap.add_argument("--scale-duration", type=float, default=30.0,
                    help="sampling window (s) for images smaller than 1 TiB")
    ap.add_argument("--interval", type=float, default=5.0, help="daemon --interval (s)")
    ap.add_argument("--max-hold", default="256M", help="daemon --max-hold")
    ap.add_argument("--daemon-args", default="", metavar="ARGS",
                    help="extra options for `vmdisktouch run`, one string "
                         "(e.g. \"--decay 0.01 --threshold 0.2\")")
    ap.add_argument("--extents", type=int, default=1000,
                    help="1 MiB extents cached at 1 TiB (scaled by sqrt(size/1 TiB) below)")
    ap.add_argument("--held-case", action=argparse.BooleanOptionalAction, default=False,
                    help="add a case at the largest size with wide hot regions that fill "
                         "the budget (default off)")
    ap.add_argument("--hot-regions", type=int, default=10, help="wide regions in the held case")
    ap.add_argument("--hot-size", type=parse_size, default=32 * MiB,
                    help="size of each wide region in the held case")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default="/var/tmp", help="where the sparse images go")
    ap.add_argument("--no-pin", action="store_true",
                    help="do not mlock the cached extents (DAMON may then evict them)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results here")
    ap.add_argument("--png", metavar="FILE",
                    help=f"where the chart goes (default {os.path.relpath(PNG, ROOT)}; "
                         "with --no-write, only when given)")
    ap.add_argument("--no-write", "--no-doc", dest="no_write", action="store_true",
                    help="do not update docs/benchmarks/daemon-cost.md (nor the default PNG)")
    ap.add_argument("--compare-rev", metavar="REV",
                    help="also run, in every case and on the same cached state, the daemon of "
                         "commit REV (from a temporary git worktree, removed afterwards) and "
                         "report the ratio current / REV")
    args = ap.parse_args()
    args.max_hold_text = args.max_hold
    args.max_hold = parse_size(args.max_hold)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]

    def on_signal(signum, _frame):
        raise SystemExit(f"bench_daemon_cost: {signal.Signals(signum).name}; cleaning up")

    signal.signal(signal.SIGTERM, on_signal)

    results = []
    with contextlib.ExitStack() as stack:
        tree = None
        if args.compare_rev:
            tree = enter_rev_worktree(stack, args.compare_rev)
        for size in sizes:
            ext = scaled_extents(size, args.extents)
            results += run_case(f"{format_size(size)}iB scattered", size, ext, 0, 0, args, tree)
        if args.held_case:
            size = max(sizes)
            ext = scaled_extents(size, args.extents)
            results += run_case(f"{format_size(size)}iB budget full", size, ext,
                                args.hot_regions, args.hot_size, args, tree)
    for r in results:
        r["interval"] = args.interval
        r["max_hold_text"] = args.max_hold_text

    command = "python benchmarks/bench_daemon_cost.py " + " ".join(sys.argv[1:])
    biggest = max(r["size"] for r in results)
    headline = [r for r in results if r["size"] == biggest and not r["rev"]]
    md = (
        "## Daemon cost: `vmdisktouch run` from 1 GiB to 1 TiB\n\n"
        + provenance(command.strip()) + "\n"
        + f"Each case is a sparse image with scattered 1 MiB extents of random data (written "
          f"first, as a guest fills a thin image; the holes around them read as zeros and are "
          f"never held), cached by buffered reads "
          f"({args.extents} at 1 TiB, scaled by √(size / 1 TiB) below; held with mlock by the "
          f"benchmark so that DAMON cannot evict them and every cycle sees the same state). "
          f"The daemon runs as `python -m vmdisktouch run IMG --max-hold {args.max_hold_text} "
          f"--interval {args.interval:g} --status STATUS.json"
          f"{' ' + args.daemon_args if args.daemon_args else ''}`; sampling starts when the "
          f"first cycle has written the status file (start-up and imports excluded). CPU is "
          f"utime + stime from `/proc/PID/stat` over the window divided by its wall time; "
          f"memory is sampled from `/proc/PID/status` once a second (maxima shown); cycle "
          f"times are the status file's `cycle_seconds` of every cycle in the window. Held "
          f"pages are file-backed (RssFile, VmLck), so RssAnon is the RSS besides them. "
          f"Daemon defaults in force (before the options above): {daemon_defaults()}. What the daemon held (median over "
          f"the window's cycles, and in how many regions) and loaded per cycle is in the "
          f"table; the held pages are part of VmRSS, RssFile and VmLck."
          + (f" The \"budget full\" case adds {args.hot_regions} cached regions of "
             f"{format_size(args.hot_size)} and samples once the budget is full."
             if args.held_case else "") + "\n\n"
        + table(results) + "\n\n"
        + "Targets (issue #5, section 2; measured ÷ target, ≤ 1 is met):\n\n"
        + verdict_text(results) + "\n\n"
        + (compare_text(results, args.compare_rev, tree.sha) + "\n\n" if tree else "")
        + "![cycle time, RSS and CPU against image size](img/daemon_cost.png)\n")
    print()
    print(md)
    all_ok = all(ok for r in headline for _, ok, _ in verdicts(r))
    print(f"targets at {format_size(biggest)} (the issue judges them at 1 TiB): "
          f"{'all met' if all_ok else 'some MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    png = args.png or (None if args.no_write else PNG)
    if png:
        draw_chart(results, png)
        print(f"wrote {png}")
    if not args.no_write:
        update_section("daemon-cost", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
