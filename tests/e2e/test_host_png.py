"""The host PNG of `vmdisktouch run --libvirt --host-png` against a real libvirtd: every
disk has a colour of its own, and keeps it while another domain is away and across a
domain's restart, which moves the disk to the end of the daemon's list (an older picture
coloured a disk by its place in the list)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image

from tests.support.libvirt_env import (URI, disk_xml, domains, libvirt_daemons,  # noqa: F401
                               qemu_io, virsh)
from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc
from vmdisktouch.adapters.pictures.host_render import (CURVES, LEGEND, LINE, PAD, DiskBand,
                                                       band_top, colours, swatch_box)

MiB = 1 << 20
INTERVAL = 0.5


def keys(st) -> list[str]:
    return [f"{d['domain']}/{d['target']}" for d in st["host"]["disks"]]


def swatches(png_path, n: int) -> list[tuple[int, int, int]]:
    """The colour of each band's swatch (the most of its pixels: a hatch is a minority)."""
    with Image.open(png_path) as png:
        img = np.asarray(png.convert("RGB"))
    base = band_top(n) + PAD + LEGEND * LINE + PAD
    assert img.shape[0] in (base, base + CURVES), "not a picture of n disks"  # curves or not
    out = []
    for k in range(n):
        x0, y0, x1, y1 = swatch_box(k)
        values, counts = np.unique(img[y0:y1 + 1, x0:x1 + 1].reshape(-1, 3), axis=0,
                                   return_counts=True)
        out.append(tuple(int(v) for v in values[counts.argmax()]))
    return out


def frame(d: DaemonProc, png_path, pred, what: str, timeout: float = 60) -> dict[str, tuple]:
    """Each disk's swatch colour, by ``domain/target``, in a frame drawn once the daemon's
    list of disks satisfies ``pred`` and has not changed for two cycles (the status is
    written just before the PNG: the list is read from the status around the PNG)."""
    deadline = time.monotonic() + timeout
    since: tuple[list[str], int] | None = None
    while time.monotonic() < deadline:
        st = d.wait_status(lambda s: pred(keys(s)), what, timeout=deadline - time.monotonic())
        order, cycle = keys(st), st["host"]["cycle"]
        if since is None or since[0] != order:
            since = (order, cycle)
        if cycle >= since[1] + 2:
            colours = swatches(png_path, len(order))
            after = d.read_status()
            if after is not None and keys(after) == order:
                return dict(zip(order, colours))
        time.sleep(INTERVAL / 2)
    raise AssertionError(f"no stable frame for {what}")


@pytest.mark.timeout(300)
def test_host_png_colours_stable_across_a_domain_restart(domains, tmp_path):  # noqa: F811
    images = [data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in ("web", "db", "ci")]
    names = [domains.define([disk_xml("vda", img)], tag=f"png{k}")
             for k, img in enumerate(images)]
    png = tmp_path / "host.png"
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0", "--decay",
                   "0.5", "--interval", str(INTERVAL), "--host-png", str(png), max_hold="16M",
                   status="host.json")

    def reads():                                         # one busier guest, one quieter
        qemu_io(names[0], "read 0 12M")
        qemu_io(names[1], "read 4M 4M")

    try:
        want = {f"{n}/vda" for n in names}
        d.wait_status(lambda s: set(keys(s)) == want, "the three disks", timeout=60)
        d.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold", timeout=30,
                      drive=reads)
        before = frame(d, png, lambda k: set(k) == want, "three disks served")
        assert len(set(before.values())) == len(before), before     # each its own
        bands = [DiskBand("", 0, np.zeros(0), np.zeros(0, bool), domain=k.split("/")[0],
                          target="vda") for k in sorted(before)]
        assert set(before.values()) == set(colours(bands))           # first from the names
        order = list(before)
        moved = order[0]                                 # first in the list: restarted,
        dom = moved.split("/")[0]                        # it comes back last
        virsh("destroy", dom)
        gone = frame(d, png, lambda k: set(k) == want - {moved}, "the domain gone")
        assert gone == {k: before[k] for k in order[1:]}
        virsh("start", dom, "--paused")
        after = frame(d, png, lambda k: set(k) == want and k[-1] == moved,
                      "the domain back, last")
        assert list(after) != order and list(after)[-1] == moved
        assert after == before, (before, after)
    finally:
        assert d.stop() == 0, d.output()[-3000:]
