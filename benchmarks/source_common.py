"""Shared by the access-source and cost benchmarks (bench_source_cost, bench_trace_overhead,
bench_readonly_hold, bench_busy_cost, bench_host_cost): images, caching, the rate-limited
guest, busy guests through qemu-nbd, the daemon's cost over a window.

* ``ensure_image``: a non-sparse image (``tests.support.images.make_image``) in a
  directory, or an existing one reused (``--image``); disk space checked
  first;
* ``cache_range``: buffered reads of a byte range, so it is in the page cache;
* ``RateGuest``: fio jobs at fixed rates (``rate_iops``) over one zone of
  the image, ``psync``, buffered, ``--invalidate=0`` (fio would otherwise drop
  the file's cache at start); writes opened ``O_DSYNC`` (``sync=dsync``), as
  QEMU's ``cache=writethrough``; stopped by PID, fio's JSON read at the end;
* ``nbd_guests``: busy disks, each a real client at its highest rate (or a fixed
  one) through ``qemu-nbd`` in a memory group, as a VM's QEMU does its I/O
  (bench_busy_cost, bench_host_cost); ``guests_iops`` what they did;
* ``Window`` and ``thread_cpu``: the events lost of every disk over a window, from
  the status file; the CPU of the daemon's main thread and of its others;
* ``watch``: the daemon's CPU (utime + stime of ``/proc/PID/stat``, and the
  threads' ``schedstat`` run time as a cross-check, as in bench_daemon_cost)
  over a window, every cycle's status, and ``VmLck`` once a second;
* ``round_orders``: A B, B A, ... so that a drift of the shared machine falls
  on every scenario alike;
* ``write_section``: the date, the machine and the exact command, then the
  body, as the latest reading NAME of its page under docs/benchmarks/;
* ``add_compare_rev`` and ``side_by_side``: ``--compare-rev REV`` (the
  daemon of an older commit, from ``tests.support.worktree``) and the table of each
  headline figure, current, REV's and current ÷ REV.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.support.procfs import CLK_TCK, cpu_ns, cpu_ticks  # noqa: E402
from benchmarks.report import machine, provenance, update_section  # noqa: E402,F401 - machine re-exported
from vmdisktouch.system.meminfo import mem_available  # noqa: E402,F401 - re-exported
from tests.support.common import GiB, MiB, WorkloadError, require_tool, stop_process  # noqa: E402
from tests.support.fio import FioJob, FioRun  # noqa: E402
from tests.support.nbd import QemuNbd  # noqa: E402
from tests.support.images import make_image  # noqa: E402
from vmdisktouch.sizes import format_size  # noqa: E402


def fmt(n: float) -> str:
    """Bytes as the daemon writes sizes (``512M``, ``1.5G``)."""
    return format_size(int(n))


def median(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def disk_free(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def exit_on_sigterm(name: str) -> None:
    """SIGTERM raises SystemExit, so the ``finally`` blocks stop the children and remove files."""
    def on_signal(signum, _frame):
        raise SystemExit(f"{name}: {signal.Signals(signum).name}; cleaning up")
    signal.signal(signal.SIGTERM, on_signal)


# -- the image -------------------------------------------------------------------------

def ensure_image(image: str | None, size: int, directory: str) -> tuple[str, bool]:
    """(path, created): ``image`` reused if it is at least ``size`` bytes, else a new
    non-sparse image of ``size`` in ``directory`` (refused when the disk lacks room)."""
    if image:
        have = os.path.getsize(image)
        if have < size:
            raise WorkloadError(f"{image} is {fmt(have)}, the scenario needs {fmt(size)}")
        return image, False
    free = disk_free(directory)
    if free < size + 2 * GiB:
        raise WorkloadError(f"{directory}: {fmt(free)} free, a {fmt(size)} image needs "
                            f"{fmt(size + 2 * GiB)} (with 2G to spare)")
    path = os.path.join(directory, f"vmdt-bench-{os.getpid()}-{size >> 20}M.raw")
    print(f"writing a {fmt(size)} non-sparse image {path} ...", flush=True)
    t0 = time.monotonic()
    try:
        make_image(path, size, sparse=False)
    except BaseException:
        remove_quietly(path)
        raise
    print(f"  written in {time.monotonic() - t0:.0f} s", flush=True)
    return path, True


def add_run_options(ap, quick: str, keep: str = "keep the daemon logs (printed path)",
                    image: str = "use this existing image (read only here)") -> None:
    """The options every source benchmark shares: --image, --dir, --quick, --doc, --json, --keep."""
    ap.add_argument("--image", help=image)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--doc", action="store_true", help="write the reading into its page under docs/benchmarks/")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--keep", action="store_true", help=keep)


def add_cost_options(ap, warmup: float, duration: float) -> None:
    """The options of the cost benchmarks (a warm-up, then a window of the daemon's CPU):
    --warmup, --duration, --dir, --quick, --doc, --json, --compare-rev."""
    ap.add_argument("--warmup", type=float, default=None, help=f"({warmup:g})")
    ap.add_argument("--duration", type=float, default=None, help=f"({duration:g})")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    add_compare_rev(ap)


def fill_defaults(args, table) -> None:
    """Each ``(key, full, quick)`` of ``table`` not given: its ``--quick`` or full value."""
    for key, full, quick in table:
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)


@contextlib.contextmanager
def scratch_image(args, prefix: str):
    """(image, temporary directory): the image of ``args`` (``ensure_image``), removed
    afterwards if made here; the directory removed unless ``--keep``."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    img, created = None, False
    try:
        img, created = ensure_image(args.image, args.image_size, args.dir)
        yield img, tmp
    finally:
        if created:
            remove_quietly(img)
        if args.keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def remove_quietly(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def cache_range(path: str, offset: int, length: int, chunk: int = 8 * MiB) -> float:
    """Read ``[offset, offset + length)`` with buffered reads; returns the seconds taken."""
    t0 = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    try:
        for o in range(offset, offset + length, chunk):
            os.pread(fd, min(chunk, offset + length - o), o)
    finally:
        os.close(fd)
    return time.monotonic() - t0


# -- the guest -------------------------------------------------------------------------

class RateGuest:
    """fio jobs at fixed rates over ``[offset, offset + size)`` of ``path``.

    ``jobs`` are ``(rw, rate_iops)`` pairs, e.g. ``[("randwrite", 600),
    ("randread", 2000)]``; one fio process, one job (a forked process) each,
    4 KiB, ``psync``, buffered, writes ``O_DSYNC``, fio's default seeds (the
    same offsets in every run).
    """

    def __init__(self, path: str, offset: int, size: int, jobs, runtime: float = 3600.0,
                 log_dir: str | None = None):
        self.jobs = list(jobs)
        self.argv = [require_tool("fio"), f"--filename={path}", f"--offset={offset}",
                     f"--size={size}", "--bs=4k", "--ioengine=psync", "--direct=0",
                     "--invalidate=0", "--norandommap", "--fadvise_hint=0", "--fallocate=none",
                     "--time_based", f"--runtime={runtime:g}", "--output-format=json"]
        for i, (rw, rate) in enumerate(self.jobs):
            self.argv += [f"--name=j{i}-{rw}", f"--rw={rw}"]
            if "write" in rw:
                self.argv.append("--sync=dsync")
            if rate:
                self.argv.append(f"--rate_iops={int(rate)}")
        self.log_dir = log_dir or "/tmp"
        self.out_path = os.path.join(self.log_dir, f"fio-{os.getpid()}-{id(self)}.json")
        self.proc: subprocess.Popen | None = None
        self.result: dict | None = None

    def start(self) -> "RateGuest":
        self._out = open(self.out_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> dict:
        """SIGTERM (fio prints its JSON), then ``{job name: (read IOPS, write IOPS)}``."""
        stop_process(self.proc, signal.SIGTERM, 15)
        if self.proc is None:
            return {}
        self._out.close()
        with open(self.out_path, errors="replace") as f:
            text = f.read()
        remove_quietly(self.out_path)
        try:
            self.result = json.loads(text[text.index("{"):])
        except ValueError:
            print(f"  warning: no fio JSON; fio said: {text[-500:]}", flush=True)
            return {}
        return {j["jobname"]: (j["read"]["iops"], j["write"]["iops"])
                for j in self.result.get("jobs", [])}


def rates_text(rates: dict) -> str:
    """fio's achieved rates, ``reads 2000/s, writes 600/s``."""
    r = sum(v[0] for v in rates.values())
    w = sum(v[1] for v in rates.values())
    return f"reads {r:,.0f}/s, writes {w:,.0f}/s"


# -- busy disks: a real client through qemu-nbd ----------------------------------------

BUSY_HOT = 256 * MiB        # half of a busy guest's I/O falls in the first 256 MiB
KINDS = ("read", "write", "add", "delete")      # the trace events of a cycle


def nbd_guests(stack: contextlib.ExitStack, paths, size: int, cgroup, log_dir: str,
               runtime: float, rate: int = 0, seed: int = 20261127) -> list[FioRun]:
    """A busy guest on each of ``paths``: ``qemu-nbd --cache=writethrough --aio=threads``
    in the memory group ``cgroup`` and fio through it (``ioengine=nbd``), 4 KiB random
    I/O, 80 % reads, half of them in the first ``BUSY_HOT`` bytes and the rest over
    ``size``, at ``rate`` I/Os a second (0: as fast as it goes), for ``runtime`` s. Each
    qemu-nbd and fio is stopped by its PID when ``stack`` closes; the fio runs, in order."""
    guests = []
    for k, p in enumerate(paths):
        nbd = QemuNbd(p, cgroup=cgroup, log=os.path.join(log_dir, f"nbd-{k}.log")).start()
        stack.callback(nbd.stop)
        extra = [f"--rate_iops={rate}"] if rate else []
        job = FioJob(p, size, [(0, BUSY_HOT)], hot_share=50, runtime=runtime, seed=seed + k,
                     name=f"g{k}", extra=extra, nbd_uri=nbd.uri)
        run = FioRun(job, cgroup, stderr_path=os.path.join(log_dir, f"fio-{k}.err")).start()
        stack.callback(run.stop)
        guests.append(run)
    return guests


def guests_iops(guests, after: float) -> float:
    """The I/Os a second of ``guests`` together: each one's median over its intervals
    later than ``after`` s from its start."""
    return sum(median([iv.iops for iv in g.intervals if iv.t > after] or [0]) for g in guests)


class Window:
    """Per-cycle figures of every disk, from the status file, while a window lasts."""

    def __init__(self):
        self.events: dict[tuple[str, int], dict] = {}       # (path, cycle) -> its events
        self.lost: dict[str, list[int]] = {}                 # path -> events_lost samples

    def look(self, st: dict | None, count: bool) -> None:
        for d in (st or {}).get("disks", []):
            if count and "trace" in d:
                self.events[(d["path"], d["cycle"])] = d["trace"].get("events", {})
            self.lost.setdefault(d["path"], []).append(int(d.get("events_lost", 0)))

    def total(self) -> dict[str, int]:
        return {k: sum(e.get(k, 0) for e in self.events.values()) for k in KINDS}

    def lost_in(self) -> int:
        return sum(max(v) - min(v) for v in self.lost.values())


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the main thread and of all the others (/proc/PID/task/*/stat)."""
    main = other = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            sec = (int(fields[11]) + int(fields[12])) / CLK_TCK
            if int(tid) == pid:
                main += sec
            else:
                other += sec
    return main, other


# -- the daemon over a window ----------------------------------------------------------

class DaemonDied(RuntimeError):
    pass


def check_alive(d) -> None:
    if not d.alive():
        raise DaemonDied(f"daemon exited with {d.returncode()}:\n{d.log_tail(20)}")


def wait_first_status(d, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        check_alive(d)
        st = d.read_status()
        if st is not None:
            return st
        if time.monotonic() > deadline:
            raise DaemonDied(f"no status file after {timeout:.0f} s:\n{d.log_tail(20)}")
        time.sleep(0.05)


def sleep_alive(d, seconds: float, guest: RateGuest | None = None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        check_alive(d)
        if guest is not None and not guest.alive():
            raise WorkloadError("fio exited early:\n" + open(guest.out_path).read()[-1000:])
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def watch(d, duration: float, on_second=None, poll: float = 0.1,
          cpu_from: float | None = None) -> dict:
    """Sample the daemon for ``duration`` s: CPU over the window, every cycle's status
    (``cycles``, oldest first), and once a second ``(t, VmLck, status)`` (``seconds``);
    ``on_second(t, vmlck, status)`` is called for each of those. With ``cpu_from``,
    ``cpu_late`` is the CPU from that second of the window to its end."""
    pid = d.pid
    start = d.read_status() or {}
    start_cycle = start.get("cycle", 0)
    cycles: dict[int, dict] = {}
    seconds: list[tuple[float, int, dict | None]] = []
    t0 = time.monotonic()
    ticks0, ns0 = cpu_ticks(pid), cpu_ns(pid)
    next_sample = t0
    st = start or None
    mark = None
    while True:
        now = time.monotonic()
        if now >= t0 + duration:
            break
        check_alive(d)
        if cpu_from is not None and mark is None and now - t0 >= cpu_from:
            mark = (now, cpu_ticks(pid))
        st = d.read_status() or st
        if st and st["cycle"] > start_cycle:
            cycles[st["cycle"]] = st
        if now >= next_sample:
            sample = (now - t0, d.vmlck(), st)
            seconds.append(sample)
            if on_second:
                on_second(*sample)
            next_sample += 1.0
        time.sleep(min(poll, max(0.0, t0 + duration - time.monotonic())))
    ticks1, ns1 = cpu_ticks(pid), cpu_ns(pid)
    wall = time.monotonic() - t0
    st = d.read_status()
    if st and st["cycle"] > start_cycle:
        cycles[st["cycle"]] = st
    cyc = [cycles[k] for k in sorted(cycles)]
    secs = [c["cycle_seconds"] for c in cyc]
    return {
        "wall": wall,
        "cpu": 100.0 * (sum(ticks1) - sum(ticks0)) / CLK_TCK / wall,
        "cpu_user": 100.0 * (ticks1[0] - ticks0[0]) / CLK_TCK / wall,
        "cpu_sys": 100.0 * (ticks1[1] - ticks0[1]) / CLK_TCK / wall,
        "cpu_schedstat": 100.0 * (ns1 - ns0) / 1e9 / wall,
        "cycles": cyc,
        "cycle_median": median(secs),
        "cycle_max": max(secs) if secs else float("nan"),
        "seconds": seconds,
        "start_status": start,
        "lost_before": start.get("events_lost", 0),
        "cpu_late": (100.0 * (sum(ticks1) - sum(mark[1])) / CLK_TCK / (t0 + wall - mark[0])
                     if mark else float("nan")),
    }


def cycle_figures(w: dict) -> dict:
    """What the window's cycles held, loaded, released and lost (status fields)."""
    cyc = w["cycles"]
    last = cyc[-1] if cyc else w["start_status"]
    held = [c["held_bytes"] for c in cyc]
    return {
        "n_cycles": len(cyc),
        "held_median": median(held),
        "held_min": min(held) if held else float("nan"),
        "loaded": sum(c.get("loaded_bytes", 0) for c in cyc),
        "released": sum(c.get("released_bytes", 0) for c in cyc),
        "rewritten_median": median([c.get("rewritten_blocks", 0) for c in cyc]),
        "events_lost": last.get("events_lost", 0) - w["lost_before"],
        "events_lost_total": last.get("events_lost", 0),
        "access_source": last.get("access_source", "?"),
        "reconciled": sum(1 for c in cyc if (c.get("trace") or {}).get("reconciled")),
        "buffer_kb": (last.get("trace") or {}).get("buffer_kb"),
        "trace_reads_median": median([(c.get("trace") or {}).get("reads", float("nan"))
                                      for c in cyc]),
    }


def overlap(regions, offset: int, length: int) -> int:
    """Bytes of ``[offset, offset + length)`` covered by the status's ``regions``."""
    end = offset + length
    return sum(max(0, min(end, o + n) - max(offset, o)) for o, n in regions or [])


# -- order and report ------------------------------------------------------------------

def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """A B C, C B A, A B C, ...: reversed on every other round."""
    return [list(reversed(names)) if k % 2 else list(names) for k in range(rounds)]


def spread_text(values, spec: str = ".3g") -> str:
    """``min–max`` of ``values``, each formatted with ``spec``."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    return f"{min(values):{spec}}–{max(values):{spec}}"


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def write_section(name: str, title: str, body: str) -> None:
    """Reading ``name`` of its page under docs/benchmarks/ (``report.update_section``):
    title, date, machine, command, then ``body``."""
    md = f"## {title}\n\n{provenance(command_line())}\n{body.rstrip()}\n"
    update_section(name, md)


def publish(body: str, results, args, section: str, title: str) -> None:
    """Print ``body``; with ``--json`` write ``results``, with ``--doc`` the section."""
    print()
    print(body)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    if args.doc:
        write_section(section, title, body)


# -- --compare-rev ---------------------------------------------------------------------

def add_compare_rev(ap) -> None:
    ap.add_argument("--compare-rev", metavar="REV",
                    help="also run the daemon scenario(s) with the daemon of commit REV (from a "
                         "temporary git worktree, removed afterwards: `python -m vmdisktouch run` "
                         "there), on the same workload, and report current / REV")


def ratio_text(cur: float, old: float) -> str:
    """``cur / old`` to 3 digits; ``—`` when it has no value."""
    try:
        r = cur / old
    except (TypeError, ZeroDivisionError):
        return "—"
    return "—" if math.isnan(r) or math.isinf(r) else f"{r:.3f}"


def side_by_side(rev: str, sha: str, rows, how: str) -> list[str]:
    """A table of ``(figure, current, REV's, format)`` rows with current ÷ REV; ``format`` a
    format spec or a function of the value. ``how``: how the two ran, said before the table."""
    def text(v, f):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "—"
        return f(v) if callable(f) else format(v, f)

    lines = [f"Side by side with `{rev}` ({sha[:10]}): {how} (current ÷ {rev}):", "",
             f"| figure | current | {rev} | current ÷ {rev} |", "|---|---|---|---|"]
    for name, cur, old, f in rows:
        lines.append(f"| {name} | {text(cur, f)} | {text(old, f)} | **{ratio_text(cur, old)}** |")
    return lines
