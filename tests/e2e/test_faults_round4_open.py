"""Fault table, issue 59: the image's path names another file while the daemon makes its parts.

The daemon opens and verifies an image once (``image.open_image``). The miss
probe opened it by path a second time, with ``O_DIRECT`` and without
``O_NOATIME``: a path swapped between the two opens (a file renamed over it,
a symlink planted) sent the probe's reads to the other file. Here the path
names another file while ``build`` makes the disk's parts, the verified one
again after (so the daemon's identity check passes, as it would after a
quick swap back). The probe must read the verified file, never the other one.
See ``tests/support/faultkit.py`` and ``docs/faults.md``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.common import ROOT
from tests.support.faultkit import MiB, Untouched, assert_clean, fault, rows_of
from tests.support.pagecache import data_image

CASE = "59"
DAY = 86400

# ``run`` whose ``build`` (the parts of a disk: the miss probe among them) runs while the
# image's path names OTHER; the verified image is renamed back over the path after it.
SWAP_DURING_BUILD = textwrap.dedent("""
    import os, sys
    from vmdisktouch.daemon import build as b
    image, other = sys.argv[1], sys.argv[2]
    made = b.build
    def build(img, *a, **k):
        os.rename(image, image + ".verified")
        os.rename(other, image)
        print("SWAPPED", flush=True)
        try:
            return made(img, *a, **k)
        finally:
            os.rename(image, other)
            os.rename(image + ".verified", image)
    b.build = build
    from vmdisktouch.commands import cli
    sys.exit(cli.main(sys.argv[3:]))
""")


def descriptors_on(pid: int, st: os.stat_result) -> list[str]:
    """The descriptors of ``pid`` open on the inode of ``st``, with their flags."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            got = os.stat(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = f.read().split("flags:")[1].split()[0]
        except (OSError, IndexError):
            continue
        if (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino):
            out.append(f"fd {fd} flags {flags}")
    return out


@fault("probe-path-swapped", "the image's path names another file (the verified image "
       "renamed aside, another renamed over the path, then back) while the daemon makes the "
       "disk's parts, after it opened and verified the image",
       "the miss probe reads the verified file, never the other one",
       "the probe made its reads (`miss_cost.probes` at least 8); the other file's atime (set 2 "
       "days back, so any read moves it) is unchanged and the daemon holds no descriptor "
       "on it", case=CASE)
def _(tmp_path, image):
    other = data_image(tmp_path / "other.img", 16 * MiB)
    old = time.time_ns() - 2 * DAY * 10**9
    os.utime(other, ns=(old, os.stat(other).st_mtime_ns))
    st_other = os.stat(other)
    status = tmp_path / "status.json"
    env = dict(os.environ, VMDISKTOUCH_LOCK_DIR=str(tmp_path / "locks"))
    log = open(tmp_path / "daemon.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", SWAP_DURING_BUILD, image, other, "run", "--uri", "", image,
         "--interval", "0.3", "--max-hold", "8M", "--status", status],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        probes, deadline = 0, time.monotonic() + 30
        while probes < 8:
            assert proc.poll() is None, (tmp_path / "daemon.log").read_text()[-2000:]
            assert time.monotonic() < deadline, \
                f"no probes: {(tmp_path / 'daemon.log').read_text()[-2000:]}"
            time.sleep(0.2)
            try:
                probes = (json.loads(status.read_text()).get("miss_cost") or {}) \
                    .get("probes", 0)
            except (OSError, ValueError):
                continue
        held = descriptors_on(proc.pid, st_other)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    out = (tmp_path / "daemon.log").read_text()
    assert_clean(out)
    assert "SWAPPED" in out
    assert os.stat(other).st_atime_ns == st_other.st_atime_ns, \
        f"the other file {other} was read (its atime moved)"
    assert held == [], f"the daemon holds {held} on the other file {other}"


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_round4_open_fault(row, tmp_path):
    image = data_image(tmp_path / "disk.img", 16 * MiB)
    kept = Untouched(image)
    row.check(tmp_path, str(image))
    kept.check()
