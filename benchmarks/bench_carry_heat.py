"""Heat carried in the domain's metadata: time to hold the hot zone after a restore, carry vs cold.

Three ways a domain arrives: ``virsh restore``, ``virsh start`` after a
managedsave, and a live migration.

Scenario: a real libvirtd (started here unless one answers, as the e2e tests
do); one domain (KVM, no guest OS, 64 MiB, running) with one raw
``cache=writethrough`` disk: a ``--image-size`` (2G) non-sparse image of
random data (its first page zeroed, so SeaBIOS finds nothing to boot). The
"guest" is a thread reading 64 KiB at random 64 KiB-aligned offsets of a
``--zone`` (256M) hot zone at ``--zone-offset`` (1G) through QEMU's block
layer, as a virtio-blk guest does (the ``qemu-io`` HMP command of
``tests.support.libvirt_env.qemu_io``, sent with libvirt-python on a connection of
its own), as fast as the monitor answers (``--read-rate`` caps it). QEMU
prints each read's own time (``qemu-io``'s ``ops/sec``) into the domain's
log: that is the guest's read latency, without the monitor's round trip.

Each trial, on a fresh domain:

1. daemon A, ``vmdisktouch run --libvirt --uri qemu:///system --max-hold
   BUDGET --min-free 0 --state-dir DIR_A --status FILE --carry-interval 2``
   (defaults otherwise: 5 s cycles, carry_heat auto = on), learns the zone
   from the reads, until the summary in the domain's live metadata
   (``virsh metadata DOMAIN http://vmdisktouch.org/xmlns/heat/1``) covers
   90 % of the zone;
2. the reads stop; flow ``save``: ``virsh save DOMAIN FILE``; ``managedsave``:
   ``virsh managedsave DOMAIN --running``; ``migrate``: nothing yet; daemon A
   stops; the image is evicted from the page cache (as on another host, or
   after a host reboot);
3. daemon B starts with an EMPTY state dir and its defaults (5 s cycles):
   mode ``carry`` nothing else, mode ``cold`` ``--carry-heat off``; once it
   has written its first status: ``virsh restore FILE --running`` /
   ``virsh start DOMAIN`` / ``virsh migrate --live --unsafe DOMAIN DEST_URI
   --migrateuri tcp://127.0.0.1:PORT`` (B then serves the destination
   libvirtd); the reads resume (at the destination) as soon as it returns;
4. measured: the seconds until B's status holds 90 % of the zone (polled
   every 0.05 s), FROM THE RESUME and from the command, and the guest's reads
   in the 10 s after the command returned: monitor calls per second, QEMU's
   own read latency.

The resume: the first time libvirt reports the domain running at the
destination (``virDomainGetState`` = RUNNING, on a read-only connection of
its own to B's libvirtd, polled every 0.02 s from the command's start: after
the restore or start has resumed the CPUs, or at the migration's Finish on
the destination). It is at most the command's return plus the poll (the
return of ``virsh restore --running`` / ``start`` / ``migrate`` follows it),
and earlier when the command's own end (virsh, the source's Confirm) takes
time. The current code (issue 40's arrival rule) holds nothing for a domain
until it runs, so the time from the command includes the restore or
migration itself; the time from the resume is the one the goal (<= 2 s) is
about. A negative time from the resume ("before") is a daemon that held the
zone before the domain ran.

``--compare-rev REV``: a third mode, ``rev``: the carry mode with REV's
daemon as B (``python -m vmdisktouch run`` in a git worktree of REV,
``tests.support.worktree.enter_rev_worktree``; daemon A is the current code in every
mode), in the same run on the same scenario. ``--current-rev REV``: the
current code's daemons (A in every mode, B in carry and cold) from a git
worktree of REV too, instead of this checkout (whose files others may be
editing while it runs): the figures then name one commit.

Trials alternate per round A B (C), (C) B A (``--rounds`` 2: A B B A), for
each flow.

The system libvirtd is shared with other sessions' tests, which start one
when none answers and stop it when they end: a trial that fails because it
went away (this run's connection dead) starts one (``ensure_daemons``),
destroys and undefines every domain this run defined (their QEMUs outlive
it, the image locked), and runs again (within ``--retries``).

The migration's destination is a second libvirtd on this machine
(``tests.support.private_libvirt.PrivateLibvirtd``): ``unshare -m -u``, its own hostname (libvirt refuses to
migrate to the host it runs on: it compares hostnames and host UUIDs), a
``host_uuid`` and socket directory of its own (``libvirtd -f``), tmpfs over
/run/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt and
/etc/libvirt/qemu (no shared state, no domains, no networks), and a
qemu.conf with ``stdio_handler = "file"`` (no virtlogd there) and no cgroup
controllers; the same network namespace (the migration stream over
127.0.0.1) and the same files (the image is shared storage). Where it
cannot be started, the error is reported and the flow left out.

Then the cost to libvirtd of one write of a summary: ``--cost-calls`` (300)
``virDomainSetMetadata`` calls (read-write connection, METADATA_ELEMENT, key
``vmdisktouch``, the namespace above, AFFECT_LIVE) of a 64-region summary
(``domain_heat.summarize``/``to_xml``) on a running domain, ``--cost-reps``
(3) times: wall time per call, and libvirtd's CPU (utime + stime of
/proc/PID/stat, less its CPU over an idle window of the same length right
after each batch); and what that is per domain at the default
``carry_interval`` (30 s) and for 100 domains; and whether the element is in
``dumpxml`` (live), ``dumpxml --migratable`` (what a migration sends) and not
in ``--inactive`` (the persistent definition).

Everything started here is stopped here, by PID (daemons, the second
libvirtd, the domains: destroyed and undefined, managed-save images
included), also on failure. ``--doc`` writes section "carry-heat" of
docs/benchmarks/carry-heat.md.

    .venv/bin/python benchmarks/bench_carry_heat.py [--rounds 2] [--doc]
        [--flows save,managedsave,migrate] [--no-cost] [--keep] [--compare-rev REV]
        [--current-rev REV]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support.procfs import CLK_TCK, cpu_ticks  # noqa: E402
from benchmarks.source_common import (  # noqa: E402
    add_compare_rev, exit_on_sigterm, fmt, machine, overlap, publish, remove_quietly,
    round_orders)
from tests.support import libvirt_env  # noqa: E402
from tests.support.libvirt_env import (URI, DomainFactory, disk_xml, ensure_daemons,  # noqa: E402
                               stop_daemons)
from tests.support.pagecache import data_image  # noqa: E402
from tests.support.private_libvirt import QEMU_LOG, PrivateLibvirtd  # noqa: E402
from tests.support.common import GiB, MiB, free_port  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tests.support.images import evict, resident_bytes  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.adapters.libvirt import domain_heat  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

HELD_LEVEL = 0.9           # "holds the zone": 90 % of it
SUMMARY_LEVEL = 0.9        # daemon A's summary covers 90 % of the zone
READ = 64 * 1024
WINDOW = 10.0              # the guest's reads measured over the first 10 s after the command
POLL = 0.05                # B's status
STATE_POLL = 0.02          # the domain's state at the destination
CONTAMINATED = 0.05        # of the zone cached before the command: not a cold page cache
MISS_SECONDS = 0.0005      # a 64 KiB read slower than this (QEMU's own time) was not cached
PREFIX = "vdt-bench-carry-"   # not vdt-test-: a test session removes stale vdt-test-* domains
QEMU_IO = 'qemu-io -d /machine/peripheral/{alias}/virtio-backend "read {off} {len}"'
MODES = ("carry", "cold")   # + "rev" with --compare-rev: carry with REV's daemon as B
FLOWS = ("save", "managedsave", "migrate")
COMMANDS = {"save": "`virsh restore --running`", "managedsave": "`virsh start`",
            "migrate": "`virsh migrate --live`"}

_QUIET = False


def _libvirt():
    import libvirt
    import libvirt_qemu
    global _QUIET
    if not _QUIET:      # libvirt prints every error to stderr by default; they are handled here
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        _QUIET = True
    return libvirt, libvirt_qemu


def vsh(uri: str, *args: str, check: bool = True, timeout: float = 300) -> str:
    """``virsh -q -c URI ARGS``: its output; RuntimeError with its message when it fails."""
    r = subprocess.run([shutil.which("virsh") or "virsh", "-q", "-c", uri, *args],
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"virsh -c {uri} {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class Domains(DomainFactory):
    """``DomainFactory`` with this benchmark's prefix (``cleanup()`` destroys and undefines
    them, managed-save images included); ``forget`` does it for one, and removes its log."""

    def define(self, disks, *, start=True, tag=""):
        saved = libvirt_env.PREFIX
        libvirt_env.PREFIX = PREFIX
        try:
            name = super().define(disks, start=start, tag=tag)
        except BaseException:
            self.made.update(n for n in self.names)
            raise
        finally:
            libvirt_env.PREFIX = saved
        self.made.add(name)
        return name

    @property
    def made(self) -> set[str]:
        """Every domain this run defined (gone or not)."""
        if not hasattr(self, "_made"):
            self._made: set[str] = set()
        return self._made

    def sweep(self) -> None:
        """Destroy and undefine every domain this run defined, by name: after a libvirtd
        went away while one ran (its QEMU outlives it, the image locked; a new libvirtd
        takes it back)."""
        for name in sorted(self.made):
            libvirt_env.destroy_undefine(name)

    def forget(self, name: str) -> None:
        if name in self.names:
            self.names.remove(name)
            libvirt_env.destroy_undefine(name)
        remove_quietly(QEMU_LOG.format(name=name))

    def cleanup(self) -> None:
        while self.names:
            self.forget(self.names[-1])




# -- the guest ---------------------------------------------------------------------------

class Guest:
    """A thread reading 64 KiB at random offsets of the zone through QEMU's block layer,
    while ``attach(name, uri)``-ed; every call recorded as (end time, latency, ok)."""

    def __init__(self, zone: tuple[int, int], rate: float = 0.0, alias: str = "virtio-disk0"):
        self.libvirt, self.lq = _libvirt()
        self.conns: dict = {}
        self.zone, self.rate, self.alias = zone, rate, alias
        self.calls: list[tuple[float, float, bool]] = []
        self.errors: list[str] = []
        self.rng = random.Random(20261126)
        self._dom = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def attach(self, name: str | None, uri: str = URI) -> None:
        """Read from domain ``name`` of libvirt ``uri`` from now on (None: stop reading);
        returns once the call under way is done."""
        dom = None
        if name:
            if uri not in self.conns:
                self.conns[uri] = self.libvirt.open(uri)
            dom = self.conns[uri].lookupByName(name)
        with self._lock:
            self._dom = dom

    def _run(self) -> None:
        off0, n = self.zone
        slots = n // READ
        gap = 1.0 / self.rate if self.rate else 0.0
        while not self._stop.is_set():
            with self._lock:
                dom = self._dom
                if dom is None:
                    pass
                else:
                    cmd = QEMU_IO.format(alias=self.alias, len=READ,
                                         off=off0 + self.rng.randrange(slots) * READ)
                    t0 = time.monotonic()
                    ok = True
                    try:
                        out = self.lq.qemuMonitorCommand(
                            dom, cmd, self.lq.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)
                        if "error" in out.lower() or "failed" in out.lower():
                            raise RuntimeError(out.strip())
                    except Exception as exc:  # noqa: BLE001 - recorded
                        ok = False
                        if len(self.errors) < 20:
                            self.errors.append(str(exc).splitlines()[0][:200])
                    t1 = time.monotonic()
                    self.calls.append((t1, t1 - t0, ok))
            if dom is None:
                self._stop.wait(0.02)
            elif not ok:
                self._stop.wait(0.05)
            elif gap:
                self._stop.wait(max(0.0, gap - (t1 - t0)))

    def window(self, t0: float, t1: float) -> dict:
        c = [x for x in self.calls if t0 <= x[0] < t1]
        good = [x[1] for x in c if x[2]]
        return {"calls": len(good), "failed": len(c) - len(good),
                "per_s": len(good) / (t1 - t0),
                "monitor_ms": 1000 * statistics.median(good) if good else float("nan")}

    def count_from(self, t0: float) -> int:
        return sum(1 for x in self.calls if x[0] >= t0 and x[2])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for c in self.conns.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


OPS = re.compile(r"^\S+ \S+, (\d+) ops; [\d:.]+ sec \(\S+ \S+ and ([\d.]+|inf) ops/sec\)", re.M)


def qemu_latencies(path: str) -> list[float]:
    """The seconds of each ``qemu-io`` read QEMU logged since its last start (``ops/sec``)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    text = text.rsplit("starting up libvirt version", 1)[-1]
    return [0.0 if rate == "inf" else 1.0 / float(rate) for _n, rate in OPS.findall(text)]


