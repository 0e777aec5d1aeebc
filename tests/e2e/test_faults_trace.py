"""Fault table, part 3: the trace source under faults (issue 31: "broke 1", "weak 1", "weak 2").

A real ``vmdisktouch run`` with the trace access source (the default where
tracefs works, ``--access-source trace`` here) on a real data image, on the
real tracefs; the test is the guest (its reads come from this process) and
the fault: a block size the events' sixteenths do not divide, its tracefs
instance changed from outside (``echo 0 > events/enable``, ``tracing_on``, a
filter, ``set_event_pid``, all of them as ``trace-cmd reset`` does), the
daemon killed or tracefs unmounted under it. Where an instance must age
past the sweep's margin (3 s) the test keeps one of its files open
meanwhile, so no other daemon on this host sweeps it first. See
``tests/support/faultkit.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.support.faultkit import LAUNCHER, MiB, Untouched, assert_clean, fault, more_cycles, rows_of
from tests.support.faultkit import image  # noqa: F401 - the rows' fixture
from tests.support.common import require_tool, without_bpf
from tests.support.pagecache import data_image, read_range
from tests.support.sandbox_exec import parse_unit
from tests.support.tracing import tracefs_root  # noqa: F401 - the test's fixture
from tests.support.common import ROOT
from tests.support.daemon_proc import DaemonProc
from vmdisktouch.daemon import sources
from vmdisktouch.daemon.sources import instance_name
from vmdisktouch.system.trace import tracefs

HOT = (8 * MiB, 6 * MiB)          # held first
NEW = (20 * MiB, 6 * MiB)         # the guest's next hot zone
FAST = ("--uri", "", "--min-free", "0", "--interval", "0.2", "--decay", "1",
        "--access-source", "trace")
EVENTS = ("filemap/mm_filemap_get_pages", "writeback/writeback_dirty_folio",
          "filemap/mm_filemap_add_to_page_cache", "filemap/mm_filemap_delete_from_page_cache")
SWEEP_AGE = getattr(tracefs, "SWEEP_MIN_AGE", 3.0) + 0.5   # (3.0: the code before #31)
ONCE = ("one WARNING line naming the instance; `new` held within 20 s; every switch read "
        "back as set up; exit 0 on SIGTERM within 5 s; the instance removed")


def where(image) -> str:
    return os.path.join(tracefs.find_root(), "instances", instance_name(str(image)))


def put(path: str, text: str) -> None:
    """``echo TEXT > PATH``, as a shell (or ``trace-cmd reset``) writes a tracefs file."""
    with open(path, "w") as f:
        f.write(text + "\n")


def get(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


# -- the daemon ---------------------------------------------------------------------------

def serving(tmp_path, image, *args, **kw) -> DaemonProc:
    """A daemon with the trace source holding ``HOT`` (the test reads it until it is held)."""
    d = DaemonProc(tmp_path, image, "--max-hold", "16M", *FAST, "--debug", *args, **kw)
    try:
        d.wait_output("cycle 1:", "the first cycle")
        assert "access source: trace" in d.output(), d.output()[-2000:]
        held_zone(d, image, HOT)
    except BaseException:
        d.stop()
        raise
    return d


def overlap(regions, zone) -> int:
    lo, hi = zone[0], zone[0] + zone[1]
    return sum(max(0, min(hi, o + n) - max(lo, o)) for o, n in regions)


def held_zone(d: DaemonProc, image, zone, timeout: float = 20.0) -> dict:
    """Read ``zone`` as a guest would until the daemon holds at least half of it."""
    return d.wait_status(lambda s: overlap(s.get("regions", []), zone) >= zone[1] // 2,
                         f"the zone at {zone[0] >> 20} MiB held", timeout=timeout,
                         drive=lambda: read_range(image, *zone))


def stopped_cleanly(d: DaemonProc, within: float = 5.0) -> None:
    t0 = time.monotonic()
    rc, _ = d.terminate(timeout=30)
    took = time.monotonic() - t0
    out = d.output()
    d.cleanup()
    assert rc == 0, out[-2000:]
    assert took < within, f"SIGTERM took {took:.1f} s"
    assert "released all holds" in out
    assert_clean(out)


def as_set_up(inst: str) -> None:
    """Every switch of the daemon's instance reads as the daemon set it up: the read event
    off (reads are counted in the kernel, as root), the three others on and filtered."""
    assert get(f"{inst}/tracing_on") == "1"
    assert "[mono]" in get(f"{inst}/trace_clock").split()
    assert get(f"{inst}/set_event_pid") == ""
    assert get(f"{inst}/events/{EVENTS[0]}/enable") == "0"
    for ev in EVENTS[1:]:
        assert get(f"{inst}/events/{ev}/enable") == "1", ev
        assert "ino == " in get(f"{inst}/events/{ev}/filter"), ev


def warnings_about(out: str, needle: str) -> list[str]:
    return [ln for ln in out.splitlines() if " WARNING " in ln and needle in ln]


# -- 31 broke 1: block sizes that are not a multiple of 64 KiB -------------------------------

def _block_size(size: str):
    def check(tmp_path, image):
        d = DaemonProc(tmp_path, image, "--max-hold", "16M", "--block-size", size, *FAST,
                       "--debug")
        try:
            d.wait_output("cycle 1:", "the first cycle")
            st = held_zone(d, image, HOT)
            assert st["access_source"] == "trace" and st["block_size"] == int(size[:-1]) * 1024
            inst = where(image)
            assert os.path.isdir(inst)
        finally:
            stopped_cleanly(d)
        assert not os.path.exists(inst)
    return check


for _size in ("4K", "8K", "32K", "60K"):
    fault(f"trace-block-size-{_size}", f"`run IMG --max-hold 16M --block-size {_size} --uri ''` "
          "with the trace source (a block of fewer than 16 pages, or not a multiple of 16: the "
          "writes are counted in sixteenths of a block)",
          "any multiple of the page size serves with the trace source (a written page counts "
          "for each sixteenth it overlaps); never exit 70, never an instance left behind",
          "access source trace, the hot zone held, exit 0 on SIGTERM within 5 s, the instance "
          "removed", "31 broke 1")(_block_size(_size))


@fault("trace-source-fails-after-its-instance", "in-process: the trace source cannot be made "
       "once its tracefs instance exists (`TraceSource` raises)", "the error goes up; the "
       "instance is removed on the way (exit 70 leaves no instance recording)",
       "the exception raised, no instance directory left", "31 broke 1")
def _(tmp_path, image):
    from vmdisktouch.config import settings
    from vmdisktouch.system.image import open_image
    from vmdisktouch.system.observe.residency_tracker import ResidencyTracker
    cfg = settings.resolve({"max_hold": "16M", "min_free": 0, "access_source": "trace"})
    img = open_image(image)
    real = sources.TraceSource

    class Broken(real):
        def __init__(self, *a, **k):
            raise RuntimeError("injected")

    sources.TraceSource = Broken
    try:
        with pytest.raises(RuntimeError, match="injected"):
            sources.choose(img, cfg, ResidencyTracker(img, cfg.block_size), lambda: None,
                           img.block_count(cfg.block_size))
        assert not os.path.exists(where(image))
    finally:
        sources.TraceSource = real
        if os.path.isdir(where(image)):                     # the old code's leftover
            tracefs.Instance(tracefs.find_root(), instance_name(str(image))).remove()
        img.close()


# -- 31 weak 1: the instance changed from outside -----------------------------------------------

def _changed(tamper, needle: str = "changed from outside", cycles: int = 3):
    def check(tmp_path, image):
        d = serving(tmp_path, image)
        inst = where(image)
        try:
            tamper(inst)
            held_zone(d, image, NEW)
            more_cycles(d, cycles)
            found = warnings_about(d.output(), needle)
            assert len(found) == 1, d.output()[-3000:]
            assert instance_name(str(image)) in found[0]
            as_set_up(where(image))
        finally:
            stopped_cleanly(d)
        assert not os.path.exists(inst)
    return check


def _trace_cmd_reset(inst: str) -> None:
    """What ``trace-cmd reset`` does to an instance's switches."""
    put(f"{inst}/tracing_on", "0")
    put(f"{inst}/events/enable", "0")
    for ev in EVENTS:
        put(f"{inst}/events/{ev}/filter", "0")
    put(f"{inst}/trace_clock", "local")


