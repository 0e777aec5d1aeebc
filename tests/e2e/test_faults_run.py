"""Fault table, part 2: faults while the daemon serves an image.

A real ``vmdisktouch run`` holds a hot zone of a real data image (the test
reads it, as a guest would), a fault is injected, and the row checks that
the daemon keeps cycling, releases what it cannot keep, stays within its
budget, never writes the image and says what happened once. A few rows
inject at an internal seam (``in-process``): a failing ``mlock``, an
unreadable MemAvailable, a clock jump. See ``tests/support/faultkit.py``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from PIL import Image

from tests.support.faultkit import (EX_TEMPFAIL, LAUNCHER, MiB, Untouched, assert_clean, fault,
                            more_cycles, rows_of)
from tests.support.faultkit import image  # noqa: F401 - the rows' fixture
from tests.support.common import require_tool
from tests.support.pagecache import data_image, read_range
from tests.support.common import ROOT
from vmdisktouch.daemon.sources import RECONCILE_EVERY
from tests.support.daemon_proc import DaemonProc
from tests.support.procfs import vmlck
from vmdisktouch.daemon.host import host_of
from vmdisktouch.system.observe import checksums
from vmdisktouch.system.hold import holder
from vmdisktouch.system import libc
from vmdisktouch import errors
from vmdisktouch.config import settings
from vmdisktouch.daemon.build import build
from vmdisktouch.system.image import open_image

HOT = (8 * MiB, 6 * MiB)
FAST_INTERVAL = 0.2
FAST = ("--uri", "", "--min-free", "0", "--interval", str(FAST_INTERVAL), "--decay", "1")
SERVE = "the daemon keeps cycling and holding; the image is untouched"


def serving(tmp_path, image, *args, budget="16M", debug=True, **kw) -> DaemonProc:
    """A daemon holding the hot zone (the test reads it until it is held). With --debug
    (not for a fault that ends the daemon: that must stay one line, no traceback): a
    quiet cycle's line is a DEBUG line, and ``more_cycles`` counts the lines where the
    fault keeps the status file from being written."""
    d = DaemonProc(tmp_path, image, "--max-hold", budget, *FAST,
                   *(["--debug"] if debug else []), *args, **kw)
    try:
        d.wait_output("cycle 1:", "the first cycle")
        hold(d, image)
    except BaseException:
        d.stop()
        raise
    return d


def hold(d: DaemonProc, image, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while d.vmlck() == 0:
        assert time.monotonic() < deadline, f"nothing held; log:\n{d.output()[-2000:]}"
        assert d.proc.poll() is None, d.output()[-2000:]
        read_range(image, *HOT)
        time.sleep(0.1)


def stopped_cleanly(d: DaemonProc, within: float = 5.0) -> None:
    t0 = time.monotonic()
    rc = d.stop()
    assert rc == 0, d.output()[-2000:]
    assert time.monotonic() - t0 < within
    assert "released all holds" in d.output()
    assert_clean(d.output())


def reload_rejected(tmp_path, image, change, *args, status="status.json") -> str:
    """Serve with a config file, ``change(cfg)``, SIGHUP: the reload is rejected, cycles go on."""
    cfg = tmp_path / "vm.toml"
    cfg.write_text('max_hold = "16M"\n')
    d = serving(tmp_path, image, "--config", cfg, *args, status=status)
    try:
        change(cfg)
        d.signal(signal.SIGHUP)
        out = d.wait_output("reload rejected", timeout=10)
        more_cycles(d)
        return out
    finally:
        stopped_cleanly(d)


# -- 3. signals: never a deadlock, never a lost stop ------------------------------------

PHASES = {   # phase -> (module attribute to wrap, on which call)
    "scan": ("vmdisktouch.system.observe.residency_tracker:ResidencyTracker.scan", 3),
    "checksums": ("vmdisktouch.system.observe.checksums:BlockChecksums.update", 3),   # mincore only
    "trace-drain": ("vmdisktouch.system.trace.trace_reader:TraceReader.drain", 3),
    "heat": ("vmdisktouch.core.heat:step", 3),
    "select": ("vmdisktouch.core.regions:allocate", 3),
    "load": ("vmdisktouch.system.files:read_ahead", 1),
    "emit": ("vmdisktouch.adapters.outputs:Outputs.write", 3),
    "reload": ("vmdisktouch.daemon.service:load_settings", 2),
    "wait": ("vmdisktouch.system.signals:LoopSignals.wait", 3),
}

def launch(tmp_path, target: str, nth: int, sig: int, *argv) -> subprocess.Popen:
    log = open(tmp_path / "daemon.log", "w+")
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, target, str(nth), str(int(sig)),
                             *map(str, argv)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _sigterm_in(phase: str):
    def check(tmp_path, image):
        target, nth = PHASES[phase]
        cfg = tmp_path / "vm.toml"
        cfg.write_text('max_hold = "16M"\n')
        source = ["--access-source", "mincore"] if phase == "checksums" else []
        argv = ["run", image, "--config", cfg, *FAST, *source, "--load-rate", "1M",
                "--status", tmp_path / "s.json"]
        proc = launch(tmp_path, target, nth, signal.SIGTERM, *argv)
        deadline = time.monotonic() + 40
        try:
            while "INJECT" not in (tmp_path / "daemon.log").read_text():
                assert proc.poll() is None, (tmp_path / "daemon.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the phase was never reached"
                read_range(image, *HOT)
                if phase == "reload" and "cycle 1:" in (tmp_path / "daemon.log").read_text():
                    proc.send_signal(signal.SIGHUP)
                time.sleep(0.05)
            t0 = time.monotonic()
            rc = proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out = (tmp_path / "daemon.log").read_text()
        assert rc == 0, out[-2000:]
        assert time.monotonic() - t0 < 5
        assert "received SIGTERM" in out and "released all holds" in out, out[-2000:]
        assert_clean(out)
    return check


for _phase in PHASES:
    fault(f"sigterm-during-{_phase}", f"SIGTERM arrives during the cycle's {_phase} phase "
          "(sent from inside the phase)",
          "the daemon ends the cycle, releases everything and exits 0 (no deadlock)",
          "exit 0 within 5 s, `received SIGTERM`, `released all holds`", "3")(
        _sigterm_in(_phase))


@fault("sighup-interval-nan", "`interval = nan` written to the config, then SIGHUP, then "
       "SIGTERM", "the reload is rejected, the old settings stay, SIGTERM still works",
       "`reload rejected`, more cycles, exit 0 within 5 s", "3")
def _(tmp_path, image):
    reload_rejected(tmp_path, image,
                    lambda cfg: cfg.write_text('max_hold = "16M"\ninterval = nan\n'))


@fault("sighup-flood", "2000 SIGHUPs as fast as another process can send them", "the "
       "reloads are coalesced; the daemon keeps cycling and stops on SIGTERM",
       "fewer reloads than signals, more cycles, exit 0, no RecursionError", "3")
def _(tmp_path, image):
    cfg = tmp_path / "vm.toml"
    cfg.write_text('max_hold = "16M"\n')
    d = serving(tmp_path, image, "--config", cfg)
    try:
        subprocess.run([sys.executable, "-c", "import os, sys, signal\n"
                        "for _ in range(2000): os.kill(int(sys.argv[1]), signal.SIGHUP)",
                        str(d.pid)], check=True, timeout=30)
        more_cycles(d)
        reloads = d.output().count("reloaded settings")
        assert 1 <= reloads < 2000, reloads
        assert "RecursionError" not in d.output()
    finally:
        stopped_cleanly(d)


@fault("two-reloads-in-one-cycle", "two SIGHUPs while one cycle runs (sent from inside its "
       "heat step)", "one reload, after the cycle", "exactly one `reloaded settings` line")
def _(tmp_path, image):
    cfg = tmp_path / "vm.toml"
    cfg.write_text('max_hold = "16M"\n')
    hup = textwrap.dedent("""
        import os, signal
        from vmdisktouch.core import heat
        orig, calls = heat.step, [0]
        def step(*a, **k):
            calls[0] += 1
            if calls[0] == 2:
                os.kill(os.getpid(), signal.SIGHUP); os.kill(os.getpid(), signal.SIGHUP)
            return orig(*a, **k)
        heat.step = step
    """)
    target = tmp_path / "hup_twice.py"
    target.write_text(hup)
    proc = subprocess.Popen([sys.executable, "-c", f"exec(open({str(target)!r}).read())\n"
                             "from vmdisktouch.commands import cli; import sys; sys.exit(cli.main("
                             "sys.argv[1:]))", "run", image, "--config", cfg, *FAST],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    # An idle disk's heat steps at its full cycles only: one every RECONCILE_EVERY
    # intervals (``DiskWatcher._quiet``); the second comes after that many, and a second.
    time.sleep(RECONCILE_EVERY * FAST_INTERVAL + 3)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err[-2000:]
    assert err.count("reloaded settings") == 1, err[-2000:]
    assert_clean(err)


# -- 1 and 6 at run time: outputs ------------------------------------------------------

def _swap_status(make):
    def check(tmp_path, image):
        d = serving(tmp_path, image)
        try:
            d.wait_status(lambda s: True, "a status file")
            for _ in range(5):
                swap = f"{d.status_path}.swap"     # made aside, then renamed over it: a
                make(image, swap)                  # cycle's write between an unlink and a
                os.replace(swap, d.status_path)    # link made the link fail (EEXIST) once
                # A cycle that checked the path just before the swap renames its status
                # over the link: nothing reached the image, and the swap is made again.
                if _refused_or_replaced(d, image):
                    break
            else:
                raise AssertionError(f"the swap was replaced 5 times: {d.output()[-2000:]}")
            more_cycles(d, 4)
            out = d.output()
            assert out.count("cannot write --status") == 1, out[-2000:]
            assert "it is the disk image" in out or "it is a symbolic link" in out
            assert d.vmlck() > 0
        finally:
            stopped_cleanly(d)
    return check


def _refused_or_replaced(d, image, timeout: float = 20.0) -> bool:
    """True once the daemon logs its refusal of the swapped status path; False when a
    cycle's status replaced the swap before any refusal."""
    deadline = time.monotonic() + timeout
    while "cannot write --status" not in d.output():
        st = os.lstat(d.status_path)
        if not stat.S_ISLNK(st.st_mode) and not os.path.samestat(st, os.stat(image)):
            return "cannot write --status" in d.output()
        assert d.proc.poll() is None, f"daemon exited: {d.output()[-2000:]}"
        assert time.monotonic() < deadline, f"no refusal: {d.output()[-2000:]}"
        time.sleep(0.02)
    return True


