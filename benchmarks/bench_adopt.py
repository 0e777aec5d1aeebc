"""What ``vmdisktouch adopt`` delivers on a slow device, against what ``advise`` forecast.

A libvirt domain (a private libvirtd, ``tests.support.private_libvirt``; no guest OS)
has one ``cache='none' io='threads'`` disk, a block device: a raw image (``--size``,
1G, every byte written) behind two loop devices (``--direct-io=on``), the lower one's
reads held to ``--throttle`` (400) a second by the blkio throttle, as bench_advise's
``loaded`` class (``tests.support.blockdev``): the domain's disk is the upper one, so
its reads wait in the device, where advise's tracepoints see them. The domain's QEMU
is moved into a cgroup v1 memory group of ``--qemu-limit`` (24M): once adopted, the
page cache alone keeps only part of the hot zone, as in bench_advise. The guest is
driven from the host: QMP ``nbd-server-start`` and ``block-export-add`` (writable) on
the disk's format node ``libvirt-1-format`` (the disk is ``<shareable/>``, else the
export's write permission conflicts with the device's), through
``virsh qemu-monitor-command``.

Cases (``--case``, fio and pg by default), each A B B A (``--rounds`` times):

* ``fio``: fio's nbd engine on the export, 4 KiB random reads (``--read-mix`` 100),
  queue depth 1, 90 % of them in a ``--zone`` (16M) hot zone at a quarter of the disk
  (``tests.support.fio.FioJob``, as bench_advise's read cases).
* ``pg``: PostgreSQL 15 on ext4 on the domain's disk: ``qemu-storage-daemon`` as the
  guest's NBD client (``driver=nbd`` on the export) exports it through FUSE (one
  request in flight, ``tests.support.pg_disk.limit_fuse_connection``), a loop device
  (direct I/O) over that, ext4 mounted, PostgreSQL in a memory group of 96M (the
  guest's RAM) and pgbench (one client, ``--pg-script`` select-only, scale 20),
  prepared on the raw image beforehand (``tests.support.pg_disk.prepare``).

* ``nogain``: a guest of half writes on a device where ``advise`` says "no gain", to see
  ``adopt`` refuse it and, forced, the host service release it by itself. No throttle, one
  loop device. Measured before choosing it (2026-11-29; ``advise --libvirt``'s forecast of
  adopting): on this machine's disk (``--nogain-dir ''``) every 50/50 guest tried was
  forecast a gain: fio through the export as ``fio`` does (90 % in 16M) +836 reads/s on
  4,122, with a flush after each I/O (fio ``fsync=1``) +375 on 2,328, the guest below
  with 3 % in 512K, the rest at random, "uniform" +49. The forecast charges an adopted
  write only the buffered path's wake-up (``path_extra``, 2.5 µs here), not its flush, so
  where a miss costs 50-200 µs the reads' gain outweighs it unless almost nothing is read
  again, and then the curve is uniform and the whole image is advised. So the image is in
  tmpfs (``--nogain-dir``, /dev/shm: a device as fast as memory; the loop device over it
  without direct I/O, which tmpfs lacks), where a miss costs 30-45 µs. The guest is the
  disk's own device, not the export: QEMU's block statistics, which ``adopt`` times the
  baseline with and the service judges, do not count the export's I/O (``virsh
  domblkstat`` stayed at 1 read while fio ran through it), so an adoption driven through
  it is never judged. ``MonitorGuest``: qemu-io in the domain's monitor
  (``virDomainQemuMonitorCommand``, HMP), 4 KiB, ``--nogain-mix`` 50 % reads,
  ``--nogain-hot`` 12 % of the I/Os at random in a ``--nogain-zone`` 512K zone, the others
  on a walk that reaches each page once (nothing else read again, no readahead once
  adopted), writes with FUA (``aio_write -f``: durable before they complete, a guest that
  flushes each write; ``--no-nogain-fua``), one at a time; about 500 a second (each a
  monitor command, with qemu-io's ``aio_flush`` after it). Without FUA (4M zone, 10 %)
  advise said "uniform", +1.6 reads/s, and adopted the guest was faster (the service
  measured 1.13 ×): nothing to release. The zone is small because advise's curve is an
  LRU's: behind the walk a 2M zone's pages are read again only after 32M of others, and
  advise wanted 32M and four times the re-reads. Its figure is QEMU's own: the mean time of a
  read or a write of the device over the window (``rd_total_times`` and
  ``wr_total_times`` over their counts, the never-slower rule's measure; ``aio_flush``,
  a wait for what is done already, left out).

Phases, each with the guest started afresh (fio, or the whole PostgreSQL stack):

* A, ``none``: the disk as libvirt opened it (O_DIRECT). The first A of a case runs
  ``vmdisktouch advise --libvirt URI --duration ADVISE --json --save FILE`` while the
  guest runs (``--advise-seconds``; fio 60, pg 300, nogain 180): its forecast of adopting
  the disk (the report's ``advice.adopted``; the writethrough one where there is none):
  the size advised and the reads a second it would add.
  Measured over ``--seconds`` (30; the first A over advise's window).
* B, ``adopted``: the guest started under ``cache=none``, after 3 s
  ``vmdisktouch adopt DOMAIN/vda --uri URI --advice FILE`` switches the disk live, and
  ``vmdisktouch run DEV --max-hold SIZE --uri URI`` (the size the first A advised)
  serves it; measured over ``--seconds`` from 5 s after the daemon holds 90 % of the
  smaller of the zone and the size advised (fio), or of the size advised (pg), or after
  90 s of waiting for it.
  ``vmdisktouch release`` at the end, the daemon stopped before it.

The ``nogain`` case's phases, A B B A with A as above (advise 180 s in the first) and B,
``forced``: the guest started under ``cache=none``, the host service ``vmdisktouch run
--libvirt --uri URI --max-hold SIZE`` (advise's size) started, after 3 s ``vmdisktouch adopt
DOMAIN/vda --advice FILE`` (its exit code and line, and QEMU still O_DIRECT), then the same
with ``--force``, which times the guest for 30 s (the baseline) and switches. From its
return, QEMU's node polled until it is O_DIRECT again and the service's log says
``released by itself``; the bound, ``release_bound()``: (``SETTLE_WINDOWS`` +
``SLOW_WINDOWS`` + 1) × ``WINDOW_S`` of ``core.never_slower`` (its first reading comes up to
a window after the switch). Then, 5 s on, the guest is measured over ``--seconds``: its
mean I/O time against the A phases' (target: within 5 %).

Every vmdisktouch command runs with ``VMDISKTOUCH_RUNTIME_DIR`` in the run's temporary
directory. Reported: reads/s (fio's per-second rates, their median) or pgbench's tps
(its ``-P 1`` lines, their median) per phase; B ÷ A (the means of each kind) against
the advised ratio ((advise's rate + the gain advised) ÷ advise's rate); B against the
forecast (A + the gain advised). Targets: fio B ÷ A ≥ 1.5 and B within ±25 % of the
forecast; pg tps B ÷ A ≥ 1.3; nogain: advise says no gain, adopt refuses, forced it is
released within the bound, and after it the mean I/O time is within 5 % of the A phases'.

    .venv/bin/python benchmarks/bench_adopt.py [--case fio,pg,nogain] [--seconds 30] [--rounds 1] [--throttle 400]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.report import provenance  # noqa: E402
from tests.support.blockdev import loop_device, read_throttle  # noqa: E402
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import GiB, MiB, require_tool  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.fio import FioJob, FioRun  # noqa: E402
from tests.support.images import evict, make_image  # noqa: E402
from tests.support import libvirt_env, pg_disk  # noqa: E402
from tests.support.libvirt_env import disk_xml  # noqa: E402
from tests.support.pg_disk import (PORT, PgDisk, _mounted, _postgres,  # noqa: E402
                                   _socket_dir,
                                   prepare as pg_prepare)
from tests.support.private_libvirt import PrivateLibvirtd  # noqa: E402
from vmdisktouch.core import never_slower  # noqa: E402
from vmdisktouch.core.never_slower import Counters  # noqa: E402
from vmdisktouch.sizes import format_size, parse_size  # noqa: E402

NAN = float("nan")
NODE = "libvirt-1-format"      # the disk's format node: libvirt names it by its index
TARGET = "vda"
RATIO_TARGET = {"fio": 1.5, "pg": 1.3}
ADVISE_S = {"fio": 60.0, "pg": 300.0, "nogain": 180.0}   # s advise watches by default
NOGAIN_BAND = 0.05             # nogain: after the release, within this of cache=none's
FORECAST_BAND = 0.25           # B within this of the forecast (fio)
HELD_SHARE = 0.9               # B measured once the daemon holds this much of its target
HELD_WAIT = 90.0               # s: the most a B phase waits for it
SETTLE = 5.0                   # s: after it, before measuring
ADOPT_AFTER = 3.0              # s of the guest under cache=none before the live switch
PG_SCALE = 20                  # pgbench's scale: about 300 MiB of tables
PG_LIMIT = 96 * MiB            # PostgreSQL's memory group: the guest's RAM


# -- vmdisktouch's commands ------------------------------------------------------------

def vmdt(env: dict, *argv: str, check: bool = True, timeout: float = 300
         ) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", *argv], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"vmdisktouch {' '.join(argv)} failed ({r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()[-500:]}")
    return r


def run_advise(env: dict, dom: "Domain", seconds: float, save: str) -> dict:
    """``vmdisktouch advise --libvirt URI --json --save SAVE`` for ``seconds``: the report
    of the domain's disk (with ``--libvirt`` its advice carries ``adopted``, the forecast
    of adopting it live, the one adopt weighs)."""
    r = vmdt(env, "advise", "--libvirt", dom.lv.uri, "--duration", f"{seconds:g}", "--json",
             "--save", save, timeout=seconds + 120)
    disks = json.loads(r.stdout)["disks"]
    mine = [d for d in disks if d.get("name") == f"{dom.name}/{TARGET}"]
    if not mine:
        raise RuntimeError(f"advise did not report {dom.name}/{TARGET}: "
                           f"{[d.get('name') for d in disks]}")
    return mine[0]


# -- the domain and its export ----------------------------------------------------------

class Domain:
    """A paused-then-resumed domain with the disk ``dev`` (cache=none, io=threads,
    discard=unmap, shareable), its QEMU in ``qemu_cg``, the disk exported over NBD."""

    def __init__(self, lv: PrivateLibvirtd, dev: str, work: str, qemu_cg: MemoryCgroup):
        self.lv = lv
        xml = disk_xml(TARGET, dev, cache="none", io="threads", dtype="block")
        xml = xml.replace("io='threads'", "io='threads' discard='unmap'")
        self.name = lv.define([xml.replace("</disk>", "<shareable/></disk>")], tag="adopt")
        self.qemu_pid = lv.qemu_pid(self.name)
        qemu_cg.add(self.qemu_pid)
        lv.virsh("resume", self.name)
        self.sock = os.path.join(work, f"{self.name}.sock")
        self.qmp("nbd-server-start", addr={"type": "unix", "data": {"path": self.sock}})
        self.qmp("block-export-add", type="nbd", id="e0", **{"node-name": NODE},
                 name="disk", writable=True)
        self.uri = f"nbd+unix:///disk?socket={self.sock}"

    def qmp(self, command: str, **arguments):
        r = self.lv.virsh("qemu-monitor-command", self.name,
                          json.dumps({"execute": command, "arguments": arguments}))
        reply = json.loads(r.stdout)
        if "error" in reply:
            raise RuntimeError(f"{command}: {reply['error']}")
        return reply["return"]

    def direct(self) -> bool:
        """QEMU's own answer: is the disk's protocol node opened with O_DIRECT?"""
        for n in self.qmp("query-named-block-nodes", flat=True):
            if n["node-name"] == "libvirt-1-storage":
                return n["cache"]["direct"]
        raise RuntimeError("no node libvirt-1-storage")


# -- the guests -------------------------------------------------------------------------

class FioGuest:
    """fio through the export: 4 KiB random I/O, qd 1, 90 % in the zone; reads/s."""

    def __init__(self, dom: Domain, dev: str, args, seconds: float):
        job = FioJob(filename=dev, size=args.size, hot_zones=[(args.size // 4, args.zone)],
                     read_mix=args.read_mix, runtime=seconds, seed=11, nbd_uri=dom.uri,
                     nbd_fsync=0)
        self.fio = FioRun(job).start()
        self.t0 = time.monotonic()

    def mark(self) -> float:
        return time.monotonic()

    def rate(self, t0: float, t1: float) -> dict:
        a, b = t0 - self.fio.t0, t1 - self.fio.t0
        v = [iv.read_iops for iv in self.fio.intervals if a + 1 <= iv.t <= b + 0.5]
        return {"reads": statistics.median(v) if v else NAN, "samples": len(v)}

    def alive(self) -> bool:
        return self.fio.proc.poll() is None

    def stop(self) -> None:
        self.fio.stop()


class PgGuest:
    """PostgreSQL on ext4 on the domain's disk (the module docstring); pgbench's tps and
    the guest disk's reads a second (its loop device's counters)."""

    def __init__(self, dom: Domain, args, seconds: float, work: str):
        self.stack = contextlib.ExitStack()
        try:
            pg_cg = self.stack.enter_context(MemoryCgroup("adopt-pg", PG_LIMIT))
            loop, qsd = self.stack.enter_context(guest_disk(dom.sock, work))
            mnt = self.stack.enter_context(_mounted(loop, os.path.join(work, "mnt")))
            data = os.path.join(mnt, "pgdata")
            pg = self.stack.enter_context(_postgres(data, _socket_dir(work),
                                                    os.path.join(work, "postgres.log"), pg_cg))
            self.pg = PgDisk(loop, qsd.pid, pg.pid, os.path.join(work, "sock"), PORT, mnt)
            self.bench = self.pg.pgbench(seconds, builtin=args.pg_script)
            self.stack.callback(self.bench.stop)
        except BaseException:
            self.stack.close()
            raise
        self.t0 = time.monotonic()
        self.marks: dict[float, object] = {}

    def mark(self) -> float:
        t = time.monotonic()
        self.marks[t] = self.pg.disk_stat()
        return t

    def rate(self, t0: float, t1: float) -> dict:
        a, b = t0 - self.t0, t1 - self.t0
        tps = [p[1] for p in self.bench.progress if a + 1 <= p[0] <= b + 0.5]
        s0, s1 = self.marks[t0], self.marks[t1]
        return {"tps": statistics.median(tps) if tps else NAN, "samples": len(tps),
                "reads": (s1.reads - s0.reads) / (t1 - t0),
                "read_us": (1e3 * (s1.read_ms - s0.read_ms) / (s1.reads - s0.reads)
                            if s1.reads > s0.reads else NAN)}

    def alive(self) -> bool:
        return self.bench.proc.poll() is None

    def stop(self) -> None:
        self.stack.close()


class MonitorGuest:
    """The ``nogain`` case's guest (the module docstring): qemu-io in the domain's monitor on
    the disk's device, so that QEMU accounts its I/O as the device's own (its block
    statistics, which the host service judges): 4 KiB ``aio_read`` or ``aio_write``
    (``read_mix`` % reads; ``fua``: ``aio_write -f``, a write the device must have made
    durable before it completes), each followed by ``aio_flush`` (qemu-io's: it waits for
    it, so one I/O in flight); ``hot`` % of them at random in ``zone`` bytes at a quarter
    of the disk, the others on a walk that reaches each page once. The figure: QEMU's own
    time of the guest's I/O."""

    DEVICE = "/machine/peripheral/virtio-disk0/virtio-backend"
    STRIDE = 40503                   # pages: odd, so the walk visits every page once

    def __init__(self, dom: "Domain", args, seconds: float):
        import random
        import threading
        import libvirt
        import libvirt_qemu
        self.conn = libvirt.open(dom.lv.uri)
        self.dom = self.conn.lookupByName(dom.name)
        self.qemu = libvirt_qemu
        self.size, self.zone, self.hot = args.size, args.nogain_zone, args.nogain_hot
        self.read_mix, self.fua = args.nogain_mix, args.nogain_fua
        if self.size & (self.size - 1):
            raise ValueError("nogain: --size must be a power of two (the walk's stride)")
        self.rng = random.Random(11)
        self.k = 0
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.end = time.monotonic() + seconds
        self.marks: dict[float, Counters] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()
        self.thread.start()

    def _hmp(self, command: str) -> None:
        out = self.qemu.qemuMonitorCommand(
            self.dom, f'qemu-io -d {self.DEVICE} "{command}"',
            self.qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)
        if out.strip():
            raise RuntimeError(f"qemu-io {command}: {out.strip()[:300]}")

    def _offset(self) -> int:
        if self.rng.random() * 100 < self.hot:
            return self.size // 4 + (self.rng.randrange(self.zone >> 12) << 12)
        # the others: the next page of a walk that visits each page once, far apart (no
        # readahead once adopted), an odd stride over a power-of-two count of pages
        self.k += 1
        pages = self.size >> 12
        return ((self.k * self.STRIDE) % pages) << 12

    def _run(self) -> None:
        try:
            while not self.done.is_set() and time.monotonic() < self.end:
                off = self._offset()
                if self.rng.random() * 100 < self.read_mix:
                    self._hmp(f"aio_read -q {off} 4k")
                else:
                    self._hmp(f"aio_write -q {'-f ' if self.fua else ''}-P 0x5a {off} 4k")
                self._hmp("aio_flush")
        except BaseException as exc:  # noqa: BLE001 - said by alive()/rate()
            self.error = exc

    def mark(self) -> float:
        t = time.monotonic()
        self.marks[t] = Counters.from_libvirt(self.dom.blockStatsFlags(TARGET, 0), t)
        return t

    def rate(self, t0: float, t1: float) -> dict:
        return window_figures(self.marks[t1].since(self.marks[t0]))

    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)
        self.conn.close()
        if self.error is not None:
            raise RuntimeError(f"the guest failed: {self.error}")


