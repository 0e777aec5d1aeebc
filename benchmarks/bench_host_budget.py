"""One budget for the host against a budget per disk: one busy VM and N light ones.

Scenario (issue 16, the defaults): four non-sparse images, each with the
hot-zone guest of bench_hotzone (``tests.support.fio.FioJob``: 4 KiB random I/O,
80 % reads, O_DSYNC writes, iodepth 1, 90 % of the accesses in its hot zone):
one *busy* VM (an 8 GiB image, a hot zone of ``--busy-hot`` (800 MiB), as
fast as it can) and ``--light`` (3) *light* ones (1 GiB images, hot zones of
``--light-hot`` (100 MiB), ``--light-iops`` (500) passed to fio's
``--rate_iops``, which caps reads and writes each: 1,000 I/O per second in
all, as measured), all at once, with a noisy neighbour (fio random 64 KiB
reads of its own 1 GiB file at 200 MiB/s), all in one cgroup v1 memory group
limited to ``--limit`` (768 MiB), so their page cache competes. fio does
the I/O on the image files (``--via file``, the default). Scenarios, one
after the other, each from a cold cache for ``--duration`` s (120):

* ``none``: no holder;
* ``oracle``: ``vmtouch -l`` of exactly each hot zone (they fit in the
  budget), locked before t = 0;
* ``global``: one daemon, ``vmdisktouch run BUSY L1 L2 L3 --max-hold
  1200M`` (one budget, every disk's regions ranked together);
* ``split``: one daemon per image, ``--max-hold`` the budget ÷ the number
  of VMs (rounded down to whole MiB: 300M each), as per-disk units would
  be configured.

``--issue32`` (issue 32, one busy VM and two identical light ones, its
section "host-budget-fair"): ``--light 2``, busy hot zone 819M of 8 GiB,
light hot zones 205M of 1 GiB, budget 1229M (exactly the three zones:
split 409M each), group limit 512M, ``--via nbd``, and the light VMs paced
by think time instead of a rate cap: ``--light-think 2000`` (fio
``--thinktime=2000``: 2 ms after each I/O completes before the next is
issued, so a light VM does about 400 I/O per second, well below what the
disk does, and its rate still follows its latency), ``--light-iops 0`` (no
cap). Any of these options given explicitly overrides the preset.

``--via nbd``: each VM's fio goes through its own ``qemu-nbd
--cache=writethrough --aio=threads -f raw`` (``tests.support.nbd.QemuNbd``, as
``bench_hotzone.py --via nbd``), started in the memory group for each
scenario and stopped by PID after it: QEMU's block layer does the buffered
reads and the writes (each followed by ``fdatasync``), fio's ``nbd`` engine
talks to its unix socket (``fsync=1``); the holders hold the image files.

The daemons run outside the group, ``--interval 5 --uri ''``, their
defaults otherwise. Measured per scenario and VM over the steady half (the
second half of the run): the median of fio's per-second IOPS, the mean
read (and write) latency (fio's ``lat_ns``, from its cumulative per-second
JSON status at the middle and at the end), and the bytes held: every
``--sample`` s (2) the status file's ``host.disks[].held_bytes`` of the
global daemon, ``VmLck`` of each split daemon or oracle ``vmtouch``;
the median of those samples; for the daemons also each disk's share
(``host.disks[].share_bytes``, or ``budget_bytes`` of a one-disk status),
its most frequent ``limited_by``, and the churn: the sum of the
``loaded_bytes`` and ``released_bytes`` of every cycle seen in the steady
half (the status files are read every 0.5 s; each cycle counted once); and
the daemon's log lines at INFO (all, and those of the steady half) and at
WARNING or above.

Targets (issue 32), on each scenario's median across rounds: global total
IOPS ≥ ``oracle_target`` × oracle's (1.1 with ``--issue32``, 1 for issue
16's defaults) and ≥ 1.3 × split's; under global the light VMs' held bytes
within 10 % of each other ((max − min) ÷ max); each VM's mean read latency
under global ≤ 1.1 × its latency under the oracle. Each is printed PASS or
MISS, and the IOPS ratios per round too.

``--rounds K`` (1): the scenario list K times, reversed on every other round
(A B C D, D C B A: the shared disk here is noisy); the targets are then
taken on each scenario's median across rounds, with its min–max.

``--compare-rev REV``: each daemon scenario (global, split) also runs with
the daemon of commit REV (``global-rev``, ``split-rev``: ``python -m
vmdisktouch run`` with its cwd a temporary git worktree of REV, removed
afterwards; same images, arguments and fio seed), right after its current
twin in each round (so A B, then B A on the reversed rounds); reported: each
headline figure now, at REV and current ÷ REV, and the targets for both.

``--slow-light RIOPS``: light1's image is a loop device (``losetup
--direct-io=on``) over its file, its reads capped at RIOPS a second by a
throttle of the root blkio group (cgroup v1 ``blkio.throttle.read_iops_device``;
every process: QEMU's misses and the daemon's timed probes alike): a disk on a
loaded array, where a miss waits milliseconds; a fio of 4 direct random
readers on the device all along stands for the array's other tenants, so it
stays loaded whatever light1 does. The other VMs are unchanged.
The read time saved a second against ``none`` is then reported per scenario:
the sum over the VMs of their reads a second (80 % of the I/O) times the
drop of their mean read latency from ``none``'s. ``--doc`` then writes section
"host-budget-slow".

``--xy`` (issue 43, a case heat ranks wrong; section "host-budget-xy"): disk
X ("busy", a 3 GiB image read uniformly, ``--busy-size 3G --busy-hot 3G``)
at ``--busy-iops 1000`` and disk Y ("light1", one light VM, a 1 GiB image
with a 600 MiB zone) at ``--light-iops 500``, budget 1G, group limit 512M,
``--via nbd``. X reads more a second, Y more a byte: holding X's first GiB
serves a third of its reads, holding Y's zone 90 % of Y's, so Y's zone is
the better buy per byte. The read time saved (as with ``--slow-light``) is
reported, and current ÷ REV of it with ``--compare-rev``. The oracle
(each hot zone) does not fit the budget here: it is not a default scenario.

``--loop`` (issue 43, a zone the heat cannot see; section
"host-budget-loop"): ``--xy``'s disks, but Y reads its 600 MiB zone only,
in 1 MiB reads, every block once a pass in random order (fio ``randread``
with its random map), a pass every ``--light-pass`` s (20: 30 reads of
1 MiB a second). Each block of Y's zone is read once every 20 s, in one
cycle of four, so its heat stays below X's, whose blocks are read in most
cycles; yet holding the zone serves every read of Y, which the group's
page cache (smaller than the zone: a loop of LRU misses) serves none of.
X's curve stays young for the whole run (it reads less than twice its
3 GiB), Y's has seen its reads come back after two passes.

``--quick``: 45 s per scenario. ``--doc`` writes section "host-budget"
(``--issue32``: "host-budget-fair") of docs/benchmarks/host-budget.md.

    .venv/bin/python benchmarks/bench_host_budget.py [--quick] [--doc] [--rounds K]
        [--compare-rev REV] [--issue32] [--light N] [--via file|nbd] [--light-think USEC]
    .venv/bin/python benchmarks/bench_host_budget.py --issue32 --rounds 2 --compare-rev d1d3730
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    add_compare_rev, exit_on_sigterm, fmt, machine, median, publish, ratio_text, round_orders,
    side_by_side, spread_text)
from tests.support.blockdev import loop_device, read_throttle  # noqa: E402
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import ROOT as CHECKOUT, GiB, MiB, stop_process  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.fio import FioJob, FioRun, mean_latency_us, start_neighbour  # noqa: E402
from tests.support.holders import VmtouchLock  # noqa: E402
from tests.support.images import evict, make_image  # noqa: E402
from tests.support.nbd import QemuNbd  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

SCENARIOS = ("none", "oracle", "global", "split")
DAEMONS = ("global", "split")
REV = "-rev"            # global-rev, split-rev: the same with the daemon of --compare-rev
NAMES = ("busy", "light1", "light2", "light3")     # the default scenario's VMs (--light 3)

# The scenario's figures: issue 16's defaults, and issue 32's preset (--issue32).
# An option given on the command line overrides either.
DEFAULTS = dict(light=3, busy_hot=800 * MiB, light_hot=100 * MiB, budget=1200 * MiB,
                limit=768 * MiB, via="file", light_think=0, light_iops=500, busy_size=8 * GiB,
                busy_iops=0, scenarios=",".join(SCENARIOS))
ISSUE32 = dict(DEFAULTS, light=2, busy_hot=819 * MiB, light_hot=205 * MiB, budget=1229 * MiB,
               limit=512 * MiB, via="nbd", light_think=2000, light_iops=0)
XY = dict(DEFAULTS, light=1, busy_size=3 * GiB, busy_hot=3 * GiB, light_hot=600 * MiB,
          budget=GiB, limit=512 * MiB, via="nbd", light_think=0, light_iops=500, busy_iops=1000,
          scenarios="none,global")
SECTIONS = {False: ("host-budget", "One host budget against split budgets"),
            True: ("host-budget-fair",
                   "One host budget against split budgets: one busy VM, two identical light "
                   "ones (issue 32)")}
LOOP = dict(XY, light_pass=20)
LOOP_SECTION = ("host-budget-loop", "One host budget by what memory buys: a uniform busy "
                "disk and a zone read block by block every 20 s (issue 43)")
XY_SECTION = ("host-budget-xy", "One host budget by what memory buys: a uniform busy disk "
              "and a zone read less often (issue 43)")
SLOW_SECTION = ("host-budget-slow", "One host budget by what a miss costs: a light VM on a "
                "loaded array (issue 43)")
ORACLE_TARGET = {False: 1.0, True: 1.1}     # global total ≥ this × oracle's
SPLIT_TARGET = 1.3                          # global total ≥ this × split's
HELD_SPREAD = 0.10                          # light VMs' held: (max − min) ÷ max ≤ this
LATENCY_TARGET = 1.1                        # each VM's read latency ≤ this × oracle's
STATUS_POLL = 0.5                           # s between reads of the status files
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
NAN = float("nan")


def with_rev_twins(names: list[str]) -> list[str]:
    """``names`` with each daemon scenario followed by its ``-rev`` twin."""
    return [x for n in names for x in ((n, n + REV) if n in DAEMONS else (n,))]


def vm_names(n_light: int) -> list[str]:
    return ["busy"] + [f"light{k}" for k in range(1, n_light + 1)]


def lights(names) -> list[str]:
    return [v for v in names if v != "busy"]


def steady(fio: FioRun, start: float, field: str = "iops") -> float:
    v = [getattr(iv, field) for iv in fio.intervals if iv.t >= start]
    return statistics.median(v) if v else NAN


def split_budget(args) -> int:
    """Each split daemon's ``--max-hold``: the budget ÷ the number of VMs, whole MiB."""
    return args.budget // (args.light + 1) // MiB * MiB


