"""The host PNG lists the disks the host service does not serve, with why, and marks those
the last ``vmdisktouch advise`` says would gain, against a real libvirtd.

One throw-away domain (no guest OS): ``vda`` writethrough (served) and ``vdb``
``cache='none' io='native'`` (not eligible: O_DIRECT). A zone of ``vdb`` is read
over and over through libvirt's own QEMU while ``advise --libvirt`` watches; its
report is kept where ``advise`` keeps it (``/run/vmdisktouch/advise.json``; a
report already there is put back afterwards). The host service then draws
``vdb`` under "not served", with a triangle and what it would gain.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from PIL import Image

from tests.support.daemon_proc import DaemonProc
from tests.support.images import make_image
from tests.support.libvirt_env import (URI, disk_xml, domains, libvirt_daemons,  # noqa: F401
                                       qemu_io)
from vmdisktouch.adapters.advice_file import ADVICE_NAME
from vmdisktouch.adapters.pictures.host_render import LINE, WOULD_GAIN, band_top

pytestmark = [pytest.mark.qemu, pytest.mark.root]

MiB = 1 << 20


@pytest.fixture
def run_dir(tmp_path):
    """This test's runtime directory (``VMDISKTOUCH_RUNTIME_DIR``), where advise keeps its
    report and the host service reads it: the host's own is not touched."""
    run = tmp_path / "run"
    run.mkdir()
    return run


@pytest.mark.timeout(300)
def test_the_host_png_marks_a_cache_none_disk_that_would_gain(domains, tmp_path,  # noqa: F811
                                                              run_dir):
    wt, none = (make_image(tmp_path / f"{n}.raw", 32 * MiB, sparse=False)
                for n in ("wt", "none"))
    name = domains.define([disk_xml("vda", wt), disk_xml("vdb", none, cache="none",
                                                         io="native")], tag="unserved")
    stop = threading.Event()

    def reader():
        rng = random.Random(2)
        while not stop.is_set():
            qemu_io(name, f"read {rng.randrange(64) * 4096} 4k", "virtio-disk1")

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        time.sleep(2)
        r = subprocess.run([sys.executable, "-m", "vmdisktouch", "advise", "--libvirt", URI,
                            "--duration", "20", "--json"], capture_output=True, text=True,
                           timeout=120, env={**os.environ,
                                             "VMDISKTOUCH_RUNTIME_DIR": str(run_dir)})
    finally:
        stop.set()
        t.join(10)
    assert r.returncode in (0, 1), r.stderr
    mine = [d for d in json.loads(r.stdout)["disks"] if d.get("domain") == name]
    vdb = next(d for d in mine if d["target"] == "vdb")
    assert vdb["advice"]["verdict"] == "hold", vdb["advice"]
    assert json.load(open(run_dir / ADVICE_NAME))["disks"] == json.loads(r.stdout)["disks"]

    png = tmp_path / "host.png"
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0", "--interval",
                   "0.5", "--host-png", str(png), max_hold="16M", status="host.json",
                   env={**os.environ, "VMDISKTOUCH_RUNTIME_DIR": str(run_dir)})
    try:
        st = d.wait_status(lambda s: any(x["domain"] == name for x in s["host"]["disks"])
                           and any(x.get("domain") == name for x in s["host"]["skipped"]),
                           "vda served, vdb skipped", timeout=60)
        time.sleep(1.5)                                   # a frame after that status
        served = len(d.read_status()["host"]["disks"])
        skipped = d.read_status()["host"]["skipped"]
        with Image.open(png) as im:
            img = np.asarray(im.convert("RGB"))
    finally:
        assert d.stop() == 0, d.output()[-3000:]
    rows = [f"{x['domain']}/{x['target']}" for x in sorted(
        skipped, key=lambda x: (x["domain"], x["target"]))]
    k = rows.index(f"{name}/vdb")
    y = band_top(served) + (k + 1) * LINE                 # the title line, then a row each
    tri = (img[y:y + LINE, :20] == WOULD_GAIN).all(axis=2).sum()
    assert tri > 20, "no triangle marks the cache=none disk that would gain"
    why = next(x["reason"] for x in skipped if x["domain"] == name and x["target"] == "vdb")
    assert "O_DIRECT" in why or "cache" in why, why