def window_figures(w: "Window") -> dict:
    """A window of QEMU's accounting: I/Os a second, the mean time of a read, a write
    (µs), and of one I/O of the guest's (its qemu-io waits, ``aio_flush``, excluded: a
    drain of what is done already), reads and writes pooled."""
    def us(k):
        return 1e-3 * w.ns[k] / w.ops[k] if w.ops[k] else NAN
    rw = w.ops[0] + w.ops[1]
    return {"ios": rw / w.seconds if w.seconds else NAN, "read_us": us(0), "write_us": us(1),
            "io_us": 1e-3 * (w.ns[0] + w.ns[1]) / rw if rw else NAN,
            "flush_us": us(2), "window": w.to_json()}


@contextlib.contextmanager
def guest_disk(sock: str, work: str):
    """The guest's view of the domain's disk on the host: qemu-storage-daemon, an NBD
    client of the export, exports it as a file through FUSE (one request in flight),
    and a direct-I/O loop device over that file; yields (loop device, qsd Popen)."""
    mountfile = os.path.join(work, "guest.raw")
    open(mountfile, "w").close()
    argv = [require_tool("qemu-storage-daemon"),
            "--blockdev", f"driver=nbd,node-name=n0,server.type=unix,server.path={sock},"
                          "export=disk,discard=unmap",
            "--blockdev", "driver=raw,node-name=d0,file=n0,discard=unmap",
            "--export", f"type=fuse,id=g0,node-name=d0,mountpoint={mountfile},writable=on"]
    with pg_disk.fuse_loop(argv, mountfile, work, sock) as out:
        yield out


