"""Does ``vmdisktouch advise`` come true? A cache=none disk advised, then served as advised.

Scenario (issue 44): a non-sparse raw image (``--size``, 2G) with the hot-zone
guest of bench_hotzone (``tests.support.fio.FioJob``: 4 KiB random I/O,
``--read-mix`` % reads, 90 % of the accesses in a ``--zone`` (256M) zone,
iodepth 1) through its own qemu-nbd (fio's ``nbd`` engine, ``fsync=1``), both
in one cgroup v1 memory group limited to ``--limit`` (128M, less than the
zone: the page cache alone keeps only part of it). Two phases, from a cold
cache, each ``--duration`` s (120):

* ``none``: ``qemu-nbd --cache=none --aio=native`` (what nova and Proxmox
  attach): ``vmdisktouch advise IMAGE --duration D/2 --json`` runs in the
  second half (outside the group). Its advice: a size, the share of reads
  it would serve from memory, the reads a second it would add.
* ``served``: the same guest through ``qemu-nbd --cache=writethrough
  --aio=threads``, and ``vmdisktouch run IMAGE --max-hold <the size advised>
  --interval 5 --uri ''`` outside the group.

Measured over each phase's second half: fio's read IOPS (median of its
per-second rates), and for ``served`` the share of the pages read that the
page cache served (the daemon's ``gain.cache_hit_ratio``, the median of its
cycles). Targets: that share within 10 points of the advised one; the read
IOPS gained (served − none) within ±25 % of the advised gain. ``--rounds K``
(2): A B, then B A (each ``served`` uses the advice of its round's ``none``).

``--cost``: the cost of watching an O_DIRECT disk at 10,000 reads a second:
fio ``--direct=1 --ioengine=libaio --iodepth=8 --rate_iops=10000`` random
reads of a 1 GiB file, ``advise`` over it for ``--duration`` s; its CPU while it
watches (``/proc/PID/stat`` user + system from 5 s in to 3 s before its end:
the start (imports, the tracefs instance) and the end (the report, the
instance removed) are one-time costs) and over the whole run
(``wait4``'s rusage), and the rate it saw against fio's own. Target ≤ 1 % of a
core while it watches. ``--doc`` writes section
"advise" (``--cost``: "advise-cost") of docs/benchmarks/advise.md.

``--cases LIST``: every forecast checked against what it becomes,
on more than one kind of device and guest. Each case (``CASES``: a device
class, a read mix, fio's queue depth) runs A B B A: ``none`` (advise in its
second half), ``served`` (as advised by the first ``none``: writethrough
and the daemon at the size advised, also where the advice was "no gain", to
see the sign), ``served``, ``none``. Device classes: ``fast``, this
machine's disk as it is; ``loaded``, the image behind two loop devices
(``--direct-io=on``), the lower one's reads held to ``LOADED_RIOPS`` a
second by the blkio throttle (``tests.support.blockdev``): the guest's
device, the upper one, waits as on a busy array, in the device (a throttle
on the guest's own device holds its bios before the block layer traces
them, and its wait was not seen); ``app``, a real application:
PostgreSQL 15 (shared_buffers 16MB, in a memory group of ``PG_LIMIT``: the
guest's RAM) on ext4 on a loop device (direct I/O) over the image exported by
``qemu-storage-daemon`` through FUSE in either cache mode
(``tests.support.pg_disk``), pgbench with one client running its builtin
``select-only`` or ``tpcb-like`` script; the disk's reads and writes a second
and their mean time are the loop device's (``/sys/block/loopN/stat``).
Reported per case: advised against measured, for the share from memory,
reads/s and the mean I/O time (fio's queue depth over its I/O a second);
target: the gain in reads/s (or in mean I/O time) within ±25 % of the
measured one, or the sign right and both within 5 %; where the measured gain
is negative, advise said "no gain". ``--doc`` writes section
"advise-cases".

    .venv/bin/python benchmarks/bench_advise.py [--rounds 2] [--duration 120] [--doc]
    .venv/bin/python benchmarks/bench_advise.py --cost [--duration 60] [--doc]
    .venv/bin/python benchmarks/bench_advise.py --cases fast-read,fast-80,fast-50,fast-80-qd8,loaded-80,pg-select,pg-tpcb [--duration 60] [--doc]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.source_common import write_section  # noqa: E402
from tests.support.blockdev import loop_device, read_throttle  # noqa: E402
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import GiB, MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.fio import FioJob, FioRun, mean_latency_us  # noqa: E402
from tests.support.images import evict, make_image  # noqa: E402
from tests.support.nbd import QemuNbd  # noqa: E402
from tests.support.pg_disk import pg_disk, prepare as pg_prepare  # noqa: E402
from vmdisktouch.sizes import format_size, parse_size  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARE_POINTS = 0.10          # the share served within this of the advised one
GAIN_BAND = 0.25             # the IOPS gained within this of the advised gain
COST_TARGET = 1.0            # % of a core, watching 10k reads a second
NAN = float("nan")
STARTED = 5.0                # s: advise's start, left out of its CPU while it watches
ENDING = 3.0                 # s: and its end
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOADED_RIOPS = 400           # reads a second the loaded array's throttle lets through
SIGN_BAND = 0.05             # a gain this small (of the rate) both ways: the sign is enough
# name: (device class, % reads, fio's queue depth, image, hot zone, memory group)
CASES = {
    "fast-read": ("fast", 100, 1, GiB, 128 * MiB, 64 * MiB),
    "fast-80": ("fast", 80, 1, GiB, 128 * MiB, 64 * MiB),
    "fast-50": ("fast", 50, 1, GiB, 128 * MiB, 64 * MiB),
    "fast-80-qd8": ("fast", 80, 8, GiB, 128 * MiB, 64 * MiB),
    "loaded-80": ("loaded", 80, 1, GiB, 16 * MiB, 32 * MiB),   # qemu-nbd alone > 8M
    # a real application: PostgreSQL on ext4 on the disk (``app_phase``); the mix is
    # pgbench's builtin script, one client
    "pg-select": ("app", "select-only", 1, GiB, None, 64 * MiB),
    "pg-tpcb": ("app", "tpcb-like", 1, GiB, None, 64 * MiB),
}
PG_SCALE = 20                # pgbench's scale: 2M accounts, about 300 MiB of tables
PG_LIMIT = 96 * MiB          # the guest's RAM: PostgreSQL's memory group (its ext4 cache)


def advise(image: str, seconds: float, tmp: str, save: str | None = None
           ) -> tuple[dict, dict]:
    """``vmdisktouch advise IMAGE --json`` for ``seconds``: (its disk, its CPU): ``cpu``
    and ``wall`` of the whole run (``wait4``'s rusage), and ``steady_cpu`` and
    ``steady_wall`` while it watches (``/proc/PID/stat``), from ``STARTED`` s in to
    ``ENDING`` s before its end: without the start (imports, the tracefs instance, the
    timed page-cache reads) and the end (the report, the instance removed)."""
    out = save or os.path.join(tmp, "advise.json")
    t0 = time.monotonic()
    with open(out, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "advise", image,
                              "--duration", f"{seconds:g}", "--json", "--save", ""],
                             cwd=ROOT, stdout=f, stderr=subprocess.PIPE, text=True)
        time.sleep(STARTED)
        ticks, t1 = cpu_ticks(p.pid), time.monotonic()
        time.sleep(max(0.0, seconds - STARTED - ENDING))
        ticks2, t2 = cpu_ticks(p.pid), time.monotonic()
        _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    cpu = usage.ru_utime + usage.ru_stime
    err = p.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"advise failed: {err.strip()}")
    with open(out) as f:
        disk = json.load(f)["disks"][0]
    return disk, {"cpu": cpu, "wall": wall, "steady_cpu": (ticks2 - ticks) / CLK_TCK,
                  "steady_wall": t2 - t1}


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (``/proc/PID/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def threads_cpu_ns(pid: int) -> dict[str, int]:
    """ns each thread of ``pid`` has run (``/proc/PID/task/TID/schedstat``, its first field)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0])
        except OSError:                 # the thread ended meanwhile
            pass
    return out