def latency_figures(lat: list[float]) -> dict:
    if not lat:
        return {"n": 0, "median_us": float("nan"), "mean_us": float("nan"),
                "miss_share": float("nan")}
    return {"n": len(lat), "median_us": 1e6 * statistics.median(lat),
            "mean_us": 1e6 * statistics.fmean(lat),
            "miss_share": sum(1 for x in lat if x > MISS_SECONDS) / len(lat)}


# -- the summary in the domain's metadata --------------------------------------------------

def summary_xml(conn, name: str) -> str | None:
    libvirt, _ = _libvirt()
    try:
        return conn.lookupByName(name).metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                                                domain_heat.NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except libvirt.libvirtError:
        return None


def summary_coverage(xml: str | None, zone: tuple[int, int], target: str = "vda") -> int:
    """Bytes of the zone the summary's regions of ``target`` cover."""
    if not xml:
        return 0
    root = ET.fromstring(xml)
    elem = root if root.tag.endswith("heat") else root.find(f".//{{{domain_heat.NS}}}heat")
    if elem is None:
        return 0
    d = domain_heat.parse(elem).get(target)
    if not isinstance(d, domain_heat.DiskHeat):
        return 0
    return overlap([(s * d.block_size, n * d.block_size) for s, n, _ in d.regions], *zone)