def nan_if_none(v) -> float:
    return NAN if v is None else float(v)


def is_nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


# -- what the daemons say --------------------------------------------------------------

def disk_rows(st: dict | None) -> dict[str, dict]:
    """``{realpath: {held, share, limited_by, cycle, loaded, from_disk, released}}`` of a
    status file:
    a host's (``host`` + ``disks``) or one disk's. ``share`` is None where the status
    gives none (a host status before issue 31: its disks' ``budget_bytes`` is the
    whole budget)."""
    if not st:
        return {}
    rows: dict[str, dict] = {}
    if "host" in st:
        for d in st.get("disks") or []:
            rows[os.path.realpath(d["path"])] = {
                "held": d.get("held_bytes"), "share": None, "limited_by": d.get("limited_by"),
                "cycle": d.get("cycle"), "loaded": d.get("loaded_bytes", 0),
                "from_disk": d.get("loaded_from_disk_bytes", 0),
                "released": d.get("released_bytes", 0)}
        for h in st["host"].get("disks") or []:
            r = rows.setdefault(os.path.realpath(h["path"]),
                                {"cycle": None, "loaded": 0, "from_disk": 0, "released": 0,
                                 "limited_by": None})
            r["held"] = h.get("held_bytes", r.get("held"))
            r["share"] = h.get("share_bytes")
            if "limited_by" in h:
                r["limited_by"] = h["limited_by"]
        return rows
    if st.get("path"):
        rows[os.path.realpath(st["path"])] = {
            "held": st.get("held_bytes"), "share": st.get("budget_bytes"),
            "limited_by": st.get("limited_by"), "cycle": st.get("cycle"),
            "loaded": st.get("loaded_bytes", 0),
            "from_disk": st.get("loaded_from_disk_bytes", 0),
            "released": st.get("released_bytes", 0)}
    return rows