# -- the phases -------------------------------------------------------------------------

def none_window(dom: "Domain", guest, seconds: float, advise=None) -> tuple:
    """A none phase's window, the disk on O_DIRECT: ``advise()`` over it (the first
    phase: its disk report is returned) or ``seconds``; ``(t0, t1, report)``."""
    assert dom.direct(), "a none phase with the disk not on O_DIRECT"
    time.sleep(SETTLE)
    t0 = guest.mark()
    disk = advise() if advise else time.sleep(seconds)
    return t0, guest.mark(), disk


def first_advice(env: dict, dom: "Domain", case: str, seconds: float, keys: tuple,
                 state: dict, out: dict) -> dict:
    """advise over the first none phase: its forecast of adopting the disk (the
    writethrough one where there is none) into ``state`` and ``out``; its disk report."""
    save = os.path.join(env["VMDISKTOUCH_RUNTIME_DIR"], f"advise-{case}.json")
    disk = run_advise(env, dom, seconds, save)
    ad = disk["advice"].get("adopted")   # adopting it live: the guest's write cache kept
    state["advice"], state["advice_file"] = ad or disk["advice"], save
    out["advice"] = {k: state["advice"].get(k) for k in keys}
    out["advice"]["forecast_of"] = "adopted" if ad else "writethrough"
    return disk