def foreign_daemons(mine: set[int]) -> list[str]:
    """Other ``vmdisktouch run --libvirt`` processes on this machine (other sessions' tests)
    that serve qemu:///system (no ``--uri``, or that one): they serve every running domain
    there, this benchmark's too, and would hold its zone. Those of another libvirtd (a
    test's private one, ``--uri qemu+unix:///system?socket=...``) cannot."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in mine or int(p) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        uris = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--uri"]
        uris += [w.split("=", 1)[1] for w in words if w.startswith("--uri=")]
        if uris and all(u not in (URI, "qemu:///system") for u in uris):
            continue
        if "vmdisktouch" in words and "run" in words and "--libvirt" in words:
            out.append(f"{p}: {' '.join(words)[:160]}")
    return out


def wait_quiet(seconds: float) -> float:
    """Wait (at most ``seconds``) until no other ``run --libvirt`` daemon runs; seconds waited."""
    t0 = time.monotonic()
    while foreign_daemons(set()) and time.monotonic() - t0 < seconds:
        time.sleep(2)
    return time.monotonic() - t0


def disk_status(st: dict | None, path: str) -> dict | None:
    for d in (st or {}).get("disks", []):
        if d.get("path") == path:
            return d
    return None


# -- one trial -----------------------------------------------------------------------------

def daemon(tmp: Path, tag: str, budget: int, *extra: str, uri: str = URI,
           tree=None) -> DaemonProc:
    """``vmdisktouch run --libvirt``: this checkout's, or (``tree``) that worktree's."""
    state = tmp / f"state-{tag}"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir()
    return DaemonProc(tmp, [], "--libvirt", "--uri", uri, "--min-free", "0",
                      "--state-dir", str(state), *extra, max_hold=budget,
                      status=f"status-{tag}.json", log=f"daemon-{tag}.log",
                      env=env_without_systemd(),
                      **({"cwd": tree.path} if tree is not None else {}))


class RunningWatch:
    """The first time (``time.monotonic``) libvirt ``uri`` reports domain ``name`` running:
    ``virDomainGetState`` on a read-only connection of its own, every ``STATE_POLL`` s
    (the domain may not exist yet: a migration's destination)."""

    def __init__(self, uri: str, name: str):
        self.uri, self.name = uri, name
        self.at: float | None = None
        self.polls = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        libvirt, _ = _libvirt()
        try:
            conn = libvirt.openReadOnly(self.uri)
        except libvirt.libvirtError as exc:
            self.error = str(exc)
            return
        try:
            while not self._stop.is_set():
                self.polls += 1
                try:
                    st, _reason = conn.lookupByName(self.name).state()
                    if st == libvirt.VIR_DOMAIN_RUNNING:
                        self.at = time.monotonic()
                        return
                except libvirt.libvirtError:
                    pass
                self._stop.wait(STATE_POLL)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def log_lines(d: DaemonProc, *needles: str, n: int = 6) -> list[str]:
    return [ln.strip() for ln in d.err().splitlines() if any(s in ln for s in needles)][-n:]


def learn(a: DaemonProc, name: str, img: str, args, ro, tag: str) -> dict:
    """Until daemon A's summary in the domain's metadata covers SUMMARY_LEVEL of the zone."""
    zone = (args.zone_offset, args.zone)
    t0 = time.monotonic()
    cov, xml, deadline = 0, None, t0 + args.learn_timeout
    while cov < SUMMARY_LEVEL * args.zone:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{tag}: the summary covered {cov / args.zone:.0%} of the zone after "
                f"{args.learn_timeout:g} s; A's status of the disk: "
                f"{json.dumps(disk_status(a.read_status(), img))[:1500]}\nA's log:\n"
                f"{a.log_tail(20)}\nmetadata: {xml}")
        if not a.alive():
            raise RuntimeError(f"daemon A exited ({a.returncode()}):\n{a.log_tail(20)}")
        time.sleep(0.5)
        xml = summary_xml(ro, name)
        cov = summary_coverage(xml, zone)
    return {"learn_s": time.monotonic() - t0, "summary_cover": cov / args.zone,
            "summary_bytes": len(xml or ""),
            "a_held": overlap((disk_status(a.read_status(), img) or {}).get("regions"),
                              *zone) / args.zone}


