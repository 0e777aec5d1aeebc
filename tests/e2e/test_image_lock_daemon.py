"""Two daemons for one image, as two units or a typo would start them: the second refuses
with one line naming the first, exits 78 (systemd does not restart it), and holds nothing;
the first goes on. Once the first stops, the image can be served again."""

from __future__ import annotations

import os
import time

import pytest

from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc

MiB = 1 << 20
ARGS = ("--max-hold", "16M", "--uri", "", "--min-free", "0", "--interval", "0.5")


@pytest.mark.timeout(120)
def test_a_second_daemon_on_the_same_image_is_refused(tmp_path):
    image = data_image(tmp_path / "part.img", 32 * MiB)
    os.symlink(image, tmp_path / "alias.img")
    first = DaemonProc(tmp_path, image, *ARGS, status="first.json", log="first.log")
    try:
        first.wait_status(lambda s: s["cycle"] >= 2, "two cycles")
        second = DaemonProc(tmp_path, tmp_path / "alias.img", *ARGS, status="second.json",
                            log="second.log")
        deadline = time.monotonic() + 30
        while second.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert second.returncode() == 78, second.output()
        out = [ln for ln in second.output().splitlines() if ln.strip()]
        assert len(out) == 1, out
        assert f"pid {first.pid}" in out[0] and "already served" in out[0], out
        assert "Traceback" not in second.output()
        assert not (tmp_path / "second.json").exists()
        assert first.alive()
        before = first.read_status()["cycle"]
        first.wait_status(lambda s: s["cycle"] > before + 1, "the first goes on")
    finally:
        assert first.stop() == 0, first.output()[-2000:]
    third = DaemonProc(tmp_path, image, *ARGS, status="third.json", log="third.log")
    try:
        third.wait_status(lambda s: s["cycle"] >= 1, "served again")
    finally:
        assert third.stop() == 0, third.output()[-2000:]
