"""I/O under memory pressure: no daemon vs vmtouch -l (whole image, hot zone) vs vmdisktouch.

The guest-like scenario of issue #3 / #5 (section 3): fio plays a VM disk
attached with ``cache=writethrough`` (buffered 4 KiB random I/O, 80 % reads,
20 % ``O_DSYNC`` writes, iodepth 1, 90 % of the accesses in a hot zone of
10 % of the image), next to a noisy neighbour (random 64 KiB reads of its own
1 GiB file), both in a cgroup v1 memory group whose limit makes them compete
for page cache. Four scenarios run one after another on the same image, each
from a cold cache (the image is evicted between them), each in a fresh group
with the same limit, each with the same fio random seed:

* ``none``        — no holder;
* ``whole``       — ``vmtouch -l`` of the whole image (locked before t = 0);
* ``oracle``      — ``vmtouch -l`` of exactly the hot zone (locked before t = 0);
* ``vmdisktouch`` — ``vmdisktouch run IMAGE --max-hold 1.25 x hot zone`` with its
  defaults otherwise, started at t = 0 together with the workload.

The holders run outside the group. It reports IOPS per interval (fio's
per-second IOPS log), the steady-state median of each scenario (second half
of the run), the ratios vmdisktouch / oracle and vmdisktouch / none, the time
vmdisktouch takes to reach 90 % of the oracle's steady IOPS (5 s rolling
median), the bytes each holder holds (``VmLck``) over time, the holder's
pages charged to the workload's group (``unevictable``) and OOM kills, and
draws ``docs/img/hotzone.png``. Results go to the ``hotzone`` section of
``docs/benchmarks.md``.

Variants (``--variant``; each runs none, oracle and vmdisktouch, and writes its
own section ``hotzone-VARIANT`` and chart ``docs/img/hotzone-VARIANT.png``):

* ``move``    — two hot zones of half the length each, moved elsewhere at half
  time (fio runs the two phases back to back; the oracle re-locks at the
  move); reports how long vmdisktouch takes to follow;
* ``write50`` — ``rwmixread=50``;
* ``bigset``  — a hot set twice the budget (a hot zone with 60 % of the
  accesses, a 1.5x longer warm zone with 30 %); reports what the daemon
  loads in the steady window, which would be large if it thrashed.

Every variant also reports the workload's IOPS while the daemon loads, next
to no daemon in the same seconds.

    python benchmarks/bench_hotzone.py                 # default, about 12 minutes
    python benchmarks/bench_hotzone.py --variant move  # about 7 minutes each variant
    python benchmarks/bench_hotzone.py --quick         # about 4 minutes, not written to the docs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.report import chart_font, provenance, update_section  # noqa: E402

from tools.cgroup import MemoryCgroup, check_budget_vs_limit  # noqa: E402
from tools.common import GiB, MiB, stop_process  # noqa: E402
from tools.daemon_proc import DaemonProc  # noqa: E402
from tools.fio import FioJob, FioRun, parse_iops_log, start_neighbour  # noqa: E402
from tools.holders import VmtouchLock  # noqa: E402
from tools.images import evict, make_image, resident_bytes  # noqa: E402
from tools.stats import first_time_at_or_above  # noqa: E402
from tools.worktree import rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

SCENARIOS = ("none", "whole", "oracle", "vmdisktouch", "tuned", "rev")
DAEMONS = ("vmdisktouch", "tuned", "rev")      # the scenarios that run the daemon
LABELS = {"none": "no daemon", "whole": "vmtouch -l whole image",
          "oracle": "vmtouch -l hot zone (oracle)", "vmdisktouch": "vmdisktouch (1.25 x hot zone)",
          "tuned": "vmdisktouch, --tuned-args", "rev": "vmdisktouch @REV (--compare-rev)"}
COLOURS = {"none": (200, 60, 50), "whole": (140, 140, 140), "oracle": (40, 110, 200),
           "vmdisktouch": (20, 160, 80), "tuned": (230, 150, 20), "rev": (150, 60, 170)}


def say(msg: str = "") -> None:
    print(msg, flush=True)


@dataclass
class Sample:
    t: float
    held: int            # VmLck of the holder
    cg_usage: int
    cg_unevictable: int
    hot_cached: int
    status_held: int = 0
    cycle: int = 0           # the daemon's status: its cycle number
    loaded: int = 0          # ... and the bytes that cycle loaded


@dataclass
class Result:
    name: str
    iops: list[tuple[float, float, float, float]]    # (t, total, read, write) per second
    samples: list[Sample]
    lock_seconds: float | None = None
    counters: dict = field(default_factory=dict)
    status: dict | None = None
    error: str | None = None
    lat_us: tuple[float, float] = (float("nan"), float("nan"))   # mean read, write completion latency

    def series(self) -> list[tuple[float, float]]:
        return [(t, v) for t, v, _r, _w in self.iops]

    def steady(self, start: float) -> list[float]:
        return [v for t, v, _r, _w in self.iops if t >= start]


class Bench:
    def __init__(self, a):
        self.a = a
        self.size = parse_size(a.image_size) // MiB * MiB
        self.hot_len = max(MiB, int(self.size * a.hot_fraction) // MiB * MiB)
        self.hot_off = self.size // 4 // MiB * MiB
        self.budget = int(self.hot_len * 1.25) // MiB * MiB
        self.variant = a.variant
        self.statuses: list[dict] = []   # --keep-log: the daemon's status of each cycle (current code)
        self.read_mix = 50 if a.variant == "write50" else 80
        self.shares = None
        mib = lambda x: int(x) // MiB * MiB  # noqa: E731
        if a.variant == "move":
            # Two hot zones of half the hot length each, moved elsewhere halfway through.
            half = mib(self.hot_len / 2)
            first = [(mib(self.size * 0.15), half), (mib(self.size * 0.55), half)]
            second = [(mib(self.size * 0.35), half), (mib(self.size * 0.80), half)]
            self.phases = [first, second]
        elif a.variant == "bigset":
            # A hot set twice the budget: the hottest part (the hot zone, 60 % of the
            # accesses) fits in it, a 1.5x wider warm zone (30 %) does not.
            warm = (mib(self.hot_off + self.hot_len + self.size / 16), mib(self.hot_len * 1.5))
            self.phases = [[(self.hot_off, self.hot_len), warm]]
            self.shares = [60, 30]
        else:
            self.phases = [[(self.hot_off, self.hot_len)]]
        # The oracle locks, per phase, the hottest bytes that fit in the budget
        # (all of the hot zones, except in 'bigset' where the warm zone only fills the rest).
        self.oracle = [zones if a.variant != "bigset"
                       else [zones[0], (zones[1][0], self.budget - zones[0][1])]
                       for zones in self.phases]
        self.limit = parse_size(a.limit) if a.limit else self.budget + 256 * MiB
        check_budget_vs_limit(self.budget, self.limit)
        self.nb_size = parse_size(a.neighbour_size)
        self.nb_rate = parse_size(a.neighbour_rate)
        self.tmp = tempfile.mkdtemp(prefix="vmdt-hotzone-", dir=a.tmpdir)
        self.image = os.path.join(self.tmp, "disk.raw")
        self.nb_file = os.path.join(self.tmp, "neighbour.raw")
        self.live: list = []         # things to stop on the way out
        self.cgroup: MemoryCgroup | None = None
        self.rev_tree = None         # --compare-rev: the worktree the 'rev' scenario runs from

    # -- scenario --
    def hot_cached(self) -> int:
        return resident_bytes(self.image, self.hot_off, self.hot_len)

    def lock_oracle(self, phase: int) -> list:
        locks = []
        for off, length in self.oracle[phase]:
            lock = VmtouchLock(self.image, off, length)
            self.live.append(lock)
            lock.start()
            locks.append(lock)
        return locks

    def run(self, name: str) -> Result:
        a = self.a
        evict(self.image)
        evict(self.nb_file)
        self.cgroup = cg = MemoryCgroup(f"bench-{name}", self.limit).create()
        holders: list = []
        lock_s = None
        try:
            if name == "whole":
                holders = [VmtouchLock(self.image, 0, self.size)]
                self.live.append(holders[0])
                lock_s = holders[0].start()
            elif name == "oracle":
                t = time.monotonic()
                holders = self.lock_oracle(0)
                lock_s = time.monotonic() - t
            if lock_s is not None:
                say(f"  vmtouch -l locked {sum(h.length for h in holders) / MiB:.0f} MiB "
                    f"in {lock_s:.1f} s")
            daemon = None
            if name in DAEMONS:
                extra = (a.tuned_args if name == "tuned" else a.daemon_args).split()
                # 'rev' runs REV's code from its worktree; every daemon has its own status
                # file (no stale status from the scenario before); --keep-log copies daemon.log
                cwd = self.rev_tree.path if name == "rev" else ROOT
                daemon = DaemonProc(self.tmp, self.image, *extra, max_hold=self.budget,
                                    interval=a.interval, cwd=cwd,
                                    status="status.json" if name == "vmdisktouch"
                                    else f"status-{name}.json",
                                    log="daemon-rev.log" if name == "rev" else "daemon.log")
                self.live.append(daemon)
                holders = [daemon]
                say(f"  {' '.join(daemon.argv[3:])}  (cwd {daemon.proc_cwd()})")
            if self.nb_rate:
                nb = start_neighbour(cg, self.nb_file, self.nb_rate, size=self.nb_size,
                                        pattern=a.neighbour_pattern)
                self.live.append(nb)
            samples: list[Sample] = []
            t0 = time.monotonic()
            stop = threading.Event()

            def sample():
                while not stop.wait(1.0):
                    try:
                        st = daemon.read_status() if daemon else None
                        if st and name != "rev" and getattr(self.a, "keep_log", None) and \
                                st.get("cycle") != (self.statuses[-1:] or [{}])[0].get("cycle"):
                            self.statuses.append(dict(st, t=time.monotonic() - t0))
                        samples.append(Sample(
                            t=time.monotonic() - t0,
                            held=sum(h.vmlck() for h in holders),
                            cg_usage=cg.usage(), cg_unevictable=cg.unevictable_bytes(),
                            hot_cached=self.hot_cached(),
                            status_held=(st or {}).get("held_bytes", 0),
                            cycle=(st or {}).get("cycle", 0),
                            loaded=(st or {}).get("loaded_bytes", 0)))
                    except (OSError, ValueError):
                        pass

            th = threading.Thread(target=sample, daemon=True)
            th.start()
            error = None
            iops: list = []
            lat = (float("nan"), float("nan"))
            phase_len = a.duration / len(self.phases)
            for k, zones in enumerate(self.phases):
                if k and name == "oracle":              # the oracle follows the move at once
                    for h in holders:
                        stop_thing(h)
                        self.live.remove(h)
                    t = time.monotonic()
                    holders = self.lock_oracle(k)
                    say(f"  moved: vmtouch -l locked the new zones in {time.monotonic() - t:.1f} s")
                log_prefix = os.path.join(self.tmp, f"fio-{name}-{k}")
                job = FioJob(self.image, self.size, zones, runtime=phase_len,
                                seed=20241122 + k, iops_log=log_prefix, name=f"guest-{name}",
                                read_mix=self.read_mix, zone_shares=self.shares)
                offset = time.monotonic() - t0

                def on_interval(iv, offset=offset):
                    t = iv.t + offset
                    if int(t) % 10 == 0 or t < 1.5:
                        held = samples[-1].held if samples else 0
                        say(f"  [{name}] t={t:5.0f}s IOPS {iv.iops:7.0f}  held {held / MiB:5.0f} MiB")

                fio = FioRun(job, cg, on_interval=on_interval,
                                stderr_path=os.path.join(self.tmp, "fio.err"))
                self.live.append(fio)
                fio.start()
                while fio.proc.poll() is None:
                    if daemon and not daemon.alive():
                        error = f"daemon exited ({daemon.returncode()}): {daemon.log_tail(1)}"
                        break
                    time.sleep(0.5)
                fio.stop()
                self.live.remove(fio)
                if not error and fio.proc.returncode != 0:
                    error = f"fio exited {fio.proc.returncode}"
                try:
                    part = parse_iops_log(log_prefix)
                except FileNotFoundError:
                    part = []
                if len(part) < 0.8 * len(fio.intervals):   # fall back to the live JSON intervals
                    part = [(iv.runtime_s, iv.iops, iv.read_iops, iv.write_iops)
                            for iv in fio.intervals]
                iops += [(t + offset, v, r, w) for t, v, r, w in part]
                try:
                    j = fio.final["jobs"][0]
                    lat = (j["read"]["clat_ns"]["mean"] / 1000, j["write"]["clat_ns"]["mean"] / 1000)
                except (KeyError, IndexError, TypeError):
                    pass
                if error:
                    break
            stop.set()
            th.join(5)
            counters = cg.counters()
            status = daemon.read_status() if daemon else None
            if counters["oom_kills"]:
                error = (error or "") + f" OOM kills in the workload's group: {counters['oom_kills']}"
            return Result(name, iops, samples, lock_s, counters, status, error, lat)
        finally:
            for x in reversed(self.live):
                stop_thing(x)
            self.live.clear()
            cg.cleanup()
            self.cgroup = None

    def cleanup(self) -> None:
        for x in reversed(self.live):
            stop_thing(x)
        self.live.clear()
        if self.cgroup:
            self.cgroup.cleanup()
        log = os.path.join(self.tmp, "daemon.log")
        if getattr(self.a, "keep_log", None) and os.path.exists(log):
            shutil.copyfile(log, self.a.keep_log)     # the last vmdisktouch scenario's log
            with open(self.a.keep_log + ".status.jsonl", "w") as f:   # and its status per cycle
                f.writelines(json.dumps(st) + "\n" for st in self.statuses)
        shutil.rmtree(self.tmp, ignore_errors=True)


def stop_thing(x) -> None:
    try:
        if isinstance(x, (VmtouchLock, DaemonProc, FioRun)):
            x.stop()
        else:
            stop_process(x)
    except Exception as exc:  # noqa: BLE001 - keep cleaning up
        print(f"warning: cleanup: {exc}", file=sys.stderr)


# -- analysis ---------------------------------------------------------------

def rolling_median(series: list[tuple[float, float]], k: int = 5) -> list[tuple[float, float]]:
    out = []
    for i in range(len(series)):
        window = [v for _, v in series[max(0, i - k + 1): i + 1]]
        out.append((series[i][0], statistics.median(window)))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


# -- chart (Pillow) -----------------------------------------------------------

def draw_chart(results: dict[str, Result], path: str, duration: float, budget: int,
               hot_len: int, steady_from: float) -> None:
    from PIL import Image, ImageDraw
    W, H = 1100, 760
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = chart_font(14)
    L, R = 80, W - 20
    panels = [(50, 470), (540, 700)]      # (top, bottom) of IOPS and held-bytes panels
    tmax = duration
    ymax = max([v for r in results.values() for _, v in rolling_median(r.series())] + [1]) * 1.1
    hmax = max([s.held for r in results.values() for s in r.samples] + [budget, 1]) * 1.1

    def x(t):
        return L + (R - L) * min(max(t, 0), tmax) / tmax

    def axes(top, bottom, vmax, unit, fmt):
        d.rectangle([L, top, R, bottom], outline=(0, 0, 0))
        for i in range(6):
            v = vmax * i / 5
            y = bottom - (bottom - top) * i / 5
            d.line([L, y, R, y], fill=(225, 225, 225))
            d.text((L - 8, y), fmt(v), fill=(0, 0, 0), font=font, anchor="rm")
        step = 10 if tmax <= 120 else 20 if tmax <= 240 else 60
        for t in range(0, int(tmax) + 1, step):
            d.line([x(t), bottom, x(t), bottom + 4], fill=(0, 0, 0))
            d.text((x(t), bottom + 6), f"{t}", fill=(0, 0, 0), font=font, anchor="mt")
        d.text((L, top - 6), unit, fill=(0, 0, 0), font=font, anchor="lb")

    top, bottom = panels[0]
    axes(top, bottom, ymax, "IOPS (5 s rolling median of per-second IOPS)", lambda v: f"{v / 1000:.0f}k")
    sx = x(steady_from)
    d.line([sx, top, sx, bottom], fill=(180, 180, 180), width=1)
    d.text((sx + 4, top + 4), "steady window", fill=(120, 120, 120), font=font)
    for name, r in results.items():
        pts = [(x(t), bottom - (bottom - top) * v / ymax) for t, v in rolling_median(r.series())]
        if len(pts) > 1:
            d.line(pts, fill=COLOURS[name], width=2)
    top, bottom = panels[1]
    axes(top, bottom, hmax, "held bytes (VmLck of the holder), MiB", lambda v: f"{v / MiB:.0f}")
    for level, label in ((budget, "budget"), (hot_len, "hot zone")):
        y = bottom - (bottom - top) * level / hmax
        d.line([L, y, R, y], fill=(200, 200, 200), width=1)
        d.text((R - 4, y + (-2 if label == "budget" else 2)), label, fill=(120, 120, 120),
               font=font, anchor="rb" if label == "budget" else "rt")
    for name, r in results.items():
        pts = [(x(s.t), bottom - (bottom - top) * s.held / hmax) for s in r.samples]
        if len(pts) > 1:
            d.line(pts, fill=COLOURS[name], width=2)
    d.text(((L + R) / 2, H - 30), "seconds since the workload started", fill=(0, 0, 0), font=font,
           anchor="mm")
    lx, ly = L + 10, 6
    for name in results:
        wtext = 40 + d.textlength(LABELS[name], font=font)
        if lx + wtext > R:                      # wrap the legend onto a second row
            lx, ly = L + 10, ly + 18
        d.rectangle([lx, ly, lx + 14, ly + 14], fill=COLOURS[name])
        d.text((lx + 20, ly + 7), LABELS[name], fill=(0, 0, 0), font=font, anchor="lm")
        lx += wtext
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img.save(path + ".tmp.png")
    os.replace(path + ".tmp.png", path)


# -- report -------------------------------------------------------------------

VARIANT_TITLES = {
    "base": "I/O under memory pressure: no daemon, `vmtouch -l`, vmdisktouch",
    "move": "I/O under memory pressure, variant: two hot zones that move halfway",
    "write50": "I/O under memory pressure, variant: 50 % writes",
    "bigset": "I/O under memory pressure, variant: a hot set twice the budget",
}
VARIANT_TEXT = {
    "base": "",
    "move": ("Variant: the hot set is two zones of half the hot length each (at 15 % and "
             "55 % of the image), which move at half time to 35 % and 80 %; the oracle "
             "unlocks the old zones and locks the new ones at the move. Steady state is "
             "the last quarter of the run."),
    "write50": "Variant: `rwmixread=50` (half the accesses are O_DSYNC writes).",
    "bigset": ("Variant: the hot set is twice the budget: the hot zone gets 60 % of the "
               "accesses and a warm zone 1.5 times as long gets 30 %; the oracle locks the "
               "hot zone and fills the rest of the budget from the warm zone. The daemon "
               "should hold the hottest part and keep it, not thrash: the bytes it loads "
               "in the steady window are reported."),
}


def steady_start(a) -> float:
    return a.duration * (0.75 if a.variant == "move" else 0.5)


def loading_window(r: Result) -> float | None:
    """Seconds until the daemon first held 90 % of its steady-state median."""
    held = [x.status_held for x in r.samples if x.t >= r.samples[-1].t / 2] if r.samples else []
    if not held or not statistics.median(held):
        return None
    level = 0.9 * statistics.median(held)
    return next((x.t for x in r.samples if x.status_held >= level), None)


def mean_iops(r: Result, t_from: float, t_to: float) -> float:
    v = [x for t, x, _r, _w in r.iops if t_from < t <= t_to]
    return statistics.mean(v) if v else float("nan")


def steady_loaded(r: Result, steady_from: float) -> tuple[int, int]:
    """(bytes the daemon loaded, cycles) over the cycles first seen in the steady window."""
    per_cycle: dict[int, int] = {}
    for x in r.samples:
        if x.t >= steady_from and x.cycle:
            per_cycle.setdefault(x.cycle, x.loaded)
    return sum(per_cycle.values()), len(per_cycle)


def compare_lines(a, results: dict[str, Result], steady_from: float) -> list[str]:
    """--compare-rev: the current code ÷ the daemon of REV, run side by side in this run."""
    if not {"vmdisktouch", "rev"} <= set(results):
        return []
    cur, old = results["vmdisktouch"], results["rev"]

    def median(values):
        return statistics.median(values) if values else float("nan")

    def ratio(x, y):
        return f"{x / y:.3f}" if y else "—"

    iops = [median(r.steady(steady_from)) for r in (cur, old)]
    held = [median([x.held for x in r.samples if x.t >= steady_from]) for r in (cur, old)]
    loaded = [steady_loaded(r, steady_from)[0] for r in (cur, old)]
    tl = [loading_window(r) for r in (cur, old)]
    fmt_t = [f"{t:.0f} s" if t is not None else "never" for t in tl]
    return [f"Side by side with `{a.compare_rev}` ({a.compare_rev_sha[:10]}), in this run, same "
            f"image, arguments and fio seed (current ÷ {a.compare_rev}):", "",
            f"- steady median IOPS: {iops[0]:,.0f} / {iops[1]:,.0f} = **{ratio(*iops)}**;",
            f"- held (median, steady): {held[0] / MiB:.0f} / {held[1] / MiB:.0f} MiB "
            f"= {ratio(*held)};",
            f"- loaded in the steady window: {loaded[0] / MiB:.0f} / {loaded[1] / MiB:.0f} MiB;",
            f"- time to hold 90 % of its steady bytes: {fmt_t[0]} / {fmt_t[1]}.", ""]


def report(b: Bench, results: dict[str, Result], command: str, chart_rel: str) -> tuple[str, dict]:
    a = b.a
    steady_from = steady_start(a)
    moved_at = a.duration / 2 if a.variant == "move" else 0.0
    med = {n: statistics.median(r.steady(steady_from)) if r.steady(steady_from) else float("nan")
           for n, r in results.items()}
    none, oracle = med.get("none"), med.get("oracle")
    figures = {"median_iops": med}
    for n in DAEMONS:
        if n in results and oracle:
            after = rolling_median([(t, v) for t, v in results[n].series() if t > moved_at])
            t90 = first_time_at_or_above(after, 0.9 * oracle, hold=1)
            figures[n] = {"t90": None if t90 is None else t90 - moved_at,
                          "over_oracle": med[n] / oracle, "over_none": med[n] / none}

    lines = [f"## {VARIANT_TITLES[a.variant]}", "",
             provenance(command),
             f"Scenario: a {b.size / GiB:.1f} GiB non-sparse raw image; fio as the guest "
             f"(`ioengine=psync`, buffered, `bs=4k`, `rw=randrw`, `rwmixread=80`, `sync=dsync`, "
             f"iodepth 1, `random_distribution=zoned_abs`: 90 % of accesses in a hot zone of "
             f"{b.hot_len / MiB:.0f} MiB = {a.hot_fraction:.0%} of the image at "
             f"{b.hot_off / MiB:.0f} MiB, the rest uniform); a noisy neighbour (fio "
             f"`{a.neighbour_pattern}` of 64 KiB blocks over its own {b.nb_size / GiB:.1f} GiB "
             f"non-sparse file at {b.nb_rate / MiB:.0f} MiB/s); both in a cgroup v1 memory group "
             f"limited to {b.limit / MiB:.0f} MiB. Each scenario runs {a.duration:.0f} s from a "
             f"cold cache, in a fresh group, with the same fio seed; holders run outside the group. "
             f"vmdisktouch: `--max-hold {b.budget >> 20}M` (1.25 × the hot zone), "
             f"`--interval {a.interval:g}`"
             + (f", `{a.daemon_args}`" if a.daemon_args else "") + ", defaults otherwise, "
             "started together with the workload; the vmtouch holders lock before t = 0 "
             "(their lock time is shown)." + (" " + VARIANT_TEXT[a.variant]
                                               if VARIANT_TEXT[a.variant] else ""), "",
             f"Steady state = t ≥ {steady_from:.0f} s; IOPS are "
             "fio's per-second IOPS log (reads + writes).", "",
             "| scenario | steady median IOPS | p10–p90 | ÷ oracle | ÷ no daemon | mean read / write "
             "latency | held (median, steady) | held pages charged to the group (max) | OOM kills "
             "| lock time |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n, r in results.items():
        s = r.steady(steady_from)
        held = statistics.median([x.held for x in r.samples if x.t >= steady_from] or [0])
        unev = max([x.cg_unevictable for x in r.samples] + [r.counters.get("unevictable", 0)])
        lines.append(
            f"| {LABELS[n]} | {med[n]:,.0f} | {pct(s, .1):,.0f}–{pct(s, .9):,.0f} | "
            f"{med[n] / oracle:.2f} | {med[n] / none:.2f} | "
            f"{r.lat_us[0]:.0f} / {r.lat_us[1]:.0f} µs | {held / MiB:.0f} MiB | "
            f"{unev / MiB:.0f} MiB | {r.counters.get('oom_kills', '?')} | "
            f"{'—' if r.lock_seconds is None else f'{r.lock_seconds:.1f} s'} |"
            + (f" **error: {r.error}**" if r.error else ""))
    lines.append("")
    for n in DAEMONS:
        if n not in figures:
            continue
        f = figures[n]
        tv, tn, t90 = f["over_oracle"], f["over_none"], f["t90"]
        lines += [
            f"Targets (issue #5, section 3) for {LABELS[n]}:", "",
            f"- ≥ 95 % of the oracle: **{tv:.1%}**, {'met' if tv >= 0.95 else 'missed'};",
            f"- ≥ 2 × no daemon: **{tn:.2f} ×**, {'met' if tn >= 2 else 'missed'} (the oracle "
            f"itself reaches {oracle / none:.2f} ×"
            + (f", the whole image locked {med['whole'] / none:.2f} ×" if "whole" in med else "")
            + ");",
            ("- 90 % of the oracle's steady IOPS within 30 s of start (5 s rolling median): "
             if a.variant != "move" else
             "- time to follow the move: from the move until 90 % of the oracle's steady IOPS "
             "(5 s rolling median): ")
            + (f"**{t90:.0f} s**, {'met' if t90 <= 30 else 'missed'} (target 30 s)."
               if t90 is not None else "**never reached**, missed.")]
        tl = loading_window(results[n])
        if tl is not None and "none" in results:
            during, base = mean_iops(results[n], 0, tl), mean_iops(results["none"], 0, tl)
            lines.append(f"- while it loads (t = 0–{tl:.0f} s, until it first holds 90 % of its "
                         f"steady bytes): {during:,.0f} IOPS, {during / base:.2f} × no daemon "
                         f"in the same seconds ({base:,.0f}).")
        loaded, cycles = steady_loaded(results[n], steady_from)
        if cycles:
            lines.append(f"- loaded in the steady window: {loaded / MiB:.0f} MiB over "
                         f"{cycles} cycles (budget {b.budget / MiB:.0f} MiB).")
        st = results[n].status or {}
        if st:
            lines.append(f"- at the end: {st.get('cycle')} cycles, held "
                         f"{st.get('held_bytes', 0) / MiB:.0f} MiB in {len(st.get('regions', []))} "
                         f"regions, last cycle {st.get('cycle_seconds', 0):.3f} s.")
        lines.append("")
    lines += compare_lines(a, results, steady_from)
    lines += [f"![IOPS and held bytes over time]({chart_rel})", ""]
    # per-interval IOPS, 10 s means
    lines += ["<details><summary>IOPS per 10 s interval (mean of the per-second IOPS)</summary>", "",
              "| t (s) | " + " | ".join(LABELS[n] for n in results) + " |",
              "|---|" + "---|" * len(results)]
    for t0 in range(0, int(a.duration), 10):
        row = []
        for n, r in results.items():
            v = [x for t, x, _r, _w in r.iops if t0 < t <= t0 + 10]
            row.append(f"{statistics.mean(v):,.0f}" if v else "—")
        lines.append(f"| {t0}–{t0 + 10} | " + " | ".join(row) + " |")
    lines += ["", "</details>", ""]
    return "\n".join(lines), figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=120.0, help="seconds per scenario (default 120)")
    p.add_argument("--image-size", default="4G", help="image size (default 4G)")
    p.add_argument("--hot-fraction", type=float, default=0.10, help="hot zone / image (default 0.10)")
    p.add_argument("--limit", default=None, help="cgroup limit (default: budget + 256M)")
    p.add_argument("--neighbour-size", default="1G")
    p.add_argument("--neighbour-rate", default="200M", help="bytes/s (0 = no neighbour)")
    p.add_argument("--neighbour-pattern", default="randread", choices=("randread", "read"))
    p.add_argument("--interval", type=float, default=5.0, help="daemon --interval (default 5, its default)")
    p.add_argument("--daemon-args", default="", help="extra arguments for vmdisktouch run")
    p.add_argument("--tuned-args", default="", help="arguments of a fifth scenario 'tuned': "
                   "vmdisktouch with these extra options (e.g. '--decay 0.1 --threshold 0.05')")
    p.add_argument("--scenarios", default=None, help="comma-separated subset of "
                   + ",".join(SCENARIOS) + " (default: all; 'tuned' only with --tuned-args, "
                   "'rev' only with --compare-rev)")
    p.add_argument("--compare-rev", metavar="REV",
                   help="also run the daemon of commit REV (a temporary git worktree, removed "
                        "afterwards) as scenario 'rev', next to the current code, with the "
                        "same arguments; reports the ratio current / REV")
    p.add_argument("--quick", action="store_true", help="2G image, 45 s per scenario; not written to the docs")
    p.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md")
    p.add_argument("--keep-log", metavar="FILE",
                   help="copy the daemon's log (one line per cycle) of the last vmdisktouch "
                        "scenario here, and its status JSON of each cycle to FILE.status.jsonl")
    p.add_argument("--chart", default=os.path.join(ROOT, "docs", "img", "hotzone.png"))
    p.add_argument("--tmpdir", default="/var/tmp", help="where the image goes (a real disk)")
    p.add_argument("--variant", default="base", choices=tuple(VARIANT_TITLES),
                   help="base; move (two hot zones that move halfway); write50 (50 %% writes); "
                        "bigset (a hot set twice the budget). Each writes its own section "
                        "and chart; variants run none, oracle and vmdisktouch by default")
    a = p.parse_args(argv)
    if a.quick:
        a.duration, a.image_size = min(a.duration, 45.0), "2G"
        a.no_doc = True
        if a.chart == p.get_default("chart"):
            a.chart = os.path.join(tempfile.gettempdir(), "hotzone-quick.png")
    if a.variant != "base" and a.chart == p.get_default("chart"):
        a.chart = os.path.join(ROOT, "docs", "img", f"hotzone-{a.variant}.png")
    if a.no_doc and a.chart.startswith(os.path.join(ROOT, "docs") + os.sep):
        a.chart = os.path.join(tempfile.gettempdir(), os.path.basename(a.chart))
    if a.scenarios is None:
        a.scenarios = ",".join(n for n in SCENARIOS if (n != "tuned" or a.tuned_args)
                               and (n != "whole" or a.variant == "base")
                               and (n != "rev" or a.compare_rev))
    names = [n for n in a.scenarios.split(",") if n]
    if a.compare_rev and "rev" not in names:
        names.append("rev")
    LABELS["tuned"] = f"vmdisktouch {a.tuned_args}"
    LABELS["rev"] = f"vmdisktouch @{a.compare_rev}"
    for n in names:
        if n not in SCENARIOS:
            p.error(f"unknown scenario {n!r}")
    if "rev" in names and not a.compare_rev:
        p.error("scenario 'rev' needs --compare-rev REV")
    command = "python benchmarks/bench_hotzone.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    b = Bench(a)
    stack = contextlib.ExitStack()
    try:
        if a.compare_rev:
            b.rev_tree = stack.enter_context(rev_worktree(a.compare_rev))
            a.compare_rev_sha = b.rev_tree.sha
            say(f"--compare-rev {a.compare_rev}: {b.rev_tree.sha[:10]} in {b.rev_tree.path}; "
                f"python -m vmdisktouch there imports {b.rev_tree.check_imports()}")
        say(f"image {b.size / GiB:.1f} GiB, hot zone {b.hot_len / MiB:.0f} MiB at {b.hot_off / MiB:.0f} MiB, "
            f"budget {b.budget / MiB:.0f} MiB, cgroup limit {b.limit / MiB:.0f} MiB, "
            f"{a.duration:.0f} s per scenario; variant {a.variant}: phases "
            + " then ".join(", ".join(f"{o / MiB:.0f}+{n / MiB:.0f} MiB" for o, n in z)
                            for z in b.phases))
        make_image(b.image, b.size)
        make_image(b.nb_file, b.nb_size)
        results: dict[str, Result] = {}
        for n in names:
            say(f"\n== {LABELS[n]}")
            r = b.run(n)
            results[n] = r
            s = r.steady(a.duration / 2)
            say(f"  steady median {statistics.median(s) if s else float('nan'):,.0f} IOPS; "
                f"cgroup {json.dumps(r.counters)}" + (f"; ERROR {r.error}" if r.error else ""))
        if not {"none", "oracle"} <= set(results):
            say("\n".join(["", *compare_lines(a, results, steady_start(a))]))
            return 0
        chart_rel = os.path.relpath(a.chart, os.path.join(ROOT, "docs"))
        draw_chart(results, a.chart, a.duration, b.budget, b.hot_len, steady_start(a))
        md, fig = report(b, results, command.strip(), chart_rel)
        say("\n" + md)
        if not a.no_doc:
            section = "hotzone" if a.variant == "base" else f"hotzone-{a.variant}"
            update_section(section, md)
            say(f"wrote the {section} section of docs/benchmarks.md and {a.chart}")
        return 0 if not any(r.error for r in results.values()) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        b.cleanup()
        stack.close()


if __name__ == "__main__":
    sys.exit(main())
