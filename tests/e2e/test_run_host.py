"""`vmdisktouch run A B C`: one process, one budget, with real guest reads: the regions of
every disk ranked together, the sum held never above the budget (VmLck), one status with a
host object, a PNG per disk; a disk deleted under it is dropped and the others go on."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from PIL import Image

from tests.support.pagecache import data_image
from tests.support.tracing import tracefs_root  # noqa: F401
from tests.support.daemon_proc import DaemonProc
from tests.support.holders import zone_reader_argv
from vmdisktouch.unitname import escape_path

MiB = 1 << 20
ARGS = ("--uri", "", "--min-free", "0", "--interval", "0.5")


def zone_held(disk: dict, zone) -> int:
    end = zone[0] + zone[1]
    return sum(max(0, min(end, o + n) - max(zone[0], o)) for o, n in disk["regions"])


def curves_drawn(png_path, st: dict, d: DaemonProc) -> None:
    """The host PNG shows the curves of the disks read (the trace source's): the panel
    under the bands, with each read disk's colour in its plot."""
    import numpy as np

    from vmdisktouch.adapters.pictures.host_render import (CHART, CURVES, LEGEND, LINE, PAD,
                                                           DiskBand, band_top)
    from vmdisktouch.adapters.pictures.host_render import colours as disk_colours
    n = len(st["disks"])
    colours = disk_colours([DiskBand(disk["path"], 0, np.zeros(0), np.zeros(0, bool))
                            for disk in st["disks"]])[:2]   # the two read, of all three
    deadline = time.monotonic() + 15
    while True:                       # the PNG follows the status by up to a cycle
        with Image.open(png_path) as png:
            img = np.asarray(png.convert("RGB"))
        drawn = []
        if img.shape[0] == band_top(n) + CURVES + PAD + LEGEND * LINE + PAD:
            top = band_top(n) + LINE + 4
            plot = img[top:top + CHART].reshape(-1, 3)
            drawn = [int((plot == c).all(axis=1).sum()) for c in colours]
            if min(drawn) > 50:
                return
        assert time.monotonic() < deadline, \
            f"no curve of each disk read (pixels {drawn}, {img.shape})\n{d.log_tail(5)}"
        time.sleep(0.3)


def reused(disk: dict) -> bool:
    """Whether the disk's curve has seen its zone read again (a first pass: all 0)."""
    return max((h for _, h in disk.get("curve") or []), default=0) > 0.5


@pytest.mark.timeout(180)
def test_three_images_share_one_budget_and_a_deleted_one_is_dropped(tmp_path):
    a, b, c = (data_image(tmp_path / f"{n}.img", 96 * MiB) for n in "abc")
    za, zb = (16 * MiB, 24 * MiB), (40 * MiB, 8 * MiB)
    readers = [subprocess.Popen(zone_reader_argv(p, *z, pause=0.1))
               for p, z in ((a, za), (b, zb))]
    d = DaemonProc(tmp_path, [a, b, c], *ARGS, "--map-png", str(tmp_path / "{disk}.map.png"),
                   "--host-png", str(tmp_path / "host.png"), max_hold="32M", status="host.json")
    try:
        st = d.wait_status(lambda s: len(s.get("disks", [])) == 3 and
                           zone_held(s["disks"][0], za) >= 0.9 * za[1] and
                           zone_held(s["disks"][1], zb) >= 0.9 * zb[1] and
                           reused(s["disks"][0]) and reused(s["disks"][1]),
                           "both zones held and read again", timeout=60)
        host = st["host"]
        assert host["budget_bytes"] == 32 * MiB and host["held_bytes"] <= 32 * MiB
        assert [x["path"] for x in host["disks"]] == [a, b, c]
        assert host["disks"][2]["held_bytes"] == 0 and host["failed"] == []
        for p in (a, b, c):
            assert (tmp_path / f"{escape_path(p)}.map.png").exists()
        with Image.open(tmp_path / "host.png") as png:
            assert png.size[0] == 1024 and png.size[1] > 3 * 18    # a band per disk
        curves_drawn(tmp_path / "host.png", st, d)
        worst = 0
        for _ in range(10):
            worst = max(worst, d.vmlck())
            time.sleep(0.2)
        assert worst <= 32 * MiB

        readers[1].kill()
        os.unlink(b)                                  # deleted under the daemon
        st = d.wait_status(lambda s: s["host"]["failed"], "b dropped", timeout=30)
        assert [f["path"] for f in st["host"]["failed"]] == [b]
        assert [x["path"] for x in st["host"]["disks"]] == [a, c]
        assert d.alive()
        before = st["host"]["cycle"]
        st = d.wait_status(lambda s: s["host"]["cycle"] > before + 2, "a goes on")
        assert zone_held(st["disks"][0], za) >= 0.9 * za[1]
        assert d.vmlck() <= 32 * MiB
        second = DaemonProc(tmp_path, a, *ARGS, max_hold="8M", status="second.json",
                            log="second.log")
        second.proc.wait(30)
        assert second.returncode() == 78 and f"pid {d.pid}" in second.output()
    finally:
        for r in readers:
            r.kill()
            r.wait()
        assert d.stop() == 0, d.output()[-3000:]
    assert "dropped, the other disks go on" in d.output()


@pytest.mark.timeout(120)
def test_the_spill_is_shared_like_the_budget(tmp_path, tracefs_root):  # noqa: F811
    """Two traced disks whose zones are three times the budget: the budget held, and the
    zones ranked next spilled (never locked), the spill of both within spill x budget."""
    a, b = (data_image(tmp_path / f"{n}.img", 64 * MiB) for n in "ab")
    za, zb = (16 * MiB, 24 * MiB), (32 * MiB, 24 * MiB)
    readers = [subprocess.Popen(zone_reader_argv(p, *z, pause=0.1))
               for p, z in ((a, za), (b, zb))]
    d = DaemonProc(tmp_path, [a, b], *ARGS, max_hold="16M", status="host.json")
    try:
        st = d.wait_status(lambda s: len(s.get("disks", [])) == 2
                           and s["host"]["held_bytes"] == 16 * MiB
                           and sum(x["spill"]["target_bytes"] for x in s["disks"]) == 16 * MiB,
                           "the budget held and as much again spilled", timeout=60)
        assert all(x["access_source"] == "trace" for x in st["disks"])
        for x, z in zip(st["disks"], (za, zb)):
            assert zone_held(x, z) == x["held_bytes"]           # held inside the zones only
        worst = 0
        for _ in range(10):
            worst = max(worst, d.vmlck())
            time.sleep(0.2)
        assert worst <= 16 * MiB
    finally:
        for r in readers:
            r.kill()
            r.wait()
        assert d.stop() == 0, d.output()[-3000:]


def test_several_images_need_a_png_path_per_disk(tmp_path):
    a = data_image(tmp_path / "a.img", 8 * MiB)
    b = data_image(tmp_path / "b.img", 8 * MiB)
    d = DaemonProc(tmp_path, [a, b], *ARGS, "--map-png", str(tmp_path / "map.png"),
                   max_hold="4M")
    d.proc.wait(30)
    out = [ln for ln in d.output().splitlines() if ln.strip()]
    assert d.returncode() == 78 and len(out) == 1 and "{disk}" in out[0], out
    d.stop()


def test_an_image_that_cannot_be_served_is_left_out_and_the_rest_start(tmp_path):
    a = data_image(tmp_path / "a.img", 8 * MiB)
    d = DaemonProc(tmp_path, [a, tmp_path / "missing.img", a], *ARGS, max_hold="4M",
                   status="host.json")
    try:
        st = d.wait_status(lambda s: s["host"]["cycle"] >= 1, "the first cycle")
        assert [x["path"] for x in st["host"]["disks"]] == [a]
        out = d.output()
        assert "left out" in out and "missing.img" in out and "named twice" in out
    finally:
        assert d.stop() == 0, d.output()[-2000:]


@pytest.mark.parametrize("argv", [[], ["--libvirt", "x.img"]])
def test_run_needs_images_or_libvirt_not_both(argv):
    import sys
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "run", *argv, "--max-hold", "1M"],
                       capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "--libvirt" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
