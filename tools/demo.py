"""``make demo``: a guest-like workload under memory pressure, without and with the daemon.

``python -m tools.demo`` (as root; about 2.5 minutes):

1. Writes a non-sparse 4 GiB disk image and a 1 GiB "neighbour" file to
   ``./demo-out/``. The guest's hot zone is 10 % of the image (410 MiB at
   1 GiB); the daemon's budget is 1.25 x the hot zone (512 MiB).
2. Phase 1, no daemon: fio plays the guest (buffered 4k random I/O, 80 %
   reads, 20 % ``O_DSYNC`` writes, 90 % of accesses in the hot zone) next to
   a noisy neighbour (random 64k reads of its own file at 200 MB/s), both in
   a cgroup v1 memory group limited to 768 MiB: the neighbour's pages push
   the guest's hot zone out of the page cache. IOPS are printed every second.
3. Phase 2, the same with ``vmdisktouch run IMAGE --max-hold 512M
   --interval 2 --status demo-out/status.json --heat-png demo-out/heat.png
   --map-png demo-out/map.png`` running outside the group; held bytes and
   IOPS are printed as it learns the hot zone and locks it.
4. Prints the median IOPS of the steady part of each phase and their ratio.

The image, the neighbour file, the cgroup and every process are cleaned up
on the way out, also on Ctrl-C or an error; the PNGs and the status JSON are
kept. The budget is kept below the group's limit with a margin: pages the
workload faulted in stay charged to its group when the daemon mlocks them,
and held pages filling the group would OOM-kill the workload (see
``tests.support.cgroup``); the demo reports that charge and checks for OOM kills.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from tests.support.cgroup import MemoryCgroup, check_budget_vs_limit
from tests.support.common import GiB, MiB, require_tool, stop_process
from tests.support.daemon_proc import DaemonProc
from tests.support.fio import FioJob, FioRun, Interval, start_neighbour
from tests.support.images import evict, make_image, resident_bytes
from tests.support.stats import steady_median
from vmdisktouch.errors import VmdtError
from vmdisktouch.sizes import counted, parse_size


def say(msg: str = "") -> None:
    print(msg, flush=True)


def _align(n: int, a: int = MiB) -> int:
    return max(a, n // a * a)


class Demo:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.image = os.path.join(self.out, "disk.raw")
        self.neighbour_file = os.path.join(self.out, "neighbour.raw")
        self.size = _align(parse_size(args.image_size))
        self.hot_len = _align(int(self.size * 0.10))
        self.hot_off = _align(self.size // 4)
        self.budget = _align(int(self.hot_len * 1.25))
        self.limit = self.budget + 256 * MiB
        self.neighbour_size = 1 * GiB
        self.neighbour_rate = 200 * MiB
        self.cgroup: MemoryCgroup | None = None
        self.neighbour = None
        self.fio: FioRun | None = None
        self.daemon: DaemonProc | None = None

    # -- helpers --
    def hot_cached(self) -> int:
        try:
            return resident_bytes(self.image, self.hot_off, self.hot_len)
        except OSError:
            return 0

    def held_in_hot(self, status: dict | None) -> int:
        if not status:
            return 0
        a, b = self.hot_off, self.hot_off + self.hot_len
        return sum(max(0, min(b, off + n) - max(a, off)) for off, n in status.get("regions", []))

    def run_phase(self, name: str, seconds: float, with_daemon: bool) -> list[Interval]:
        evict(self.image)
        evict(self.neighbour_file)
        self.cgroup = MemoryCgroup("demo", self.limit).create()
        self.neighbour = start_neighbour(self.cgroup, self.neighbour_file, self.neighbour_rate,
                                            size=self.neighbour_size)
        held_at: list[float] = []   # phase time when the daemon covered >= 90 % of the hot zone

        def on_interval(iv: Interval) -> None:
            try:
                show(iv)
            except Exception as exc:  # noqa: BLE001 - never kill the reader thread
                say(f"  [{name}] t={iv.t:5.1f}s  IOPS {iv.iops:7.0f}  ({exc})")

        def show(iv: Interval) -> None:
            line = (f"  [{name}] t={iv.t:5.1f}s  IOPS {iv.iops:7.0f} "
                    f"(read {iv.read_iops:6.0f}, write {iv.write_iops:5.0f})  "
                    f"hot zone cached {self.hot_cached() / MiB:4.0f} MiB")
            if self.daemon:
                st = self.daemon.read_status()
                hh = self.held_in_hot(st)
                if hh >= 0.9 * self.hot_len and not held_at:
                    held_at.append(iv.t)
                line += (f"  daemon: cycle {st['cycle'] if st else 0:3d}, held "
                         f"{self.daemon.vmlck() / MiB:4.0f} MiB "
                         f"({hh / MiB:.0f} MiB in the hot zone)")
            say(line)

        if with_daemon:
            self.daemon = DaemonProc(self.out, self.image,
                                     "--heat-png", os.path.join(self.out, "heat.png"),
                                     "--map-png", os.path.join(self.out, "map.png"),
                                     *self.args.daemon_args.split(),
                                     max_hold=self.budget, interval=2.0)
            say(f"  started: vmdisktouch {' '.join(self.daemon.argv[3:])}")
        job = FioJob(self.image, self.size, [(self.hot_off, self.hot_len)],
                        runtime=seconds, seed=20241122, name="guest")
        self.fio = FioRun(job, self.cgroup, on_interval=on_interval,
                             stderr_path=os.path.join(self.out, "fio.err")).start()
        deadline = time.monotonic() + seconds + 30
        while self.fio.proc.poll() is None:
            if self.daemon and not self.daemon.alive():
                raise VmdtError(f"the daemon exited ({self.daemon.returncode()}): "
                                f"{self.daemon.log_tail(1) or 'see demo-out/daemon.log'}")
            if time.monotonic() > deadline:
                raise VmdtError("fio did not finish in time")
            time.sleep(0.2)
        self.fio.wait()
        if self.fio.proc.returncode != 0 or not self.fio.intervals:
            err = ""
            try:
                with open(os.path.join(self.out, "fio.err"), errors="replace") as f:
                    err = f.read().strip().splitlines()[-1:]
            except OSError:
                pass
            raise VmdtError(f"fio failed (exit {self.fio.proc.returncode}) {err}")
        c = self.cgroup.counters()
        self.phase_counters = c
        if c["oom_kills"]:
            raise VmdtError(f"the workload's cgroup had {c['oom_kills']} OOM kill(s): held pages "
                            "charged to it filled its limit")
        stop_process(self.neighbour)
        self.neighbour = None
        self.held_at = held_at[0] if held_at else None
        return self.fio.intervals

    def cleanup(self) -> None:
        if self.fio:
            self.fio.stop()
        stop_process(self.neighbour)
        if self.daemon:
            self.daemon.stop()
        if self.cgroup:
            self.cgroup.cleanup()
        for p in (self.image, self.neighbour_file, os.path.join(self.out, "fio.err")):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def end_phase(self) -> None:
        if self.daemon:
            last = {}                 # the daemon removes its PNGs at its stop: kept for the reader
            for name in ("map.png", "heat.png"):
                try:
                    with open(os.path.join(self.out, name), "rb") as f:
                        last[name] = f.read()
                except FileNotFoundError:
                    pass
            self.daemon.stop()
            for name, data in last.items():
                with open(os.path.join(self.out, name), "wb") as f:
                    f.write(data)
        if self.cgroup:
            self.cgroup.cleanup()
        self.cgroup = None

    # -- the demo --
    def run(self) -> int:
        t_start = time.monotonic()
        os.makedirs(self.out, exist_ok=True)
        require_tool("fio")
        check_budget_vs_limit(self.budget, self.limit)
        probe = MemoryCgroup("probe", self.limit).create()
        probe.cleanup()
        say(f"vmdisktouch demo: image {self.size / GiB:.1f} GiB, hot zone {self.hot_len / MiB:.0f} MiB "
            f"at {self.hot_off / MiB:.0f} MiB (90 % of accesses), budget {self.budget / MiB:.0f} MiB, "
            f"cgroup limit {self.limit / MiB:.0f} MiB")
        say(f"writing {self.image} ...")
        make_image(self.image, self.size, sparse=False)
        make_image(self.neighbour_file, self.neighbour_size, sparse=False)
        say(f"  done in {time.monotonic() - t_start:.1f} s")

        p1, p2 = self.args.phase1, self.args.phase2
        say(f"\nphase 1: no daemon ({p1:.0f} s): fio + noisy neighbour in a {self.limit / MiB:.0f} MiB cgroup")
        before = self.run_phase("no daemon", p1, with_daemon=False)
        c1 = self.phase_counters
        self.end_phase()

        say(f"\nphase 2: with vmdisktouch ({p2:.0f} s)")
        after = self.run_phase("vmdisktouch", p2, with_daemon=True)
        c2 = self.phase_counters
        held_at = self.held_at
        st = self.daemon.read_status() or {}
        self.end_phase()

        warm = self.args.warmup
        b = steady_median([iv.iops for iv in before if iv.t >= warm], 0)
        start2 = max(warm, (held_at or 0) + 4) if held_at is not None else p2 * 2 / 3
        a = steady_median([iv.iops for iv in after if iv.t >= start2], 0)
        say("\nsummary")
        say(f"  no daemon:   median {b:7.0f} IOPS (t >= {warm:.0f} s)")
        if held_at is not None:
            say(f"  vmdisktouch: median {a:7.0f} IOPS (t >= {start2:.0f} s; it held 90 % of the hot "
                f"zone at t = {held_at:.0f} s)")
        else:
            say(f"  vmdisktouch: median {a:7.0f} IOPS (last third; it never held 90 % of the hot zone)")
        say(f"  ratio:       {a / b:.2f}x")
        say(f"  daemon: {counted(st.get('cycle', 0), 'cycle')}, held "
            f"{st.get('held_bytes', 0) / MiB:.0f} MiB in "
            f"{counted(len(st.get('regions', [])), 'region')} at the end")
        say(f"  cgroup: OOM kills {c1['oom_kills']} / {c2['oom_kills']}; held pages charged to the "
            f"workload's group (unevictable) {c2['unevictable'] / MiB:.0f} MiB of its "
            f"{self.limit / MiB:.0f} MiB limit")
        out = os.path.abspath(self.out)
        say(f"  pictures: {out}/map.png (the block map) and {out}/heat.png (the heat map): "
            "open them in an image viewer")
        say(f"  also: {out}/status.json, {out}/daemon.log "
            f"({time.monotonic() - t_start:.0f} s in all)")
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="demo-out", help="output directory (default: ./demo-out)")
    p.add_argument("--image-size", default="4G", help="disk image size (default 4G)")
    p.add_argument("--phase1", type=float, default=40.0, help="seconds without the daemon")
    p.add_argument("--phase2", type=float, default=90.0, help="seconds with the daemon")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds of each phase not counted")
    p.add_argument("--daemon-args", default="", help="extra arguments for vmdisktouch run, "
                   "e.g. '--decay 0.1 --threshold 0.05'")
    args = p.parse_args(argv)

    def on_term(signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)

    demo = Demo(args)
    rc, msg = 0, None
    try:
        rc = demo.run()
    except KeyboardInterrupt:
        rc, msg = 130, "interrupted"
    except (VmdtError, OSError) as exc:
        rc, msg = 1, str(exc)
    except Exception as exc:  # noqa: BLE001 - one line, then clean up
        rc, msg = 1, f"internal error: {type(exc).__name__}: {exc}"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # let the clean-up finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        demo.cleanup()
    if msg:
        print(f"\ndemo: {msg} (cleaned up)", file=sys.stderr, flush=True)
    return rc

if __name__ == "__main__":
    sys.exit(main())
