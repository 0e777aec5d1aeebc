"""One runtime for one disk and many: what every mode gets from the same code.

Each of these failed on the two-runtime code (``run`` beside ``run_host``):
``run IMG IMG --uri`` did not follow the owning domain; a host-mode reload
skipped the output-path checks; the host status file protected no file.
Real processes throughout, and a real libvirtd for the domain.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys

import pytest

from tests.support.libvirt_env import URI, disk_xml, domains, libvirt_daemons, qemu_io, virsh  # noqa: F401
from tests.support.pagecache import data_image, read_range
from tests.support.common import ROOT
from tests.support.daemon_proc import DaemonProc

MiB = 1 << 20
HOT = (16 * MiB, 8 * MiB)
FAST = ("--interval", "0.5", "--decay", "0.5", "--min-free", "0")


def disk(status: dict, path: str) -> dict:
    return next(d for d in status["disks"] if d["path"] == path)


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.timeout(180)
def test_several_paths_follow_their_domain_s_stop_and_start(domains, tmp_path):  # noqa: F811
    a, b = (data_image(tmp_path / f"{n}.raw", 64 * MiB) for n in "ab")
    name = domains.define([disk_xml("vda", a, cache="writethrough")], tag="paths")

    def reads():
        qemu_io(name, f"read {HOT[0]} {HOT[1]}")     # the guest, through libvirt's QEMU
        read_range(b, *HOT)                          # b: a file no domain uses

    d = DaemonProc(tmp_path, [a, b], *FAST, "--uri", URI, max_hold="32M", status="host.json")
    try:
        st = d.wait_status(lambda s: len(s.get("disks", [])) == 2
                           and disk(s, a)["held_bytes"] > 0 and disk(s, b)["held_bytes"] > 0,
                           "both disks held", timeout=60, drive=reads)
        assert disk(st, a)["domain_active"] is True and disk(st, b)["domain_active"] is None

        virsh("destroy", name)
        st = d.wait_status(lambda s: disk(s, a)["held_bytes"] == 0
                           and disk(s, a)["domain_active"] is False,
                           "a released while its domain is off", timeout=20,
                           drive=lambda: read_range(b, *HOT))
        assert disk(st, a)["holding"] is False
        assert disk(st, b)["held_bytes"] > 0 and disk(st, b)["holding"] is True
        assert "its libvirt domain is not running; releasing the holds" in d.output()

        virsh("start", name, "--paused")
        st = d.wait_status(lambda s: disk(s, a)["held_bytes"] > 0
                           and disk(s, a)["domain_active"] is True,
                           "a held again after its domain started", timeout=60, drive=reads)
        assert st["host"]["held_bytes"] <= 32 * MiB
    finally:
        assert d.stop() == 0, d.output()[-3000:]


@pytest.mark.timeout(120)
def test_a_host_reload_whose_output_names_a_served_image_is_refused(tmp_path):
    a, b = (data_image(tmp_path / f"{n}.raw", 32 * MiB) for n in "ab")
    before = digest(b)
    conf = tmp_path / "host.toml"
    conf.write_text('max_hold = "16M"\n')
    d = DaemonProc(tmp_path, [a, b], *FAST, "--uri", "", "--config", conf, status="host.json")
    try:
        st = d.wait_status(lambda s: s.get("host", {}).get("cycle", 0) >= 2, "two cycles")
        assert st["host"]["budget_bytes"] == 16 * MiB
        conf.write_text(f'max_hold = "8M"\nhost_png = "{b}"\n')
        d.signal(signal.SIGHUP)
        d.wait_output("reload rejected", "the reload refused", timeout=20)
        cycle = st["host"]["cycle"]
        st = d.wait_status(lambda s: s["host"]["cycle"] >= cycle + 3, "more cycles")
        assert st["host"]["budget_bytes"] == 16 * MiB          # the old settings stay
        assert "refusing --host-png" in d.output() and "it is the disk image" in d.output()
        assert digest(b) == before
    finally:
        assert d.stop() == 0, d.output()[-3000:]
    assert digest(b) == before


def test_the_host_status_file_is_protected_like_any_output(tmp_path):
    a, b = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in "ab")
    before = digest(b)
    alias = tmp_path / "status.json"
    os.link(b, alias)                        # the status path is the image b by another name
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "run", a, b, "--max-hold", "8M",
                        *FAST, "--uri", "", "--status", str(alias)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 78, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("vmdisktouch: refusing --status") and "it is the disk image" in last
    assert digest(b) == before
