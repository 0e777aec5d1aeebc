"""The daemon's CPU per busy disk: a real client at three event rates, a cached-read flood.

Scenarios (each a fresh guest and daemon on the same images, the page cache of
the images dropped first):

* ``nbd-RATE`` (``--rates``: 1000, 3000, max): one ``--image-size`` (2 GiB)
  raw image served by ``qemu-nbd --cache=writethrough --aio=threads`` in a
  memory cgroup of ``--limit`` (512M), fio through it (``ioengine=nbd``), 4 KiB
  random I/O, 80 % reads, half of them in the first 256 MiB and the rest over
  the whole image, at RATE I/Os a second (``max``: as fast as it goes): the
  group's page cache churns, so every read outside what is held adds pages and
  evicts others.
* ``flood``: the image cached whole, two fio jobs reading 4 KiB at random from
  the file (``psync``, buffered) as fast as they can, no group: hundreds of
  thousands of reads a second, each one event.
* ``three``: three images, each with its own qemu-nbd and fio at the highest
  rate in one group, served by one host service.

The daemon: ``vmdisktouch run IMG... --max-hold 1G (3G for three)
--interval 5 --uri '' --min-free 0 --access-source trace``. After ``--warmup``
s (20) a ``--duration`` s (60) window: its CPU (utime + stime of
/proc/PID/stat, what getrusage counts, over the window's wall time, in % of
one core), the trace events of every cycle in the window from its status
(events per second), the events lost in the window but for its first second,
and its memory besides the held pages (VmRSS - VmLck, the largest sample).

``--compare-rev REV`` runs every scenario with REV's daemon too (a temporary
git worktree), A B B A over ``--rounds`` (2), and reports current ÷ REV.
``--profile DIR`` runs the current daemon under cProfile (one file per
scenario in DIR; not a cost figure: the profiler slows it). ``--quick``: 1G,
10 s warm-up, 20 s windows, one round. ``--doc`` writes section "busy-cost" of
docs/benchmarks/busy-cost.md.

Targets (issue 42): one busy disk (nbd-max) at most 1 % of a core, the flood
at most 5 % with no events lost after the first second, three busy disks at
most 2 % in total; memory besides held pages at most 100 MiB for one disk.

    .venv/bin/python benchmarks/bench_busy_cost.py [--quick] [--compare-rev REV] [--doc]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import shutil
import stat
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    RateGuest, Window, add_cost_options, cache_range, exit_on_sigterm, fill_defaults, fmt,
    guests_iops, machine, median, nbd_guests, publish, ratio_text, round_orders, thread_cpu)
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import ROOT as CHECKOUT, GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.images import evict  # noqa: E402
from tests.support.pagecache import data_image  # noqa: E402
from tests.support.procfs import CLK_TCK, cpu_ticks, memory_fields  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

TARGETS = {"nbd-max": 1.0, "flood": 5.0, "three": 2.0}      # % of one core
TARGET_RSS = 100 * MiB


def scenario(name: str) -> dict:
    """``nbd-RATE``, ``flood`` or ``three``: what the guest does."""
    if name == "flood":
        return {"kind": "flood", "disks": 1, "rate": 0}
    if name == "three":
        return {"kind": "nbd", "disks": 3, "rate": 0}
    rate = name[4:] if name.startswith("nbd-") else ""
    if rate == "max" or rate.isdigit() and int(rate) > 0:
        return {"kind": "nbd", "disks": 1, "rate": 0 if rate == "max" else int(rate)}
    raise SystemExit(f"bench_busy_cost: unknown scenario {name!r}")


# Where the main thread's time goes, by the cumulative time of these functions
# (``(file suffix, function)``; a category sums its functions, none calls another).
SPLIT = [
    ("ring-buffer reading (read(2) of trace_pipe_raw)",
     [("trace/trace_reader.py", "_read_pages")]),
    ("parsing the pages", [("trace/ringbuf.py", "parse_pages")]),
    ("decoding and sorting the events", [("trace/trace_reader.py", "_decode"),
                                         ("trace/ringbuf.py", "time_order"),
                                         ("trace/ringbuf.py", "concat_events")]),
    ("per-event bookkeeping (reads, writes, adds, deletes)", [("core/access.py", "feed"),
                                                             ("core/shift.py", "count")]),
    ("the cycle's evidence (AccessLog.take)", [("core/access.py", "take")]),
    ("mincore reconciliation", [("observe/residency_tracker.py", "scan")]),
    ("the policy (heat, regions, budget)", [("core/policy.py", "prepare"),
                                            ("core/policy.py", "select"),
                                            ("core/policy.py", "finish"),
                                            ("core/policy.py", "settle")]),
    ("holding: load, mlock, release, recharge", [("hold/holder.py", "apply"),
                                                 ("hold/holder.py", "drop"),
                                                 ("cgroup/charge_tracker.py", "update")]),
    ("the spill (unlocked reads)", [("hold/spill.py", "warm")]),
    ("the report and the status file", [("daemon/host.py", "report"),
                                        ("vmdisktouch/report.py", "to_json")]),
]


def profile_split(path: str) -> list[tuple[str, float]]:
    """``SPLIT``'s categories' seconds in a cProfile file, then the rest and the total."""
    st = pstats.Stats(path)
    cum: dict[tuple[str, str], float] = {}
    total = 0.0
    for (file, _line, func), (_cc, _nc, tt, ct, _callers) in st.stats.items():
        total += tt
        cum[(file, func)] = cum.get((file, func), 0.0) + ct
    out = []
    for name, funcs in SPLIT:
        out.append((name, sum(v for (file, func), v in cum.items()
                              if any(file.endswith(f) and func == fn for f, fn in funcs))))
    out.append(("the rest of the main thread (the loop, libvirt, logging, the probe)",
                total - sum(v for _, v in out)))
    out.append(("the main thread, profiled", total))
    return out


PROFILED = """
import cProfile, runpy, sys, time
out = sys.argv.pop(1)
sys.argv.pop(1)              # "-m"
module = sys.argv.pop(1)
sys.argv[0] = module
p = cProfile.Profile(time.thread_time)
try:
    p.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    p.dump_stats(out)