fault("status-swapped-for-symlink", "between two cycles the status file is replaced by a "
      "symlink to the image", SERVE + "; the write is refused",
      "one `cannot write --status ... it is the disk image` line, holds kept", "1")(
    _swap_status(lambda image, status: os.symlink(image, status)))
fault("status-swapped-for-hardlink", "between two cycles the status file is replaced by a "
      "hard link of the image", SERVE + "; the write is refused",
      "one `cannot write --status` line, holds kept", "1")(
    _swap_status(lambda image, status: os.link(image, status)))


@fault("reload-output-is-image", "SIGHUP after `status = \"IMG\"` was written to the config",
       "the reload is rejected, the old settings stay", "`reload rejected ... it is the disk "
       "image`", "1")
def _(tmp_path, image):
    out = reload_rejected(tmp_path, image, lambda cfg: cfg.write_text(
        f'max_hold = "16M"\nstatus = "{image}"\n'), status=None)
    assert "it is the disk image" in out


def remove_dir(path) -> None:
    """Empty ``path`` and remove it, again if a file the daemon wrote meanwhile (its next
    status) came between the two."""
    for _ in range(50):
        for f in path.iterdir():
            f.unlink(missing_ok=True)
        try:
            path.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise AssertionError(f"{path} kept filling up")


