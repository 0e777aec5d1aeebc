"""Issue 40 part 5, the rules behind the fault rows: the watchdog's floor, the descriptor
reserve and its message, the units' LimitNOFILE, the status command's size cap and clock."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT
from vmdisktouch.adapters.systemd import sdnotify
from vmdisktouch.commands import status


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(sdnotify, "_warned", [False])


def test_watchdog_below_a_second_is_one_second_warned_once(fresh_warning, caplog):
    env = {"WATCHDOG_USEC": "1"}
    with caplog.at_level(logging.WARNING, logger="vmdisktouch"):
        assert sdnotify.watchdog_interval(env) == 1.0
        assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "999999"}) == 1.0
    assert [r.getMessage() for r in caplog.records if "WATCHDOG_USEC" in r.getMessage()] == [
        "WATCHDOG_USEC=1 is below one second: the watchdog is pinged as if it were 1 s "
        "(WatchdogSec= of at least 2 s leaves room for a slow cycle)"]


def test_watchdog_of_a_second_or_more_is_kept(fresh_warning, caplog):
    with caplog.at_level(logging.WARNING, logger="vmdisktouch"):
        assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "1000000"}) == 1.0
        assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
        assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert not caplog.records


CHILD = r"""
import os, resource, sys
from vmdisktouch.errors import VmdtError
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image
img = open_image(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    open_image(sys.argv[1])
except VmdtError as exc:
    print("OPEN", type(exc).__name__, exc)
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    image_lock.acquire(img, sys.argv[3])
except VmdtError as exc:
    print("LOCK", type(exc).__name__, exc)
"""


def test_descriptors_left_out_with_the_real_cause(tmp_path):
    """Below the reserve an image is not opened (ConfigError naming the numbers), and
    EMFILE at the lock says so instead of the lock directory's hint."""
    img = tmp_path / "disk.img"
    img.write_bytes(b"\0" * 65536)
    (tmp_path / "locks").mkdir(mode=0o700)
    r = subprocess.run([sys.executable, "-c", CHILD, str(img), "64", str(tmp_path / "locks")],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert out["OPEN"].startswith(f"ConfigError {img}: not opened: too many open files: "), out
    assert "descriptors in use, limit 64 (LimitNOFILE; ulimit -n); 64 are kept" in out["OPEN"]
    assert out["LOCK"].startswith("ConfigError cannot "), out
    assert "too many open files: 64 descriptors in use, limit 64" in out["LOCK"], out
    assert "VMDISKTOUCH_LOCK_DIR" not in out["LOCK"], out


@pytest.mark.parametrize("unit", ["vmdisktouch.service", "vmdisktouch@.service"])
def test_units_raise_the_descriptor_limit(unit):
    lines = (ROOT / "systemd" / unit).read_text().splitlines()
    assert [x for x in lines if x.startswith("LimitNOFILE=")] == ["LimitNOFILE=65536"]


def test_status_file_over_the_cap_is_not_read(tmp_path):
    (tmp_path / "big.json").write_bytes(b" " * (status.MAX_STATUS_BYTES + 1))
    (tmp_path / "fits.json").write_bytes(b" " * status.MAX_STATUS_BYTES)
    big, fits = status.read_files(str(tmp_path))
    assert status.MAX_STATUS_BYTES == 4 << 20
    assert big["error"] == "unreadable: larger than 4M"
    assert fits["error"].startswith("malformed: not JSON")


def test_each_file_aged_by_the_clock_read_after_it(tmp_path):
    """The clock is read once per file, after it: a slow file before a live one does not
    make the live one's time lie in the future."""
    doc = {"path": "/img", "pid": os.getpid(), "interval_seconds": 1.0, "time": 1000.0}
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(doc))
    ticks = iter([1001.0, 1100.0])
    a, b = status.read_files(str(tmp_path), clock=lambda: next(ticks))
    assert (a["age_seconds"], a["stale"]) == (1.0, False)
    assert (b["age_seconds"], b["stale"]) == (100.0, True)