for _id, _what, _tamper in (
        ("events-disabled", "`echo 0 > INST/events/enable`",
         lambda inst: put(f"{inst}/events/enable", "0")),
        ("tracing-off", "`echo 0 > INST/tracing_on`",
         lambda inst: put(f"{inst}/tracing_on", "0")),
        ("filter-replaced", "`echo 'i_ino == 1' > INST/events/filemap/"
         "mm_filemap_add_to_page_cache/filter`",
         lambda inst: put(f"{inst}/events/{EVENTS[2]}/filter", "i_ino == 1")),
        ("trace-cmd-reset", "what `trace-cmd reset` does: `tracing_on` 0, every event "
         "disabled, every filter cleared, `trace_clock` local", _trace_cmd_reset)):
    fault(f"trace-instance-{_id}", f"while the daemon holds one hot zone, {_what} on its "
          "tracefs instance, then the guest reads a new hot zone", "the daemon notices within "
          "a few cycles (three small reads a cycle), sets the instance back, says so once, "
          "and the new zone is held (that cycle's evidence from the page cache)", ONCE,
          "31 weak 1")(_changed(_tamper))


fault("trace-instance-blind-otherwise", "while the daemon holds one hot zone, `echo 1 > "
      "INST/set_event_pid` (no switch its quick checks read changes, the buffer's events stop; "
      "the reads, counted in the kernel, go on), then the guest reads a new hot zone", "at "
      "the next scheduled mincore pass (12 cycles) the full check finds the pid filter: set "
      "back, said once, and the new zone held", ONCE,
      "31 weak 1")(_changed(lambda inst: put(f"{inst}/set_event_pid", "1"), cycles=14))