@fault("output-dir-removed", "the output directory is removed while the daemon runs, then "
       "made again", SERVE, "one `cannot write` line per output, then `written again`", "6")
def _(tmp_path, image):
    out = tmp_path / "out"
    out.mkdir()
    d = serving(tmp_path, image, "--map-png", out / "map.png", status="out/s.json")
    try:
        remove_dir(out)
        more_cycles(d, 4)
        assert d.output().count("cannot write --status") == 1
        assert d.output().count("cannot write --map-png") == 1
        assert d.vmlck() > 0
        out.mkdir()
        d.wait_output("written again")
        d.wait_status(lambda st: st["output_errors"] >= 2, "both failed writes counted",
                      timeout=20)
    finally:
        stopped_cleanly(d)


@fault("output-enospc", "the map's file system fills up (a 256 KiB tmpfs, filled while "
       "the daemon runs)", SERVE + "; the status (elsewhere) is still written",
       "one `cannot write --map-png ... No space left` line, `output_errors` counted", "6")
def _(tmp_path, image):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        d = serving(tmp_path, image, "--map-png", mnt / "map.png")
        try:
            (mnt / "map.png").unlink()
            fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while os.write(fd, b"x" * 4096):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
            more_cycles(d, 3)
            out = d.output()
            assert out.count("cannot write --map-png") == 1 and "No space left" in out
            # A cycle's status is written before its PNG: its count lags the log by a cycle.
            d.wait_status(lambda st: st["output_errors"] >= 2, "two failed writes counted",
                          timeout=20)
            assert d.vmlck() > 0
        finally:
            stopped_cleanly(d)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@fault("output-is-mount-point", "the status path is a bind mount of another file (rename "
       "over it fails with EBUSY, as across file systems)", SERVE,
       "one `cannot write --status ... busy` line, holds kept")