def trial(flow: str, mode: str, args, img: str, tmp: Path, doms: Domains, guest: Guest,
          ro, k: int, dst: PrivateLibvirtd | None, tree=None, cur_tree=None) -> dict:
    """One trial; ``tree``: REV's worktree (B in mode rev); ``cur_tree``: the current code's
    worktree (--current-rev; None: this checkout)."""
    zone = (args.zone_offset, args.zone)
    tag = f"{k}-{flow}-{mode}"
    name = doms.define([disk_xml("vda", img)], tag=f"{flow[:4]}{k}")
    vsh(URI, "resume", name)
    a = b = watch = None
    saved = tmp / f"{name}.save"
    res = {"flow": flow, "mode": mode, "round": k, "domain": name}
    b_uri = dst.uri if flow == "migrate" else URI
    qlog = dst.qemu_log(name) if flow == "migrate" else QEMU_LOG.format(name=name)
    foreign: set[str] = set()
    try:
        evict(img)
        a = daemon(tmp, f"{tag}-A", args.budget, "--carry-interval", "2", tree=cur_tree)
        foreign.update(foreign_daemons({a.pid}))
        guest.attach(name)
        res.update(learn(a, name, img, args, ro, tag))
        foreign.update(foreign_daemons({a.pid}))
        guest.attach(None)
        if flow == "save":
            vsh(URI, "save", name, str(saved))
            res["in_saved_xml"] = domain_heat.NS in vsh(URI, "save-image-dumpxml", str(saved))
        elif flow == "managedsave":
            vsh(URI, "managedsave", name, "--running")
            res["in_saved_xml"] = domain_heat.NS in vsh(URI, "managedsave-dumpxml", name)
        else:
            res["in_saved_xml"] = domain_heat.NS in vsh(URI, "dumpxml", name, "--migratable")
        res["a_rc"] = a.stop()
        res["a_log"] = log_lines(a, "heat", "metadata")
        evict(img)
        res["resident_after_evict"] = resident_bytes(img, *zone) / args.zone
        extra = ["--carry-heat", "off"] if mode == "cold" else []
        b = daemon(tmp, f"{tag}-B", args.budget, *extra, uri=b_uri,
                   tree=tree if mode == "rev" else cur_tree)
        deadline = time.monotonic() + 60
        while b.read_status() is None:
            if not b.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"daemon B wrote no status ({b.returncode()}):\n"
                                   f"{b.log_tail(20)}")
            time.sleep(0.05)
        res["resident_at_command"] = resident_bytes(img, *zone) / args.zone
        foreign.update(foreign_daemons({b.pid}))
        if flow == "save":
            cmd = ["restore", str(saved), "--running"]
        elif flow == "managedsave":
            cmd = ["start", name]
        else:
            cmd = ["migrate", "--live", "--unsafe", name, dst.uri, "--migrateuri",
                   f"tcp://127.0.0.1:{free_port()}"]
        done: dict = {}

        def command():
            try:
                vsh(URI, *cmd)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                done["error"] = exc
            done["t"] = time.monotonic()

        th = threading.Thread(target=command, daemon=True)
        t_cmd = time.monotonic()
        watch = RunningWatch(b_uri, name)
        th.start()
        held_at = served_at = None
        trace: list[tuple[float, int]] = []
        end = t_cmd + args.hold_timeout
        while True:
            now = time.monotonic()
            if "t" in done and "back" not in done:
                if "error" in done:
                    raise RuntimeError(str(done["error"]))
                guest.attach(name, b_uri)
                done["back"] = time.monotonic()
            if not b.alive():
                raise RuntimeError(f"daemon B exited ({b.returncode()}):\n{b.log_tail(20)}")
            ds = disk_status(b.read_status(), img)
            if ds is not None and served_at is None:
                served_at = now - t_cmd
            h = overlap((ds or {}).get("regions"), *zone)
            if not trace or trace[-1][1] != h:
                trace.append((round(now - t_cmd, 2), h))
            if held_at is None and h >= HELD_LEVEL * args.zone:
                held_at = now - t_cmd
            back = done.get("back")
            if (back is not None and now >= back + WINDOW and (held_at is not None or now > end)
                    and (watch.at is not None or now > back + WINDOW + 5)):
                break
            time.sleep(POLL)
        th.join(60)
        watch.close()
        running = None if watch.at is None else watch.at - t_cmd
        foreign.update(foreign_daemons({b.pid}))
        res["foreign"] = sorted(foreign)
        res["contaminated"] = bool(foreign) or res["resident_at_command"] > CONTAMINATED
        back = done["back"]
        n_win = sum(1 for x in guest.calls if back <= x[0] < back + WINDOW and x[2])
        guest.attach(None)
        res.update({
            "command_s": back - t_cmd, "served_s": served_at, "held_s": held_at,
            "running_s": running, "state_polls": watch.polls, "state_error": watch.error,
            "held_after_resume_s": (None if held_at is None or running is None
                                    else held_at - running),
            "held_after_return_s": None if held_at is None else held_at - (back - t_cmd),
            "held_trace": trace, "reads": guest.window(back, back + WINDOW),
            "b_log": log_lines(b, "carried", "metadata", "heat"),
        })
        # QEMU logs once it exits: the destroy below flushes it
        vsh(b_uri, "destroy", name, check=False)
        lat = qemu_latencies(qlog)
        res["qemu"] = latency_figures(lat[:n_win])
        res["qemu"]["logged"] = len(lat)
        held = "never" if held_at is None else f"{held_at:.2f} s"
        r, q = res["reads"], res["qemu"]
        print(f"  round {k + 1} {flow:11s} {mode:5s}: summary {res['summary_cover']:.0%} of "
              f"the zone after {res['learn_s']:.1f} s; {cmd[0]} {res['command_s']:.2f} s, "
              f"running at {s_text(running, '.2f')}; B held 90 % {held} after the command, "
              f"{after_text(res['held_after_resume_s'], '.2f')} after the resume; "
              f"first {WINDOW:g} s: {r['per_s']:.0f} "
              f"reads/s, QEMU's read median {q['median_us']:.0f} us, mean {q['mean_us']:.0f} "
              f"us, {q['miss_share']:.0%} over {MISS_SECONDS * 1e6:.0f} us "
              f"({q['n']} of {n_win} matched, {q['logged']} logged); zone cached at the "
              f"command {res['resident_at_command']:.1%}", flush=True)
        for x in res["foreign"]:
            print(f"      another vmdisktouch --libvirt daemon ran: {x}", flush=True)
        for ln in res["b_log"]:
            print(f"      B: {ln[:240]}", flush=True)
        return res
    finally:
        guest.attach(None)
        if watch is not None:
            watch.close()
        for d in (a, b):
            if d is not None:
                d.stop()
        if flow == "migrate" and dst is not None:
            vsh(dst.uri, "destroy", name, check=False)
        doms.forget(name)
        remove_quietly(str(saved))


