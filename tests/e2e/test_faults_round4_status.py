"""Fault table, issue 54 round 4: what ``status`` and the daemon's log say (its "weak" cases).

* ``advise --save`` keeps its report beside the status files: ``status`` read it as a
  broken daemon ("advise.json: malformed: path is missing", stale in ``--json``).
* ``run`` without ``--status`` was invisible to ``status`` (exit 3 while it ran): it now
  writes one in the runtime directory (``VMDISKTOUCH_RUNTIME_DIR`` here, never the
  host's ``/run/vmdisktouch``), named per image as the units name theirs.
* ``run IMG`` started silently on an image that ``qemu-nbd --cache=none`` opens with
  O_DIRECT: one warning names it, never the daemon's own O_DIRECT miss probe.
* After a stop the status file still said what the last cycle held: it now says the
  daemon stopped, nothing held, on the host line and each disk's.
* A start under a read flood warned of lost trace events while its buffer grew: the
  losses of the start's sizing are counted apart and not warned; a loss after it is.

Every daemon runs on a real image with real tracefs; its status directory is the test's
own. See ``tests/support/faultkit.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.support.common import ROOT, require_tool
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.faultkit import (MiB, Untouched, assert_clean, fault, more_cycles, rows_of,
                                    vmdt)
from tests.support.faultkit import image  # noqa: F401 - the rows' fixture
from tests.support.nbd import QemuNbd
from tests.support.pagecache import data_image, read_range
from tests.support.tracing import tracefs_root  # noqa: F401 - the test's fixture
from vmdisktouch.daemon.sources import instance_name
from vmdisktouch.system.trace import tracefs
from vmdisktouch.unitname import escape_path

CASE = "54 weak"
FAST = ("--uri", "", "--min-free", "0", "--interval", "0.5", "--access-source", "trace")


def runtime(tmp_path) -> tuple[str, dict]:
    """A runtime directory of the test's own (0755, as the units make it) and the
    environment that points the daemons and ``status`` at it."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755, exist_ok=True)
    return str(run), dict(env_without_systemd(), VMDISKTOUCH_RUNTIME_DIR=str(run))


def status_cmd(env, *argv) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "status", *argv],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert_clean(r.stderr)
    return r


def stop(d: DaemonProc) -> str:
    rc = d.stop()
    out = d.output()
    assert rc == 0, out[-2000:]
    assert_clean(out)
    return out


def launch(tmp_path, setup: str) -> str:
    """An executable that runs ``python -m vmdisktouch ARGS`` after ``setup`` (Python, run
    first in the daemon's process): ``DaemonProc(..., python=launch(...))``."""
    path = tmp_path / "launch"
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                    + setup + "from vmdisktouch.commands import cli\n"
                    "assert sys.argv[1:3] == ['-m', 'vmdisktouch'], sys.argv\n"
                    "sys.exit(cli.main(sys.argv[3:]))\n")
    path.chmod(0o755)
    return str(path)


# -- advise's report beside the status files ------------------------------------------------

@fault("status-advise-report", "`vmdisktouch advise IMG --save RUNDIR/advise.json` (its "
       "default place is /run/vmdisktouch/advise.json, where the status files are) beside a "
       "live daemon's status file, then `vmdisktouch status`",
       "the report is not shown as a daemon, broken or stale",
       "`status` shows only the daemon's line and exits 0, no `malformed`; `--json` one entry, "
       "live; with the report alone, `no status files`, exit 3", f"{CASE} status-advise")
def _(tmp_path, image):
    run, env = runtime(tmp_path)
    other = data_image(tmp_path / "other.raw", 16 * MiB)
    r = vmdt("advise", other, "--duration", "1", "--save", os.path.join(run, "advise.json"),
             "--json", timeout=60, env=env)
    # 3: nothing read the disk in the window; the report is kept all the same
    assert r.returncode in (0, 3) and os.path.exists(os.path.join(run, "advise.json")), r.stderr
    r = status_cmd(env, "--dir", run)
    assert r.returncode == 3 and r.stdout.strip() == f"no status files in {run}", r.stdout
    d = DaemonProc(tmp_path, image, *FAST, max_hold="8M", status=os.path.join(run, "a.json"),
                   env=env)
    try:
        d.wait_status(lambda s: s["cycle"] >= 1, "the first cycle")
        r = status_cmd(env, "--dir", run)
        assert r.returncode == 0 and "malformed" not in r.stdout, r.stdout
        [line] = r.stdout.splitlines()
        assert line.startswith(f"{image}: held ") and line.endswith(" LIVE"), line
        [entry] = json.loads(status_cmd(env, "--dir", run, "--json").stdout)
        assert entry["file"] == os.path.join(run, "a.json") and entry["stale"] is False
    finally:
        stop(d)


