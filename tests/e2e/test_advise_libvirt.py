"""``vmdisktouch advise --libvirt`` and ``discover``'s ADVICE column against a real libvirtd.

One throw-away domain (no guest OS) with two raw disks: ``vda`` attached
``cache='none' io='native'`` (O_DIRECT, linux-aio: what OpenStack and Proxmox
attach) and ``vdb`` ``cache='writethrough'``. Guest-like reads go through
libvirt's own QEMU (``qemu-io`` on each device's backend, a zone read
over and over: 64 pages, as qemu-io over the monitor reads
tens of pages a second). ``advise`` must find both disks by their domain, see each
one's reads the way its cache mode sends them, and ``discover`` must show the
advice it kept.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time

import pytest

from tests.support.advise_run import advise_traced
from tests.support.images import make_image
from tests.support.libvirt_env import (URI, DomainFactory, disk_xml,  # noqa: F401
                                       libvirt_daemons, qemu_io)

pytestmark = [pytest.mark.qemu, pytest.mark.root]

MiB = 1 << 20


def vmdt(*argv, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmdisktouch", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout)


def test_advise_libvirt_sees_a_cache_none_native_disk_and_discover_shows_its_advice(
        libvirt_daemons, tmp_path):  # noqa: F811
    images = {t: make_image(tmp_path / f"{t}.raw", 64 * MiB, sparse=False)
              for t in ("vda", "vdb")}
    factory = DomainFactory(tmp_path)
    stop = threading.Event()
    try:
        name = factory.define([disk_xml("vda", images["vda"], cache="none", io="native"),
                               disk_xml("vdb", images["vdb"], cache="writethrough",
                                        io="threads")], tag="advise")

        def reader():
            rng = random.Random(1)
            while not stop.is_set():
                for alias in ("virtio-disk0", "virtio-disk1"):
                    qemu_io(name, f"read {rng.randrange(64) * 4096} 4k", alias)

        threads = [threading.Thread(target=reader, daemon=True)]
        for t in threads:
            t.start()
        time.sleep(2)
        saved = tmp_path / "advise.json"
        r, exact, lost = advise_traced(images["vda"], "--libvirt", URI, "--duration", "20",
                                       "--json", "--save", saved)
        stop.set()
        for t in threads:
            t.join(10)
        assert r.returncode in (0, 1), r.stderr           # 1: another domain's disk
        assert "Traceback" not in r.stderr, r.stderr
        disks = {d["target"]: d for d in json.loads(r.stdout)["disks"]
                 if d.get("domain") == name}
        assert set(disks) == {"vda", "vdb"}, disks
        vda, vdb = disks["vda"], disks["vdb"]
        assert vda["cache"] == "none" and vda["seen_by"] == "direct I/O", vda
        assert vdb["cache"] == "writethrough" and vdb["seen_by"] == "page cache", vdb
        for d in (vda, vdb):
            assert d["reads_per_second"] > 5, d
            assert d["path"] == images[d["target"]]
        assert vda["miss_latency_us"] > 0
        assert vda["advice"]["verdict"] in ("hold", "uniform"), vda["advice"]
        assert vda["advice"]["adopted"] is None        # io='native': adopt refuses it
        # a 256 KiB zone read over and over: the curve is near its top by 512 KiB
        top = vda["curve"][-1][1]
        near = [h for b, h in vda["curve"] if b >= 512 << 10][0]
        assert top > 0.3 and near >= top - 0.1, vda["curve"]
        # and the window's curve is the exact LRU's over the reads QEMU made, within 5 points
        assert lost == 0
        window = dict((b, h) for b, h in vda["window_curve"])
        for size in (128 << 10, 256 << 10, 512 << 10):
            near = min(window, key=lambda b: abs(b - size))
            truth = float(exact.curve([near / 4096], False)[0])
            assert abs(window[near] - truth) <= 0.05, (near, window[near], truth)

        out = vmdt("discover", "--uri", URI, "--json", "--advice", saved)
        assert out.returncode == 0, out.stderr
        listed = {o["target"]: o for o in json.loads(out.stdout) if o["domain"] == name}
        assert listed["vda"]["advice"] == vda["advice"]
        assert listed["vdb"]["advice"] == vdb["advice"]
        text = vmdt("discover", "--uri", URI, "--advice", saved).stdout
        row = next(ln for ln in text.splitlines() if ln.startswith(name) and " vda " in ln)
        assert "from memory" in row or "none:" in row, row
        assert "ADVICE: from vmdisktouch advise --libvirt" in text
    finally:
        stop.set()
        factory.cleanup()
