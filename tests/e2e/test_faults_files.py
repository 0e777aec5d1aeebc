"""Fault table, issue 31: what a local user or a stray file can plant in the daemon's files.

The warm-restart state (``--state-dir``), the per-image lock
(``VMDISKTOUCH_LOCK_DIR``) and the output directories are places where
another user, or a file left behind, can put a FIFO, a symlink, a hard
link, a huge or a malicious file, or swap a directory after start. Each row
runs a real ``vmdisktouch run`` on real files and checks that the daemon
neither hangs nor follows, truncates or reads what it must not, says so in
one line, and still ends on SIGTERM within 5 s. See ``tests/support/faultkit.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from tests.e2e.test_faults_run import FAST, LAUNCHER, more_cycles, serving, stopped_cleanly
from tests.support.faultkit import EX_CONFIG, MiB, assert_clean, assert_refused, fault, rows_of, vmdt
from tests.support.faultkit import Untouched, image  # noqa: F401 - the rows' fixture
from tests.support.common import require_tool
from tests.support.pagecache import data_image
from tests.support.common import ROOT
from tests.support.daemon_proc import DaemonProc
from tests.support.procfs import memory_fields
from vmdisktouch.adapters import warm_state
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image

NOBODY = 65534
RUN = ("run", "--uri", "", "--min-free", "0", "--interval", "0.2", "--max-hold", "8M")
# The daemon's peak memory with a state refused: its own ~45 MB, far from the
# 256 MiB to 2 GiB each attack below made it read or unpack before.
PEAK_BYTES = 200 * MiB
SERVE_NOTE = "the daemon keeps cycling and holding; nothing is written through the link"


def run(image, *args, env=None, timeout=20.0):
    return vmdt(*RUN[:1], image, *RUN[1:], *args, env=env, timeout=timeout)


def lock_env(directory) -> dict:
    return dict(os.environ, VMDISKTOUCH_LOCK_DIR=str(directory))


def private_dir(path) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return str(path)


def state_file(sd, image) -> str:
    """The name the daemon looks for the state of ``image`` under (in ``sd``)."""
    with open_image(str(image)) as img:
        return warm_state.state_path(str(sd), img)


def lock_file(directory, image) -> str:
    return os.path.join(str(directory), image_lock.lock_name(os.stat(image)))


def warm_start(tmp_path, image, sd, *args, **kw) -> DaemonProc:
    """A daemon with ``--state-dir sd`` until its first cycle; killed if it never gets there."""
    d = DaemonProc(tmp_path, image, "--max-hold", "8M", *FAST, "--state-dir", sd, *args, **kw)
    try:
        d.wait_output("cycle 1:", "the first cycle", timeout=30)
    except BaseException:
        d.kill()
        raise
    return d


def ends_on_sigterm(d: DaemonProc) -> None:
    """SIGTERM: exit 0 within 5 s (else SIGKILL, and the row fails)."""
    rc, took = d.terminate(timeout=5)
    if rc is None:
        d.kill()
    assert rc == 0 and took < 5, f"exit {rc} after {took:.1f} s: {d.output()[-2000:]}"
    assert "released all holds" in d.output()
    assert_clean(d.output())
    d.cleanup()


def ignored_once(d: DaemonProc, needle: str) -> str:
    lines = [ln for ln in d.output().splitlines() if "ignoring the saved state" in ln]
    assert len(lines) == 1 and needle in lines[0], d.output()[-3000:]
    assert "restored the heat" not in d.output()
    return lines[0]


def peak_memory(d: DaemonProc) -> int:
    return memory_fields(d.pid, ("VmHWM",))["VmHWM"]


# -- 1 and 7: a state file that is a FIFO: no hang, SIGTERM still works ----------------------

@fault("state-file-fifo", "the state file is a FIFO (`mkfifo SD/file-DEV-INO.state.npz`; "
       "`run IMG --state-dir SD`)", "the daemon starts cold and serves; SIGTERM ends it",
       "one `ignoring the saved state ...: it is a FIFO` line, cycle 1, exit 0 within 5 s "
       "(it hung in open() until SIGKILL)", "31 broke 2")
def _(tmp_path, image):
    sd = private_dir(tmp_path / "state")
    os.mkfifo(state_file(sd, image))
    d = warm_start(tmp_path, image, sd)
    ignored_once(d, "it is a FIFO, not a regular file")
    ends_on_sigterm(d)


def launch(tmp_path, target: str, *argv, env=None) -> subprocess.Popen:
    """``vmdisktouch ARGV`` that sends itself SIGTERM on entering ``target`` (the phase)."""
    log = open(tmp_path / "daemon.log", "w+")
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, target, "1",
                             str(int(signal.SIGTERM)), *map(str, argv)], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                            start_new_session=True)


def sigterm_while(tmp_path, image, target: str, *args, env=None) -> tuple[int, str]:
    """SIGTERM sent from inside ``target`` at start: the exit status within 5 s, the log."""
    proc = launch(tmp_path, target, *RUN[:1], image, *RUN[1:], "--decay", "1",
                  "--status", tmp_path / "s.json", *args, env=env)
    log = tmp_path / "daemon.log"
    try:
        deadline = time.monotonic() + 30
        while "INJECT" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the phase was never reached"
            time.sleep(0.05)
        t0 = time.monotonic()
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running 5 s after SIGTERM: "
                                 + log.read_text()[-2000:]) from None
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert_clean(out)
    return rc, out


@fault("sigterm-opening-state-fifo", "SIGTERM while the daemon opens a state file that is a "
       "FIFO (sent from inside `warm_state.load`)", "the daemon ends, exit 0, within 5 s",
       "exit 0 within 5 s, `received SIGTERM` (it blocked in open(), deaf to SIGTERM)",
       "31 sigterm")
def _(tmp_path, image):
    sd = private_dir(tmp_path / "state")
    os.mkfifo(state_file(sd, image))
    rc, out = sigterm_while(tmp_path, image, "vmdisktouch.adapters.warm_state:load",
                            "--state-dir", sd)
    assert rc == 0 and "received SIGTERM" in out and "it is a FIFO" in out, out[-2000:]


@fault("sigterm-opening-lock-fifo", "SIGTERM while the daemon opens a lock file that is a "
       "FIFO (sent from inside `image_lock.acquire`)", "the daemon ends within 5 s, never "
       "exit 70", "exit 78 within 5 s, `refusing the lock file`", "31 sigterm")
def _(tmp_path, image):
    locks = private_dir(tmp_path / "locks")
    os.mkfifo(lock_file(locks, image))
    rc, out = sigterm_while(tmp_path, image, "vmdisktouch.system.image_lock:acquire",
                            env=lock_env(locks))
    assert rc == EX_CONFIG and "refusing the lock file" in out, out[-2000:]


@fault("sigterm-checking-status", "SIGTERM while the daemon checks its status file, a FIFO "
       "(sent from inside `outputs.check_paths`)", "the daemon ends within 5 s",
       "exit 78 within 5 s, `it is a FIFO`", "31 sigterm")
def _(tmp_path, image):
    os.mkfifo(tmp_path / "s.json")
    rc, out = sigterm_while(tmp_path, image, "vmdisktouch.adapters.outputs:check_paths")
    assert rc == EX_CONFIG and "it is a FIFO" in out, out[-2000:]


# -- 2: a lock file that is a FIFO ------------------------------------------------------

@fault("lock-file-fifo", "the lock file is a FIFO (`mkfifo LOCKDIR/file-DEV-INO.lock`)",
       "the daemon refuses in one line; never exit 70, never a hang", "exit 78, "
       "`refusing the lock file ...: it is a FIFO, not a regular file` (was exit 70: "
       "ftruncate EINVAL)", "31 broke 6")
def _(tmp_path, image):
    locks = private_dir(tmp_path / "locks")
    os.mkfifo(lock_file(locks, image))
    assert_refused(run(image, env=lock_env(locks)), EX_CONFIG, "it is a FIFO, not a regular")


# -- 3: state files that are huge, a zip bomb, or a symlink ------------------------------

def _refused_state(tmp_path, image, plant, needle: str) -> None:
    sd = private_dir(tmp_path / "state")
    plant(state_file(sd, image))
    d = warm_start(tmp_path, image, sd)
    try:
        peak = peak_memory(d)
        assert peak < PEAK_BYTES, f"peak memory {peak >> 20} MiB"
        ignored_once(d, needle)
    except BaseException:
        d.kill()
        raise
    ends_on_sigterm(d)


def _sparse(path):
    with open(path, "wb") as f:
        f.truncate(1 << 30)


@fault("state-sparse-1g", "the state file is a 1 GiB sparse file", "ignored without reading "
       "it: the daemon's memory stays bounded", "one `ignoring ...: it is 1073741824 bytes, "
       "more than` line, VmHWM < 200 MiB (was 1.09 GB)", "31 weak 3")
def _(tmp_path, image):
    _refused_state(tmp_path, image, _sparse, "it is 1073741824 bytes, more than")


def _bomb(image, unpacked: int):
    """A state with this image's real meta whose heat map unpacks to ``unpacked`` bytes."""
    def plant(path):
        with open_image(str(image)) as img:
            n = img.block_count(MiB)
            real = warm_state.save(os.path.dirname(path), img, MiB, np.zeros(n), np.zeros(n),
                                   [], time.time())
        with zipfile.ZipFile(real) as z:
            meta = z.read("meta.npy")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("meta.npy", meta)
            with z.open("heat_resident.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_1_0(
                    f, {"descr": "<f4", "fortran_order": False, "shape": (unpacked // 4,)})
                zeros = bytes(16 * MiB)
                for _ in range(unpacked // len(zeros)):
                    f.write(zeros)
            for key in ("heat_rewritten", "held"):
                with z.open(f"{key}.npy", "w") as f:
                    np.lib.format.write_array(f, np.zeros(n, np.float32) if key != "held"
                                              else np.zeros((0, 2), np.int64))
        data = buf.getvalue()
        assert len(data) < 300_000, len(data)
        with open(path, "wb") as f:
            f.write(data)
    return plant


@fault("state-zip-bomb", "the state file is a zip bomb: this image's meta, and a heat map "
       "of 256 MiB of zeros packed in 260 KB (under the file's bound: the unpacking is what "
       "is bounded)", "ignored before it is unpacked: the daemon's memory stays bounded",
       "one `ignoring ...: its heat_resident unpacks to 268435584 bytes` line, VmHWM < 200 "
       "MiB (a 1.9 MB one cost 1.98 GB and 9.4 s)", "31 weak 3")
def _(tmp_path, image):
    _refused_state(tmp_path, image, _bomb(image, 256 * MiB),
                   "its heat_resident unpacks to 268435584 bytes")


@fault("state-symlink-dev-zero", "the state file is a symlink to /dev/zero", "not followed, "
       "not read", "one `ignoring ...: it is a symbolic link` line, VmHWM < 200 MiB "
       "(was 2.14 GB)", "31 weak 3")
def _(tmp_path, image):
    _refused_state(tmp_path, image, lambda p: os.symlink("/dev/zero", p),
                   "it is a symbolic link")


@fault("state-symlink-elsewhere", "the state file is a symlink to a file outside the state "
       "directory (a valid state of this very image, standing for /etc/shadow)",
       "the link is not followed: the file is never opened", "one `ignoring ...: it is a "
       "symbolic link` line, no `restored` (it was opened and read whole)", "31 weak 3")
def _(tmp_path, image):
    def plant(path):
        with open_image(str(image)) as img:
            n = img.block_count(MiB)
            real = warm_state.save(private_dir(tmp_path / "elsewhere"), img, MiB,
                                   np.ones(n), np.zeros(n), [], time.time())
        os.symlink(real, path)
    _refused_state(tmp_path, image, plant, "it is a symbolic link")


# -- 4: an inode number reused by another image ----------------------------------------

@contextlib.contextmanager
def ext4(tmp_path, size=128 * MiB):
    fs = tmp_path / "fs.ext4"
    with open(fs, "wb") as f:
        f.truncate(size)
    subprocess.run([require_tool("mkfs.ext4"), "-q", "-F", str(fs)], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(fs), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@fault("state-inode-reused", "`rm IMG; cp OTHER IMG` between two runs, on ext4, and the new "
       "file gets the old one's inode number (same size)", "the other image's saved heat is "
       "not restored", "one `ignoring ...: it is of another image` line, no `restored` "
       "(it restored the heat saved 0 s ago)", "31 weak 4")
def _(tmp_path, image):
    sd = private_dir(tmp_path / "state")
    other = data_image(tmp_path / "other.img", 32 * MiB)
    with ext4(tmp_path) as mnt:
        img = data_image(mnt / "disk.img", 32 * MiB)
        ino = os.stat(img).st_ino
        first = warm_start(tmp_path, img, sd, log="first.log")
        ends_on_sigterm(first)                    # saved at stop
        assert os.listdir(sd) == [os.path.basename(state_file(sd, img))]
        os.unlink(img)
        shutil.copyfile(other, img)
        assert os.stat(img).st_ino == ino, "ext4 gave the copy another inode number"
        second = warm_start(tmp_path, img, sd, log="second.log")
        try:
            ignored_once(second, "it is of another image")
        except BaseException:
            second.kill()
            raise
        ends_on_sigterm(second)


# -- 5: lock, state and status directories others can write --------------------------------

@fault("lock-dir-symlink", "the lock directory is a symlink (to a directory of root's)",
       "not followed: the daemon refuses in one line", "exit 78, `refusing the lock "
       "directory ...: ... is a symbolic link` (it was followed)", "31 weak 5")
def _(tmp_path, image):
    real = private_dir(tmp_path / "real-locks")
    os.symlink(real, tmp_path / "locks")
    assert_refused(run(image, env=lock_env(tmp_path / "locks")), EX_CONFIG,
                   "is a symbolic link")
    assert os.listdir(real) == []


@fault("lock-dir-open-to-others", "the lock directory is mode 0777 and nobody's, and nobody "
       "holds the image's lock in it, its text `pid 1 /fake`", "the directory is refused "
       "(not the image as `served` by a fake holder)", "exit 78, `refusing the lock "
       "directory ...: owned by uid 65534`, no `pid 1 /fake` (it named pid 1 /fake)",
       "31 weak 5")
def _(tmp_path, image):
    locks = tmp_path / "locks"
    locks.mkdir()
    os.chown(locks, NOBODY, NOBODY)
    os.chmod(locks, 0o777)
    path = lock_file(locks, image)
    with open(path, "w") as f:
        f.write("pid 1 /fake\n")
    os.chown(path, NOBODY, NOBODY)
    with open(path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)          # the pre-lock nobody took
        r = run(image, env=lock_env(locks))
    assert_refused(r, EX_CONFIG, "owned by uid 65534")
    assert "refusing the lock directory" in r.stderr and "pid 1 /fake" not in r.stderr


@fault("lock-file-hard-link", "the lock file is a hard link to another file", "the other "
       "file is not truncated or written; the daemon refuses in one line", "exit 78, `it "
       "has 2 hard links`, the other file unchanged (it was overwritten)", "31 weak 5")
def _(tmp_path, image):
    locks = private_dir(tmp_path / "locks")
    victim = tmp_path / "victim.conf"
    victim.write_text("keep me\n")
    os.link(victim, lock_file(locks, image))
    assert_refused(run(image, env=lock_env(locks)), EX_CONFIG, "it has 2 hard links")
    assert victim.read_text() == "keep me\n"


@fault("lock-holder-escapes", "the held lock file's text holds terminal escape sequences "
       "and 10 KB more", "the holder is named in printable, bounded text", "exit 78, "
       "`already served`, no ESC or BEL, the holder's text at most 200 characters (printed "
       "raw, 4 KB of it)",
       "31 weak 5")
def _(tmp_path, image):
    locks = private_dir(tmp_path / "locks")
    path = lock_file(locks, image)
    with open(path, "w") as f:
        f.write("\x1b]0;owned\x07\x1b[2J\x1b[31mpid 1 /fake" + "A" * 10000 + "\n")
    with open(path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run(image, env=lock_env(locks))
    last = assert_refused(r, EX_CONFIG, "already served")
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, repr(r.stderr[:300])
    holder = last.split("another vmdisktouch (", 1)[1].split("; lock ", 1)[0]
    assert holder.startswith("?]0;owned?") and len(holder) <= 200, holder


@fault("status-dir-open-to-others", "`--status DIR/s.json`, DIR mode 0777", "refused in one "
       "line: another user could swap the status file or plant one", "exit 78, `its "
       "directory is not closed to other users` (it was written there)", "31 weak 5")
def _(tmp_path, image):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert_refused(run(image, "--status", shared / "s.json"), EX_CONFIG,
                   "not closed to other users")
    assert os.listdir(shared) == []


@fault("state-dir-open-to-others", "`--state-dir DIR`, DIR nobody's", "refused in one line: "
       "another user could plant the state", "exit 78, `refusing --state-dir DIR: ... owned "
       "by uid 65534` (it was used)", "31 weak 5")
def _(tmp_path, image):
    sd = tmp_path / "state"
    sd.mkdir()
    os.chown(sd, NOBODY, NOBODY)
    assert_refused(run(image, "--state-dir", sd), EX_CONFIG, "owned by uid 65534")
    assert os.listdir(sd) == []


# -- 6: an output directory swapped for a symlink after start --------------------------------

@fault("output-dir-swapped-for-symlink", "the directory of `--status` and `--map-png` is "
       "renamed and replaced by a symlink to another directory while the daemon runs, then "
       "put back", SERVE_NOTE, "nothing in the link's target, one `cannot write` line per "
       "output, `written again` once put back (both files were written through it)",
       "31 weak 6")
def _(tmp_path, image):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    d = serving(tmp_path, image, "--map-png", out / "map.png", status=out / "s.json")
    try:
        os.rename(out, tmp_path / "out.real")
        os.symlink(target, out)
        more_cycles(d, 4)
        assert os.listdir(target) == [], os.listdir(target)
        text = d.output()
        assert text.count("cannot write --status") == 1, text[-2000:]
        assert text.count("cannot write --map-png") == 1, text[-2000:]
        assert d.vmlck() > 0
        os.unlink(out)
        os.rename(tmp_path / "out.real", out)
        d.wait_output("written again", count=2)
    finally:
        stopped_cleanly(d)


@fault("output-parent-swapped-for-foreign-symlink", "`--map-png P/A/B/map.png`, P nobody's: "
       "nobody swaps A for a symlink to a directory of theirs holding a B", SERVE_NOTE,
       "nothing in nobody's B, one `cannot write --map-png ... another user could change` "
       "line (the map was written there)", "31 weak 6")
def _(tmp_path, image):
    p = tmp_path / "p"
    (p / "a" / "b").mkdir(parents=True)
    theirs = tmp_path / "theirs"
    (theirs / "b").mkdir(parents=True)
    for path in (p, theirs, theirs / "b"):
        os.chown(path, NOBODY, NOBODY)
    d = serving(tmp_path, image, "--map-png", p / "a" / "b" / "map.png")
    try:
        os.rename(p / "a", p / "a.real")
        os.symlink(theirs, p / "a")
        os.lchown(p / "a", NOBODY, NOBODY)
        more_cycles(d, 4)
        assert os.listdir(theirs / "b") == []
        text = d.output()
        assert text.count("cannot write --map-png") == 1, text[-2000:]
        assert "another user could change" in text
        assert d.vmlck() > 0
    finally:
        stopped_cleanly(d)


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_files_fault(row, tmp_path, image):
    kept = Untouched(image)
    row.check(tmp_path, image)
    kept.check()