def count_log(paths: list[str], steady_wall: float) -> dict:
    """Log lines of the daemon(s) per level, INFO from ``steady_wall`` (Unix time) on, and
    the first few WARNING-or-above lines."""
    out = {"INFO": 0, "INFO_steady": 0, "WARNING+": 0, "warnings": []}
    for p in paths:
        try:
            with open(p, errors="replace") as f:
                lines = f.readlines()
        except FileNotFoundError:
            continue
        for line in lines:
            m = LOG_LINE.match(line)
            if not m:
                continue
            level = m.group(2)
            if level == "INFO":
                out["INFO"] += 1
                try:
                    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                except ValueError:
                    t = 0.0
                out["INFO_steady"] += t >= steady_wall
            elif level != "DEBUG":
                out["WARNING+"] += 1
                if len(out["warnings"]) < 5:
                    out["warnings"].append(line.rstrip()[:300])
    return out


def spread_of(values) -> tuple[float, float]:
    """(min, max) of the values that are not NaN; NaNs when none."""
    values = [v for v in values if not is_nan(v)]
    return (min(values), max(values)) if values else (NAN, NAN)


def most_common(values) -> str | None:
    values = [v for v in values if v is not None]
    return collections.Counter(values).most_common(1)[0][0] if values else None


# -- one scenario ----------------------------------------------------------------------