# -- run without --status -------------------------------------------------------------------

@fault("status-run-default", "two `vmdisktouch run IMG` on two images, neither with "
       "`--status`, then `vmdisktouch status`; a third where the runtime directory cannot be "
       "made; one as nobody", "every running daemon is seen by `status`, whatever its options; one that "
       "cannot write there still serves",
       "`status` exits 0 with one LIVE line per image, each from `RUNDIR/ESCAPED.json` (the "
       "unit's `%i.json`); the third, and one run as nobody beside a root-owned runtime "
       "directory, hold and say once that `vmdisktouch status` cannot see them",
       f"{CASE} status-run")
def _(tmp_path, image):
    run, env = runtime(tmp_path)
    second = data_image(tmp_path / "second.raw", 16 * MiB)
    ds = [DaemonProc(tmp_path, img, *FAST, max_hold="8M", status=None, env=env,
                     log=f"{n}.log") for n, img in (("a", image), ("b", second))]
    try:
        for d in ds:
            d.wait_output("cycle 1:", "the first cycle")
        time.sleep(1.5)                                  # and a few more
        r = status_cmd(env)
        assert r.returncode == 0, (r.stdout, ds[0].output()[-2000:])
        lines = r.stdout.splitlines()
        assert len(lines) == 2 and all(x.endswith(" LIVE") for x in lines), r.stdout
        for d, img in zip(ds, (image, second)):
            assert any(x.startswith(f"{img}: held ") and f"pid {d.pid}," in x for x in lines)
            assert os.path.exists(os.path.join(run, escape_path(img) + ".json"))
        # the runtime directory cannot be made (a file stands where it goes): it serves
        blocked = tmp_path / "blocked"
        blocked.write_text("")
        env3 = dict(env, VMDISKTOUCH_RUNTIME_DIR=str(blocked / "run"))
        third = data_image(tmp_path / "third.raw", 16 * MiB)
        d = DaemonProc(tmp_path, third, *FAST, max_hold="8M", status=None, env=env3,
                       log="c.log")
        try:
            d.wait_output("cycle 1:", "the first cycle of the third")
            said = [x for x in d.output().splitlines()
                    if "`vmdisktouch status` cannot see this daemon" in x]
            assert len(said) == 1 and str(blocked) in said[0], d.output()[-2000:]
        finally:
            stop(d)
        as_nobody(tmp_path)
    finally:
        for d in ds:
            stop(d)
    r = status_cmd(env)
    assert r.returncode == 3 and r.stdout.count("STOPPED") == 2, r.stdout


def as_nobody(tmp_path) -> None:
    """A daemon run as nobody, the runtime directory root's (0755, as /run/vmdisktouch):
    it serves, and says once that ``status`` cannot see it."""
    shared = tempfile.mkdtemp(prefix="vmdt-status-", dir="/var/tmp")
    try:
        os.chmod(shared, 0o755)
        run = os.path.join(shared, "run")
        os.mkdir(run, 0o755)
        locks = os.path.join(shared, "locks")
        os.mkdir(locks, 0o700)
        os.chown(locks, 65534, 65534)
        img = data_image(os.path.join(shared, "nobody.raw"), 16 * MiB)
        os.chmod(img, 0o644)
        env = dict(env_without_systemd(), VMDISKTOUCH_RUNTIME_DIR=run,
                   VMDISKTOUCH_LOCK_DIR=locks)
        d = DaemonProc(tmp_path, img, "--uri", "", "--min-free", "0", "--interval", "0.5",
                       max_hold="2M", status=None, env=env, log="nobody.log",
                       prefix=(require_tool("setpriv"), "--reuid=65534", "--regid=65534",
                               "--clear-groups"))
        try:
            d.wait_output("cycle 1:", "the first cycle as nobody")
            said = [x for x in d.output().splitlines()
                    if "`vmdisktouch status` cannot see this daemon" in x]
            assert len(said) == 1 and "Permission denied" in said[0], d.output()[-2000:]
        finally:
            stop(d)
        assert os.listdir(run) == []
    finally:
        shutil.rmtree(shared)


