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
``docs/benchmarks/hotzone.md``.

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

``--via nbd`` sends the same job through QEMU's block layer instead of
fio's psync engine on the file: ``qemu-nbd --cache=writethrough
--aio=threads -f raw`` (``tests.support.nbd``), started in the workload's group for
each scenario and stopped by PID after it, does the buffered reads and the
writes (each followed by ``fdatasync``), and fio's ``nbd`` engine talks to
its unix socket (``--nbd-fsync``: fio's ``fsync=N``); the holders still hold
the image file. Its sections and charts are ``hotzone[-VARIANT]-nbd``.

``--rounds K`` runs the scenario list K times, ``--order ABBA`` (the
default) reversing it on every other round, and reports each scenario's
median and min–max of its steady IOPS across rounds and the ratios of the
medians (``hotzone_rounds``); the detailed table and chart are of the last
round. The report and the chart are ``hotzone_report`` and ``hotzone_chart``,
the options ``hotzone_args``.

    python benchmarks/bench_hotzone.py                 # default, about 12 minutes
    python benchmarks/bench_hotzone.py --variant move  # about 7 minutes each variant
    python benchmarks/bench_hotzone.py --quick         # about 4 minutes, not written to the docs
    python benchmarks/bench_hotzone.py --via nbd --rounds 3 --scenarios none,oracle,vmdisktouch
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.hotzone_args import parse_args, section_name  # noqa: E402
from benchmarks.hotzone_chart import draw_chart  # noqa: E402
from benchmarks.hotzone_report import (DAEMONS, LABELS, Result, Sample, compare_lines,  # noqa: E402
                                       moved_held_lines, report, say, steady_start)
from benchmarks.hotzone_report import rolling_median, steady_loaded  # noqa: E402,F401 (bench_params: hz.*)
from benchmarks.hotzone_report import provenance, scenario_text, title  # noqa: E402
from benchmarks.hotzone_rounds import round_orders, rounds_summary, start_lines  # noqa: E402
from benchmarks.report import update_section  # noqa: E402
from benchmarks.source_common import overlap  # noqa: E402

from tests.support.cgroup import MemoryCgroup, check_budget_vs_limit  # noqa: E402
from tests.support.common import GiB, MiB, stop_process  # noqa: E402
from tests.support.daemon_proc import DaemonProc  # noqa: E402
from tests.support.fio import FioJob, FioRun, parse_iops_log, start_neighbour  # noqa: E402
from tests.support.holders import VmtouchLock  # noqa: E402
from tests.support.images import evict, make_image, resident_bytes  # noqa: E402
from tests.support.nbd import QemuNbd  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402


class Bench:
    def __init__(self, a):
        self.a = a
        self.size = parse_size(a.image_size) // MiB * MiB
        self.hot_len = max(MiB, int(self.size * a.hot_fraction) // MiB * MiB)
        self.hot_off = self.size // 4 // MiB * MiB
        self.budget = int(self.hot_len * 1.25) // MiB * MiB
        self.variant = a.variant
        # bench_params builds its own options, without these
        self.via, self.nbd_fsync = getattr(a, "via", "file"), getattr(a, "nbd_fsync", 1)
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
        lock_s = nbd = hcg = None
        try:
            if a.holder_limit and name in DAEMONS:     # the daemon in a group of its own
                hcg = MemoryCgroup(f"holders-{name}", parse_size(a.holder_limit)).create()
            if self.via == "nbd":   # QEMU's block layer does the guest's I/O, in the group
                nbd = QemuNbd(self.image, cgroup=cg, log=os.path.join(self.tmp, f"qemu-nbd-{name}.log"))
                self.live.append(nbd)
                nbd.start()
                say(f"  qemu-nbd pid {nbd.pid} in the group: {nbd.uri}")
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
                                    log="daemon-rev.log" if name == "rev" else "daemon.log",
                                    prefix=hcg.wrap([]) if hcg else ())
                self.live.append(daemon)
                holders = [daemon]
                say(f"  {' '.join(daemon.argv[daemon.argv.index('-m') + 1:])}  "
                    f"(cwd {daemon.proc_cwd()})" + (f", in {hcg.path}" if hcg else ""))
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
                            loaded=(st or {}).get("loaded_bytes", 0),
                            last_zones_held=sum(overlap((st or {}).get("regions"), *z)
                                                for z in self.phases[-1])))
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
                                read_mix=self.read_mix, zone_shares=self.shares,
                                nbd_uri=nbd.uri if nbd else None, nbd_fsync=self.nbd_fsync)
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
                    elif nbd and not nbd.alive():
                        error = f"qemu-nbd exited ({nbd.proc.returncode})"
                    if error:
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
            if nbd:     # its own memory, charged to the group besides the page cache it reads
                counters.update({f"qemu_nbd_{k}": v for k, v in nbd.memory().items()})
            status = daemon.read_status() if daemon else None
            if counters["oom_kills"]:
                error = (error or "") + f" OOM kills in the workload's group: {counters['oom_kills']}"
            return Result(name, iops, samples, lock_s, counters, status, error, lat)
        finally:
            for x in reversed(self.live):
                stop_thing(x)
            self.live.clear()
            cg.cleanup()
            if hcg:
                hcg.cleanup()
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