def one_scenario(name: str, vms: list[dict], nb_path: str, args, tmp: str, rnd: int,
                 rev_tree=None) -> dict:
    """One scenario from a cold cache; ``NAME-rev`` runs NAME with ``rev_tree``'s daemon."""
    kind = name[:-len(REV)] if name.endswith(REV) else name
    cwd = rev_tree.path if kind != name else CHECKOUT
    for vm in vms:
        evict(vm["path"])
    evict(nb_path)
    cg = MemoryCgroup(f"host-budget-{name}-{rnd}", args.limit).create()
    holders: list = []             # what holds each VM's bytes, VM order (global: one daemon)
    daemons: list[DaemonProc] = []
    logs: list[str] = []
    nbds: list[QemuNbd] = []
    runs: list[FioRun] = []
    nb = None
    error = None
    samples: list[dict] = []       # {t, held: {vm: bytes}, share, limited_by, vmlck}
    cycles: dict[tuple, tuple] = {}    # (vm, cycle) -> (t first seen, loaded, released, from disk)
    by_path = {os.path.realpath(vm["path"]): vm["name"] for vm in vms}
    steady_t = args.duration / 2
    steady_wall = NAN
    try:
        if args.via == "nbd":       # QEMU's block layer does each guest's I/O, in the group
            for vm in vms:
                nbds.append(QemuNbd(vm["path"], cgroup=cg,
                                    log=os.path.join(tmp, f"qemu-nbd-{vm['name']}.log")).start())
        if kind == "oracle":
            for vm in vms:
                h = VmtouchLock(vm["path"], *vm["zone"])
                holders.append(h)
                h.start()
        elif kind == "global":
            logs.append(f"daemon-{name}.log")
            daemons.append(DaemonProc(tmp, [vm["path"] for vm in vms], "--uri", "",
                                      max_hold=args.budget, interval=5.0,
                                      status=f"status-{name}.json", log=logs[-1],
                                      env=env_without_systemd(), cwd=cwd))
            holders = daemons[:]
        elif kind == "split":
            for vm in vms:
                logs.append(f"daemon-{name}-{vm['name']}.log")
                daemons.append(DaemonProc(tmp, vm["path"], "--uri", "",
                                          max_hold=split_budget(args), interval=5.0,
                                          status=f"status-{name}-{vm['name']}.json",
                                          log=logs[-1], env=env_without_systemd(), cwd=cwd))
            holders = daemons[:]
        if kind != name:
            print(f"  {name}: {len(daemons)} daemon(s) of {rev_tree.rev}, cwd "
                  f"{daemons[0].proc_cwd()}", flush=True)
        nb = start_neighbour(cg, nb_path, 200 * MiB, runtime=args.duration + 30)
        t0 = time.monotonic()
        steady_wall = time.time() + steady_t
        for k, vm in enumerate(vms):
            extra = [] if not vm["iops"] else [f"--rate_iops={vm['iops']}"]
            if vm.get("pass"):          # the zone in 1 MiB reads, each once a pass
                extra = ["--rw=randread", f"--bs={MiB}", f"--offset={vm['zone'][0]}",
                         f"--size={vm['zone'][1]}", "--norandommap=0",
                         "--random_distribution=random", "--fsync=0",
                         f"--rate_iops={max(1, round(vm['zone'][1] / MiB / vm['pass']))}"]
            if vm["think"]:
                extra.append(f"--thinktime={vm['think']}")
            job = FioJob(vm["path"], vm["size"], [vm["zone"]], runtime=args.duration,
                         seed=20241122, name=f"{vm['name']}-{name}", extra=extra,
                         nbd_uri=nbds[k].uri if nbds else None)
            runs.append(FioRun(job, cg, stderr_path=os.path.join(tmp, f"fio-{vm['name']}.err"))
                        .start())
        next_sample = t0
        while any(r.proc.poll() is None for r in runs):
            now = time.monotonic()
            dead = [d for d in daemons if not d.alive()]
            if dead:
                error = f"daemon exited ({dead[0].returncode()}): {dead[0].log_tail(3)}"
            elif any(not n.alive() for n in nbds):
                error = "a qemu-nbd exited"
            elif now > t0 + args.duration + 60:
                error = "fio did not finish"
            if error:
                break
            rows: dict[str, dict] = {}
            for d in daemons:
                rows.update(disk_rows(d.read_status()))
            for path, row in rows.items():
                vm = by_path.get(path)
                if vm and row.get("cycle") is not None and (vm, row["cycle"]) not in cycles:
                    cycles[(vm, row["cycle"])] = (now - t0, row.get("loaded") or 0,
                                                  row.get("released") or 0,
                                                  row.get("from_disk") or 0)
            if now >= next_sample:
                next_sample += args.sample
                per_row = {by_path[p]: r for p, r in rows.items() if p in by_path}
                if kind == "global":
                    held = {vm["name"]: (per_row.get(vm["name"]) or {}).get("held") for vm in vms}
                elif holders:       # split daemons, oracle vmtouch: one per VM, VmLck
                    held = {vm["name"]: h.vmlck() for vm, h in zip(vms, holders)}
                else:
                    held = {vm["name"]: 0 for vm in vms}
                samples.append({
                    "t": now - t0, "held": held,
                    "share": {v: r.get("share") for v, r in per_row.items()},
                    "limited_by": {v: r.get("limited_by") for v, r in per_row.items()},
                    "vmlck": sum(h.vmlck() for h in holders)})
            time.sleep(STATUS_POLL)
        for vm, r in zip(vms, runs):
            if r.proc.poll() not in (None, 0) and not error:
                try:
                    with open(os.path.join(tmp, f"fio-{vm['name']}.err"), errors="replace") as f:
                        tail = f.read()[-300:].strip()
                except OSError:
                    tail = ""
                error = f"fio of {vm['name']} exited {r.proc.returncode}: {tail}"
        held_end = sum(h.vmlck() for h in holders)
    finally:
        for r in runs:
            r.stop()
        if nb is not None:
            stop_process(nb)
        for n in nbds:
            n.stop()
        for h in holders:
            h.stop()
        cg.cleanup()
    names = [vm["name"] for vm in vms]
    late = [s for s in samples if s["t"] >= steady_t]
    per = {vm["name"]: steady(r, steady_t) for vm, r in zip(vms, runs)}
    out = {"scenario": name, "round": rnd, "per_vm": per, "total": sum(per.values()),
           "held_end": held_end, "error": error,
           "reads": {vm["name"]: steady(r, steady_t, "read_iops") for vm, r in zip(vms, runs)},
           "read_lat_us": {v: mean_latency_us(r.intervals, steady_t, "read")
                           for v, r in zip(names, runs)},
           "write_lat_us": {v: mean_latency_us(r.intervals, steady_t, "write")
                            for v, r in zip(names, runs)},
           "held": {v: median([nan_if_none(s["held"].get(v)) for s in late]) for v in names},
           "held_range": {v: spread_of([nan_if_none(s["held"].get(v)) for s in late])
                          for v in names},
           "held_total_vmlck": median([s["vmlck"] for s in late]),
           "share": {v: median([nan_if_none(s["share"].get(v)) for s in late]) for v in names},
           "limited_by": {v: most_common(s["limited_by"].get(v) for s in late) for v in names},
           "loaded_steady": {v: sum(c[1] for (x, _), c in cycles.items()
                                    if x == v and c[0] >= steady_t) for v in names},
           "released_steady": {v: sum(c[2] for (x, _), c in cycles.items()
                                      if x == v and c[0] >= steady_t) for v in names},
           "from_disk_steady": {v: sum(c[3] for (x, _), c in cycles.items()
                                       if x == v and c[0] >= steady_t) for v in names},
           "cycles_steady": max((sum(1 for (x, _), c in cycles.items()
                                     if x == v and c[0] >= steady_t) for v in names), default=0),
           "log": count_log([os.path.join(tmp, p) for p in logs], steady_wall) if logs else None}
    print_scenario(out, names, {vm["name"]: vm["zone"][1] for vm in vms})
    return out