def phase(kind: str, case: str, dom: Domain, dev: str, args, tmp: str, env: dict,
          state: dict) -> dict:
    """One phase: ``none`` (the first one with advise) or ``adopted``."""
    first = kind == "none" and "advice" not in state
    advise_s = (args.advise_seconds or ADVISE_S[case]) if first else 0.0
    budget = ADOPT_AFTER + HELD_WAIT + SETTLE + args.seconds + advise_s + 90   # adopt times 30 s
    work = tempfile.mkdtemp(prefix=f"{case}-{kind}-", dir=tmp)
    evict(dev)
    guest = (FioGuest(dom, dev, args, budget) if case == "fio" else PgGuest(dom, args, budget, work))
    out: dict = {"case": case, "kind": kind}
    daemon = None
    try:
        if kind == "none":
            keys = ("verdict", "bytes", "hit_ratio", "more_reads_per_second", "advice",
                    "now", "then")
            t0, t1, disk = none_window(dom, guest, args.seconds, first and (
                lambda: first_advice(env, dom, case, advise_s, keys, state, out)))
            if first:
                out["advice_writethrough"] = {k: disk["advice"].get(k) for k in keys}
                out["advise_cache"] = disk.get("cache")
        else:
            adv = state["advice"]
            time.sleep(ADOPT_AFTER)
            argv = ["adopt", f"{dom.name}/{TARGET}", "--uri", dom.lv.uri,
                    "--advice", state["advice_file"]]
            if adv.get("verdict") == "no_gain":
                argv.append("--force")
                out["forced"] = True
            ta = time.monotonic()
            vmdt(env, *argv)
            out["adopt_s"] = time.monotonic() - ta
            assert not dom.direct(), "adopt returned but QEMU still opens the disk O_DIRECT"
            hold = adv.get("bytes") or 0
            out["held_target"] = hold
            if hold:
                daemon = DaemonProc(work, dev, "--uri", dom.lv.uri, max_hold=hold,
                                    interval=5.0, env=env)
                td = time.monotonic()
                want = HELD_SHARE * (min(hold, args.zone) if case == "fio" else hold)
                deadline = td + HELD_WAIT
                while time.monotonic() < deadline:
                    if not daemon.alive():
                        raise RuntimeError(f"the daemon exited: {daemon._read(daemon.log_path)[-800:]}")
                    if daemon.vmlck() >= want:
                        break
                    time.sleep(0.5)
                out["held_after_s"] = time.monotonic() - td
                out["held_at_start"] = daemon.vmlck()
            time.sleep(SETTLE)
            t0 = guest.mark()
            time.sleep(args.seconds)
            t1 = guest.mark()
            if daemon is not None:
                out["held"] = daemon.vmlck()
                st = daemon.read_status() or {}
                g = ((st.get("disks") or [{}])[0].get("gain") or {})
                out["served_share"] = g.get("cache_hit_ratio")
        out["qemu_group"] = state["qemu_cg"].usage()
        if not guest.alive():
            raise RuntimeError("the guest ended before the phase did")
        out.update(guest.rate(t0, t1))
        out["window_s"] = t1 - t0
    finally:
        if daemon is not None:
            daemon.stop()
        if kind == "adopted":
            vmdt(env, "release", f"{dom.name}/{TARGET}", "--uri", dom.lv.uri, check=False)
        guest.stop()
        shutil.rmtree(work, ignore_errors=True)
    if kind == "adopted":
        out["released_direct"] = dom.direct()
    return out