def _(tmp_path, image):
    d = serving(tmp_path, image)
    other = tmp_path / "other.json"
    other.write_text('{"cycle": 0}\n')     # looks like a status file: the rename is tried
    try:
        d.wait_status(lambda s: True, "a status file")
        subprocess.run(["mount", "--bind", str(other), str(d.status_path)], check=True)
        try:
            more_cycles(d, 3)
            out = d.output()
            assert out.count("cannot write --status") == 1 and "busy" in out, out[-1500:]
            assert d.vmlck() > 0
        finally:
            subprocess.run(["umount", str(d.status_path)], check=True)
    finally:
        stopped_cleanly(d)


# -- 7. atime ---------------------------------------------------------------------------

@fault("checksums-keep-atime", "the guest writes a held block, then the checksum pass reads "
       "it (relatime would update the atime)", "no metadata write to the image",
       "the image's atime is unchanged by the checksum reads (`O_NOATIME`)", "7")
def _(tmp_path, image):
    fd = os.open(image, os.O_RDONLY)
    try:
        with open_image(image) as img:
            sums = checksums.BlockChecksums(img, MiB)
        with open(image, "r+b") as f:     # the guest's write: mtime now
            f.seek(MiB)
            f.write(os.urandom(4096))
        old = time.time_ns() - 86400 * 10**9
        os.utime(image, ns=(old, os.stat(image).st_mtime_ns))
        sums.update(np.arange(4), os.fstat(fd).st_size)
        assert os.stat(image).st_atime_ns == old
        sums.close()
    finally:
        os.close(fd)
    return "guest-wrote"


# -- 8 and more: the image changes under the daemon ----------------------------------------

@fault("image-deleted", "the image is deleted while served", "the holds are released; "
       "exit 75 (systemd restarts and finds no image: exit 66, no more restarts)",
       "exit 75, `image was deleted`", "8")
