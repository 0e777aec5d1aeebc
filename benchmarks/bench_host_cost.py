"""The cost of one process serving many disks, some busy: CPU, memory and cycle of `run IMG x N`.

Scenario (the issue "a host of a hundred VMs"): ``--disks`` (100; ``--images``
is the same option) sparse images of ``--image-size`` (64 GiB) each on
``--dir`` (/var/tmp), each with ``--extents`` (8) extents of ``--extent``
(4 MiB) of data spread over it (a thin guest disk). ``--busy`` (10) of them
are busy: each served by ``qemu-nbd --cache=writethrough --aio=threads`` in
one memory cgroup of ``--limit`` (512M) per busy disk, fio through it at its
highest rate (``ioengine=nbd``, 4 KiB random I/O, 80 % reads, half of them in
the first 256 MiB and the rest over the whole image: ``source_common.nbd_guests``,
the busy disk of bench_busy_cost). The others are idle: no reads at all
(``--light-reads`` 0); ``--light-reads R`` gives each of them R reads of 4 KiB
a second inside its extents from one Python guest process (buffered), the
light disks of the earlier readings (32 disks at 50 reads/s). One daemon
serves them all: ``vmdisktouch run IMG... --max-hold 1G --interval 5 --uri ''
--min-free 0`` (its defaults otherwise: the trace source).

Each daemon starts from a dropped page cache of the images, warms up
(``--warmup`` s, 30; with light reads also until 90 % of their extents or of the
budget is held), then two windows of ``--duration`` (60) s each:

* ``quiet``: the busy disks' clients not started (with ``--light-reads 0``
  every disk idle);
* ``busy`` (when ``--busy`` > 0): qemu-nbd and fio started on the busy disks,
  ``--busy-warmup`` (20) s, then the window; the clients stopped after it.

In each window: the daemon's CPU (utime + stime of /proc/PID/stat over the
wall time, in % of one core; its user and system parts; its main thread and
its other threads, /proc/PID/task), and once a second its memory besides the
held pages (VmRSS - VmLck of /proc/PID/status; in total and divided by the
disks), the host's ``cycle_seconds`` (the longest one seen is the longest
cycle) and every disk's ``events_lost`` (the events lost in the window: the
growth of each disk's count, summed), from the status file.

Targets (the issue): 100 idle disks at most 1.5 % of a core (fewer disks: the
same 1.5 %; more: 0.015 % a disk); each busy disk adds at most 0.5 % of a core (the
busy window's CPU less the quiet window's, divided by ``--busy``); memory
besides the held pages at most 4 MiB a disk (the largest sample of both
windows); the longest cycle at most 0.5 s.

``--compare-rev REV``: the same with the daemon of commit REV too (``python
-m vmdisktouch run`` with its cwd a temporary git worktree of REV, removed
afterwards), on the same images, over ``--rounds`` (2 with ``--compare-rev``,
else 1) rounds, the order reversed every other round (A B B A: current, REV,
REV, current; ``source_common.round_orders``). Reported: the medians of the
rounds now, at REV and current ÷ REV.

``--quick``: 8 disks of which 2 busy, 4 GiB images, 10 s warm-ups, 20 s
windows. ``--doc`` writes section ``--section`` of docs/benchmarks/host-cost.md
("host-of-a-hundred"; "host-of-a-hundred-rev" for a ``--compare-rev`` run); the
earlier readings of 32 light disks, section "host-cost", are ``--disks 32 --busy 0
--light-reads 50 --section host-cost`` (one window, each disk read).

Everything made is removed at the end, also on an error or SIGTERM: the
images, qemu-nbd and fio (stopped by PID), the memory cgroup, the daemon and the
worktree.

    .venv/bin/python benchmarks/bench_host_cost.py [--quick] [--disks N] [--busy K]
        [--light-reads R] [--compare-rev REV] [--rounds N] [--doc]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    CLK_TCK, Window, add_cost_options, cpu_ticks, exit_on_sigterm, fill_defaults, fmt,
    guests_iops, machine, median, nbd_guests, publish, ratio_text, round_orders, side_by_side,
    thread_cpu)
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import ROOT as CHECKOUT, GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.images import evict  # noqa: E402
from tests.support.procfs import memory_fields  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

TARGET_IDLE_CPU = 1.5           # % of a core for 100 idle disks (more: 0.015 % a disk)
TARGET_BUSY_CPU = 0.5           # % of a core each busy disk adds
TARGET_RSS_DISK = 4 * MiB       # memory besides the held pages, a disk
TARGET_CYCLE = 0.5              # s, the host's longest cycle

GUEST = """
import os, random, sys, time
rate, ext, paths = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
fds = [(os.open(p, os.O_RDONLY), [int(x) for x in os.environ['EXTENTS_' + str(i)].split(',')])
       for i, p in enumerate(paths)]