def release_bound() -> float:
    """The most the host service takes to release a disk that got slower, from the switch
    (``core.never_slower``): its first reading of the disk's counters comes at its next
    tick, up to a window after the switch, then ``SETTLE_WINDOWS`` windows not judged and
    ``SLOW_WINDOWS`` slower ones in a row."""
    return (never_slower.SETTLE_WINDOWS + never_slower.SLOW_WINDOWS + 1) * never_slower.WINDOW_S


def judge_of(env: dict, dom: Domain) -> dict:
    """The baseline ``adopt`` recorded for the disk (its record in the runtime directory),
    as the host service judges against it: its noise and the limit it makes."""
    import glob
    from vmdisktouch.adapters.libvirt import adopted
    for f in glob.glob(os.path.join(env["VMDISKTOUCH_RUNTIME_DIR"], "adopted", "*.json")):
        with open(f) as fh:
            doc = json.load(fh)
        if doc.get("target") == TARGET:
            base = adopted.baseline_of(doc)
            if base:
                j = never_slower.Judge(base)
                return {"object": j, "noise": round(j.noise, 3), "limit": round(j.limit, 3),
                        "baseline_ops": [w.total for w in base],
                        "baseline_us": round(never_slower.ratio(j.before, j.before)[1] * 1e6, 1)}
    return {"object": None}


def nogain_phase(kind: str, dom: Domain, dev: str, args, tmp: str, env: dict,
                 state: dict) -> dict:
    """One phase of the ``nogain`` case: ``none`` (the first one with advise) or
    ``forced`` (the module docstring)."""
    first = kind == "none" and "advice" not in state
    work = tempfile.mkdtemp(prefix=f"nogain-{kind}-", dir=tmp)
    key = f"{dom.name}/{TARGET}"
    evict(dev)
    guest = MonitorGuest(dom, args, 3600)
    out: dict = {"case": "nogain", "kind": kind}
    service = None
    try:
        if kind == "none":
            keys = ("verdict", "reason", "bytes", "hit_ratio", "more_reads_per_second",
                    "advice", "now", "then", "path_extra_us", "write_cost_us")
            t0, t1, disk = none_window(dom, guest, args.seconds, first and (
                lambda: first_advice(env, dom, "nogain",
                                     args.advise_seconds or ADVISE_S["nogain"], keys, state,
                                     out)))
            if first:
                out["advise_disk"] = {k: disk.get(k) for k in (
                    "reads_per_second", "writes_per_second", "miss_latency_us",
                    "hit_latency_us", "path_extra_us", "wants_bytes", "window_curve")}
            out.update(guest.rate(t0, t1))
            out["window_s"] = t1 - t0
        else:
            adv = state["advice"]
            hold = adv.get("bytes") or args.nogain_zone
            service = DaemonProc(work, [], "--libvirt", "--uri", dom.lv.uri, "--min-free", "0",
                                 max_hold=max(hold, MiB), interval=1.0, env=env)
            time.sleep(ADOPT_AFTER)
            # advise said no gain: adopt refuses, and changes nothing
            r = vmdt(env, "adopt", key, "--uri", dom.lv.uri, "--advice", state["advice_file"],
                     check=False)
            out["refused"] = {"rc": r.returncode,
                              "line": (r.stderr or r.stdout).strip().splitlines()[-1:],
                              "direct_after": dom.direct()}
            # forced: adopt times the guest (the baseline), then switches
            ta = time.monotonic()
            vmdt(env, "adopt", key, "--uri", dom.lv.uri, "--advice", state["advice_file"],
                 "--force")
            ts = time.monotonic()
            out["adopt_s"] = ts - ta
            out["judge"] = judge_of(env, dom)
            out["switched"] = not dom.direct()
            t_sw = guest.mark()
            bound = release_bound()
            t_direct = t_logged = None
            line = f"{key}: released by itself"
            ticks, slower = [t_sw], []            # the rule's windows, as the bench sees them
            judge = out["judge"].pop("object")
            while time.monotonic() < ts + bound + 60 and (t_direct is None or t_logged is None):
                if not service.alive():
                    raise RuntimeError(f"the service exited: {service.output()[-800:]}")
                now = time.monotonic()
                if t_direct is None and now - ticks[-1] >= never_slower.WINDOW_S:
                    ticks.append(guest.mark())
                    w = guest.marks[ticks[-1]].since(guest.marks[ticks[-2]])
                    r = never_slower.ratio(judge.before, w) if judge else None
                    slower.append(None if r is None else round(r[0] - 1, 3))
                if t_direct is None and dom.direct():
                    t_direct = now
                    t_rel = guest.mark()
                if t_logged is None and line in service.output():
                    t_logged = now
                time.sleep(0.5)
            out["bound_s"] = bound
            out["windows_slower_by"] = slower
            st = service.read_status() or {}
            out["status_disks"] = [{k: d.get(k) for k in ("path", "adopted_gain", "advised_gain",
                                                         "adopted_since")}
                                   for d in st.get("disks") or ()]
            if args.keep_logs:
                shutil.copy(service.log_path, os.path.join(
                    args.keep_logs, f"service-{kind}-{int(time.time())}.log"))
            out["direct_after_s"] = None if t_direct is None else t_direct - ts
            out["logged_after_s"] = None if t_logged is None else t_logged - ts
            said = [x for x in service.output().splitlines() if line in x]
            out["release_line"] = said[0].split(line, 1)[1][:400] if said else None

            def skipped():
                st = service.read_status() or {}
                return [u.get("code") for u in (st.get("host") or {}).get("skipped") or ()
                        if u.get("domain") == dom.name]
            out["skipped"] = skipped()
            until = time.monotonic() + 15        # the release in status: its next cycles
            while t_direct is not None and not out["skipped"] and time.monotonic() < until:
                time.sleep(0.5)
                out["skipped"] = skipped()
            t_end = t_rel if t_direct is not None else guest.mark()
            out["adopted"] = guest.rate(t_sw, t_end)     # from the switch to the release
            out["adopted"]["window_s"] = t_end - t_sw
            if t_direct is not None:
                time.sleep(SETTLE)
            t0 = guest.mark()
            time.sleep(args.seconds)
            t1 = guest.mark()
            out["after_direct"] = dom.direct()
            out.update(guest.rate(t0, t1))          # after the release: against the A phases
            out["window_s"] = t1 - t0
        out["qemu_group"] = state["qemu_cg"].usage()
        if not guest.alive():
            raise RuntimeError(f"the guest ended before the phase did: {guest.error}")
    finally:
        if service is not None:
            service.stop()
            out["service_log_tail"] = service.output()[-600:] if kind != "none" else None
        if kind != "none":
            vmdt(env, "release", key, "--uri", dom.lv.uri, check=False)
        guest.stop()
        shutil.rmtree(work, ignore_errors=True)
    return out