# -- the cost to libvirtd -------------------------------------------------------------------

class _Img:
    def __init__(self, path: str):
        self.size = os.path.getsize(path)
        self.fd = os.open(path, os.O_RDONLY)

    def close(self):
        os.close(self.fd)


def realistic_summary(img: str, block: int = MiB) -> tuple[str, int]:
    """A 64-region summary of the image, as the daemon writes it (``summarize``, ``to_xml``):
    100 runs of 2 to 9 blocks of varied heat, of which the 64 densest are kept."""
    import numpy as np
    im = _Img(img)
    try:
        n = -(-im.size // block)
        heat = np.zeros(n, dtype=np.float32)
        rng = np.random.default_rng(7)
        step = n // 100
        for i in range(100):
            s = i * step
            heat[s:s + int(rng.integers(2, 10))] = rng.uniform(0.06, 0.9)
        s = domain_heat.summarize(heat, 0.05, "vda", im, block, time.time())
    finally:
        im.close()
    return domain_heat.to_xml([s]), len(s.regions)


def libvirtd_pid() -> int:
    """The PID of the libvirtd answering on qemu:///system (its pid file, checked)."""
    try:
        pid = int(Path("/run/libvirtd.pid").read_text().strip())
        if Path(f"/proc/{pid}/comm").read_text().strip() == "libvirtd":
            return pid
    except (OSError, ValueError):
        pass
    raise RuntimeError("no libvirtd behind /run/libvirtd.pid")


def cost(args, img: str, doms: Domains, interval: float = 30.0) -> dict:
    libvirt, _ = _libvirt()
    name = doms.define([disk_xml("vda", img)], tag="cost")
    vsh(URI, "resume", name)
    xml, nreg = realistic_summary(img)
    conn = libvirt.open(URI)
    try:
        dom = conn.lookupByName(name)
        pid = libvirtd_pid()
        n = args.cost_calls

        def write():
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, domain_heat.KEY,
                            domain_heat.NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)

        write()                                   # the first one adds the element
        walls, idles, busy = [], [], []
        for _rep in range(args.cost_reps):
            c0, t0 = sum(cpu_ticks(pid)), time.monotonic()
            for _ in range(n):
                write()
            wall = time.monotonic() - t0
            busy.append(sum(cpu_ticks(pid)) - c0)
            walls.append(wall)
            c0, t0 = sum(cpu_ticks(pid)), time.monotonic()
            time.sleep(wall)                      # the idle window: what libvirtd spends anyway
            idles.append((sum(cpu_ticks(pid)) - c0, time.monotonic() - t0))
        back = summary_xml(conn, name) or ""
        in_live = domain_heat.NS in vsh(URI, "dumpxml", name)
        in_migratable = domain_heat.NS in vsh(URI, "dumpxml", name, "--migratable")
        in_inactive = domain_heat.NS in vsh(URI, "dumpxml", name, "--inactive")
    finally:
        conn.close()
        doms.forget(name)
    calls = n * args.cost_reps
    wall = sum(walls)
    ticks = sum(busy)
    idle_ticks = sum(t for t, _ in idles) * wall / sum(w for _, w in idles)
    cpu_call = ticks / CLK_TCK / calls
    net_call = max(0.0, ticks - idle_ticks) / CLK_TCK / calls
    r = {"calls": calls, "regions": nreg, "xml_bytes": len(xml), "wall_ms": 1000 * wall / calls,
         "cpu_ms": 1000 * cpu_call, "net_cpu_ms": 1000 * net_call, "ticks": ticks,
         "idle_ticks": idle_ticks, "clk_tck": CLK_TCK, "interval": interval,
         "per_domain_pct": 100 * net_call / interval,
         "per_100_pct": 100 * 100 * net_call / interval,
         "round_trip": back.count("<region") == nreg, "in_live_xml": in_live,
         "in_migratable_xml": in_migratable, "in_inactive_xml": in_inactive}
    print(f"  setMetadata x {calls} ({nreg} regions, {len(xml)} bytes): {r['wall_ms']:.2f} ms "
          f"wall per call; libvirtd CPU {r['cpu_ms']:.2f} ms per call ({r['net_cpu_ms']:.2f} ms "
          f"less its idle CPU); at one write per {interval:g} s: {r['per_domain_pct']:.4f} % of "
          f"a core per domain, {r['per_100_pct']:.3f} % for 100 domains", flush=True)
    print(f"  read back whole: {r['round_trip']}; in dumpxml (live) {in_live}, --migratable "
          f"{in_migratable}, --inactive {in_inactive}", flush=True)
    return r


# -- the report -----------------------------------------------------------------------------

def med(xs):
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else None


def s_text(x, spec=".1f", unit=" s"):
    return "never" if x is None else f"{x:{spec}}{unit}"


def after_text(x, spec=".1f") -> str:
    if x is None:
        return "never"
    return f"{x:{spec}} s" if x >= 0 else f"before ({x:{spec}} s)"


def ratio(a, b) -> str:
    return "—" if a is None or b is None or a < 0 or b <= 0 else f"{a / b:.2f} ×"


def ratio_num(a, b):
    return None if a is None or b is None or a < 0 or b <= 0 else a / b


def yes(b) -> str:
    return "yes" if b else "no"


