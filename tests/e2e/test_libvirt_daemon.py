"""``vmdisktouch run`` under libvirt: refusing O_DIRECT disks, and releasing/re-taking the
holds as the owning domain stops and starts (libvirt lifecycle events).

Written against the intended CLI: ``run`` asks libvirt (qemu:///system) about
the image at start-up, refuses an ineligible disk unless ``--force``, and
writes ``domain_active`` (true, false, or null when the disk is not under
libvirt) into the status file every cycle; while the domain is inactive it
holds nothing.

The hot zone is driven by guest-like reads through libvirt's own QEMU
(``qemu-io -d``, see FIELD-NOTES), repeated until the daemon holds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support.libvirt_env import disk_xml, domains, libvirt_daemons, qemu_io, virsh  # noqa: F401
from tests.support.pagecache import data_image, read_range
from tests.support.daemon_proc import DaemonProc

MiB = 1 << 20
HOT = (32 * MiB, 16 * MiB)    # the zone the "guest" keeps reading
# A short interval and a fast heat so the test takes seconds, not minutes.
FAST = ["--max-hold", "64M", "--interval", "0.5", "--decay", "0.5", "--min-free", "0"]


def image(path, size=256 * MiB) -> str:
    return data_image(path, size)


@pytest.fixture
def daemons():
    started: list[DaemonProc] = []

    def start(tmp_path, path, *extra):
        d = DaemonProc(tmp_path, path, *FAST, *extra)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def run_once(path, *extra, timeout=60):
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "run", path, *FAST, *extra],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("cache, io", [("none", "threads"), ("directsync", "threads"),
                                       ("none", "native")])
def test_run_refuses_an_o_direct_disk(domains, tmp_path, cache, io):  # noqa: F811
    img = image(tmp_path / "direct.raw")
    domains.define([disk_xml("vda", img, cache=cache, io=io)], tag="refuse")
    r = run_once(img, "--status", str(tmp_path / "status.json"))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("vmdisktouch: ") and f"cache={cache}" in lines[0]
    assert "--force" in lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "status.json").exists()


def test_run_force_holds_an_o_direct_disk_anyway(domains, daemons, tmp_path):  # noqa: F811
    img = image(tmp_path / "direct.raw")
    domains.define([disk_xml("vda", img, cache="none")], tag="force")
    d = daemons(tmp_path, img, "--force")
    st = d.wait_status(lambda s: s["cycle"] >= 2, "two cycles")
    assert st["domain_active"] is True
    out = d.output()
    assert "cache=none" in out            # the override is logged as a warning
    assert d.stop() == 0


def test_release_and_rehold_across_destroy_and_start(domains, daemons, tmp_path):  # noqa: F811
    img = image(tmp_path / "vm.raw")
    name = domains.define([disk_xml("vda", img, cache="writethrough")], tag="daemon")
    d = daemons(tmp_path, img)

    def guest_reads():
        qemu_io(name, f"read {HOT[0]} {HOT[1]}")

    st = d.wait_status(lambda s: s["held_bytes"] > 0, "a hold of the hot zone", drive=guest_reads)
    assert st["domain_active"] is True
    assert any(off < HOT[0] + HOT[1] and off + n > HOT[0] for off, n in st["regions"])

    virsh("destroy", name)
    t0 = time.monotonic()
    st = d.wait_status(lambda s: s["held_bytes"] == 0 and s["domain_active"] is False,
                       "the holds released after virsh destroy", timeout=15)
    assert time.monotonic() - t0 < 10     # events, not a slow poll: a few 0.5 s cycles
    # While the domain is off, the image's leftover page cache does not bring holds back.
    read_range(img, *HOT)
    cycle = st["cycle"]
    st = d.wait_status(lambda s: s["cycle"] >= cycle + 4, "four more cycles")
    assert st["held_bytes"] == 0 and st["domain_active"] is False

    virsh("start", name, "--paused")
    st = d.wait_status(lambda s: s["held_bytes"] > 0 and s["domain_active"] is True,
                       "the holds taken up again after virsh start", drive=guest_reads)
    assert d.stop() == 0


def test_a_disk_not_under_libvirt_works_as_before(libvirt_daemons, daemons,  # noqa: F811
                                                   tmp_path):
    img = image(tmp_path / "free.raw")
    d = daemons(tmp_path, img)
    st = d.wait_status(lambda s: s["held_bytes"] > 0, "a hold of a file outside libvirt",
                       drive=lambda: read_range(img, *HOT))
    assert st["domain_active"] is None
    assert d.stop() == 0
    assert "Traceback" not in open(tmp_path / "daemon.log").read()
    os.unlink(img)