# -- 31 weak 2: instances left behind -------------------------------------------------------------

def aged(inst: str) -> None:
    """Hold a file of ``inst`` open (no daemon on this host sweeps it) until it is older
    than the sweep's margin."""
    fd = os.open(f"{inst}/tracing_on", os.O_RDONLY)
    try:
        time.sleep(max(0.0, os.stat(inst).st_ctime + SWEEP_AGE - time.time()))
    finally:
        os.close(fd)


def killed(tmp_path, image, log: str) -> str:
    """A daemon SIGKILLed: its instance left behind, still recording; the instance's path."""
    d = DaemonProc(tmp_path, image, "--max-hold", "8M", *FAST, "--debug", log=log,
                   status=log + ".json")
    try:
        d.wait_output("cycle 1:", "the first cycle")
    except BaseException:
        d.stop()
        raise
    inst = where(image)
    os.kill(d.pid, signal.SIGKILL)                     # not d.kill(): its cleanup removes it
    d.proc.wait(30)
    for f in d._files:
        f.close()
    assert get(f"{inst}/events/{EVENTS[1]}/enable") == "1"     # left recording
    aged(inst)
    return inst


@fault("trace-instance-of-a-killed-daemon", "a daemon is SIGKILLed (its tracefs instance "
       "stays, recording every I/O on its image), then a daemon starts on another image",
       "any daemon's start removes the instances whose owners are gone, and says which",
       "the other daemon's log names the instance removed; it is gone; a live daemon's "
       "instance is left alone", "31 weak 2")
def _(tmp_path, image):
    other = data_image(tmp_path / "other.img", 32 * MiB)
    live = serving(tmp_path, other, log="live.log", status="live.json")
    try:
        inst = killed(tmp_path, image, "killed.log")
        d = DaemonProc(tmp_path, data_image(tmp_path / "third.img", 8 * MiB), "--max-hold",
                       "8M", *FAST, "--debug", log="third.log", status="third.json")
        try:
            out = d.wait_output("cycle 1:", "the first cycle")
            assert not os.path.exists(inst)
            assert f"removed the stale instance {inst}" in out, out[-2000:]
            assert os.path.isdir(where(other))           # in use: left alone
            more_cycles(live, 2)
        finally:
            stopped_cleanly(d)
    finally:
        stopped_cleanly(live)
        if os.path.isdir(where(image)):
            tracefs.Instance(tracefs.find_root(), instance_name(str(image))).remove()