"""


def profiling_python(tmp: str, out: str) -> str:
    """An executable that runs ``python -m MODULE ARGS`` under cProfile with the main
    thread's CPU time as its clock (not the wall: waits and I/O cost nothing), to OUT."""
    path = os.path.join(tmp, f"python-profiled-{os.path.basename(out)}")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec {sys.executable} -c \'{PROFILED}\' {out} "$@"\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def run_one(name: str, tag: str, cwd, images: list[str], args, tmp: str,
            profile: str | None) -> dict:
    sc = scenario(name)
    paths = images[:sc["disks"]]
    for p in paths:
        evict(p)
    stack = contextlib.ExitStack()
    with stack:
        runtime = args.warmup + args.duration + 60
        guests, flood = [], None
        if sc["kind"] == "flood":
            cache_range(paths[0], 0, args.image_size)
            g = RateGuest(paths[0], 0, args.image_size, [("randread", 0), ("randread", 0)],
                          runtime=runtime, log_dir=tmp).start()
            stack.callback(g.stop)
            flood = g
        else:
            cg = MemoryCgroup(f"busy-{name}-{tag}-{os.getpid()}", args.limit).create()
            stack.callback(cg.cleanup)
            guests = nbd_guests(stack, paths, args.image_size, cg, tmp, runtime, sc["rate"])
        python = profiling_python(tmp, profile) if profile else sys.executable
        d = DaemonProc(tmp, paths, "--uri", "", "--min-free", "0", "--access-source", "trace",
                       max_hold=args.max_hold * len(paths), interval=args.interval,
                       status=f"status-{name}-{tag}.json", log=f"daemon-{name}-{tag}.log",
                       env=env_without_systemd(), cwd=cwd, python=python)
        stack.callback(d.stop)
        w = Window()
        end_warm = time.monotonic() + args.warmup
        while time.monotonic() < end_warm:
            if not d.alive():
                raise RuntimeError(f"{name} {tag}: the daemon died:\n{d.log_tail(20)}")
            time.sleep(0.2)
        ticks0, w0 = cpu_ticks(d.pid), time.monotonic()
        rss = []
        next_mem = w0
        first_second = w0 + 1.0
        while time.monotonic() - w0 < args.duration:
            st = d.read_status()
            now = time.monotonic()
            w.look(st, count=True)
            if now < first_second:
                w.lost.clear()
            if now >= next_mem:
                f = memory_fields(d.pid, ("VmRSS", "VmLck"))
                rss.append(f.get("VmRSS", 0) - f.get("VmLck", 0))
                next_mem = now + 1.0
            if not d.alive():
                raise RuntimeError(f"{name} {tag}: the daemon died:\n{d.log_tail(20)}")
            time.sleep(0.2)
        ticks1, wall = cpu_ticks(d.pid), time.monotonic() - w0
        threads = thread_cpu(d.pid)
        st = d.read_status() or {}
        held = st.get("host", {}).get("held_bytes", 0)
        rc = d.stop()
        if rc != 0:
            raise RuntimeError(f"{name} {tag}: the daemon exited {rc}:\n{d.log_tail(20)}")
    iops = guests_iops(guests, args.warmup)
    if flood is not None:           # fio's own figure over its whole run, from its JSON
        iops = sum(j["read"]["iops"] for j in (flood.result or {}).get("jobs", []))
    events = w.total()
    cycles = len({c for _, c in w.events})
    window_s = cycles * args.interval or wall
    r = {"scenario": name, "daemon": tag, "cpu": 100.0 * (sum(ticks1) - sum(ticks0))
         / CLK_TCK / wall, "events": events, "events_per_s": sum(events.values()) / window_s,
         "lost": w.lost_in(), "rss_max": max(rss) if rss else 0, "held": held, "iops": iops,
         "threads_cpu_s": threads}
    print(f"  {name} {tag}: CPU {r['cpu']:.2f} % of a core, {r['events_per_s']:,.0f} events/s "
          f"({', '.join(f'{k} {v:,}' for k, v in events.items())} in {cycles} cycles), lost "
          f"{r['lost']}, memory besides held {fmt(r['rss_max'])}, held {fmt(held)}"
          + (f", guest {iops:,.0f} IOPS" if iops == iops else ""), flush=True)
    print(f"    CPU over the whole run: main thread {threads[0]:.2f} s, the others "
          f"{threads[1]:.2f} s", flush=True)
    if profile:
        r["profile"] = profile_split(profile)
        for what, sec in r["profile"]:
            print(f"    {sec:7.2f} s  {what}", flush=True)
    return r


