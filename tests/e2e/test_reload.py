"""SIGHUP reloads the config file of a real ``vmdisktouch run`` without dropping its holds.

A real daemon holds a hot zone of a real file; the config file is rewritten
and the daemon gets SIGHUP. Checked: the new settings take effect, the held
regions stay held (not released and re-read), a smaller budget releases down
to it, and a bad file is rejected with the old settings kept.
"""

from __future__ import annotations

import pathlib
import signal

import pytest

from tests.support.pagecache import data_image, read_range
from tests.support.daemon_proc import DaemonProc

MiB = 1 << 20
HOT = (64 * MiB, 32 * MiB)


def write_config(path, status, *, max_hold: str, decay: float, extra: str = "") -> None:
    path.write_text(f'max_hold = "{max_hold}"\nmin_free = 0\ninterval = "300ms"\n'
                    f'decay = {decay}\nthreshold = 0.05\nstatus = "{status}"\n{extra}')


@pytest.fixture
def image(tmp_path):
    return pathlib.Path(data_image(tmp_path / "disk.img", 256 * MiB))


@pytest.mark.timeout(180)
def test_sighup_reload_keeps_the_holds_and_applies_the_new_settings(tmp_path, image):
    cfg = tmp_path / "vm.toml"
    status = tmp_path / "status.json"
    # A fast heat (decay 1/s) so the zone is held within seconds.
    write_config(cfg, status, max_hold="64M", decay=1.0)
    d = DaemonProc(tmp_path, image, "--config", str(cfg), "--uri", "")
    try:
        st = d.wait_status(lambda s: s["held_bytes"] >= 16 * MiB, "a hold of the hot zone",
                           timeout=60, drive=lambda: read_range(image, *HOT))
        assert st["budget_bytes"] == 64 * MiB
        held_before = st["regions"]

        # 1. A larger budget and a slow decay: the holds stay, nothing is re-read.
        write_config(cfg, status, max_hold="96M", decay=0.001)
        d.signal(signal.SIGHUP)
        st = d.wait_status(lambda s: s["budget_bytes"] == 96 * MiB, "the reloaded budget")
        cycle = st["cycle"]
        for _ in range(5):
            st = d.wait_status(lambda s, c=cycle: s["cycle"] > c, "another cycle")
            cycle = st["cycle"]
            held = {tuple(r) for r in st["regions"]}
            assert all(tuple(r) in held or any(o <= r[0] and r[0] + r[1] <= o + n
                                               for o, n in held)
                       for r in held_before), (held_before, st["regions"])
            assert st["released_bytes"] == 0, st
            assert d.vmlck() <= 96 * MiB
        assert "reloaded settings from" in d.output()

        # 2. A smaller budget: released down to it at once, the rest kept.
        write_config(cfg, status, max_hold="8M", decay=0.001)
        d.signal(signal.SIGHUP)
        st = d.wait_status(lambda s: s["budget_bytes"] == 8 * MiB, "the smaller budget")
        assert 0 < st["held_bytes"] <= 8 * MiB, st
        assert d.vmlck() <= 8 * MiB
        kept = st["regions"]
        assert all(any(o <= r[0] and r[0] + r[1] <= o + n for o, n in held_before)
                   for r in kept), "the kept holds are part of the old ones"

        # 3. A bad file is rejected: the daemon keeps running with the old settings.
        cfg.write_text('max_hold = "8M"\ndecay = "fast"\n')
        d.signal(signal.SIGHUP)
        cycle = st["cycle"]
        st = d.wait_status(lambda s: s["cycle"] >= cycle + 3, "three more cycles")
        assert st["budget_bytes"] == 8 * MiB and st["held_bytes"] > 0
        out = d.output()
        assert "reload rejected, keeping the current settings" in out
        assert f"{cfg}: key decay" in out
        assert "Traceback" not in out
    finally:
        rc = d.stop()
    assert rc == 0, d.output()[-2000:]