# -- an image a process opens with O_DIRECT ---------------------------------------------------

DIRECT = ("qemu-nbd (pid {pid}) opens it with O_DIRECT: nothing it reads comes from the page "
          "cache; see `vmdisktouch advise`")


@fault("status-o-direct-opener", "`qemu-nbd --cache=none` serves the image (O_DIRECT), then "
       "`vmdisktouch run IMG`; and one started while the daemon runs", "the daemon says at start that holding serves that reader "
       "nothing, naming it, never itself",
       f"one WARNING `{DIRECT.format(pid='N')}` with qemu-nbd's pid, none naming the daemon's "
       "pid; the same once for a qemu-nbd started after the daemon; none when qemu-nbd opens "
       "it with the host cache", f"{CASE} status-o-direct")
def _(tmp_path, image):
    require_tool("qemu-nbd")
    run, env = runtime(tmp_path)
    with QemuNbd(str(image), cache="none", aio="threads") as nbd:
        d = DaemonProc(tmp_path, image, *FAST, max_hold="8M", env=env, log="direct.log")
        try:
            d.wait_output("cycle 1:", "the first cycle")
            time.sleep(1)
            out = stop(d)
        finally:
            d.stop()
        said = [x for x in out.splitlines() if "O_DIRECT" in x]
        assert len(said) == 1 and " WARNING " in said[0], out[-3000:]
        assert said[0].endswith(DIRECT.format(pid=nbd.pid)), said
        assert f"pid {d.pid}" not in said[0]
    # one that comes later is said too (looked for every second here, not every 30 s)
    d = DaemonProc(tmp_path, image, *FAST, max_hold="8M", env=env, log="later.log",
                   python=launch(tmp_path, "from vmdisktouch.daemon import served\n"
                                           "served.DIRECT_MIN_SECONDS = 1.0\n"))
    try:
        d.wait_output("cycle 1:", "the first cycle")
        assert "O_DIRECT:" not in d.output(), d.output()[-3000:]
        with QemuNbd(str(image), cache="none", aio="threads") as nbd:
            d.wait_output(DIRECT.format(pid=nbd.pid), "qemu-nbd said", timeout=20)
            time.sleep(2)
        out = stop(d)
    finally:
        d.stop()
    assert len([x for x in out.splitlines() if "O_DIRECT:" in x]) == 1, out[-3000:]
    with QemuNbd(str(image), cache="writethrough", aio="threads"):
        d = DaemonProc(tmp_path, image, *FAST, max_hold="8M", env=env, log="buffered.log")
        try:
            d.wait_output("cycle 1:", "the first cycle")   # its miss probe opens it O_DIRECT
            time.sleep(1)
        finally:
            out = stop(d)
        assert "O_DIRECT:" not in out, out[-3000:]


# -- after a stop ------------------------------------------------------------------------------

@fault("status-after-stop", "`vmdisktouch run A B C` (one budget) holds A and B, then "
       "SIGTERM; `vmdisktouch status` after", "the status after a stop is consistent: "
       "nothing held, and it says the daemon stopped",
       "the file's `host.held_bytes` and every disk's are 0, `host.stopped` true; `status` "
       "prints `held 0 of 24M budget` and `STOPPED`, no disk line holding, exit 3",
       f"{CASE} status-stop")
def _(tmp_path, image):
    run, env = runtime(tmp_path)
    a, b = image, data_image(tmp_path / "b.raw", 32 * MiB)
    c = data_image(tmp_path / "c.raw", 32 * MiB)
    path = os.path.join(run, "host.json")
    d = DaemonProc(tmp_path, [a, b, c], *FAST, max_hold="24M", status=path, env=env)
    try:
        d.wait_status(lambda s: s["host"]["held_bytes"] >= 16 * MiB and
                      all(x["held_bytes"] > 0 for x in s["host"]["disks"][:2]),
                      "A and B held", timeout=40,
                      drive=lambda: (read_range(a, 0, 12 * MiB), read_range(b, 0, 12 * MiB)))
    finally:
        stop(d)
    with open(path) as f:
        doc = json.load(f)
    assert doc["host"]["held_bytes"] == 0 and doc["host"].get("stopped") is True, doc["host"]
    assert [x["held_bytes"] for x in doc["host"]["disks"]] == [0, 0, 0], doc["host"]["disks"]
    assert all(x["held_bytes"] == 0 and x["regions"] == [] for x in doc["disks"])
    r = status_cmd(env)
    lines = r.stdout.splitlines()
    assert r.returncode == 3 and len(lines) == 4, r.stdout
    assert re.match(rf"host \(pid {d.pid}, v[^)]+\): held 0 of 24M budget, ", lines[0]), lines
    assert lines[0].endswith(" STOPPED"), lines[0]
    assert all(re.match(r"  \S+: held 0/", x) for x in lines[1:]), lines