def interrupted(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_thing(x) -> None:
    try:
        if isinstance(x, (VmtouchLock, DaemonProc, FioRun, QemuNbd)):
            x.stop()
        else:
            stop_process(x)
    except Exception as exc:  # noqa: BLE001 - keep cleaning up
        print(f"warning: cleanup: {exc}", file=sys.stderr)


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, interrupted)     # stop what we started, as on Ctrl-C
    a, names = parse_args(argv, __doc__.split("\n")[0])
    command = "python benchmarks/bench_hotzone.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    b = Bench(a)
    stack = contextlib.ExitStack()
    try:
        if a.compare_rev:
            b.rev_tree = enter_rev_worktree(stack, a.compare_rev, say)
            a.compare_rev_sha = b.rev_tree.sha
        say(f"image {b.size / GiB:.1f} GiB, hot zone {b.hot_len / MiB:.0f} MiB at {b.hot_off / MiB:.0f} MiB, "
            f"budget {b.budget / MiB:.0f} MiB, cgroup limit {b.limit / MiB:.0f} MiB, "
            f"{a.duration:.0f} s per scenario; variant {a.variant}: phases "
            + " then ".join(", ".join(f"{o / MiB:.0f}+{n / MiB:.0f} MiB" for o, n in z)
                            for z in b.phases))
        make_image(b.image, b.size, sparse=False)
        make_image(b.nb_file, b.nb_size, sparse=False)
        orders = round_orders(names, a.rounds, a.order)
        rounds: list[dict[str, Result]] = []
        for k, order in enumerate(orders):
            if a.rounds > 1:
                say(f"\n=== round {k + 1} of {a.rounds}: {', '.join(order)}")
            b.statuses.clear()          # --keep-log: the last round's daemon statuses
            done = {}
            for n in order:
                say(f"\n== {LABELS[n]}" + (f" (round {k + 1})" if a.rounds > 1 else ""))
                r = done[n] = b.run(n)
                say(f"  steady median {r.steady_median(a.duration / 2):,.0f} IOPS; "
                    f"cgroup {json.dumps(r.counters)}" + (f"; ERROR {r.error}" if r.error else ""))
            rounds.append({n: done[n] for n in names})
        results = rounds[-1]
        summary = ""
        if a.rounds > 1:
            summary, _ = rounds_summary(rounds, orders, a.order, steady_start(a))
            if a.variant == "move":
                summary += "\n" + "\n".join(moved_held_lines(b, rounds))
        if not {"none", "oracle"} <= set(results):
            say("\n".join(["", *([summary] if summary else
                                  start_lines(rounds, steady_start(a), names)),
                            *compare_lines(a, results, steady_start(a))]))
            if summary and not a.no_doc:     # rounds without the oracle: their own section
                name = section_name(a) + "-rounds"
                update_section(name, "\n".join([title(b) + f", {a.rounds} rounds", "",
                                                provenance(command.strip()),
                                                scenario_text(b), "", summary]))
            return 0
        if summary:
            summary += f"\nThe table and chart below are of round {a.rounds}.\n\n"
        chart_rel = os.path.relpath(a.chart, os.path.join(ROOT, "docs"))
        draw_chart(results, a.chart, a.duration, b.budget, b.hot_len, steady_start(a))
        md, fig = report(b, results, command.strip(), chart_rel)
        if summary:     # after the title and the provenance, before the scenario
            head, sep, rest = md.partition("\nScenario: ")
            md = head + "\n" + summary + sep.lstrip("\n") + rest
        say("\n" + md)
        if not a.no_doc:
            update_section(section_name(a), md)
            say(f"wrote {a.chart}")
        return 0 if not any(r.error for rs in rounds for r in rs.values()) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        b.cleanup()
        stack.close()


if __name__ == "__main__":
    sys.exit(main())