def fs_type(path: str) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", path], check=True, capture_output=True,
                          text=True).stdout.strip()


def run_case(case: str, args, tmp: str) -> list[dict]:
    where = tmp
    if case == "nogain" and args.nogain_dir:
        where = tempfile.mkdtemp(prefix="vdt-adopt-nogain-", dir=args.nogain_dir)
    try:
        return _run_case(case, args, tmp, where)
    finally:
        if where != tmp:
            shutil.rmtree(where, ignore_errors=True)


def _run_case(case: str, args, tmp: str, where: str) -> list[dict]:
    image = make_image(os.path.join(where, f"{case}.raw"), args.size, sparse=False)
    if case == "pg":
        os.chmod(tmp, 0o711)          # postgres (its own user) reaches its work below it
        pg_prepare(image, tempfile.mkdtemp(prefix="pg-prepare-", dir=tmp), scale=PG_SCALE)
        evict(image)
    env = {**env_without_systemd(), "VMDISKTOUCH_RUNTIME_DIR": os.path.join(tmp, f"run-{case}")}
    os.makedirs(env["VMDISKTOUCH_RUNTIME_DIR"])
    phases: list[dict] = []
    with contextlib.ExitStack() as stack:
        if case == "nogain":                # no throttle: the device as it is
            # tmpfs has no O_DIRECT: the loop driver's copy is the device's read
            dev = stack.enter_context(loop_device(image, direct_io=fs_type(where) != "tmpfs"))
        else:
            array = stack.enter_context(loop_device(image, direct_io=True))
            stack.enter_context(read_throttle(array, args.throttle))
            dev = stack.enter_context(loop_device(array, direct_io=True))
        qemu_cg = stack.enter_context(MemoryCgroup(f"adopt-qemu-{case}", args.qemu_limit))
        lv = PrivateLibvirtd(tmp, name=f"adopt-{case}")
        stack.callback(lv.close)
        dom = Domain(lv, dev, tmp, qemu_cg)
        state = {"qemu_cg": qemu_cg}
        for _ in range(args.rounds):
            b = "forced" if case == "nogain" else "adopted"
            for kind in ("none", b, b, "none"):
                r = (nogain_phase(kind, dom, dev, args, tmp, env, state) if case == "nogain"
                     else phase(kind, case, dom, dev, args, tmp, env, state))
                phases.append(r)
                print(f"{case} {kind}: {json.dumps(r)}", flush=True)
    os.unlink(image)
    return phases


# -- the report -------------------------------------------------------------------------

def verdict(case: str, phases: list[dict]) -> dict:
    key = "reads" if case == "fio" else "tps"
    a = [p[key] for p in phases if p["kind"] == "none"]
    b = [p[key] for p in phases if p["kind"] == "adopted"]
    adv = next(p["advice"] for p in phases if "advice" in p)
    now = (adv.get("now") or {}).get("reads_per_second") or NAN
    gain = adv.get("more_reads_per_second") or 0.0
    ma, mb = statistics.mean(a), statistics.mean(b)
    v = {"a": a, "b": b, "ratio": mb / ma, "advice": adv, "advised_ratio": (now + gain) / now,
         "now": now, "gain": gain}
    if case == "fio":
        v["forecast"] = ma + gain
        v["off"] = mb / v["forecast"] - 1
        v["gain_ratio"] = (mb - ma) / gain if gain else NAN
    else:
        ra = [p["reads"] for p in phases if p["kind"] == "none"]
        rb = [p["reads"] for p in phases if p["kind"] == "adopted"]
        v["disk_reads"] = (statistics.mean(ra), statistics.mean(rb))
        v["forecast_reads"] = statistics.mean(ra) + gain
    return v