def busiest_thread(before: dict[str, int], after: dict[str, int], seconds: float) -> float:
    """The CPU share (of one CPU) of the busiest thread between two ``threads_cpu_ns``."""
    return max(((ns - before.get(t, 0)) / (seconds * 1e9) for t, ns in after.items()),
               default=NAN)


def steady_reads(fio: FioRun, start: float) -> float:
    v = [iv.read_iops for iv in fio.intervals if iv.t >= start]
    return statistics.median(v) if v else NAN


def phase(kind: str, image: str, args, tmp: str, advice: dict | None) -> dict:
    """One phase from a cold cache: ``none`` (advised) or ``served`` (as advised)."""
    evict(image)
    half = args.duration / 2
    with MemoryCgroup(f"advise-{kind}", args.limit) as cg:
        nbd = (QemuNbd(image, cgroup=cg, cache="none", aio="native") if kind == "none" else
               QemuNbd(image, cgroup=cg, cache="writethrough", aio="threads")).start()
        job = FioJob(filename=image, size=args.size, hot_zones=[(args.size // 4, args.zone)],
                     read_mix=args.read_mix, runtime=args.duration + 10, seed=11,
                     nbd_uri=nbd.uri)
        daemon = None
        try:
            if kind == "served":
                daemon = DaemonProc(tmp, image, "--uri", "", max_hold=advice["bytes"],
                                    interval=5.0, env=env_without_systemd())
            fio = FioRun(job, cgroup=cg).start()
            out: dict = {"kind": kind, "advice_used": advice}
            time.sleep(half)
            if kind == "none":
                out["advice_disk"], out["advise_cost"] = advise(image, half - 2, tmp)
            else:
                out["served_share"] = served_share(daemon, half)
                out["held"] = daemon.vmlck()
            out["reads"] = steady_reads(fio, half)
            fio.stop()
        finally:
            stop_all(daemon, nbd)
    return out


def say(args, section: str, title: str, text: str) -> None:
    """Print a reading, and with ``--doc`` write it as ``section`` of its page."""
    print(text)
    if args.doc:
        write_section(section, title, text)


def stop_all(*procs) -> None:
    """Stop what a phase started (a daemon, a qemu-nbd, a pgbench), those it did start."""
    for p in procs:
        if p is not None:
            p.stop()


def served_share(daemon, seconds: float) -> float:
    """The share of the pages read that the page cache served while ``daemon`` served the
    disk for ``seconds`` (its status's ``gain.cache_hit_ratio``, the median over its
    cycles); NaN without a daemon (nothing advised) or a figure."""
    ratios: dict = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        st = (daemon.read_status() or {}) if daemon else {}
        g = ((st.get("disks") or [{}])[0].get("gain") or {})
        if g.get("cache_hit_ratio") is not None:
            ratios[st.get("cycle")] = g["cache_hit_ratio"]
        time.sleep(0.5)
    return statistics.median(ratios.values()) if ratios else NAN


def cost(args, tmp: str) -> dict:
    image = make_image(os.path.join(tmp, "cost.raw"), GiB, sparse=False)
    job = FioJob(filename=image, size=GiB, hot_zones=[(0, 128 * MiB)], read_mix=100,
                 runtime=args.duration + 15, seed=5,
                 extra=["--direct=1", "--ioengine=libaio", "--iodepth=8",
                        "--rate_iops=10000"])
    fio = FioRun(job).start()
    try:
        time.sleep(5)
        t0 = time.monotonic() - fio.t0
        disk, use = advise(image, args.duration, tmp)
        t1 = time.monotonic() - fio.t0
    finally:
        fio.stop()
    fio_reads = statistics.median(iv.read_iops for iv in fio.intervals if t0 <= iv.t <= t1)
    return {"cpu_pct": 100 * use["cpu"] / use["wall"], "wall": use["wall"],
            "steady_pct": 100 * use["steady_cpu"] / use["steady_wall"],
            "seen": disk["reads_per_second"], "fio": fio_reads, "lost": disk["events_lost"]}


def report(rounds: list[dict], args) -> str:
    rows = ["| round | none: reads/s | advised size | advised share | advised gain, reads/s "
            "| served: reads/s | served share | held | gain measured ÷ advised |",
            "|---|---|---|---|---|---|---|---|---|"]
    passes = []
    for k, r in enumerate(rounds, 1):
        a, s = r["none"], r["served"]
        adv = s["advice_used"]
        gain = s["reads"] - a["reads"]
        ratio = gain / adv["more_reads_per_second"] if adv["more_reads_per_second"] else NAN
        share_ok = abs(s["served_share"] - adv["hit_ratio"]) <= SHARE_POINTS
        gain_ok = abs(ratio - 1) <= GAIN_BAND
        passes.append((share_ok, gain_ok, ratio, s["served_share"] - adv["hit_ratio"]))
        rows.append(f"| {k} | {a['reads']:,.0f} | {format_size(adv['bytes'])} | "
                    f"{adv['hit_ratio']:.0%} | {adv['more_reads_per_second']:,.0f} | "
                    f"{s['reads']:,.0f} | {s['served_share']:.0%} | {format_size(s['held'])} | "
                    f"**{ratio:.2f}** |")
    lines = rows + [""]
    for k, (share_ok, gain_ok, ratio, diff) in enumerate(passes, 1):
        lines.append(f"Round {k}: share served − advised **{diff * 100:+.1f} points** "
                     f"(target ±{SHARE_POINTS * 100:.0f}: {'PASS' if share_ok else 'MISS'}); "
                     f"gain measured ÷ advised **{ratio:.2f}** (target 1 ± {GAIN_BAND}: "
                     f"{'PASS' if gain_ok else 'MISS'}).")
    lines += ["", "The advice served in each round (a B A round serves the advice of the "
              "round before): " + "; ".join(f"round {k}: \"{r['served']['advice_used']['advice']}\""
                                             for k, r in enumerate(rounds, 1))]
    return "\n".join(lines)


def case_phase(kind: str, case: str, dev: str, args, tmp: str, advice: dict | None) -> dict:
    """One phase of a case (``--cases``) from a cold cache: ``none`` (advise in its second
    half) or ``served`` (writethrough, the daemon at the size advised)."""
    cls, mix, qd, size, zone, limit = CASES[case]
    if cls == "app":
        return app_phase(kind, case, dev, args, tmp, advice)
    evict(dev)
    half = args.duration / 2
    with MemoryCgroup(f"advise-{case}-{kind}", limit) as cg:
        nbd = (QemuNbd(dev, cgroup=cg, cache="none", aio="native") if kind == "none" else
               QemuNbd(dev, cgroup=cg, cache="writethrough", aio="threads")).start()
        job = FioJob(filename=dev, size=size, hot_zones=[(size // 4, zone)], read_mix=mix,
                     runtime=args.duration + 10, seed=11, nbd_uri=nbd.uri, nbd_fsync=0,
                     extra=[f"--iodepth={qd}"])
        daemon = None
        try:
            if kind == "served" and advice.get("bytes"):
                daemon = DaemonProc(tmp, dev, "--uri", "", max_hold=advice["bytes"],
                                    interval=5.0, env=env_without_systemd())
            fio = FioRun(job, cgroup=cg).start()
            out: dict = {"kind": kind}
            time.sleep(half)
            t0 = time.monotonic() - fio.t0
            threads0 = threads_cpu_ns(nbd.pid)
            out.update(watch_half(kind, case, dev, tmp, half, daemon))
            t1 = time.monotonic() - fio.t0
            out["nbd_busiest_cpu"] = busiest_thread(threads0, threads_cpu_ns(nbd.pid), t1 - t0)
            out["read_us"] = mean_latency_us(fio.intervals, t0, "read")
            out["write_us"] = mean_latency_us(fio.intervals, t0, "write") if mix < 100 else NAN
            ivs = [iv for iv in fio.intervals if t0 <= iv.t <= t1]
            out["reads"] = statistics.median(iv.read_iops for iv in ivs) if ivs else NAN
            out["writes"] = statistics.median(iv.write_iops for iv in ivs) if ivs else NAN
            total = statistics.median(iv.iops for iv in ivs) if ivs else NAN
            out["io_time_us"] = qd / total * 1e6 if total else NAN
            fio.stop()
        finally:
            stop_all(daemon, nbd)
    return out


def watch_half(kind: str, case: str, image: str, tmp: str, half: float, daemon) -> dict:
    """A phase's second half: ``none``, advise over it (its advice); ``served``, the share
    the page cache served and what ``daemon`` held."""
    if kind == "none":
        saved = os.path.join(tmp, f"advise-{case}-{time.monotonic():.0f}.json")
        disk, _ = advise(image, half - 6, tmp, saved)
        return {"advice_disk": disk, "advice": disk["advice"],
                "read_latency_us_p50_p99": disk["read_latency_us_p50_p99"]}
    return {"served_share": served_share(daemon, half - 2),
            "held": daemon.vmlck() if daemon else 0}


def app_phase(kind: str, case: str, image: str, args, tmp: str, advice: dict | None) -> dict:
    """``case_phase`` of a real application: PostgreSQL on ext4 on a loop device over the
    image exported by qemu-storage-daemon (``tests.support.pg_disk``), QEMU's cache mode
    ``none`` or ``writethrough``, pgbench (one client) its guest; the disk's reads and
    writes a second and their mean time are the loop device's (the guest's disk)."""
    _, script, qd, _, _, limit = CASES[case]
    evict(image)
    half = args.duration / 2
    work = tempfile.mkdtemp(prefix=f"pg-{kind}-", dir=tmp)
    cache = "none" if kind == "none" else "writethrough"
    with MemoryCgroup(f"advise-{case}-{kind}", limit) as cg, \
            MemoryCgroup(f"advise-{case}-{kind}-pg", PG_LIMIT) as pg_cg, \
            pg_disk(image, work, cache=cache, qsd_cgroup=cg, pg_cgroup=pg_cg) as pg:
        daemon = bench = None
        try:
            if kind == "served" and advice.get("bytes"):
                daemon = DaemonProc(tmp, image, "--uri", "", max_hold=advice["bytes"],
                                    interval=5.0, env=env_without_systemd())
            bench = pg.pgbench(args.duration + 10, builtin=script)
            start = time.monotonic()
            time.sleep(half)
            t0, s0, threads0 = time.monotonic() - start, pg.disk_stat(), threads_cpu_ns(pg.qsd_pid)
            w0 = pg.writes()
            out: dict = {"kind": kind}
            out.update(watch_half(kind, case, image, tmp, half, daemon))
            t1, s1, w1 = time.monotonic() - start, pg.disk_stat(), pg.writes()
            d = {k: w1[k] - w0[k] for k in w0}
            out["pg_writes"] = {
                "backend_pages_per_s": d["backend_pages"] / (t1 - t0),
                "background_pages_per_s": d["background_pages"] / (t1 - t0),
                "wal_syncs_per_s": d["wal_syncs"] / (t1 - t0),
                "wal_sync_us": 1e3 * d["wal_sync_ms"] / d["wal_syncs"] if d["wal_syncs"] else NAN,
                "wal_writes_per_s": d["wal_writes"] / (t1 - t0),
                "wal_write_us": (1e3 * d["wal_write_ms"] / d["wal_writes"] if d["wal_writes"]
                                 else NAN)}
            out["nbd_busiest_cpu"] = busiest_thread(threads0, threads_cpu_ns(pg.qsd_pid), t1 - t0)
            reads, writes = s1.reads - s0.reads, s1.writes - s0.writes
            out["reads"], out["writes"] = reads / (t1 - t0), writes / (t1 - t0)
            out["read_us"] = 1e3 * (s1.read_ms - s0.read_ms) / reads if reads else NAN
            out["write_us"] = 1e3 * (s1.write_ms - s0.write_ms) / writes if writes else NAN
            out["io_time_us"] = (1e3 * (s1.read_ms - s0.read_ms + s1.write_ms - s0.write_ms)
                                 / (reads + writes) if reads + writes else NAN)
            tps = [p[1] for p in bench.stop().progress if t0 <= p[0] <= t1]
            out["tps"] = statistics.median(tps) if tps else NAN
        finally:
            stop_all(daemon, bench)
    return out


def run_case(case: str, args, tmp: str) -> dict:
    """A B B A of one case: none, served, served, none; each served phase serves the
    first none's advice."""
    cls, mix, qd, size, zone, limit = CASES[case]
    image = make_image(os.path.join(tmp, f"{case}.raw"), size, sparse=False)
    phases: list[dict] = []
    try:
        if cls == "loaded":
            # the throttle on the lower device: it holds a bio before the block layer traces
            # it, so on the upper one the wait is the device's own, as on a busy array
            with loop_device(image, direct_io=True) as array, \
                    read_throttle(array, LOADED_RIOPS), \
                    loop_device(array, direct_io=True) as dev:
                _abba(case, dev, args, tmp, phases)
        elif cls == "app":
            os.chmod(tmp, 0o711)        # postgres (its own user) reaches its work below it
            work = tempfile.mkdtemp(prefix="pg-prepare-", dir=tmp)
            pg_prepare(image, work, scale=PG_SCALE)
            _abba(case, image, args, tmp, phases)
        else:
            _abba(case, image, args, tmp, phases)
    finally:
        os.unlink(image)
    return {"case": case, "phases": phases}


def _abba(case: str, dev: str, args, tmp: str, phases: list) -> None:
    advice = None
    for kind in ("none", "served", "served", "none"):
        r = case_phase(kind, case, dev, args, tmp, advice)
        if kind == "none" and advice is None:
            advice = r["advice"]
        phases.append(r)
        shown = {x: y for x, y in r.items() if x != "advice_disk"}
        print(f"{case} {kind}: {json.dumps(shown)}", flush=True)


def phases_from_log(path: str, names: list[str]) -> list[dict]:
    """The cases a run printed (``CASE KIND: {json}`` per phase), those with all four
    phases, in the order of ``names``."""
    got: dict = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if name in names and ": " in rest:
                got.setdefault(name, []).append(json.loads(rest.split(": ", 1)[1]))
    return [{"case": n, "phases": got[n]} for n in names if len(got.get(n, [])) == 4]


def case_verdict(c: dict) -> dict:
    """Advised against measured for one case (``--cases``)."""
    nones = [p for p in c["phases"] if p["kind"] == "none"]
    served = [p for p in c["phases"] if p["kind"] == "served"]
    adv = nones[0]["advice"]
    mean = lambda ps, k: statistics.mean(p[k] for p in ps)   # noqa: E731
    r0, r1 = mean(nones, "reads"), mean(served, "reads")
    t0, t1 = mean(nones, "io_time_us"), mean(served, "io_time_us")
    gain, advised = r1 - r0, adv.get("more_reads_per_second") or 0.0
    then = (adv.get("then") or {})
    adv_t = (then.get("mean_io_time_us") or NAN) - ((adv.get("now") or {}).get(
        "mean_io_time_us") or NAN)
    ratio = gain / advised if advised else NAN
    t_ratio = (t1 - t0) / adv_t if adv_t and adv_t == adv_t else NAN
    small = abs(gain) <= SIGN_BAND * r0 and abs(advised) <= SIGN_BAND * r0
    sign = (gain > 0) == (advised > 0)
    ok = (abs(ratio - 1) <= GAIN_BAND or abs(t_ratio - 1) <= GAIN_BAND
          or (sign and small))
    if gain < 0 and adv.get("verdict") != "no_gain":
        ok = False
    # the formula before (e7df261) on the same window: a free hit, writes unchanged
    q = adv.get("queue_depth") or 1.0
    now_r = (adv.get("now") or {}).get("reads_per_second") or 0.0
    free = ((adv.get("saved_per_read_us") or 0.0) + (adv.get("path_extra_us") or 0.0)) * 1e-6
    old = now_r * (1 / max(1 - free * now_r / q, 1e-9) - 1) if adv.get("bytes") else NAN
    rel = advised / now_r if now_r else NAN          # the gain advised, of its window's rate
    return {"old": old, "old_ratio": gain / old if old else NAN, "rel": rel,
            "rel_measured": gain / r0 if r0 else NAN,
            "r0": r0, "r1": r1, "gain": gain, "advised": advised, "ratio": ratio,
            "t0": t0, "t1": t1, "adv_t": adv_t, "t_ratio": t_ratio, "ok": ok,
            "share": statistics.median(p["served_share"] for p in served),
            "adv_share": adv.get("hit_ratio"), "verdict": adv.get("verdict"),
            "bytes": adv.get("bytes"), "second": nones[1]["advice"],
            "w0": mean(nones, "writes"), "w1": mean(served, "writes"),
            "text": adv.get("advice")}


def cases_report(cases: list[dict]) -> str:
    rows = ["| case | advised | advised share | served share | reads/s none → served "
            "| gain measured | gain advised | measured ÷ advised | mean I/O µs none → "
            "served (advised change) | writes/s none → served | target | gain as a share of "
            "the rate: advised (of advise's window), measured | e7df261's formula: "
            "gain advised (measured ÷ it) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for c in cases:
        v = case_verdict(c)
        rows.append(
            f"| {c['case']} | {v['verdict']} {format_size(v['bytes'] or 0)} | "
            f"{(v['adv_share'] or 0):.0%} | {v['share']:.0%} | {v['r0']:,.0f} → "
            f"{v['r1']:,.0f} | {v['gain']:+,.0f} | {v['advised']:+,.0f} | "
            f"**{v['ratio']:.2f}** | {v['t0']:.1f} → {v['t1']:.1f} ({v['adv_t']:+.1f}) | "
            f"{v['w0']:,.0f} → {v['w1']:,.0f} | {'PASS' if v['ok'] else 'MISS'} | "
            f"{v['rel']:+.0%}, {v['rel_measured']:+.0%} | "
            f"{v['old']:+,.0f} ({v['old_ratio']:.2f}) |")
        notes.append(f"- {c['case']}: \"{v['text']}\" (the second none phase advised: "
                     f"{v['second'].get('verdict')}, {v['second'].get('more_reads_per_second'):+,.0f} "
                     f"reads/s)")
    return "\n".join(rows + ["", "The advice each case served (from its first none phase):",
                             ""] + notes + ["", where_time_went(cases)])


def where_time_went(cases: list[dict]) -> str:
    """fio's mean read and write time and qemu-nbd's busiest thread (a share of one CPU),
    none against served, each the mean of its two phases: a rate bound by that thread
    shows it near 1, one bound by the writes' flushes shows their time; and for the
    application cases, pgbench's transactions a second."""
    rows = ["Where the time went (each the mean of the case's two phases of a kind):", "",
            "| case | read µs none → served | write µs none → served | QEMU's busiest "
            "thread (qemu-nbd, qemu-storage-daemon), CPUs: none → served | pgbench tps: "
            "none → served |", "|---|---|---|---|---|"]
    for c in cases:
        m = {k: [statistics.mean(p.get(f, NAN) for p in c["phases"] if p["kind"] == k)
                 for f in ("read_us", "write_us", "nbd_busiest_cpu", "tps")]
             for k in ("none", "served")}
        rows.append(f"| {c['case']} | {m['none'][0]:.0f} → {m['served'][0]:.0f} | "
                    f"{m['none'][1]:.0f} → {m['served'][1]:.0f} | "
                    f"{m['none'][2]:.2f} → {m['served'][2]:.2f} | "
                    + (f"{m['none'][3]:,.0f} → {m['served'][3]:,.0f} |"
                       if m["none"][3] == m["none"][3] else "|"))
    return "\n".join(rows + pg_writes_table(cases))


def pg_writes_table(cases: list[dict]) -> list[str]:
    """For the application cases: PostgreSQL's own count of its writes (``PgDisk.writes``),
    none against served, each the mean of its two phases: which of them a transaction
    waited for (the WAL's, and data pages a backend wrote itself) and what each took."""
    keys = ("backend_pages_per_s", "background_pages_per_s", "wal_writes_per_s",
            "wal_write_us", "wal_syncs_per_s", "wal_sync_us")
    rows = []
    for c in cases:
        if not all("pg_writes" in p for p in c["phases"]):
            continue
        m = {k: [statistics.mean(p["pg_writes"][f] for p in c["phases"] if p["kind"] == k)
                 for f in keys] for k in ("none", "served")}
        rows.append(f"| {c['case']} | " + " | ".join(
            f"{m['none'][i]:,.0f} → {m['served'][i]:,.0f}" for i in range(len(keys))) + " |")
    if not rows:
        return []
    return ["", "PostgreSQL's writes (`pg_stat_bgwriter`, `pg_stat_wal`; a transaction waits "
            "for its WAL's write and flush, and for a data page a backend writes itself, not "
            "for those of the background writer and the checkpointer):", "",
            "| case | pages written by backends /s | by the background /s | WAL writes /s | "
            "WAL write µs | WAL flushes /s | WAL flush µs |", "|---|---|---|---|---|---|---|"
            ] + rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=2 * GiB)
    ap.add_argument("--zone", type=parse_size, default=256 * MiB)
    ap.add_argument("--limit", type=parse_size, default=128 * MiB)
    ap.add_argument("--read-mix", type=int, default=80)
    ap.add_argument("--duration", type=float, default=None, help="s per phase (120; --cost 60)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--cases", help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--from-log", metavar="FILE",
                    help="with --cases: the report of the phases a run printed to FILE (a run "
                         "cut short, or one to report again), no new run")
    ap.add_argument("--image", help="reuse this image (else a scratch one under /var/tmp)")
    ap.add_argument("--doc", action="store_true")
    args = ap.parse_args()
    args.duration = args.duration or (60.0 if args.cost else 120.0)
    with tempfile.TemporaryDirectory(prefix="vmdt-advise-", dir="/var/tmp") as tmp:
        if args.cost:
            c = cost(args, tmp)
            body = ("fio: 4 KiB O_DIRECT random reads "
                    "(libaio, iodepth 8, `--rate_iops=10000`) of a 1 GiB file; `vmdisktouch "
                    f"advise` over it for {args.duration:g} s.\n\n"
                    "| figure | value |\n|---|---|\n"
                    f"| advise CPU while it watches (user + system, from {STARTED:g} s in to "
                    f"{ENDING:g} s before its end) | "
                    f"**{c['steady_pct']:.2f} % of a core** (target ≤ {COST_TARGET:g}: "
                    f"{'PASS' if c['steady_pct'] <= COST_TARGET else 'MISS'}) |\n"
                    f"| advise CPU, the whole run (its start included; rusage) | "
                    f"{c['cpu_pct']:.2f} % of a core |\n"
                    f"| reads/s advise saw | {c['seen']:,.0f} |\n"
                    f"| reads/s fio did (median) | {c['fio']:,.0f} |\n"
                    f"| events lost | {c['lost']} |\n")
            say(args, "advise-cost", "Watching an O_DIRECT disk: the cost of advise", body)
            return 0
        if args.cases:
            done = (phases_from_log(args.from_log, args.cases.split(",")) if args.from_log
                    else [run_case(case, args, tmp) for case in args.cases.split(",")])
            text = cases_report(done)
            head = (f"{args.duration:g} s a phase, A B B A (none, served, served, none), "
                    f"measured over each phase's second half; fio 4 KiB random I/O through "
                    f"qemu-nbd, 90 % in a hot zone (CASES in the script), no guest flushes; "
                    f"pg-*: PostgreSQL 15 on ext4 on a loop device over the image's "
                    f"qemu-storage-daemon FUSE export, pgbench -c 1 (scale {PG_SCALE}, "
                    f"PostgreSQL in {format_size(PG_LIMIT)}), the disk's figures the loop "
                    f"device's; "
                    f"loaded: the image behind two loop devices, the lower one's reads "
                    f"throttled to {LOADED_RIOPS}/s.\n\n")
            say(args, "advise-cases", "Forecast against outcome, by device and guest",
                head + text)
            return 0
        image = args.image or make_image(os.path.join(tmp, "disk.raw"), args.size,
                                         sparse=False)
        rounds = []
        for k in range(args.rounds):
            order = ("none", "served") if k % 2 == 0 else ("served", "none")
            r: dict = {}
            if order[0] == "served":            # B A: the advice of the round before
                r["none_before"] = rounds[-1]["none"]
            for kind in order:
                advice = (r.get("none") or r.get("none_before"))["advice_disk"]["advice"] \
                    if kind == "served" else None
                r[kind] = phase(kind, image, args, tmp, advice)
                shown = {x: y for x, y in r[kind].items() if x not in ("advice_disk",
                                                                        "advice_used")}
                print(f"round {k + 1} {kind}: {json.dumps(shown)}", flush=True)
            rounds.append(r)
        text = report(rounds, args)
        head = (f"{format_size(args.size)} raw image, a "
                f"{format_size(args.zone)} zone (90 % of the accesses), {args.read_mix} % "
                f"reads, through qemu-nbd in a memory group of {format_size(args.limit)}; "
                f"{args.duration:g} s a phase, measured over its second half.\n\n")
        say(args, "advise", "Advice for a cache=none disk, then served as advised", head + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