def _(tmp_path, image):
    d = serving(tmp_path, image, debug=False)
    os.unlink(image)
    assert d.proc.wait(timeout=20) == EX_TEMPFAIL
    assert "image was deleted" in d.output() and "released all holds" in d.output()
    assert_clean(d.output())
    d.stop()
    return "deleted"


@fault("image-replaced", "another file is renamed over the image path while served",
       "the holds are released; exit 75 so systemd restarts on the new file",
       "exit 75, `replaced by another file`", "8")
def _(tmp_path, image):
    d = serving(tmp_path, image, debug=False)
    new = data_image(tmp_path / "new.img", 4 * MiB)
    os.replace(new, image)
    assert d.proc.wait(timeout=20) == EX_TEMPFAIL
    assert "replaced by another file" in d.output()
    d.stop()
    return "replaced"


@fault("image-truncated-to-zero", "the image is truncated to 0 bytes, then grown back",
       "no SIGBUS; nothing held while empty; held again after", "held 0 while empty, "
       "then held again, exit 0")
def _(tmp_path, image):
    d = serving(tmp_path, image)
    try:
        os.truncate(image, 0)
        deadline = time.monotonic() + 20
        while d.vmlck():
            assert time.monotonic() < deadline and d.proc.poll() is None, d.output()[-2000:]
            time.sleep(0.1)
        more_cycles(d, 3)
        with open(image, "r+b") as f:
            f.write(os.urandom(32 * MiB))
        hold(d, image)
    finally:
        stopped_cleanly(d)
    return "rewritten"


@fault("image-grows-1g", "the image grows from 32 MiB to 1 GiB (sparse) while served",
       SERVE, "`size changed`, more cycles, holds kept")
def _(tmp_path, image):
    d = serving(tmp_path, image)
    try:
        os.truncate(image, 1 << 30)
        d.wait_output("size changed")
        more_cycles(d)
        assert d.vmlck() > 0
    finally:
        stopped_cleanly(d)
    return "grown"


@fault("image-fs-goes-read-only", "the image's file system (ext4 on a loop device) is "
       "remounted read-only while served", SERVE, "more cycles, holds kept, exit 0")
def _(tmp_path, image):
    fs = tmp_path / "fs.ext4"
    with open(fs, "wb") as f:
        f.truncate(96 * MiB)
    subprocess.run([require_tool("mkfs.ext4"), "-q", "-F", str(fs)], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(fs), str(mnt)], check=True)
    try:
        img = data_image(mnt / "disk.img", 32 * MiB)
        kept = Untouched(img)
        d = serving(tmp_path, img)
        try:
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            more_cycles(d, 4)
            assert d.vmlck() > 0
        finally:
            stopped_cleanly(d)
        kept.check()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@fault("lock-limit-lowered", "RLIMIT_MEMLOCK of a daemon without CAP_IPC_LOCK is lowered to "
       "2 MiB while it runs (`prlimit --pid`), then the guest reads", SERVE + "; never more "
       "locked than the new limit", "one `mlock refused` line, VmLck <= 2 MiB, more cycles")