# -- lost trace events while the buffer grows at start -----------------------------------------

NO_BPF = """\
from vmdisktouch.system.trace import bpf_reads
def refused(*a, **k):
    raise bpf_reads.BpfUnavailable("refused by the test: reads stay events")
bpf_reads.ReadCounter.create = refused
"""


class Flood:
    """``dd bs=4k`` of the cached image over and over, in its own session: a read flood
    (each 4 KiB read one trace event while reads are not counted in the kernel)."""

    def __init__(self, image):
        self.proc = subprocess.Popen(
            ["sh", "-c", f'while :; do dd if="$1" of=/dev/null bs=4k status=none; done',
             "flood", str(image)], start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(10)


def lost_warnings(out: str) -> list[str]:
    return [x for x in out.splitlines() if " WARNING " in x and "events lost" in x]


@fault("status-events-lost-at-start", "a start under a read flood (dd of the cached image, "
       "about half a million reads a second, reads left as trace events): the buffer grows "
       "from its first size, losing events; then, the flood over, the buffer is shrunk from "
       "outside (`echo 16 > INST/buffer_size_kb`) and the flood comes back",
       "losses while the buffer is sized at start are expected: counted apart, no warning; "
       "a loss after that warns",
       "no WARNING of lost events over the start; the status: `trace.lost_at_start` > 0, "
       "`events_lost` 0, `trace.sizing` false; after the shrink one WARNING of lost events, "
       "`events_lost` > 0, and `status` says `events lost`", f"{CASE} status-events-lost")
def _(tmp_path, image):
    run, env = runtime(tmp_path)
    big = data_image(tmp_path / "big.raw", 64 * MiB)
    read_range(big, 0, 64 * MiB)                    # cached: the flood reads memory
    launcher = launch(tmp_path, NO_BPF)
    status = os.path.join(run, "s.json")
    flood = Flood(big)
    d = None
    try:
        time.sleep(0.5)
        d = DaemonProc(tmp_path, big, *FAST, max_hold="16M", status=status, env=env,
                       python=launcher)
        d.wait_output("cycle 1:", "the first cycle", timeout=60)
        assert "refused by the test" in d.output(), d.output()[-2000:]
        time.sleep(6)
        flood.stop()
        more_cycles(d, 8, timeout=60)
        st = d.read_status()["disks"][0]
        assert lost_warnings(d.output()) == [], lost_warnings(d.output())
        assert st["trace"]["lost_at_start"] > 0, st["trace"]     # the flood did lose some
        assert st["events_lost"] == 0 and st["trace"]["sizing"] is False, st["trace"]
        # later: a loss past the start's sizing warns
        inst = os.path.join(tracefs.find_root(), "instances", instance_name(str(big)))
        with open(os.path.join(inst, "buffer_size_kb"), "w") as f:
            f.write("16\n")
        flood = Flood(big)
        d.wait_status(lambda s: s["disks"][0]["events_lost"] > 0, "a steady loss", timeout=30)
        flood.stop()
        more_cycles(d, 2, timeout=30)
        assert len(lost_warnings(d.output())) == 1, d.output()[-3000:]
        r = status_cmd(env, "--dir", run)
        assert r.returncode == 0 and "events lost" in r.stdout, r.stdout
    finally:
        flood.stop()
        if d is not None:
            stop(d)


# -- the table's own test -------------------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_round4_status_fault(row, tmp_path, image, tracefs_root):  # noqa: F811
    kept = Untouched(image)
    assert row.check(tmp_path, image) is None
    kept.check()