def report(res: dict, args) -> str:
    trials = res["trials"]
    flows = [f for f in FLOWS if any(t["flow"] == f for t in trials)]
    modes = [m for m in MODES + ("rev",) if any(t["mode"] == m for t in trials)]
    rev = args.compare_rev
    names = {"carry": "carry", "cold": "cold", "rev": f"{rev} (carry)"}
    short = {"carry": "carry", "cold": "cold", "rev": rev}
    has_rev = "rev" in modes

    def m(flow, mode, key, sub=None):
        return med([(t[key] if sub is None else t[key][sub]) for t in trials
                    if t["flow"] == flow and t["mode"] == mode])

    head_cols = ["flow (B starts at)"] + [f"from the resume: {short[x]}" if i == 0 else short[x]
                                          for i, x in enumerate(modes)]
    head_cols += ["carry ÷ cold"] + ([f"carry ÷ {rev}"] if has_rev else [])
    head_cols += [f"from the command: {short[x]}" if i == 0 else short[x]
                  for i, x in enumerate(modes)]
    head_cols += [f"domain running at: {short[x]}" if i == 0 else short[x]
                  for i, x in enumerate(modes)]
    side = ["| " + " | ".join(head_cols) + " |", "|---" * len(head_cols) + "|"]
    guest_cols = (["flow"] + [f"QEMU's mean read: {short[x]}" if i == 0 else short[x]
                              for i, x in enumerate(modes)]
                  + [f"reads/s: {short[x]}" if i == 0 else short[x] for i, x in enumerate(modes)])
    reads = ["| " + " | ".join(guest_cols) + " |", "|---" * len(guest_cols) + "|"]
    ratios = {}
    for flow in flows:
        fr = {x: m(flow, x, "held_after_resume_s") for x in modes}
        fc = {x: m(flow, x, "held_s") for x in modes}
        run = {x: m(flow, x, "running_s") for x in modes}
        lat = {x: m(flow, x, "qemu", "mean_us") for x in modes}
        rps = {x: m(flow, x, "reads", "per_s") for x in modes}
        ratios[flow] = {
            "resume": {x: fr[x] for x in modes}, "command": {x: fc[x] for x in modes},
            "held": ratio_num(fr.get("carry"), fr.get("cold")),
            "held_rev": ratio_num(fr.get("carry"), fr.get("rev")),
            "held_command": ratio_num(fc.get("carry"), fc.get("cold")),
            "qemu_mean": ratio_num(lat.get("carry"), lat.get("cold")),
            "reads": ratio_num(rps.get("carry"), rps.get("cold"))}
        row = [f"{flow} ({COMMANDS[flow]})"]
        row += [f"**{after_text(fr[x], '.2f')}**" if x == "carry" else after_text(fr[x], ".2f")
                for x in modes]
        row += [f"**{ratio(fr.get('carry'), fr.get('cold'))}**"]
        if has_rev:
            row += [f"**{ratio(fr.get('carry'), fr.get('rev'))}**"]
        row += [s_text(fc[x], ".2f") for x in modes]
        row += [s_text(run[x], ".2f") for x in modes]
        side.append("| " + " | ".join(row) + " |")
        reads.append("| " + " | ".join([flow] + [s_text(lat[x], ".0f", " µs") for x in modes]
                                       + [f"{rps[x] or 0:.0f}" for x in modes]) + " |")
    res["ratios"] = ratios
    lines = ["| flow | mode | round | A's summary covered | command returned | domain running "
             "| B serves the disk | B holds 90 % | from the resume | from the return | reads/s "
             f"| QEMU's read: median | mean | over {MISS_SECONDS * 1e6:.0f} µs "
             "| zone cached at the command |",
             "|---" * 15 + "|"]
    for t in trials:
        r, q = t["reads"], t["qemu"]
        lines.append(f"| {t['flow']} | {names[t['mode']]} | {t['round'] + 1} | "
                     f"{t['summary_cover']:.0%} after {t['learn_s']:.0f} s | "
                     f"{t['command_s']:.2f} s | {s_text(t['running_s'], '.2f')} | "
                     f"{s_text(t['served_s'], '.2f')} | {s_text(t['held_s'], '.2f')} | "
                     f"**{after_text(t['held_after_resume_s'], '.2f')}** | "
                     f"{after_text(t['held_after_return_s'], '.2f')} | "
                     f"{r['per_s']:.0f} | {q['median_us']:.0f} µs | {q['mean_us']:.0f} µs | "
                     f"{q['miss_share']:.0%} | {t['resident_at_command']:.1%}"
                     f"{' †' if t['contaminated'] else ''} |")
    c = res.get("cost")
    cost_lines = []
    if c:
        cost_lines = [
            "", f"**Cost to libvirtd of one write**: {c['calls']} `setMetadata` calls "
            f"(read-write connection, METADATA_ELEMENT, AFFECT_LIVE) of a {c['regions']}-region "
            f"summary ({c['xml_bytes']:,} bytes, `domain_heat.summarize`/`to_xml`) on a running "
            f"domain:", "",
            "| wall per call | libvirtd CPU per call | less its idle CPU | one domain, a write "
            "per 30 s | 100 domains |", "|---|---|---|---|---|",
            f"| {c['wall_ms']:.2f} ms | {c['cpu_ms']:.2f} ms | {c['net_cpu_ms']:.2f} ms | "
            f"{c['per_domain_pct']:.4f} % of a core | {c['per_100_pct']:.3f} % of a core |", "",
            f"(libvirtd's utime + stime at {c['clk_tck']} ticks/s: {c['ticks']} ticks over the "
            f"calls, {c['idle_ticks']:.0f} over idle windows of the same length; the machine "
            f"is shared, so the idle figure is other sessions' use of the same libvirtd. One "
            f"write per 30 s is the most the daemon does: it writes only when the regions "
            f"or their heat moved by an eighth.) The element is in `virsh dumpxml` (live: "
            f"{yes(c['in_live_xml'])}), in `dumpxml --migratable`, the XML a migration sends "
            f"({yes(c['in_migratable_xml'])}), and not in the persistent definition "
            f"(`--inactive`: {yes(c['in_inactive_xml'])})."]
    mig = res.get("migration") or {}
    mig_lines = ["", "**Live migration**: " + mig.get("text", "not tried (`--flows`).")]
    carry = [t for t in trials if t["mode"] in ("carry", "rev")]
    cold_arrived = sum(1 for t in trials if t["mode"] == "cold"
                       and any("arrived with" in x for x in t["b_log"]))
    cur = res.get("current") or "?"
    head = (
        f"The current code: {cur[:10]}{cur[40:]} ("
        + (f"`--current-rev {args.current_rev}`, a git worktree" if args.current_rev
           else "this checkout")
        + ")" + (f"; {rev}: {res['rev_sha'][:10]} (a git worktree)" if has_rev else "")
        + ". "
        f"Real libvirtd; a domain (KVM, no guest OS, 64 MiB, running) with one raw writethrough "
        f"disk of {fmt(args.image_size)} (random data); the guest: 64 KiB reads at random "
        f"offsets of a {fmt(args.zone)} zone at {fmt(args.zone_offset)} through QEMU's block "
        f"layer (`qemu-io` over the monitor, as fast as it answers: the monitor's round trip, "
        f"~1.7 ms, bounds reads/s; QEMU's own time per read, from its log, is the guest's "
        f"latency). Daemon A (`vmdisktouch run --libvirt --uri {URI} --max-hold "
        f"{fmt(args.budget)} --min-free 0 --state-dir A --carry-interval 2`) learns the zone "
        f"until the summary in the domain's metadata covers 90 % of it; the reads stop; "
        f"`virsh save` (or `managedsave --running`; or nothing, for the migration); A stops; "
        f"the image is evicted from the page cache; daemon B starts with an empty state dir "
        f"(carry: its defaults, 5 s cycles; cold: `--carry-heat off`"
        + (f"; {rev} (carry): the carry mode with {rev}'s daemon as B, from a git worktree, "
           f"A the current code" if has_rev else "")
        + f"); then `virsh restore "
        f"--running` (or `virsh start`, or `virsh migrate --live` to a second libvirtd on this "
        f"machine, which B serves); the reads resume as the command returns. B's status polled "
        f"every {POLL:g} s. **From the resume**: from the first time libvirt reported the "
        f"domain running at the destination (`virDomainGetState` RUNNING, polled every "
        f"{STATE_POLL:g} s on a connection of its own from the command's start), the figure "
        f"the goal (≤ 2 s) is about; from the command: from the command's start (the current "
        f"code holds nothing for a domain until it runs: issue 40's arrival rule, so this "
        f"includes the restore or migration). The guest's reads over the {WINDOW:g} s after "
        f"the command returned. {args.rounds} rounds, "
        + ("A B C then C B A" if has_rev else "A B then B A")
        + f" ({', '.join(names[x] for x in modes)}), medians. The summary was in the XML the "
        f"domain travelled "
        f"with (`save-image-dumpxml`, `managedsave-dumpxml`, `dumpxml --migratable`) in "
        f"{sum(1 for t in carry if t.get('in_saved_xml'))} of {len(carry)} carry"
        f"{' and rev' if has_rev else ''} trials; "
        f"B logged its arrival with the carried heat in "
        f"{sum(1 for t in carry if any('arrived with the heat carried' in x for x in t['b_log']))}"
        f" of {len(carry)} (cold: {cold_arrived}). Other sessions' tests share this libvirtd; "
        f"a `vmdisktouch run --libvirt` of theirs would serve this domain too: a trial during "
        f"which one ran, or whose zone was more than {CONTAMINATED:.0%} cached at the command, "
        f"was run again (up to {args.retries} times; {len(res['discarded'])} discarded; "
        f"{sum(1 for t in trials if t['contaminated'])} kept anyway, marked †).\n\n")
    return head + "\n".join(side + ["", "The guest's reads in the first " f"{WINDOW:g} s after "
                                     "the command returned (medians):", ""] + reads
                             + ["", "Every trial:", ""] + lines + cost_lines + mig_lines)


