"""bench_hotzone's results and its report: the data of a scenario, the figures, the Markdown.

``Result`` is one scenario's run (fio's IOPS per second, the holder's
samples, the group's counters); ``report`` turns the results of one round
into the section of ``docs/benchmarks/hotzone.md`` (the table, the issue #5 targets,
the IOPS per 10 s), ``compare_lines`` the ``--compare-rev`` ratios.
``guest_text`` says how the guest's I/O reached the image (``--via``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from benchmarks.report import provenance
from tests.support.common import GiB, MiB
from tests.support.stats import first_time_at_or_above
from vmdisktouch.sizes import counted

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
    last_zones_held: int = 0  # bytes of the last phase's hot zones in the status's regions


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

    def steady_median(self, start: float) -> float:
        s = self.steady(start)
        return statistics.median(s) if s else float("nan")


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


def guest_text(b) -> str:
    """How the guest's I/O reaches the image: fio on the file, or through qemu-nbd (``--via``)."""
    job = "`bs=4k`, `rw=randrw`, `rwmixread=80`"
    if b.via == "file":
        return f"`ioengine=psync`, buffered, {job}, `sync=dsync`"
    flush = (f"`fsync={b.nbd_fsync}`: an NBD flush after every I/O, reads included, which "
             "qemu-nbd answers without a syscall, having run `fdatasync` after each write"
             if b.nbd_fsync else "no NBD flushes: qemu-nbd runs `fdatasync` after each write")
    return ("through QEMU's block layer: `qemu-nbd --cache=writethrough --aio=threads -f raw` "
            "on a unix socket, in the group, doing the buffered reads and writes; fio "
            f"`ioengine=nbd`, {flush}; {job}")



def title(b) -> str:
    return f"## {VARIANT_TITLES[b.a.variant]}" + (", through qemu-nbd" if b.via == "nbd" else "") \
        + (f", the daemon's own group limited to {b.a.holder_limit}" if b.a.holder_limit else "")


def scenario_text(b) -> str:
    """The scenario paragraph of a section (``b``: the Bench)."""
    a = b.a
    return (f"Scenario: a {b.size / GiB:.1f} GiB non-sparse raw image; fio as the guest "
            f"({guest_text(b)}, iodepth 1, `random_distribution=zoned_abs`: 90 % of accesses "
            f"in a hot zone of "
            f"{b.hot_len / MiB:.0f} MiB = {a.hot_fraction:.0%} of the image at "
            f"{b.hot_off / MiB:.0f} MiB, the rest uniform); a noisy neighbour (fio "
            f"`{a.neighbour_pattern}` of 64 KiB blocks over its own {b.nb_size / GiB:.1f} GiB "
            f"non-sparse file at {b.nb_rate / MiB:.0f} MiB/s); both in a cgroup v1 memory group "
            f"limited to {b.limit / MiB:.0f} MiB. Each scenario runs {a.duration:.0f} s from a "
            f"cold cache, in a fresh group, with the same fio seed; holders run outside the group"
            + (f", the daemon in a group of its own limited to {a.holder_limit}"
               if a.holder_limit else "") + ". "
            f"vmdisktouch: `--max-hold {b.budget >> 20}M` (1.25 × the hot zone), "
            f"`--interval {a.interval:g}`"
            + (f", `{a.daemon_args}`" if a.daemon_args else "") + ", defaults otherwise, "
            "started together with the workload; the vmtouch holders lock before t = 0 "
            "(their lock time is shown)." + (" " + VARIANT_TEXT[a.variant]
                                              if VARIANT_TEXT[a.variant] else ""))


def moved_held_seconds(b, result: Result) -> float | None:
    """Variant move: seconds from the move until 90 % of the moved zones are in the
    status's regions (None: never)."""
    want = 0.9 * sum(n for _, n in b.phases[-1])
    moved_at = b.a.duration / 2
    return next((x.t - moved_at for x in result.samples
                 if x.t > moved_at and x.last_zones_held >= want), None)


def moved_held_lines(b, rounds: list[dict[str, Result]]) -> list[str]:
    """Variant move with rounds: the moved zones' hold time of each daemon, per round."""
    out = []
    for n in DAEMONS:
        ths = [moved_held_seconds(b, r[n]) for r in rounds if n in r]
        if ths:
            out.append(f"- {LABELS[n]}: the moved zones held (90 % of them in the status's "
                       "regions) after " + ", ".join("never" if t is None else f"{t:.0f} s"
                                                     for t in ths) + " (per round).")
    return out + [""] if out else []


def t90(r: Result, oracle: float, moved_at: float = 0.0) -> float | None:
    """Seconds from ``moved_at`` (the start, or the move) until the 5 s rolling median of
    the IOPS first reaches 90 % of the oracle's steady median (None: never)."""
    after = rolling_median([(t, v) for t, v in r.series() if t > moved_at])
    t = first_time_at_or_above(after, 0.9 * oracle, hold=1)
    return None if t is None else t - moved_at


def events_lost(r: Result) -> int | None:
    """The trace events the kernel lost in the run (the daemon's last status)."""
    return (r.status or {}).get("events_lost")


def report(b, results: dict[str, Result], command: str, chart_rel: str) -> tuple[str, dict]:
    """The Markdown section of one round (``b``: the Bench, for the scenario's geometry)."""
    a = b.a
    steady_from = steady_start(a)
    moved_at = a.duration / 2 if a.variant == "move" else 0.0
    med = {n: r.steady_median(steady_from) for n, r in results.items()}
    none, oracle = med.get("none"), med.get("oracle")
    figures = {"median_iops": med}
    for n in DAEMONS:
        if n in results and oracle:
            figures[n] = {"t90": t90(results[n], oracle, moved_at),
                          "over_oracle": med[n] / oracle, "over_none": med[n] / none,
                          "events_lost": events_lost(results[n])}

    lines = [title(b), "", provenance(command), scenario_text(b), "",
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
        if a.variant == "move":
            th = moved_held_seconds(b, results[n])
            lines.append("- the moved zones held (90 % of them in the status's regions): "
                         + (f"**{th:.0f} s** after the move, {'met' if th <= 10 else 'missed'} "
                            "(target 10 s)." if th is not None else "**never**, missed."))
            figures[n]["held_moved_s"] = th
        loaded, cycles = steady_loaded(results[n], steady_from)
        if cycles:
            lines.append(f"- loaded in the steady window: {loaded / MiB:.0f} MiB over "
                         f"{cycles} cycles (budget {b.budget / MiB:.0f} MiB).")
        st = results[n].status or {}
        if st:
            lines.append(f"- at the end: {counted(st.get('cycle', 0), 'cycle')}, held "
                         f"{st.get('held_bytes', 0) / MiB:.0f} MiB in "
                         f"{counted(len(st.get('regions', [])), 'region')}, "
                         f"last cycle {st.get('cycle_seconds', 0):.3f} s; trace "
                         f"events lost in the run: {st.get('events_lost')}.")
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