for fd, _ in fds:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
rng = random.Random(1)
step = 1.0 / (rate * len(fds))
t = time.monotonic()
while True:
    for fd, offs in fds:
        off = rng.choice(offs) + rng.randrange(ext // 4096) * 4096
        os.pread(fd, 4096, off)
        t += step
        d = t - time.monotonic()
        if d > 0:
            time.sleep(d)
"""


def make_images(args, out: list) -> None:
    """The sparse images, appended to ``out`` as ``(path, extent offsets)`` as each is made
    (so that a failure half way removes those already made)."""
    for i in range(args.disks):
        path = os.path.join(args.dir, f"vmdt-host-cost-{os.getpid()}-{i}.raw")
        with open(path, "wb") as f:
            out.append((path, []))
            f.truncate(args.image_size)
        gap = args.image_size // args.extents
        offs = [k * gap + (i * 7 + k * 13) % 64 * MiB for k in range(args.extents)]
        fd = os.open(path, os.O_WRONLY)
        try:
            for off in offs:
                os.pwrite(fd, os.urandom(args.extent), off)
            os.fsync(fd)
        finally:
            os.close(fd)
        out[-1] = (path, offs)


def mem(pid: int) -> int:
    f = memory_fields(pid, ("VmRSS", "VmLck"))
    return f.get("VmRSS", 0) - f.get("VmLck", 0)


def check_alive(d, tag: str) -> None:
    if not d.alive():
        raise RuntimeError(f"{tag}: the daemon died:\n{d.log_tail(20)}")


def window(d, args, tag: str, name: str) -> dict:
    """``args.duration`` s of the daemon: CPU over the window, once a second its memory
    besides held pages, the host's cycle and every disk's lost events."""
    w = Window()
    rss, held, cycles, disk_cycles = [], [], [], []
    ticks0, thr0, w0 = cpu_ticks(d.pid), thread_cpu(d.pid), time.monotonic()
    while time.monotonic() - w0 < args.duration:
        check_alive(d, tag)
        st = d.read_status() or {}
        rss.append(mem(d.pid))
        host = st.get("host", {})
        held.append(host.get("held_bytes", 0))
        cycles.append(host.get("cycle_seconds", 0.0))
        disk_cycles.append(max((x.get("cycle_seconds", 0.0) for x in st.get("disks", [])),
                               default=0.0))
        w.look(st, count=False)
        time.sleep(max(0.0, w0 + len(rss) - time.monotonic()))
    ticks1, thr1, wall = cpu_ticks(d.pid), thread_cpu(d.pid), time.monotonic() - w0
    r = {"window": name, "wall": wall,
         "cpu": 100.0 * (sum(ticks1) - sum(ticks0)) / CLK_TCK / wall,
         "cpu_user": 100.0 * (ticks1[0] - ticks0[0]) / CLK_TCK / wall,
         "cpu_sys": 100.0 * (ticks1[1] - ticks0[1]) / CLK_TCK / wall,
         "cpu_main": 100.0 * (thr1[0] - thr0[0]) / wall,
         "cpu_others": 100.0 * (thr1[1] - thr0[1]) / wall,
         "rss_max": max(rss), "rss_median": median(rss), "held_median": median(held),
         "cycle_max": max(cycles), "cycle_median": median(cycles),
         "disk_cycle_max": max(disk_cycles), "lost": w.lost_in(),
         "disks": len(st.get("disks", []))}
    print(f"  {tag} {name}: CPU {r['cpu']:.2f} % of a core (user {r['cpu_user']:.2f}, system "
          f"{r['cpu_sys']:.2f}; main thread {r['cpu_main']:.2f}, others {r['cpu_others']:.2f}), "
          f"memory besides held {fmt(r['rss_max'])} max ({fmt(r['rss_max'] / args.disks)} a "
          f"disk), held {fmt(r['held_median'])}, longest cycle {r['cycle_max'] * 1000:.0f} ms "
          f"(median {r['cycle_median'] * 1000:.0f} ms; slowest disk's own "
          f"{r['disk_cycle_max'] * 1000:.0f} ms), events lost {r['lost']}", flush=True)
    return r


def run_daemon(images, busy_paths, args, tmp: str, tag: str, cwd) -> dict:
    """One daemon over every image: warm-up, the quiet window, then the busy one."""
    for p, _ in images:         # each daemon from the same page cache: none of the images
        evict(p)
    with contextlib.ExitStack() as stack:
        d = DaemonProc(tmp, [p for p, _ in images], "--uri", "", "--min-free", "0",
                       *args.daemon_args.split(), max_hold=args.max_hold,
                       interval=args.interval, status=f"host-{tag}.json",
                       log=f"daemon-{tag}.log", env=env_without_systemd(), cwd=cwd)
        stack.callback(d.stop)
        print(f"  {tag}: pid {d.pid}, cwd {d.proc_cwd()}", flush=True)
        light = args.disks - len(busy_paths) if args.light_reads > 0 else 0
        want = 0.9 * min(parse_size(args.max_hold), light * args.extents * args.extent)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.warmup or \
                ((d.read_status() or {}).get("host", {}).get("held_bytes", 0) < want
                 and time.monotonic() - t0 < 300):
            check_alive(d, tag)
            time.sleep(0.5)
        r = {"daemon": tag, "warm": time.monotonic() - t0,
             "quiet": window(d, args, tag, "quiet"), "busy": None}
        if busy_paths:
            cg = MemoryCgroup(f"host-busy-{tag.strip('@')}", args.limit * len(busy_paths))
            cg.create()
            stack.callback(cg.cleanup)
            with contextlib.ExitStack() as clients:       # stopped right after the window
                guests = nbd_guests(clients, busy_paths, args.image_size, cg, tmp,
                                    args.busy_warmup + args.duration + 60)
                end = time.monotonic() + args.busy_warmup
                while time.monotonic() < end:
                    check_alive(d, tag)
                    time.sleep(0.2)
                r["busy"] = window(d, args, tag, "busy")
                r["busy"]["iops"] = guests_iops(guests, args.busy_warmup)
            print(f"  {tag}: the busy clients did {r['busy']['iops']:,.0f} I/Os a second in "
                  "all", flush=True)
        rc = d.stop()
        if rc != 0:
            raise RuntimeError(f"{tag}: the daemon exited {rc}:\n{d.log_tail(20)}")
    return r


def summary(runs: list[dict], busy: int, disks: int) -> dict:
    """The headline figures of one daemon's runs: medians of the rounds (the largest for
    memory, the longest cycle and the lost events)."""
    def med(win, key):
        return median([r[win][key] for r in runs if r[win]])

    def most(key):
        return max(r[w][key] for r in runs for w in ("quiet", "busy") if r[w])
    s = {"cpu_quiet": med("quiet", "cpu"), "cpu_busy": med("busy", "cpu") if busy else None,
         "per_busy": median([(r["busy"]["cpu"] - r["quiet"]["cpu"]) / busy for r in runs])
         if busy else None,
         "rss_max": most("rss_max"), "rss_disk": most("rss_max") / disks,
         "cycle_max": most("cycle_max"), "lost": most("lost"),
         "held_quiet": med("quiet", "held_median"),
         "iops": med("busy", "iops") if busy else None,
         "rounds": len(runs)}
    return s


def target_lines(s: dict, args) -> list[str]:
    idle = TARGET_IDLE_CPU * max(1.0, args.disks / 100)
    what = ("idle disks" if args.light_reads <= 0 else
            f"disks, {args.disks - args.busy} of them with {args.light_reads:g} reads/s (the "
            "target is for idle ones)")
    out = [f"- {args.disks} {what}: ≤ {idle:.2f} % of a core (the target of 100 idle disks; "
           f"more: {TARGET_IDLE_CPU / 100:g} % a disk): **{s['cpu_quiet']:.2f} %**, "
           f"{'met' if s['cpu_quiet'] <= idle else 'missed'}"]
    if args.busy:
        out.append(f"- each busy disk adds ≤ {TARGET_BUSY_CPU:g} % of a core: **"
                   f"{s['per_busy']:.2f} %** (({s['cpu_busy']:.2f} − {s['cpu_quiet']:.2f}) ÷ "
                   f"{args.busy}), {'met' if s['per_busy'] <= TARGET_BUSY_CPU else 'missed'}")
    out.append(f"- memory besides held pages ≤ {fmt(TARGET_RSS_DISK)} a disk: **"
               f"{fmt(s['rss_disk'])}** ({fmt(s['rss_max'])} ÷ {args.disks}), "
               f"{'met' if s['rss_disk'] <= TARGET_RSS_DISK else 'missed'}")
    out.append(f"- the longest cycle ≤ {TARGET_CYCLE:g} s: **{s['cycle_max']:.2f} s**, "
               f"{'met' if s['cycle_max'] <= TARGET_CYCLE else 'missed'}")
    out.append(f"- events lost in a window (no target): **{s['lost']}**")
    return out


def compare_lines(cur: dict, old: dict, rev: str, sha: str, how: str) -> list[str]:
    """--compare-rev: the headline figures (``summary``) now and at REV, and current ÷ REV."""
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    rows = [("CPU, quiet window, % of a core", cur["cpu_quiet"], old["cpu_quiet"], ".2f")]
    if cur.get("cpu_busy") is not None:
        rows += [("CPU, busy window, % of a core", cur["cpu_busy"], old["cpu_busy"], ".2f"),
                 ("CPU each busy disk adds, % of a core", cur["per_busy"], old["per_busy"],
                  ".2f"),
                 ("the busy clients' I/Os a second", cur["iops"], old["iops"], ",.0f")]
    rows += [("memory besides held pages, max", cur["rss_max"], old["rss_max"], fmt),
             ("memory besides held pages, a disk", cur["rss_disk"], old["rss_disk"], fmt),
             ("held, quiet window (median)", cur["held_quiet"], old["held_quiet"], fmt),
             ("the longest cycle", cur["cycle_max"], old["cycle_max"], ms),
             ("events lost in a window", cur["lost"], old["lost"], "d")]
    return side_by_side(rev, sha, rows, how)


def table(results: list[dict], args) -> str:
    head = ("| daemon | round | window | CPU, % of a core | user / system | main thread / "
            "others | memory besides held (VmRSS - VmLck), max: total / a disk | held "
            "(median) | longest cycle (median) | slowest disk's own | events lost | busy "
            "clients' I/Os a second |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        for w in (r["quiet"], r["busy"]):
            if w:
                iops = f"{w['iops']:,.0f}" if "iops" in w else "—"
                rows.append(
                    f"| {r['daemon']} | {r['round']} | {w['window']} | {w['cpu']:.2f} | "
                    f"{w['cpu_user']:.2f} / {w['cpu_sys']:.2f} | {w['cpu_main']:.2f} / "
                    f"{w['cpu_others']:.2f} | {fmt(w['rss_max'])} / "
                    f"{fmt(w['rss_max'] / args.disks)} | {fmt(w['held_median'])} | "
                    f"{w['cycle_max'] * 1000:.0f} ms ({w['cycle_median'] * 1000:.0f} ms) | "
                    f"{w['disk_cycle_max'] * 1000:.0f} ms | {w['lost']} | {iops} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--disks", "--images", dest="disks", type=int, default=None,
                    help="the images served (100; --quick 8)")
    ap.add_argument("--busy", type=int, default=None,
                    help="how many of them are busy (10; --quick 2)")
    ap.add_argument("--light-reads", "--reads", dest="light_reads", type=float, default=0.0,
                    help="reads a second of each disk that is not busy (0: idle)")
    ap.add_argument("--image-size", type=parse_size, default=None, help="(64G; --quick 4G)")
    ap.add_argument("--extents", type=int, default=8)
    ap.add_argument("--extent", type=parse_size, default=4 * MiB)
    ap.add_argument("--limit", type=parse_size, default=512 * MiB,
                    help="the busy clients' memory group, per busy disk (512M)")
    ap.add_argument("--busy-warmup", type=float, default=None, help="(20; --quick 10)")
    ap.add_argument("--max-hold", default="1G")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=None,
                    help="(2 with --compare-rev, else 1; A B B A)")
    ap.add_argument("--daemon-args", default="")
    ap.add_argument("--keep", action="store_true", help="keep the daemon logs (printed path)")
    ap.add_argument("--section", default=None, help="the section --doc writes "
                    "(host-of-a-hundred; with --compare-rev host-of-a-hundred-rev)")
    add_cost_options(ap, warmup=30, duration=60)
    args = ap.parse_args()
    fill_defaults(args, (("disks", 100, 8), ("busy", 10, 2), ("image_size", 64 * GiB, 4 * GiB),
                         ("warmup", 30.0, 10.0), ("duration", 60.0, 20.0),
                         ("busy_warmup", 20.0, 10.0)))
    if args.rounds is None:
        args.rounds = 2 if args.compare_rev else 1
    if args.section is None:
        args.section = "host-of-a-hundred" + ("-rev" if args.compare_rev else "")
    if not 0 <= args.busy <= args.disks:
        ap.error(f"--busy {args.busy}: between 0 and --disks ({args.disks})")
    exit_on_sigterm("bench_host_cost")
    print(f"{machine()}; {args.disks} sparse images of {fmt(args.image_size)}, "
          f"{args.extents} x {fmt(args.extent)} of data each; {args.busy} busy (qemu-nbd, fio "
          f"at its highest rate), the others {args.light_reads:g} reads/s each", flush=True)
    stack = contextlib.ExitStack()
    tmp = tempfile.mkdtemp(prefix="bench-host-cost-", dir="/tmp")
    images, guest, tree = [], None, None
    results = []
    try:
        if args.compare_rev:
            tree = enter_rev_worktree(stack, args.compare_rev)
        t0 = time.monotonic()
        make_images(args, images)
        print(f"  {len(images)} images made in {time.monotonic() - t0:.0f} s", flush=True)
        busy_paths = [p for p, _ in images[:args.busy]]
        light = images[args.busy:]
        if args.light_reads > 0 and light:
            env = dict(os.environ, **{f"EXTENTS_{i}": ",".join(map(str, offs))
                                      for i, (_, offs) in enumerate(light)})
            guest = subprocess.Popen([sys.executable, "-c", GUEST, str(args.light_reads),
                                      str(args.extent), *[p for p, _ in light]], env=env)
        daemons = [("current", CHECKOUT)] + ([(f"@{tree.rev}", tree.path)] if tree else [])
        for rnd, order in enumerate(round_orders(daemons, args.rounds), 1):
            for tag, cwd in order:
                r = run_daemon(images, busy_paths, args, tmp, tag, cwd)
                results.append(dict(r, round=rnd))
    finally:
        if guest is not None:
            guest.kill()
            guest.wait()
        for p, _ in images:
            with contextlib.suppress(OSError):
                os.unlink(p)
        if args.keep:
            print(f"logs kept in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        stack.close()
    cur = summary([r for r in results if r["daemon"] == "current"], args.busy, args.disks)
    order = " ".join("A" if tag == "current" else "B"
                     for o in round_orders(daemons, args.rounds) for tag, _ in o)
    light_text = (f"the other {args.disks - args.busy} idle (no reads)" if args.light_reads <= 0
                  else f"the other {args.disks - args.busy} read by a guest process, 4 KiB at "
                  f"random in their extents, {args.light_reads:g} reads/s each")
    body = (f"{args.disks} sparse images of {fmt(args.image_size)} on {args.dir}, each with "
            f"{args.extents} extents of {fmt(args.extent)} of data; {args.busy} busy (qemu-nbd "
            f"`--cache=writethrough --aio=threads` in a memory group of "
            f"{fmt(args.limit * args.busy)}, fio through it at its highest rate, 4 KiB random, "
            f"80 % reads), {light_text}; one daemon `vmdisktouch run IMG... --max-hold "
            f"{args.max_hold} --interval {args.interval:g} --uri '' --min-free 0"
            + (f" {args.daemon_args}" if args.daemon_args else "") + "` (trace source), from a "
            f"dropped page cache; after a {args.warmup:g} s warm-up a {args.duration:g} s "
            "window with the busy clients not started (quiet)"
            + (f", then the clients started, {args.busy_warmup:g} s, and a {args.duration:g} s "
               "window (busy)" if args.busy else "") + "."
            + (f" Side by side with the daemon of `{tree.rev}` ({tree.sha[:10]}), "
               f"{args.rounds} round(s): {order}." if tree else
               (f" {args.rounds} rounds." if args.rounds > 1 else "")) + "\n\n"
            + table(results, args) + "\n\n"
            + ("Targets (the medians of the current daemon's rounds; memory, cycle and lost: "
               "the largest):\n\n" if args.rounds > 1 else "Targets:\n\n")
            + "\n".join(target_lines(cur, args)))
    out = {"current": cur, "runs": results}
    if tree:
        old = summary([r for r in results if r["daemon"] != "current"], args.busy, args.disks)
        how = (f"the same images and clients, the daemon of {tree.rev} (`python -m vmdisktouch "
               f"run` in a git worktree of it), each from a dropped page cache, {order}")
        body += "\n\n" + "\n".join(compare_lines(cur, old, f"@{tree.rev}", tree.sha, how))
        if args.busy:
            body += (f"\n\nEach busy disk adds {cur['per_busy']:+.2f} % of a core now, "
                     f"{old['per_busy']:+.2f} % at {tree.rev} (current ÷ {tree.rev} "
                     f"{ratio_text(cur['per_busy'], old['per_busy'])}).")
        out["rev"] = dict(old, rev=tree.rev, sha=tree.sha)
    publish(body, out, args, args.section, "Many disks, one process: CPU and memory"
            if args.section == "host-cost" else f"A host of {args.disks} disks, {args.busy} busy: "
            "CPU, memory, the longest cycle")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