def migration_text(res: dict, dst_error: str | None, dst_host: str | None) -> str:
    m = [t for t in res["trials"] if t["flow"] == "migrate"]
    if dst_error is not None:
        return (f"could not be set up here: {dst_error}. What is shown instead: the element is "
                f"in `dumpxml --migratable` (the XML a migration sends, above) and travels "
                f"through save/restore and managedsave. Left untested: a real migration "
                f"(Begin/Prepare/Finish with the element), B at a destination.")
    if not m:
        return "not run (`--flows`)."
    return (f"measured above (flow `migrate`): a second libvirtd on this machine in its own "
            f"mount and UTS namespaces (hostname `{dst_host}`, its own host UUID, sockets, "
            f"run/state/log dirs; same network namespace and files), `virsh migrate --live "
            f"--unsafe` with `--migrateuri tcp://127.0.0.1:PORT`; B serves that libvirtd "
            f"(`--uri qemu+unix:///system?socket=...`). Not tested: two hosts (a real "
            f"network, clocks apart: `saved-at` is checked against a 60 s slack), a "
            f"destination whose page cache differs from the source's (here both are one: the "
            f"image is evicted before the migration instead), and a migration with the guest "
            f"reading during it (the reads stop for it, as for a save).")


def git_head() -> str:
    """This checkout's commit, with ``+changes`` when its vmdisktouch/ differs from it."""
    def run(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = run("status", "--porcelain", "--", "vmdisktouch").strip()
    return run("rev-parse", "HEAD").strip() + (" +changes" if dirty else "")


def alive(conn) -> bool:
    """Whether the libvirtd of ``conn`` still answers on it (not one started since)."""
    try:
        conn.getLibVersion()
        return conn.isAlive() == 1
    except Exception:  # noqa: BLE001 - a dead connection
        return False


def reconnect(ro, guest: Guest):
    """A new read-only connection for ``ro``, and the guest's connections dropped."""
    libvirt, _ = _libvirt()
    for c in [ro, *guest.conns.values()]:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - a dead connection
            pass
    guest.conns.clear()
    return libvirt.openReadOnly(URI)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-size", type=parse_size, default=2 * GiB)
    ap.add_argument("--zone", type=parse_size, default=256 * MiB)
    ap.add_argument("--zone-offset", type=parse_size, default=GiB)
    ap.add_argument("--budget", type=parse_size, default=384 * MiB)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flows", default=",".join(FLOWS))
    ap.add_argument("--read-rate", type=float, default=0.0,
                    help="cap on the guest's reads per second (0: as fast as the monitor answers)")
    ap.add_argument("--learn-timeout", type=float, default=120.0)
    ap.add_argument("--hold-timeout", type=float, default=90.0)
    ap.add_argument("--retries", type=int, default=2,
                    help="run a trial again when another session's --libvirt daemon ran "
                         "meanwhile or the zone was cached at the command")
    ap.add_argument("--quiet-wait", type=float, default=120.0,
                    help="before each trial, wait at most this long for other sessions' "
                         "--libvirt daemons to end")
    ap.add_argument("--cost-calls", type=int, default=300)
    ap.add_argument("--cost-reps", type=int, default=3)
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    add_compare_rev(ap)
    ap.add_argument("--current-rev", metavar="REV",
                    help="run the current code's daemons from a git worktree of REV (e.g. HEAD) "
                         "instead of this checkout, whose files may change while it runs")
    args = ap.parse_args()
    flows = [f.strip() for f in args.flows.split(",") if f.strip()]
    bad = set(flows) - set(FLOWS)
    if bad:
        ap.error(f"--flows: unknown {', '.join(sorted(bad))} (of {', '.join(FLOWS)})")
    exit_on_sigterm("bench_carry_heat")
    print(f"{machine()}; {fmt(args.image_size)} image, zone {fmt(args.zone)} at "
          f"{fmt(args.zone_offset)}, budget {fmt(args.budget)}, {args.rounds} rounds, "
          f"flows {', '.join(flows)}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-carry-", dir=args.dir))
    res: dict = {"trials": [], "discarded": []}
    guest = doms = dst = ro = None
    dst_error = None
    stack = contextlib.ExitStack()
    try:
        tree = enter_rev_worktree(stack, args.compare_rev) if args.compare_rev else None
        cur_tree = (enter_rev_worktree(stack, args.current_rev, say=lambda x: print(
            x.replace("--compare-rev", "--current-rev"), flush=True))
            if args.current_rev else None)
        res["current"] = cur_tree.sha if cur_tree else git_head()
        res["rev_sha"] = tree.sha if tree else None
        modes = list(MODES) + (["rev"] if tree is not None else [])
        ensure_daemons(tmp)
        img = data_image(tmp / "carry.raw", args.image_size)
        with open(img, "r+b") as f:            # nothing bootable: SeaBIOS gives up
            f.write(bytes(4096))
            os.fsync(f.fileno())
        evict(img)
        doms = Domains(tmp)
        if "migrate" in flows:
            try:
                dst = PrivateLibvirtd(tmp, name="dst")
                print(f"  second libvirtd (hostname {dst.hostname}) at {dst.uri}", flush=True)
            except Exception as exc:  # noqa: BLE001 - reported: the flow is left out
                dst_error = str(exc)
                print(f"  no second libvirtd: {dst_error}", flush=True)
                flows.remove("migrate")
        guest = Guest((args.zone_offset, args.zone), args.read_rate)
        libvirt, _ = _libvirt()
        ro = libvirt.openReadOnly(URI)
        for k, order in enumerate(round_orders(modes, args.rounds)):
            for flow in flows:
                for mode in order:
                    for attempt in range(1 + args.retries):
                        waited = wait_quiet(args.quiet_wait)
                        if waited > 1:
                            print(f"  waited {waited:.0f} s for other sessions' --libvirt "
                                  f"daemons to end", flush=True)
                        try:
                            t = trial(flow, mode, args, img, tmp, doms, guest, ro, k, dst,
                                      tree, cur_tree)
                        except Exception as exc:  # noqa: BLE001 - once: libvirtd went away
                            if alive(ro) or attempt == args.retries:
                                raise
                            # another session stopped the libvirtd it had started (and this
                            # run used): start one, reconnect, run the trial again
                            print(f"  libvirtd went away ({str(exc).splitlines()[-1][:160]}):"
                                  f" started again, the trial again", flush=True)
                            res["libvirtd_restarts"] = res.get("libvirtd_restarts", 0) + 1
                            ensure_daemons(tmp)
                            time.sleep(2)       # libvirtd takes the running QEMUs back
                            doms.sweep()
                            ro = reconnect(ro, guest)
                            continue
                        if not t["contaminated"] or attempt == args.retries:
                            break
                        res["discarded"].append(t)
                        print("  discarded (another daemon, or the zone cached): again",
                              flush=True)
                    res["trials"].append(t)
        if not args.no_cost:
            res["cost"] = cost(args, img, doms)
        res["migration"] = {"error": dst_error,
                            "text": migration_text(res, dst_error,
                                                   dst.hostname if dst else None)}
        res["guest_errors"] = guest.errors
    finally:
        if ro is not None:
            ro.close()
        if guest is not None:
            guest.close()
        if doms is not None:
            doms.cleanup()
            if res.get("libvirtd_restarts"):
                doms.sweep()
        if dst is not None:
            dst.close()
        stop_daemons()
        stack.close()
        if args.keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    body = report(res, args)
    publish(body, res, args, "carry-heat", "Heat carried in the domain's metadata")
    print()
    def num(x):
        return "—" if x is None else f"{x:.2f}"

    for flow, r in res["ratios"].items():
        fr = ", ".join(f"{x} {after_text(v, '.2f')}" for x, v in r["resume"].items())
        print(f"{flow}: 90 % held after the resume: {fr}; carry ÷ cold {num(r['held'])}"
              + (f", carry ÷ {args.compare_rev} {num(r['held_rev'])}" if args.compare_rev
                 else "")
              + f"; from the command carry ÷ cold {num(r['held_command'])}; QEMU's mean read "
              f"in the first {WINDOW:g} s carry ÷ cold {num(r['qemu_mean'])}; reads/s "
              f"{num(r['reads'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
