"""Fault table, issue 40 part 5: hostile files and limits around the daemon.

A 12 MB file in the status directory (``status`` took 14-20 s and showed the
live daemon as "written in the future, STALE"); a descriptor limit smaller
than the images need (disks left out with a wrong hint, then exit 78 for the
daemon's own status file); ``WATCHDOG_USEC=1`` (an idle daemon spun at half a
core); ``config --check`` saying "ok" for an output path ``run`` refuses.
See ``tests/support/faultkit.py`` and ``docs/faults.md``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.support.faultkit import (EX_CONFIG, MiB, Untouched, assert_clean, assert_refused, fault,
                            rows_of, vmdt)
from tests.support.pagecache import data_image
from tests.support.procfs import cpu_seconds
from tests.support.common import ROOT

CASE = "40 round 3"


def disk(path) -> dict:
    """One disk's status as a live daemon (this test's pid) writes it now."""
    return {"path": str(path), "pid": os.getpid(), "version": "0-test",
            "interval_seconds": 1.0, "cycle": 3, "cycle_seconds": 0.01,
            "budget_bytes": 8 * MiB, "held_bytes": 4 * MiB, "regions": [[0, 4 * MiB]],
            "access_source": "mincore", "time": time.time()}


def daemon(argv, tmp_path, env=None, prefix=()) -> subprocess.Popen:
    """``vmdisktouch run ARGV`` as a child, its log in ``tmp_path/daemon.log``."""
    env = dict(os.environ if env is None else env,
               VMDISKTOUCH_LOCK_DIR=str(tmp_path / "locks"))
    log = open(tmp_path / "daemon.log", "w")
    return subprocess.Popen([*prefix, sys.executable, "-m", "vmdisktouch", "run", "--uri", "",
                             *map(str, argv)], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen, tmp_path) -> tuple[int, str]:
    """SIGTERM the daemon; (exit status, its log)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    return rc, (tmp_path / "daemon.log").read_text()


# -- 1: a 12 MB file in the status directory ------------------------------------------

@fault("status-12mb-file", "a 12 MB JSON file (2 million regions) beside a live daemon's "
       "status file, rewritten every 0.2 s while `status` reads",
       "`status` and `status --json` finish in under 2 s, show the live daemon LIVE, and "
       "name the big file in one line",
       "both under 2 s, exit 0; the live entry `LIVE` (`stale: false`), never `written in "
       "the future`; `FILE: unreadable: larger than 4M`; `--json` under 64 KiB", case=CASE)
def _(tmp_path, image):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "big.json", "w") as f:
        f.write('{"path": "/x", "regions": [' + ",".join(["[1,2]"] * 2_000_000) + "]}")
    assert os.path.getsize(run / "big.json") > 12_000_000
    good = run / "good.json"
    good.write_text(json.dumps(disk(image)))
    done = threading.Event()

    def rewrite():                         # the live daemon, writing every 0.2 s
        while not done.wait(0.2):
            (run / ".tmp").write_text(json.dumps(disk(image)))
            os.replace(run / ".tmp", good)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        for argv in ((), ("--json",)):
            t0 = time.monotonic()
            r = vmdt("status", "--dir", run, *argv, timeout=60)
            took = time.monotonic() - t0
            assert_clean(r.stderr)
            assert r.returncode == 0, r.stderr[-2000:]
            assert took < 2.0, f"status {' '.join(argv)} took {took:.1f} s"
            if argv:
                assert len(r.stdout) < 64 << 10, f"--json printed {len(r.stdout)} bytes"
                entries = json.loads(r.stdout)
                [live] = [e for e in entries if e.get("path") == image]
                assert live["stale"] is False and live["age_seconds"] >= 0, live
                [bad] = [e for e in entries if e is not live]
                assert bad == {"file": str(run / "big.json"), "stale": True,
                               "error": "unreadable: larger than 4M"}, bad
            else:
                lines = r.stdout.splitlines()
                assert f"{run}/big.json: unreadable: larger than 4M" in lines, lines
                [live] = [x for x in lines if x.startswith(f"{image}: held 4M/8M")]
                assert live.endswith(", LIVE") and "future" not in live, live
                assert len(lines) == 2, lines
    finally:
        done.set()
        writer.join()


# -- 2: fewer descriptors than the images need ----------------------------------------

IMAGES = 30     # at about 9 descriptors each (2 CPUs), more than 256 holds


@fault("descriptors-ulimit-256", f"`ulimit -n 256` (prlimit) and {IMAGES} images given, more "
       "than the descriptors hold",
       "the daemon serves the images that fit, says the real cause for each one left out, "
       "keeps descriptors for its own files, and exits 0 on SIGTERM",
       "some served and the rest each `left out: IMAGE: not opened: too many open files: N "
       "descriptors in use, limit 256 (LimitNOFILE...`, never the lock-directory hint; the "
       "status file written for 3 cycles and lists the served ones; exit 0 after SIGTERM",
       case=CASE)