def nogain_verdict(phases: list[dict]) -> dict:
    """The ``nogain`` case's targets: advise said no gain; adopt refused it and changed
    nothing; forced, the service released it by itself within ``release_bound()`` of the
    switch; after it, the guest's mean I/O time within ``NOGAIN_BAND`` of the A phases'."""
    a = [p["io_us"] for p in phases if p["kind"] == "none"]
    b = [p for p in phases if p["kind"] == "forced"]
    adv = next(p["advice"] for p in phases if "advice" in p)
    after = [p["io_us"] for p in b if p["after_direct"]]      # measured once released
    ratio = statistics.mean(after) / statistics.mean(a) if after else NAN
    bound = release_bound()
    in_time = [p.get("direct_after_s") is not None and p["direct_after_s"] <= bound
               and p.get("logged_after_s") is not None and p["logged_after_s"] <= bound
               for p in b]
    return {
        "a": a, "after": after, "ratio": ratio, "advice": adv, "bound": bound,
        "no_gain": adv.get("verdict") == "no_gain",
        "refused": all(p["refused"]["rc"] != 0 and p["refused"]["direct_after"] for p in b),
        "released": all(in_time), "in_time": sum(in_time), "phases": len(b),
        "within": bool(after) and len(after) == len(b) and abs(ratio - 1) <= NOGAIN_BAND,
    }


def nogain_report(phases: list[dict]) -> str:
    v = nogain_verdict(phases)
    adv = v["advice"]
    b = [p for p in phases if p["kind"] == "forced"]

    def ok(x):
        return "**PASS**" if x else "**MISS**"

    def s(x):
        return "never" if x is None else f"{x:.1f} s"
    rows = ["| phase | the guest's mean I/O time (read, write) | I/Os a second | what happened |",
            "|---|---|---|---|"]
    for p in phases:
        fig = (f"{p['io_us']:,.0f} µs ({p['read_us']:,.0f}, {p['write_us']:,.0f})")
        if p["kind"] == "none":
            what = ("cache=none; advise watched" if "advice" in p else "cache=none")
        else:
            ad = p.get("adopted") or {}
            what = (f"adopt refused (exit {p['refused']['rc']}, O_DIRECT still: "
                    f"{p['refused']['direct_after']}); forced: adopted "
                    f"{ad.get('io_us', NAN):,.0f} µs ({ad.get('read_us', NAN):,.0f}, "
                    f"{ad.get('write_us', NAN):,.0f}) over the {ad.get('window_s', NAN):.0f} s "
                    f"it lasted; O_DIRECT again {s(p.get('direct_after_s'))} after the "
                    f"switch, logged {s(p.get('logged_after_s'))}; the figure: "
                    + ("after it" if p["after_direct"] else "still adopted"))
        rows.append(f"| {p['kind']} | {fig} | {p['ios']:,.0f} | {what} |")
    lines = rows + [""]
    lines.append(f"- advise (its forecast of {adv.get('forecast_of')}): {adv.get('verdict')}, "
                 f"{format_size(adv.get('bytes') or 0)}, "
                 f"{adv.get('more_reads_per_second') or 0:+,.1f} "
                 f"reads/s: \"{adv.get('advice')}\"")
    for p in b:
        lines.append(f"  - refusal: {' '.join(p['refused']['line'])}")
        lines.append(f"  - released: {p.get('release_line')}; status skipped: {p.get('skipped')}")
    lines.append("")
    lines.append(f"Targets: advise says no gain: {ok(v['no_gain'])}; adopt refuses, QEMU still "
                 f"O_DIRECT: {ok(v['refused'])}; forced, released by itself within "
                 f"{v['bound']:.0f} s of the switch ((SETTLE_WINDOWS "
                 f"{never_slower.SETTLE_WINDOWS} + "
                 f"SLOW_WINDOWS {never_slower.SLOW_WINDOWS} + 1) × {never_slower.WINDOW_S:g} s): "
                 f"{ok(v['released'])} ({v['in_time']} of {v['phases']}); after it the mean "
                 f"I/O time {', '.join(f'{x:,.0f}' for x in v['after']) or 'not measured'} µs "
                 f"({len(v['after'])} of {v['phases']} released) against cache=none's "
                 f"{statistics.mean(v['a']):,.0f} µs, **{v['ratio']:.3f} ×**, within "
                 f"{NOGAIN_BAND:.0%}: {ok(v['within'])}")
    return "\n".join(lines)