@contextlib.contextmanager
def throttled_loop(path: str, riops: int):
    """A loop device over ``path`` (direct I/O to it) whose reads the blkio group caps at
    ``riops`` a second, kept busy by 4 direct readers; all removed at the end."""
    with loop_device(path, direct_io=True) as dev, read_throttle(dev, riops):
        # The array's other tenants: direct random reads, 4 at a time, always queued.
        load = subprocess.Popen(["fio", "--name=array-load", f"--filename={dev}", "--direct=1",
                                 "--rw=randread", "--bs=4k", "--ioengine=libaio",
                                 "--iodepth=4", "--time_based", "--runtime=86400"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            print(f"light1 on {dev} over {path}, reads throttled to {riops}/s, loaded by 4 "
                  f"direct readers", flush=True)
            yield dev
        finally:
            stop_process(load)


def saved_lines(results: list[dict], names: list[str]) -> list[str]:
    """Read time saved a second against ``none``, per scenario (medians of the rounds):
    the sum over the VMs of reads a second x the drop of their mean read latency."""
    vms = result_vms(results)
    if "none" not in names:
        return []
    base = {v: med(results, "none", lambda r, v=v: r["read_lat_us"][v]) for v in vms}

    def saved(r) -> float:
        return sum(r["reads"][v] * (base[v] - r["read_lat_us"][v]) / 1e6 for v in vms)
    rows = [f"| {n} | {med(results, n, saved):.3f} | " + " | ".join(
        lat_text(med(results, n, lambda r, v=v: r["read_lat_us"][v])) for v in vms) + " |"
        for n in names if n != "none"]
    twins = [n for n in DAEMONS if n in names and n + REV in names]
    rounds = sorted({r["round"] for r in results})

    def in_round(n: str, k: int) -> float:
        return next((saved(r) for r in results if r["scenario"] == n and r["round"] == k), NAN)
    after = [""] + [
        f"Read time saved, {n} ÷ {n}{REV}: "
        f"{ratio_text(med(results, n, saved), med(results, n + REV, saved))} × (per round: "
        + ", ".join(ratio_text(in_round(n, k), in_round(n + REV, k)) for k in rounds) + ")."
        for n in twins]
    return (["Read time saved a second against none (fio's reads a second, x "
             "the drop of the mean read latency, summed over the VMs; medians of the rounds):",
             "", "| scenario | seconds saved a second | " + " | ".join(
                 f"{v} read µs" for v in vms) + " |", "|---|---|" + "---|" * len(vms)] + rows
            + (after if twins else []))


def exact(n: int) -> str:
    """A size of the scenario as given: ``1229M`` when whole MiB, else as the daemon writes it."""
    return f"{n >> 20}M" if n % MiB == 0 and n < 64 * GiB else fmt(n)


def lat_text(v: float) -> str:
    return "—" if is_nan(v) else f"{v:,.0f}"


def size_text(v) -> str:
    return "—" if v is None or is_nan(v) else fmt(v)


def print_scenario(out: dict, names: list[str], zones: dict[str, int]) -> None:
    name = out["scenario"]
    print(f"  {name:<10}: total {out['total']:,.0f} IOPS (" + ", ".join(
        f"{k} {v:,.0f}" for k, v in out["per_vm"].items()) + "); mean read latency µs ("
        + ", ".join(f"{v} {lat_text(out['read_lat_us'][v])}" for v in names)
        + f"); held at the end {fmt(out['held_end'])}", flush=True)
    if any(not is_nan(out["held"][v]) and out["held"][v] > 0 for v in names):
        odd = [v for v in names if out["held"][v] > 1.25 * zones[v]]
        print(f"  {'':<10}  held (steady median, min–max) " + ", ".join(
            f"{v} {size_text(out['held'][v])} ({size_text(out['held_range'][v][0])}–"
            f"{size_text(out['held_range'][v][1])})" for v in names)
            + (f"  [more than 1.25 × the hot zone: {', '.join(odd)}]" if odd else ""), flush=True)
    if out["log"] is not None:
        share = ", ".join(f"{v} {size_text(out['share'][v])}"
                          + (f" ({out['limited_by'][v]})" if out["limited_by"][v] else "")
                          for v in names)
        lg = out["log"]
        print(f"  {'':<10}  share (limited_by) {share}; steady half: {out['cycles_steady']} "
              f"cycles, loaded (from disk) " + ", ".join(
                  f"{v} {fmt(out['loaded_steady'][v])} ({fmt(out['from_disk_steady'][v])})"
                  for v in names)
              + ", released " + ", ".join(f"{v} {fmt(out['released_steady'][v])}" for v in names)
              + f"; log: {lg['INFO']} INFO lines ({lg['INFO_steady']} in the steady half), "
              f"{lg['WARNING+']} WARNING+", flush=True)
        for w in lg["warnings"]:
            print(f"  {'':<10}  log: {w}", flush=True)
    if out["error"]:
        print(f"  {'':<10}  ERROR {out['error']}", flush=True)


# -- the report ------------------------------------------------------------------------

def med(results: list[dict], n: str, f) -> float:
    """Median across rounds of ``f(result)`` for scenario ``n`` (NaN when missing)."""
    def safe(r):
        try:
            v = f(r)
        except (KeyError, TypeError):
            return NAN
        return NAN if v is None else float(v)
    return median([safe(r) for r in results if r["scenario"] == n])


def result_vms(results: list[dict]) -> list[str]:
    """The VM names of the results, busy first (from their ``per_vm``)."""
    for r in results:
        return list(r["per_vm"])
    return list(NAMES)


def spread(values) -> float:
    """(max − min) ÷ max of ``values``; NaN when any is missing or they are all 0."""
    values = list(values)
    if not values or any(is_nan(v) for v in values) or max(values) <= 0:
        return NAN
    return (max(values) - min(values)) / max(values)


def verdict(ok) -> str:
    return "—" if ok is None else ("PASS" if ok else "MISS")


def targets(results: list[dict], vms: list[str], oracle_target: float, g: str = "global",
            o: str = "oracle", s: str = "split") -> list[tuple[str, float, bool | None]]:
    """The targets of issue 32 for global scenario ``g`` against ``o`` and ``s``, on the
    medians across rounds: ``[(text, value, ok)]`` (ok None: not measured)."""
    have = {r["scenario"] for r in results}
    out = []
    if g not in have:
        return out
    total = med(results, g, lambda r: r["total"])
    for other, factor, what in ((o, oracle_target, "oracle"), (s, SPLIT_TARGET, "split")):
        if other in have:
            x = total / med(results, other, lambda r: r["total"])
            out.append((f"total ≥ {factor:g} × {what}", x, None if is_nan(x) else x >= factor))
    light = lights(vms)
    if len(light) > 1:
        sp = spread(med(results, g, lambda r, v=v: r["held"][v]) for v in light)
        out.append((f"light VMs' held within {HELD_SPREAD * 100:g} % of each other", sp,
                    None if is_nan(sp) else sp <= HELD_SPREAD))
    if o in have:
        for v in vms:
            x = (med(results, g, lambda r, v=v: r["read_lat_us"][v])
                 / med(results, o, lambda r, v=v: r["read_lat_us"][v]))
            out.append((f"{v} read latency ≤ {LATENCY_TARGET:g} × oracle", x,
                        None if is_nan(x) else x <= LATENCY_TARGET))
    return out


def target_text(t: list[tuple[str, float, bool | None]]) -> str:
    def value_text(text, value):
        if is_nan(value):
            return "—"
        return f"**{value * 100:.1f} %**" if "within" in text else f"**{value:.2f} ×**"
    return "; ".join(f"{text}: {value_text(text, value)}, {verdict(ok)}" for text, value, ok in t)


def held_cell(results: list[dict], n: str, v: str) -> str:
    """The median held (across rounds) and the min–max of the samples in every round."""
    runs = [r for r in results if r["scenario"] == n]
    lo = [r["held_range"][v][0] for r in runs if "held_range" in r]
    hi = [r["held_range"][v][1] for r in runs if "held_range" in r]
    lo = min((x for x in lo if not is_nan(x)), default=NAN)
    hi = max((x for x in hi if not is_nan(x)), default=NAN)
    text = size_text(med(results, n, lambda r: r["held"][v]))
    if is_nan(lo) or lo == hi:
        return text
    return f"{text} ({size_text(lo)}–{size_text(hi)})"


def report_lines(results: list[dict], names: list[str], rounds: int,
                 oracle_target: float = 1.0) -> list[str]:
    """Per scenario the medians across rounds (min–max): IOPS and read latency per VM, the
    bytes held, the daemons' shares, churn and log lines; the targets."""
    vms = result_vms(results)
    many = rounds > 1
    total = {n: med(results, n, lambda r: r["total"]) for n in names}
    lines = ["| scenario | total IOPS (steady median" + (", median of the rounds"
             if many else "") + ") | " + ("min–max | " if many else "")
             + " | ".join(f"{v} IOPS" for v in vms) + " | "
             + " | ".join(f"{v} read µs" for v in vms) + " |",
             "|---|---|" + ("---|" if many else "") + "---|" * (2 * len(vms))]
    for n in names:
        runs = [r for r in results if r["scenario"] == n]
        lines.append(f"| {n} | {total[n]:,.0f} | "
                     + (f"{spread_text([r['total'] for r in runs], ',.0f')} | " if many else "")
                     + " | ".join(f"{med(results, n, lambda r, v=v: r['per_vm'][v]):,.0f}"
                                  for v in vms) + " | "
                     + " | ".join(lat_text(med(results, n, lambda r, v=v: r['read_lat_us'][v]))
                                  for v in vms) + " |")
    lines += ["", "Held in the steady half (median of the samples, and in brackets their "
              "min–max over the rounds; global: the status file's "
              "`host.disks[].held_bytes`, split and oracle: `VmLck`), each disk's share of the "
              "budget and its most frequent `limited_by` (daemons), what the daemons loaded "
              "(of it read from the disk, the rest only locked) and released in the steady half "
              "(all disks), their log lines:", "",
              "| scenario | " + " | ".join(f"{v} held" for v in vms)
              + " | shares (limited_by) | loaded / from disk / released, steady "
              "| INFO lines (steady) "
              "| WARNING+ | held at the end |",
              "|---|" + "---|" * len(vms) + "---|---|---|---|---|"]
    for n in names:
        runs = [r for r in results if r["scenario"] == n]
        held = " | ".join(held_cell(results, n, v) for v in vms)
        if any(r.get("log") is not None for r in runs):
            def share(v):
                lb = most_common((r.get("limited_by") or {}).get(v) for r in runs)
                return (size_text(med(results, n, lambda r: r["share"][v]))
                        + (f" ({lb})" if lb else ""))
            shares = ", ".join(share(v) for v in vms)
            churn = " / ".join(size_text(med(results, n, lambda r, k=k: sum(r[k].values())))
                               for k in ("loaded_steady", "from_disk_steady", "released_steady"))
            info = (f"{med(results, n, lambda r: r['log']['INFO']):g} "
                    f"({med(results, n, lambda r: r['log']['INFO_steady']):g})")
            warn = f"{med(results, n, lambda r: r['log']['WARNING+']):g}"
        else:
            shares, churn, info, warn = "—", "—", "—", "—"
        lines.append(f"| {n} | {held} | {shares} | {churn} | {info} | {warn} | "
                     f"{size_text(med(results, n, lambda r: r['held_end']))} |")
    errors = [f"{r['scenario']} (round {r['round']}): {r['error']}" for r in results
              if r.get("error")]
    if errors:
        lines += ["", "Errors: " + "; ".join(errors) + "."]
    if many:
        lines += ["", "Per round (total IOPS): " + "; ".join(
            f"round {k}: " + ", ".join(f"{r['scenario']} {r['total']:,.0f}"
                                        for r in results if r["round"] == k)
            for k in range(1, rounds + 1)) + "."]
    t = targets(results, vms, oracle_target)
    if t:
        lines += ["", "Targets (medians of the rounds): " + target_text(t) + "."]
        if many:
            lines += ["Per round: " + "; ".join(
                f"round {k}: " + target_text([x for x in targets(
                    [r for r in results if r["round"] == k], vms, oracle_target)
                    if x[0].startswith("total")])
                for k in range(1, rounds + 1)) + "."]
    return lines


def compare_lines(results: list[dict], names: list[str], rounds: int, rev: str,
                  sha: str, oracle_target: float = 1.0) -> list[str]:
    """--compare-rev: each daemon scenario's figures now and at REV, and current ÷ REV."""
    vms = result_vms(results)
    light = lights(vms)
    rows = []
    pairs = [n for n in DAEMONS if n in names and n + REV in names]
    for n in pairs:
        for what, f, spec in (("total IOPS", lambda r: r["total"], ",.0f"),
                              ("busy VM IOPS", lambda r: r["per_vm"]["busy"], ",.0f"),
                              ("light VMs IOPS (sum)",
                               lambda r: sum(v for k, v in r["per_vm"].items() if k != "busy"),
                               ",.0f"),
                              ("held at the end", lambda r: r["held_end"], fmt)):
            rows.append((f"{n}: {what}", med(results, n, f), med(results, n + REV, f), spec))
        extra = [("busy VM read latency, µs", lambda r: r["read_lat_us"]["busy"], ",.0f"),
                 ("light VMs read latency (mean of them), µs",
                  lambda r: statistics.fmean(r["read_lat_us"][v] for v in light), ",.0f"),
                 ("light VMs held (mean of them)",
                  lambda r: statistics.fmean(r["held"][v] for v in light), fmt),
                 ("loaded in the steady half",
                  lambda r: sum(r["loaded_steady"].values()), fmt),
                 ("INFO log lines", lambda r: r["log"]["INFO"], ",.0f")]
        for what, f, spec in extra:
            cur, old = med(results, n, f), med(results, n + REV, f)
            if not (is_nan(cur) and is_nan(old)):
                rows.append((f"{n}: {what}", cur, old, spec))
    total = {n: med(results, n, lambda r: r["total"]) for n in names}

    def div(x, y):
        return x / y if y else NAN

    if "global" in pairs:
        for other, target in (("oracle", oracle_target), ("split", SPLIT_TARGET)):
            if other in total:      # REV's global against REV's split, the same oracle
                twin = other + REV if other in DAEMONS else other
                rows.append((f"global ÷ {other} (target ≥ {target:g})",
                             div(total["global"], total[other]),
                             div(total["global" + REV], total[twin]), ".2f"))
        if len(light) > 1:
            sp = [spread(med(results, g, lambda r, v=v: r["held"][v]) for v in light)
                  for g in ("global", "global" + REV)]
            if not all(is_nan(x) for x in sp):
                rows.append((f"global: light VMs' held (max − min) ÷ max "
                             f"(target ≤ {HELD_SPREAD * 100:g} %)", *sp, ".3f"))
        if "oracle" in total:
            worst = [max((med(results, g, lambda r, v=v: r["read_lat_us"][v])
                          / med(results, "oracle", lambda r, v=v: r["read_lat_us"][v])
                          for v in vms), default=NAN) for g in ("global", "global" + REV)]
            if not all(is_nan(x) for x in worst):
                rows.append((f"global: worst read latency ÷ oracle's "
                             f"(target ≤ {LATENCY_TARGET:g})", *worst, ".2f"))
    how = ("the same images, arguments and fio seed, each daemon scenario run with the current "
           f"daemon and with that of {rev} (`python -m vmdisktouch run` in a git worktree of it) "
           "one right after the other" + (", the order reversed every other round; medians of "
                                          "the rounds" if rounds > 1 else ""))
    lines = side_by_side(rev, sha, rows, how)
    if rounds > 1:
        per = [f"{n} " + ", ".join(
            ratio_text(*(next((r["total"] for r in results if r["scenario"] == x
                               and r["round"] == k), NAN) for x in (n, n + REV)))
            for k in range(1, rounds + 1)) for n in pairs]
        lines += ["", f"Total IOPS current ÷ {rev} in each round: " + "; ".join(per) + "."]
    if "global" in pairs:
        t = targets(results, vms, oracle_target, g="global" + REV, s="split" + REV)
        if t:
            lines += ["", f"Targets with {rev}'s daemon (global-rev against the oracle and "
                      "split-rev): " + target_text(t) + "."]
    return lines


def scenario_text(args, tree) -> str:
    vms = vm_names(args.light)
    n = len(vms)
    if args.light_pass:
        light_pace = [f"only their zone, in 1 MiB reads, each block once a pass in random "
                      f"order, a pass every {args.light_pass:g} s (fio `--rw=randread` with its "
                      f"random map, `--rate_iops="
                      f"{max(1, round(args.light_hot / MiB / args.light_pass))}`)"]
    else:
        light_pace = ([f"think time {args.light_think / 1000:g} ms after each I/O (fio "
                       f"`--thinktime={args.light_think}`)"] if args.light_think else []) + (
            [f"fio `--rate_iops={args.light_iops}` each, a cap per direction"]
            if args.light_iops else [])
    via = ("each VM's fio through its own `qemu-nbd --cache=writethrough --aio=threads -f raw` "
           "(fio's nbd engine, `fsync=1`) in the group" if args.via == "nbd"
           else "fio on the image files (psync, buffered)")
    busy_zone = ("read uniformly" if args.busy_hot >= args.busy_size
                 else f"hot zone {exact(args.busy_hot)}")
    busy_pace = (f"fio `--rate_iops={args.busy_iops}`" if args.busy_iops
                 else "as fast as it can")
    return (f"{n} non-sparse images: busy ({exact(args.busy_size)}, {busy_zone}, {busy_pace}) and {args.light} light ones (1 GiB, hot zones of {exact(args.light_hot)}"
            + (", " + " and ".join(light_pace) if light_pace else ", as fast as they can")
            + "), the busy one" + ("" if args.light_pass else " and the light ones")
            + " with the hot-zone guest (fio 4 KiB random, 80 % reads, O_DSYNC writes, "
            f"90 % of the accesses in its zone; {via}), and a noisy neighbour (64 KiB random "
            f"reads of its own 1 GiB file at 200 MiB/s), all in one memory group limited to "
            f"{exact(args.limit)}; {args.duration:g} s per scenario from a cold cache"
            + (f"; light1's image on a loop device whose reads are throttled to "
               f"{args.slow_light} a second (a loaded array)" if args.slow_light else "")
            + ". global: "
            f"`vmdisktouch run {' '.join(v.upper() for v in vms)} --max-hold "
            f"{exact(args.budget)}`; "
            f"split: {n} daemons with `--max-hold {exact(split_budget(args))}`; oracle: "
            f"`vmtouch -l` of each hot zone; daemons `--interval 5 --uri ''`."
            + (f" NAME-rev: the same with the daemon of `{tree.rev}` ({tree.sha[:10]})."
               if tree else "") + " Steady = the second half"
            + (f"; {args.rounds} rounds, reversed every other round (A B B A)"
               if args.rounds > 1 else "") + ".")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--issue32", action="store_true",
                    help="issue 32's scenario: --light 2, busy hot 819M, light hot 205M, budget "
                         "1229M, limit 512M, --via nbd, --light-think 2000, --light-iops 0; "
                         "section host-budget-fair")
    ap.add_argument("--xy", action="store_true",
                    help="issue 43's case heat ranks wrong: busy 3G read uniformly at 1000 "
                         "IOPS, one light VM with a 600M zone at 500 IOPS, budget 1G, limit "
                         "512M, --via nbd, scenarios none,global; section host-budget-xy")
    ap.add_argument("--loop", action="store_true",
                    help="--xy, but the light VM reads its zone in 1 MiB reads, each block "
                         "once a pass (--light-pass); section host-budget-loop")
    ap.add_argument("--light-pass", type=float, default=None, metavar="SECONDS",
                    help="light VMs read their zone in 1 MiB reads, a pass every SECONDS "
                         "(0: the hot-zone guest; --loop: 20)")
    ap.add_argument("--light", type=int, default=None, help="light VMs (3; --issue32: 2)")
    ap.add_argument("--busy-size", type=parse_size, default=None,
                    help="the busy VM's image (8G; --xy: 3G)")
    ap.add_argument("--busy-iops", type=int, default=None,
                    help="fio --rate_iops of the busy VM, 0: none (0; --xy: 1000)")
    ap.add_argument("--via", choices=("file", "nbd"), default=None,
                    help="fio on the image file, or through qemu-nbd (file; --issue32: nbd)")
    ap.add_argument("--busy-hot", type=parse_size, default=None, help="(800M; --issue32: 819M)")
    ap.add_argument("--light-hot", type=parse_size, default=None, help="(100M; --issue32: 205M)")
    ap.add_argument("--light-iops", type=int, default=None,
                    help="fio --rate_iops of each light VM, 0: none (500; --issue32: 0)")
    ap.add_argument("--light-think", type=int, default=None, metavar="USEC",
                    help="fio --thinktime of each light VM, µs, 0: none (0; --issue32: 2000)")
    ap.add_argument("--slow-light", type=int, default=0, metavar="RIOPS",
                    help="light1 on a loop device whose reads are throttled to RIOPS a second")
    ap.add_argument("--budget", type=parse_size, default=None, help="(1200M; --issue32: 1229M)")
    ap.add_argument("--limit", type=parse_size, default=None, help="(768M; --issue32: 512M)")
    ap.add_argument("--duration", type=float, default=None, help="(120)")
    ap.add_argument("--sample", type=float, default=2.0, help="s between held samples (2)")
    ap.add_argument("--scenarios", default=None,
                    help=f"({','.join(SCENARIOS)}; --xy: {XY['scenarios']})")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (1)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--keep", action="store_true",
                    help="keep the daemons' logs and status files, fio's and qemu-nbd's "
                         "stderr (the last scenario's of each name; printed path)")
    add_compare_rev(ap)
    args = ap.parse_args()
    if args.issue32 + args.xy + args.loop > 1:
        ap.error("--issue32, --xy and --loop are presets: give one")
    preset = ISSUE32 if args.issue32 else XY if args.xy else LOOP if args.loop else DEFAULTS
    for k, v in dict(preset, light_pass=preset.get("light_pass", 0)).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.light < 1:
        ap.error("--light needs at least 1")
    args.duration = args.duration or (45.0 if args.quick else 120.0)
    oracle_target = ORACLE_TARGET[args.issue32]
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n!r} (of {', '.join(SCENARIOS)})")
    if args.compare_rev:
        if not set(names) & set(DAEMONS):
            ap.error("--compare-rev needs a daemon scenario (global, split) in --scenarios")
        names = with_rev_twins(names)
    exit_on_sigterm("bench_host_budget")
    pace = (f"1 MiB reads, a pass every {args.light_pass:g} s" if args.light_pass else
            ", ".join(x for x in (f"think {args.light_think} µs" if args.light_think else "",
                                  f"at {args.light_iops} IOPS" if args.light_iops else "") if x))
    print(f"{machine()}; busy hot zone {exact(args.busy_hot)}, {args.light} light ones of "
          f"{exact(args.light_hot)} ({pace or 'unpaced'}); via {args.via}; budget "
          f"{exact(args.budget)} (split {exact(split_budget(args))} each); group limit "
          f"{exact(args.limit)}; {args.duration:g} s per scenario: {', '.join(names)}", flush=True)
    stack = contextlib.ExitStack()
    tree = enter_rev_worktree(stack, args.compare_rev) if args.compare_rev else None
    work = tempfile.mkdtemp(prefix="bench-host-budget-", dir=args.dir)
    tmp = tempfile.mkdtemp(prefix="bench-host-budget-", dir="/tmp")
    results = []
    try:
        vms = []
        for k, vm in enumerate(vm_names(args.light)):
            size = args.busy_size if k == 0 else GiB
            hot = min(size, args.busy_hot if k == 0 else args.light_hot)
            path = os.path.join(work, f"{vm}.raw")
            make_image(path, size, sparse=False)
            if vm == "light1" and args.slow_light:
                path = stack.enter_context(throttled_loop(path, args.slow_light))
            vms.append({"name": vm, "path": path, "size": size,
                        "zone": (min(size // 8, size - hot), hot),
                        "iops": args.busy_iops or None if k == 0 else args.light_iops,
                        "think": None if k == 0 else args.light_think,
                        "pass": None if k == 0 else args.light_pass})
        nb_path = os.path.join(work, "neighbour.raw")
        make_image(nb_path, GiB, sparse=False)
        for rnd, order in enumerate(round_orders(names, args.rounds), 1):
            if args.rounds > 1:
                print(f"round {rnd}: {', '.join(order)}", flush=True)
            for name in order:
                results.append(one_scenario(name, vms, nb_path, args, tmp, rnd, tree))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.keep:
            print(f"logs kept in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        stack.close()
    lines = report_lines(results, names, args.rounds, oracle_target)
    if args.slow_light or args.xy or args.loop:
        lines += [""] + saved_lines(results, names)
    if tree:
        lines += [""] + compare_lines(results, names, args.rounds, tree.rev, tree.sha,
                                      oracle_target)
    body = scenario_text(args, tree) + "\n\n" + "\n".join(lines)
    publish(body, results, args, *(SLOW_SECTION if args.slow_light else XY_SECTION if args.xy
                                   else LOOP_SECTION if args.loop else SECTIONS[args.issue32]))
    return 0 if not any(r.get("error") for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