def _(tmp_path, image):
    prlimit = "/usr/bin/prlimit"
    assert os.access(prlimit, os.X_OK), "prlimit (util-linux) is needed for this row"
    paths = []
    for i in range(IMAGES):
        p = tmp_path / f"d{i:02d}.img"
        with open(p, "wb") as f:
            f.truncate(8 * MiB)            # sparse: the limit is the point, not the data
        paths.append(str(p))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    status = run / "host.json"
    proc = daemon(["--max-hold", "16M", "--interval", "1", "--status", status, *paths],
                  tmp_path, prefix=(prlimit, "--nofile=256"))
    try:
        deadline = time.monotonic() + 60
        doc = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                doc = json.loads(status.read_text())
            except (OSError, ValueError):
                doc = None
            if doc and doc["host"]["cycle"] >= 3:
                break
            time.sleep(0.2)
    finally:
        rc, log = stop(proc, tmp_path)
    assert_clean(log)
    assert rc == 0, f"exit {rc}: {log[-3000:]}"
    assert doc and doc["host"]["cycle"] >= 3, f"no status after 3 cycles: {log[-3000:]}"
    served = {d["path"] for d in doc["host"]["disks"]}
    left = [x for x in log.splitlines() if "left out:" in x]
    assert 0 < len(served) < IMAGES and len(served) + len(left) == IMAGES, (served, left)
    for line in left:
        assert "not opened: too many open files: " in line and "descriptors in use, " \
               "limit 256 (LimitNOFILE" in line, line
    assert {x.split("left out: ")[1].split(":")[0] for x in left} == set(paths) - served
    assert "VMDISKTOUCH_LOCK_DIR" not in log and "cannot write --status" not in log, log


# -- 3: WATCHDOG_USEC=1 ------------------------------------------------------------

@fault("watchdog-usec-1", "`WATCHDOG_USEC=1` (a one-microsecond watchdog) for an idle daemon",
       "the period is raised to 1 s with one warning: the daemon does not spin, and still "
       "pings", "under 5 % of a core (utime+stime from /proc/PID/stat) over 5 s after "
       "READY=1; `WATCHDOG=1` received at least 4 times; one warning naming WATCHDOG_USEC",
       case=CASE)
def _(tmp_path, image):
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.2)
    env = dict(os.environ, NOTIFY_SOCKET=sock_path, WATCHDOG_USEC="1")
    env.pop("WATCHDOG_PID", None)
    proc = daemon([image, "--max-hold", "8M", "--interval", "5"], tmp_path, env=env)
    pings = 0
    try:
        deadline = time.monotonic() + 30
        while "READY=1" not in _recv(sock):
            assert time.monotonic() < deadline and proc.poll() is None, \
                (tmp_path / "daemon.log").read_text()[-2000:]
        before, t0 = cpu_seconds(proc.pid), time.monotonic()
        while time.monotonic() - t0 < 5.0:
            pings += _recv(sock).count("WATCHDOG=1")
        used = (cpu_seconds(proc.pid) - before) / (time.monotonic() - t0)
    finally:
        rc, log = stop(proc, tmp_path)
        sock.close()
    assert_clean(log)
    assert rc == 0, log[-2000:]
    assert used < 0.05, f"the idle daemon used {used:.0%} of a core"
    assert pings >= 4, f"{pings} watchdog pings in 5 s"
    assert sum("WATCHDOG_USEC=1 is below one second" in x for x in log.splitlines()) == 1, log


def _recv(sock) -> str:
    try:
        return sock.recv(4096).decode()
    except socket.timeout:
        return ""


# -- 4: config --check refuses what run refuses -------------------------------------

def _not_ours(tmp_path):
    (tmp_path / "notes.txt").write_text("not a status file\n")
    return f'status = "{tmp_path}/notes.txt"'


def _open_dir(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    return f'status = "{shared}/s.json"'


REFUSALS = [
    ("missing-dir", "a status file in a directory that does not exist",
     lambda t: f'status = "{t}/no/such/dir/s.json"', "does not exist"),
    ("config-itself", "the status file named as the config file itself",
     lambda t: f'status = "{t}/vmdisktouch.toml"', "it is the config file"),
    ("unwritable-dir", "a map PNG in a directory no file can be created in (/proc)",
     lambda t: 'map_png = "/proc/vmdisktouch-map.png"', "cannot create a file in /proc"),
    ("not-ours", "a status path naming an existing file vmdisktouch did not write",
     _not_ours, "not a file vmdisktouch writes"),
    ("dir-open", "a status file in a directory writable by others (0777)",
     _open_dir, "not closed to other users"),
    ("same-file", "the map PNG and the heat PNG the same file",
     lambda t: f'map_png = "{t}/x.png"\nheat_png = "{t}/x.png"', "names the same file"),
]
for _id, _what, _line, _needle in REFUSALS:
    fault(f"config-check-{_id}", f"`config --check FILE` with {_what}",
          "`config --check` refuses what `run --config FILE` refuses at start, in the same "
          "one line", f"both exit 78 with the same last line, naming `{_needle}`",
          case=CASE)(lambda tmp_path, image, line=_line, needle=_needle:
                     _check_as_run(tmp_path, image, line, needle))


def _check_as_run(tmp_path, image, line, needle: str) -> None:
    cfg = tmp_path / "vmdisktouch.toml"
    cfg.write_text(f'max_hold = "8M"\n{line(tmp_path)}\n')
    env = dict(os.environ, VMDISKTOUCH_LOCK_DIR=str(tmp_path / "locks"))
    ran = assert_refused(vmdt("run", "--uri", "", "--config", cfg, image, env=env),
                         EX_CONFIG, needle)
    checked = assert_refused(vmdt("config", "--check", cfg), EX_CONFIG, needle)
    assert checked == ran, (checked, ran)


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_round3_files_fault(row, tmp_path):
    image = data_image(tmp_path / "disk.img", 16 * MiB)
    kept = Untouched(image)
    row.check(tmp_path, str(image))
    kept.check()