def report(results: dict[str, list[dict]], args) -> str:
    rows = ["| case | A, none: per phase | B, adopted: per phase | B ÷ A | advised: size, "
            "share from memory, gain | advised ratio | B against the forecast | targets |",
            "|---|---|---|---|---|---|---|---|"]
    notes = []
    for case, phases in results.items():
        if case == "nogain":
            continue
        v = verdict(case, phases)
        adv = v["advice"]
        unit = "reads/s" if case == "fio" else "tps"
        a = ", ".join(f"{x:,.0f}" for x in v["a"])
        b = ", ".join(f"{x:,.0f}" for x in v["b"])
        advised = (f"{adv.get('verdict')} {format_size(adv.get('bytes') or 0)}, "
                   f"{(adv.get('hit_ratio') or 0):.0%}, {v['gain']:+,.0f} reads/s "
                   f"(on {v['now']:,.0f})")
        if case == "fio":
            fc = (f"{statistics.mean(v['b']):,.0f} against {v['forecast']:,.0f}: "
                  f"**{v['off']:+.0%}** (gain measured ÷ advised {v['gain_ratio']:.2f})")
            ok1 = v["ratio"] >= RATIO_TARGET[case]
            ok2 = abs(v["off"]) <= FORECAST_BAND
            targets = (f"B ÷ A ≥ {RATIO_TARGET[case]}: {'PASS' if ok1 else 'MISS'}; "
                       f"±{FORECAST_BAND:.0%}: {'PASS' if ok2 else 'MISS'}")
        else:
            ra, rb = v["disk_reads"]
            fc = (f"guest disk reads/s {ra:,.0f} → {rb:,.0f} against {v['forecast_reads']:,.0f} "
                  f"forecast ({rb / v['forecast_reads'] - 1:+.0%})")
            ok1 = v["ratio"] >= RATIO_TARGET[case]
            targets = f"tps B ÷ A ≥ {RATIO_TARGET[case]}: {'PASS' if ok1 else 'MISS'}"
        rows.append(f"| {case} | {a} {unit} | {b} {unit} | **{v['ratio']:.2f} ×** | "
                    f"{advised} | {v['advised_ratio']:.2f} × | {fc} | {targets} |")
        notes.append(f"- {case}: advise said \"{adv.get('advice')}\" (its forecast of "
                     f"{adv.get('forecast_of')})")
        wt = next((p["advice_writethrough"] for p in phases if "advice_writethrough" in p), None)
        if wt and adv.get("forecast_of") == "adopted":
            notes.append(f"  - its forecast of cache=writethrough: {wt.get('verdict')} "
                         f"{format_size(wt.get('bytes') or 0)}, "
                         f"{(wt.get('more_reads_per_second') or 0):+,.0f} reads/s")
        for p in phases:
            if p["kind"] == "adopted":
                notes.append(f"  - adopted phase: adopt took {p.get('adopt_s', NAN):.1f} s, "
                             f"held {format_size(p.get('held_at_start') or 0)} after "
                             f"{p.get('held_after_s', NAN):.1f} s, "
                             f"{format_size(p.get('held') or 0)} at the end; served share "
                             f"{p.get('served_share')}; QEMU's group "
                             f"{format_size(p['qemu_group'])}")
    out = "\n".join(rows + [""] + notes) if len(rows) > 2 else ""
    if "nogain" in results:
        out += ("\n\n" if out else "") + nogain_report(results["nogain"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="fio,pg", help="fio, pg, nogain, or several (fio,pg)")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured s per phase")
    ap.add_argument("--advise-seconds", type=float, default=None,
                    help="how long advise watches, in the first A phase (fio 60, pg 300, "
                         "nogain 180: "
                         "at 400 reads/s advise needs about 270 s of PostgreSQL's reads)")
    ap.add_argument("--rounds", type=int, default=1, help="each an A B B A")
    ap.add_argument("--throttle", type=int, default=400, metavar="READS",
                    help="the device's reads a second (the lower loop device's blkio throttle)")
    ap.add_argument("--size", type=parse_size, default=GiB)
    ap.add_argument("--zone", type=parse_size, default=16 * MiB)
    ap.add_argument("--read-mix", type=int, default=100, help="fio: %% reads")
    ap.add_argument("--qemu-limit", type=parse_size, default=24 * MiB,
                    help="the domain QEMU's memory group (its page cache once adopted)")
    ap.add_argument("--nogain-mix", type=int, default=50, help="nogain: %% reads")
    ap.add_argument("--nogain-zone", type=parse_size, default=MiB // 2,
                    help="nogain: the hot zone")
    ap.add_argument("--nogain-hot", type=float, default=12.0,
                    help="nogain: %% of the I/Os in the hot zone")
    ap.add_argument("--nogain-fua", action=argparse.BooleanOptionalAction, default=True,
                    help="nogain: each write durable before it completes (aio_write -f)")
    ap.add_argument("--nogain-dir", default="/dev/shm",
                    help="nogain: where its image goes (/dev/shm: a device as fast as memory; "
                         "'': --dir, this disk)")
    ap.add_argument("--keep-logs", metavar="DIR",
                    help="nogain: copy the host service's log of each B phase into DIR")
    ap.add_argument("--pg-script", default="select-only", help="pgbench's builtin script")
    ap.add_argument("--dir", default="/var/tmp", help="where the images go (this disk)")
    args = ap.parse_args()
    cases = args.case.split(",")
    for c in cases:
        if c not in ADVISE_S:
            ap.error(f"--case: fio, pg or nogain, not {c!r}")
    tmp = tempfile.mkdtemp(prefix="vdt-adopt-", dir=args.dir)
    results: dict[str, list[dict]] = {}
    try:
        # /dev/kvm for libvirt's QEMU user (its probe of QEMU), as ensure_daemons does;
        # no libvirtd of qemu:///system is needed, the domain's is private
        libvirt_env._let_libvirt_qemu_use_kvm()
        for case in cases:
            results[case] = run_case(case, args, tmp)
    finally:
        libvirt_env._restore_kvm()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(provenance("python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])))
    if "nogain" in cases:
        where = (f"an image in {args.nogain_dir} ({fs_type(args.nogain_dir)})" if args.nogain_dir
                 else "this machine's disk")
        print(f"nogain: {where}; {format_size(args.size)} disk, QEMU in "
              f"{format_size(args.qemu_limit)}; qemu-io in the monitor: {args.nogain_mix} % "
              f"reads, {args.nogain_hot:g} % in a {format_size(args.nogain_zone)} zone, 4 KiB, "
              f"one in flight, writes {'with' if args.nogain_fua else 'without'} FUA; "
              f"{args.seconds:g} s measured a phase, A B B A × {args.rounds}; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end.\n")
    if any(c != "nogain" for c in cases):
        print(f"A device held to {args.throttle} reads/s; {format_size(args.size)} disk, QEMU in "
              f"{format_size(args.qemu_limit)}; fio: {args.read_mix} % reads, 90 % in a "
              f"{format_size(args.zone)} zone, qd 1; pg: pgbench {args.pg_script} -c 1, scale "
              f"{PG_SCALE}, PostgreSQL in {format_size(PG_LIMIT)}; {args.seconds:g} s measured a "
              f"phase, A B B A × {args.rounds}.\n")
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
