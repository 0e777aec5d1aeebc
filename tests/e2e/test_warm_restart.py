"""Warm restart with a real daemon: the heat survives a SIGKILL (the last periodic save)
and the hot zone is held again in the first cycle of the next start, before the guest
reads anything, even from a cold page cache; a replaced image starts cold."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc
from tests.support.holders import zone_reader_argv
from tests.support.images import evict

MiB = 1 << 20
ZONE = (32 * MiB, 32 * MiB)


def zone_held(status) -> int:
    end = ZONE[0] + ZONE[1]
    return sum(max(0, min(end, o + n) - max(ZONE[0], o)) for o, n in status["regions"])


@pytest.mark.timeout(180)
def test_the_heat_survives_a_sigkill_and_a_restart_holds_at_once(tmp_path):
    image = data_image(tmp_path / "disk.img", 128 * MiB)
    args = ("--max-hold", "48M", "--uri", "", "--min-free", "0", "--interval", "0.5",
            "--state-dir", str(tmp_path / "state"), "--state-save-interval", "1")
    reader = subprocess.Popen(zone_reader_argv(image, *ZONE, pause=0.1))
    try:
        first = DaemonProc(tmp_path, image, *args, status="first.json", log="first.log")
        try:
            first.wait_status(lambda s: zone_held(s) >= 0.9 * ZONE[1], "the zone held",
                              timeout=60)
            time.sleep(2.5)                                  # a periodic save since
        finally:
            first.kill()                                     # no save at stop
    finally:
        reader.kill()
        reader.wait()
    [state] = os.listdir(tmp_path / "state")
    evict(image)                                             # cold cache, nobody reading

    second = DaemonProc(tmp_path, image, *args, status="second.json", log="second.log")
    try:
        st = second.wait_status(lambda s: s["cycle"] >= 1, "the first cycle", timeout=60)
        assert st["cycle"] == 1 and zone_held(st) >= 0.9 * ZONE[1], st["regions"]
        assert "restored the heat saved" in second.output() and st["warmed_from"] == "state"
        before = os.stat(tmp_path / "state" / state).st_mtime_ns
    finally:
        assert second.stop() == 0, second.output()[-2000:]
    assert os.stat(tmp_path / "state" / state).st_mtime_ns > before     # saved at stop

    new = data_image(tmp_path / "new.img", 128 * MiB)
    os.replace(new, image)                                   # replaced: another inode
    third = DaemonProc(tmp_path, image, *args, status="third.json", log="third.log")
    try:
        st = third.wait_status(lambda s: s["cycle"] >= 1, "the first cycle", timeout=60)
        assert zone_held(st) == 0 and st["warmed_from"] is None
        assert "no saved state" in third.output() and "restored" not in third.output()
    finally:
        assert third.stop() == 0, third.output()[-2000:]