def report(results: list[dict], names: list[str], rev: str | None, sha: str,
           rounds: int = 1) -> str:
    lines = ["| scenario | events/s | CPU, % of a core | target | lost after 1 s | memory "
             "besides held | " + (f"{rev}: CPU | current ÷ {rev} |" if rev else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if rev else "")]
    for name in names:
        cur = [r for r in results if r["scenario"] == name and r["daemon"] == "current"]
        old = [r for r in results if r["scenario"] == name and r["daemon"] != "current"]
        c = median([r["cpu"] for r in cur])
        each = ", ".join(f"{r['cpu']:.2f}" for r in cur)
        row = (f"| {name} | {median([r['events_per_s'] for r in cur]):,.0f} | "
               f"**{c:.2f}** ({each}) | "
               f"{TARGETS.get(name, '—')} | {max(r['lost'] for r in cur)} | "
               f"{fmt(max(r['rss_max'] for r in cur))} |")
        if rev:
            o = median([r["cpu"] for r in old])
            each = ", ".join(f"{r['cpu']:.2f}" for r in old)
            row += f" {o:.2f} ({each}) | **{ratio_text(c, o)}** |"
        lines.append(row)
    head = ("CPU is the median of the rounds (each round's in brackets); events/s counts the "
            "trace events of the window's cycles (reads, writes, adds and deletes)")
    if rev:
        head += f"; side by side with `{rev}` ({sha[:10]}), the same guests, " + \
            ("A B B A" if rounds > 1 else "A B (the current daemon first, one round)")
    return head + ".\n\n" + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="nbd-1000,nbd-3000,nbd-max,flood,three")
    ap.add_argument("--image-size", type=parse_size, default=None, help="(2G)")
    ap.add_argument("--limit", type=parse_size, default=512 * MiB)
    ap.add_argument("--max-hold", type=parse_size, default=GiB, help="per disk (1G)")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=None, help="(2; 1 without --compare-rev)")
    ap.add_argument("--profile", metavar="DIR")
    add_cost_options(ap, warmup=20, duration=60)
    args = ap.parse_args()
    fill_defaults(args, (("image_size", 2 * GiB, GiB), ("warmup", 20.0, 10.0),
                         ("duration", 60.0, 20.0)))
    if args.rounds is None:
        args.rounds = 2 if args.compare_rev and not args.quick else 1
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    for n in names:
        scenario(n)
    exit_on_sigterm("bench_busy_cost")
    print(f"{machine()}; images of {fmt(args.image_size)}, scenarios {', '.join(names)}",
          flush=True)
    stack = contextlib.ExitStack()
    tmp = tempfile.mkdtemp(prefix="bench-busy-cost-", dir="/tmp")
    images: list[str] = []
    results: list[dict] = []
    tree = None
    try:
        if args.compare_rev:
            tree = enter_rev_worktree(stack, args.compare_rev)
        ndisks = max(scenario(n)["disks"] for n in names)
        for k in range(ndisks):
            path = os.path.join(args.dir, f"vmdt-busy-{os.getpid()}-{k}.raw")
            images.append(str(data_image(path, args.image_size)))
        daemons = [("current", CHECKOUT)] + ([(f"@{tree.rev}", tree.path)] if tree else [])
        for rnd, order in enumerate(round_orders(daemons, args.rounds)):
            for name in names:
                for tag, cwd in order:
                    prof = None
                    if args.profile and tag == "current":
                        os.makedirs(args.profile, exist_ok=True)
                        prof = os.path.abspath(os.path.join(args.profile,
                                                            f"{name}-{rnd}.prof"))
                    results.append(run_one(name, tag, cwd, images, args, tmp, prof))
        body = report(results, names, f"@{tree.rev}" if tree else None,
                      tree.sha if tree else "", args.rounds)
        publish(body, results, args, "busy-cost", "The cost of a busy disk")
    finally:
        for p in images:
            with contextlib.suppress(OSError):
                os.unlink(p)
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