def _(tmp_path, image):
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    limit = 8 * MiB if hard == resource.RLIM_INFINITY else min(8 * MiB, hard // MiB * MiB)
    assert limit >= 4 * MiB, f"RLIMIT_MEMLOCK hard limit {hard} is too low for this row"
    prefix = [require_tool("prlimit"), f"--memlock={limit}:{limit}",   # lowering: always allowed
              require_tool("setpriv"), "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
    d = DaemonProc(tmp_path, image, "--max-hold", str(limit), *FAST, prefix=prefix)
    try:
        d.wait_output("cycle 1:")
        subprocess.run([require_tool("prlimit"), "--pid", str(d.pid),
                        "--memlock=2097152:2097152"], check=True)
        d.wait_output("mlock refused", drive=lambda: read_range(image, *HOT))
        more_cycles(d, 4)
        assert d.output().count("mlock refused") == 1
        assert d.vmlck() <= 2 * MiB
    finally:
        stopped_cleanly(d)


# -- in process: faults at the seams ----------------------------------------------------------

def _watcher(image, budget="16M", **kw):
    cfg = settings.resolve({"max_hold": budget, "interval": 1.0, "min_free": 0, "decay": 1.0,
                            **kw})
    return build(open_image(image), cfg)


@fault("mlock-fails-half-way", "in-process: `mlock` refuses (ENOMEM) the second 32 MiB "
       "chunk of a 64 MiB region", "what was locked stays, the rest is not retried until a "
       "reload, nothing stray stays locked", "held 32 MiB = VmLck, `lock_refused` set")
def _(tmp_path, image):
    big = data_image(tmp_path / "big.img", 64 * MiB)
    img = open_image(big)
    real, calls = libc.mlock, [0]

    def mlock(addr, length):
        calls[0] += 1
        if calls[0] == 2:
            raise errors.syscall_error("mlock", 12, f"{length} bytes")
        real(addr, length)

    h = holder.Holder(img, MiB, 64 * MiB, 0, mem_available=lambda: 1 << 50)
    base = vmlck()
    libc.mlock = mlock
    try:
        r = h.apply([(0, 64)])
        assert r.lock_refused and "CAP_IPC_LOCK" in r.lock_refused
        assert h.held_bytes() == 32 * MiB == vmlck() - base
        assert h.apply([(0, 64)]).loaded_bytes == 0 and calls[0] == 2    # capped: no retry
    finally:
        libc.mlock = real
        h.close()
        img.close()
    assert vmlck() == base



@fault("image-shrinks-before-lock", "in-process: the image is truncated to 4 MiB between "
       "the selection and the `mlock` of a region past that", "no SIGBUS; the region is "
       "dropped; the daemon goes on", "apply returns, held only what the file still covers")
def _(tmp_path, image):
    img = open_image(image)
    real = libc.mlock

    def mlock(addr, length):
        os.truncate(image, 4 * MiB)
        real(addr, length)

    h = holder.Holder(img, MiB, 32 * MiB, 0, mem_available=lambda: 1 << 50)
    libc.mlock = mlock
    try:
        h.apply([(8, 16)])
        assert h.held_bytes() == 0
    finally:
        libc.mlock = real
        h.close()
        img.close()
    return "truncated"


@fault("meminfo-unreadable", "in-process: MemAvailable cannot be read for 3 cycles "
       "(`/proc/meminfo` fails), with a 1 MiB floor", "nothing is held while the floor cannot "
       "be checked; holding resumes after", "holds shed to 0, one warning, held again")
def _(tmp_path, image):
    from vmdisktouch.system.meminfo import MemInfoError
    fail = [False]

    def mem():
        if fail[0]:
            raise MemInfoError("cannot read /proc/meminfo: Permission denied")
        return 1 << 40

    w = _watcher(image, min_free=MiB, access_source="mincore")   # its own reads are evidence
    h = host_of(w)
    w.mem_available.read = mem          # the FailSafe the holder reads through
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("vmdisktouch").addHandler(handler)
    try:
        for _ in range(20):
            read_range(image, *HOT)
            h.tick()[0]
            if w.holder.held_bytes():
                break
        assert w.holder.held_bytes() > 0
        fail[0] = True
        for _ in range(3):
            read_range(image, *HOT)
            assert h.tick()[0].held_bytes == 0
        assert len([m for m in warnings if "/proc/meminfo" in m]) == 1, warnings
        fail[0] = False
        for _ in range(20):
            read_range(image, *HOT)
            if h.tick()[0].held_bytes:
                break
        assert w.holder.held_bytes() > 0
    finally:
        logging.getLogger("vmdisktouch").removeHandler(handler)
        w.close()


@fault("clock-jumps", "in-process: the cycle clock jumps 10^9 s forward, then back 10 s",
       "no exception; the heat stays finite; within budget", "ticks go on, heat finite")
def _(tmp_path, image):
    w = _watcher(image)
    h = host_of(w)
    now = [0.0]
    w.clock = lambda: now[0]
    try:
        for step in (1.0, 1.0, 1e9, -10.0, 1.0, 1.0):
            now[0] += step
            read_range(image, *HOT)
            r = h.tick()[0]
            assert np.isfinite(w.state.total).all()
            assert r.held_bytes <= 16 * MiB
    finally:
        w.close()


@fault("huge-blocks-per-pixel", "`--blocks-per-pixel 1099511627776` (2^40)", SERVE,
       "the PNGs are written and decode (one map pixel each)")
def _(tmp_path, image):
    d = serving(tmp_path, image, "--blocks-per-pixel", str(1 << 40),
                "--map-png", tmp_path / "m.png", "--heat-png", tmp_path / "h.png")
    try:
        more_cycles(d)
        for name in ("m.png", "h.png"):
            with Image.open(tmp_path / name) as im:
                im.load()
                assert im.width >= 512                 # one map pixel, drawn 64 x 64
    finally:
        stopped_cleanly(d)


@fault("garbage-systemd-env", "`NOTIFY_SOCKET=garbage`, `WATCHDOG_USEC=-5`, "
       "`JOURNAL_STREAM=x`", SERVE, "holds, exits 0 on SIGTERM")
def _(tmp_path, image):
    # a malformed JOURNAL_STREAM is not the journal: a terminal's timestamped lines
    env = dict(os.environ, NOTIFY_SOCKET="garbage", WATCHDOG_USEC="-5", JOURNAL_STREAM="x")
    d = serving(tmp_path, image, env=env)
    stopped_cleanly(d)
    lines = d.err().splitlines()
    assert lines and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ", line)
                         for line in lines), lines


@fault("libvirt-unreachable", "`--uri qemu+unix:///system?socket=TMP/gone`", SERVE +
       " as a disk outside libvirt", "holds, exits 0 on SIGTERM")
def _(tmp_path, image):
    d = DaemonProc(tmp_path, image, "--max-hold", "16M", *FAST[2:],
               "--uri", f"qemu+unix:///system?socket={tmp_path}/gone")
    try:
        hold(d, image)
    finally:
        stopped_cleanly(d, within=15)


@fault("config-gone-on-reload", "the config file is deleted, then SIGHUP", "the reload is "
       "rejected; the old settings stay", "`reload rejected`, more cycles")
def _(tmp_path, image):
    reload_rejected(tmp_path, image, lambda cfg: cfg.unlink())


@fault("config-fifo-on-reload", "the config file is replaced by a FIFO, then SIGHUP",
       "no hang: the reload is rejected at once", "`reload rejected`, more cycles")
def _(tmp_path, image):
    reload_rejected(tmp_path, image, lambda cfg: (cfg.unlink(), os.mkfifo(cfg)))


@fault("budget-above-memory", "`--max-hold 64T`, above the host's memory", "a warning says "
       "the floor, not the budget, limits what is held; the daemon serves",
       "one warning naming MemTotal, holds, exit 0", "4")
def _(tmp_path, image):
    d = serving(tmp_path, image, budget="64T")
    try:
        assert "MemTotal" in d.output().split("cycle 1:")[0]
    finally:
        stopped_cleanly(d)


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)
CHANGES_IMAGE = {"image-deleted", "image-replaced", "image-truncated-to-zero",
                 "image-grows-1g", "checksums-keep-atime", "image-shrinks-before-lock"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_run_fault(row, tmp_path, image):
    kept = Untouched(image)
    changed = row.check(tmp_path, image)
    assert (row.id in CHANGES_IMAGE) == (changed is not None), row.id
    if changed is None:          # the rows that change the image themselves say so
        kept.check()


def test_docs_faults_is_current():
    from tests.support import faultkit
    text = (ROOT / "docs" / "faults.md").read_text()
    assert text == faultkit.markdown(), "regenerate: python -m tests.support.faultkit > docs/faults.md"
    assert len(faultkit.TABLE) >= 40