def _glob(name: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", name)


def stop_post(name: str) -> subprocess.CompletedProcess:
    """The unit's ``ExecStopPost=`` as systemd runs it, its ``find`` narrowed to ``name``
    (the other vmdisktouch instances of this host are not this test's)."""
    unit = parse_unit((ROOT / "systemd" / "vmdisktouch@.service").read_text())
    (line,) = unit["Service"]["ExecStopPost"]
    argv = shlex.split(line.lstrip("+-:@!"))
    assert argv[:2] == ["/bin/sh", "-c"] and '"vmdisktouch@*"' in argv[2], argv
    argv[2] = argv[2].replace('"vmdisktouch@*"', shlex.quote(_glob(name)))
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@fault("trace-instance-at-unit-stop", "a daemon under the unit is SIGKILLed (the watchdog, "
       "the OOM killer), then the unit stops", "the unit's ExecStopPost removes the instances "
       "no live process holds, and logs each; a running daemon's instance stays",
       "`removed the tracefs instance left behind:` the killed daemon's, it is gone; a live "
       "daemon's is not removed and it keeps cycling", "31 weak 2")
def _(tmp_path, image):
    other = data_image(tmp_path / "other.img", 32 * MiB)
    live = serving(tmp_path, other, log="live.log", status="live.json")
    try:
        aged(where(other))
        r = stop_post(instance_name(str(other)))
        assert os.path.isdir(where(other)) and r.stdout == "", r
        inst = killed(tmp_path, image, "killed.log")
        r = stop_post(instance_name(str(image)))
        assert r.stdout == f"removed the tracefs instance left behind: {inst}\n", r
        assert not os.path.exists(inst)
        more_cycles(live, 2)
    finally:
        stopped_cleanly(live)
        if os.path.isdir(where(image)):
            tracefs.Instance(tracefs.find_root(), instance_name(str(image))).remove()


@fault("tracefs-unmounted-under-the-daemon", "tracefs is unmounted under the running daemon "
       "(`umount -l /sys/kernel/tracing` in its mount namespace), the guest reads a new hot "
       "zone, then SIGTERM", "the daemon keeps tracing through the descriptors it holds, and "
       "removes its instance at exit", "the new zone held, exit 0 within 5 s, the instance "
       "gone (seen from the host's tracefs), no `was gone already`", "31 weak 2")
def _(tmp_path, image):
    prefix = [require_tool("unshare"), "--mount", "--propagation", "private"]
    d = serving(tmp_path, image, prefix=prefix)
    inst = where(image)
    try:
        subprocess.run([require_tool("nsenter"), "-t", str(d.pid), "-m", require_tool("umount"),
                        "-l", "/sys/kernel/tracing"], check=True, timeout=30)
        held_zone(d, image, NEW)
        more_cycles(d, 13)                          # a scheduled pass and its probe too
        assert not warnings_about(d.output(), "trace:"), d.output()[-2000:]
        rc, took = d.terminate(timeout=30)
        assert rc == 0 and took < 5, (rc, took, d.output()[-2000:])
        left = os.path.exists(inst)                 # before d.cleanup() removes a leftover
    finally:
        out = d.output()
        d.stop()
    assert not left, "the instance was left behind"
    assert "released all holds" in out and "was gone already" not in out
    assert_clean(out)


# -- SIGTERM on these paths ---------------------------------------------------------------------

TRACE_PHASES = {   # phase -> (what to wrap, what makes the daemon reach it after cycle 1)
    "sweep": ("vmdisktouch.system.trace.tracefs:sweep", None),
    "instance-check": ("vmdisktouch.system.trace.tracefs:Instance.check", None),
    "instance-restore": ("vmdisktouch.system.trace.tracefs:Instance.restore",
                         lambda inst: put(f"{inst}/events/enable", "0")),
    "probe": ("vmdisktouch.system.trace.trace_reader:TraceReader.probe", None),
    "instance-remade": ("vmdisktouch.daemon.sources:TraceSource._unseen",
                        lambda inst: put(f"{inst}/set_event_pid", "1")),
}
# The probe's read of a daemon that counts reads in the kernel always comes back: the
# instance is remade only where reads are events, as without CAP_BPF and CAP_PERFMON.
PHASE_PREFIX = {"instance-remade": without_bpf}


def _sigterm_in(phase: str):
    def check(tmp_path, image):
        target, trigger = TRACE_PHASES[phase]
        logf = tmp_path / "daemon.log"
        argv = ["run", image, "--max-hold", "16M", *FAST, "--debug", "--status",
                tmp_path / "s.json"]
        with open(logf, "w") as log:
            proc = subprocess.Popen([*PHASE_PREFIX.get(phase, list)(), sys.executable, "-c",
                                     LAUNCHER, target, "1", str(int(signal.SIGTERM)),
                                     *map(str, argv)], stdout=log, stderr=subprocess.STDOUT,
                                    cwd=ROOT)
        deadline, triggered = time.monotonic() + 60, False
        try:
            while "INJECT" not in logf.read_text():
                assert proc.poll() is None, logf.read_text()[-2000:]
                assert time.monotonic() < deadline, "the phase was never reached"
                read_range(image, *HOT)
                if trigger and not triggered and "cycle 1:" in logf.read_text():
                    trigger(where(image))
                    triggered = True
                time.sleep(0.05)
            t0 = time.monotonic()
            rc = proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out = logf.read_text()
        assert rc == 0, out[-2000:]
        assert time.monotonic() - t0 < 5
        assert "received SIGTERM" in out and "released all holds" in out, out[-2000:]
        assert_clean(out)
        assert not os.path.exists(where(image)), "the instance was left behind"
    return check


for _phase in TRACE_PHASES:
    fault(f"sigterm-during-trace-{_phase}", f"SIGTERM arrives during the trace source's "
          f"{_phase} (sent from inside it)", "the daemon ends the cycle, releases everything, "
          "removes its instance and exits 0", "exit 0 within 5 s, `received SIGTERM`, "
          "`released all holds`, no instance left", "31 weak 1" if "instance-" in _phase
          or _phase == "probe" else "31 weak 2")(_sigterm_in(_phase))


# -- the table's own test -------------------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_trace_fault(row, tmp_path, image, tracefs_root):  # noqa: F811
    kept = Untouched(image)
    assert row.check(tmp_path, image) is None
    kept.check()
