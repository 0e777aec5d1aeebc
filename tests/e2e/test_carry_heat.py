"""The heat travels with the domain, against a real libvirtd (issue 33).

A host service with its defaults writes each disk's hot regions into its
domain's live metadata; a fresh daemon with an empty state directory (as on
the destination host) holds them within 10 s of a restore, paused, with no
guest I/O; the summary survives save/restore and managedsave and lands on
the right disk; a mismatched one is ignored; a domain that does not carry is
left untouched. No byte of an image changes, and the budget is never
exceeded (VmLck sampled every 0.2 s)."""

from __future__ import annotations

import hashlib
import time
import xml.etree.ElementTree as ET

import pytest

from tests.support.libvirt_env import (URI, VmLck, disk_xml, domains,  # noqa: F401
                               libvirt_daemons, qemu_io, virsh)
from tests.support.images import evict
from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc
from vmdisktouch.adapters.libvirt import domain_heat as dh

MiB = 1 << 20
BUDGET = 24 * MiB
ZONE = {"vda": (8 * MiB, 8 * MiB), "vdb": (40 * MiB, 6 * MiB)}     # offset, length
ALIAS = {"vda": "virtio-disk0", "vdb": "virtio-disk1"}


def summary(domain: str) -> dict:
    """The summary in the domain's live XML: target -> DiskHeat (or why not); {} if none."""
    elem = dh.find(ET.fromstring(virsh("dumpxml", domain)))
    return {} if elem is None else dh.parse(elem)


def covered(s, zone) -> float:
    """The share of ``zone`` (bytes) the summary's regions cover."""
    off, length = zone
    blocks = set(range(off // s.block_size, (off + length) // s.block_size))
    return len(blocks & s.covered()) / len(blocks)


def held_share(st, path, zone) -> float:
    off, length = zone
    disk = next((d for d in st.get("disks", []) if d["path"] == path), None)
    if disk is None:
        return 0.0
    got = sum(max(0, min(o + n, off + length) - max(o, off)) for o, n in disk["regions"])
    return got / length


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read()).hexdigest()


def host(tmp_path, name, *args):
    """A host service with its defaults: a budget, no floor here, a status file."""
    state = tmp_path / f"state-{name}"
    return DaemonProc(tmp_path / name, [], "--libvirt", "--uri", URI, "--min-free", "0",
                      "--state-dir", str(state), *args, max_hold=str(BUDGET),
                      status="host.json")


def learn(tmp_path, dom, images, *args):
    """Daemon A reads the zones as the guest; returns once the summary covers them, as hot
    as a zone read for some seconds is."""
    (tmp_path / "a").mkdir()
    a = host(tmp_path, "a", "--interval", "1", "--carry-interval", "1", *args)
    try:
        deadline = time.monotonic() + 60
        while True:
            for t in images:
                off, length = ZONE[t]
                qemu_io(dom, f"read {off} {length}", ALIAS[t])
            s = summary(dom)
            if all(not isinstance(s.get(t), (str, type(None))) and covered(s[t], ZONE[t]) >= 0.9
                   and max(h for _, _, h in s[t].regions) >= 0.4 for t in images):
                return a, s
            assert time.monotonic() < deadline, f"no summary covers the zones: {s}\n" \
                                                f"{a.log_tail(20)}"
            time.sleep(0.5)
    except BaseException:
        a.stop()
        raise


def arrive(tmp_path, images, restart, what):
    """A fresh daemon B (empty state dir, default interval) up; ``restart()`` brings the
    domain back paused; B must hold every zone within 10 s. Returns (B, seconds, VmLck)."""
    (tmp_path / "b").mkdir()
    b = host(tmp_path, "b")
    try:
        b.wait_status(lambda s: "host" in s, "daemon B up", timeout=60)
        lck = VmLck(b)
        t0 = time.monotonic()
        restart()
        st = b.wait_status(lambda s: all(held_share(s, p, ZONE[t]) >= 0.9
                                         for t, p in images.items()),
                           f"the zones held after {what}", timeout=30)
        return b, time.monotonic() - t0, lck, st
    except BaseException:
        b.stop()
        raise


@pytest.mark.timeout(300)
def test_a_restored_domain_arrives_warm_on_a_fresh_daemon(domains, tmp_path):  # noqa: F811
    img = data_image(tmp_path / "a.raw", 64 * MiB)
    before = digest(img)
    dom = domains.define([disk_xml("vda", img)], tag="carry")
    a, s = learn(tmp_path, dom, ["vda"])
    assert s["vda"].size == 64 * MiB and s["vda"].fingerprint
    assert len(virsh("metadata", dom, dh.NS).encode()) < 4096        # a few KiB at most
    saved = tmp_path / "dom.save"
    virsh("save", dom, str(saved))
    a.stop()
    evict(img)
    b, seconds, lck, st = arrive(tmp_path, {"vda": img},
                                 lambda: virsh("restore", str(saved), "--paused"), "restore")
    try:
        assert seconds <= 10, f"held after {seconds:.1f} s\n{b.log_tail(20)}"
        assert virsh("domstate", dom).strip() == "paused"          # no guest I/O
        assert "arrived with the heat carried" in b.err()
        assert [d["warmed_from"] for d in st["disks"] if d["path"] == img] == ["metadata"]
        assert lck.worst <= BUDGET, lck.worst
    finally:
        lck.stop.set()
        b.stop()
    assert digest(img) == before                                  # nothing written


@pytest.mark.timeout(300)
def test_managedsave_keeps_the_summary_and_each_disk_gets_its_own(domains, tmp_path):  # noqa: F811
    imgs = {t: data_image(tmp_path / f"{t}.raw", 64 * MiB) for t in ("vda", "vdb")}
    before = {t: digest(p) for t, p in imgs.items()}
    dom = domains.define([disk_xml(t, p) for t, p in imgs.items()], tag="carrym")
    a, s = learn(tmp_path, dom, list(imgs))
    virsh("managedsave", dom)
    a.stop()
    for p in imgs.values():
        evict(p)
    b, seconds, lck, st = arrive(tmp_path, imgs, lambda: virsh("start", dom, "--paused"),
                                 "start from the managed save")
    try:
        assert seconds <= 10, f"held after {seconds:.1f} s\n{b.log_tail(20)}"
        after = summary(dom)
        for t in imgs:                      # carried as written, on its own disk
            assert covered(after[t], ZONE[t]) >= 0.9
            other = "vdb" if t == "vda" else "vda"
            assert held_share(st, imgs[t], ZONE[other]) < 0.2, st
        assert lck.worst <= BUDGET
    finally:
        lck.stop.set()
        b.stop()
    assert {t: digest(p) for t, p in imgs.items()} == before


def foreign(xml: str, change: tuple[str, str]) -> str:
    return xml.replace(*change)


MISMATCHES = [
    (('size="67108864"', 'size="67112960"'), "bytes"),                 # another size
    (("fingerprint=\"", "fingerprint=\"00"), "fingerprint"),          # another image
    (('blocks="', 'blocks="9'), "corrupt"),                           # corrupt
    (('version="1"', 'version="2"'), "foreign"),                      # not ours
]


@pytest.mark.timeout(300)
def test_a_mismatched_summary_is_ignored_in_one_line(domains, tmp_path):  # noqa: F811
    """Each mismatch in turn on the summary one daemon learned (learning it is most of the
    time), a fresh host service for each."""
    img = data_image(tmp_path / "a.raw", 64 * MiB)
    dom = domains.define([disk_xml("vda", img)], tag="carryx")
    a, _ = learn(tmp_path, dom, ["vda"])
    a.stop()
    good = virsh("metadata", dom, dh.NS)
    for change, line in MISMATCHES:
        virsh("metadata", dom, dh.NS, "--key", dh.KEY, "--set", foreign(good, change), "--live")
        evict(img)
        (tmp_path / f"b-{line}").mkdir()
        b = host(tmp_path, f"b-{line}", "--interval", "1")
        try:
            b.wait_status(lambda s: any(d["path"] == img for d in s.get("disks", [])) and
                          s["host"]["cycle"] >= 3, f"three cycles ({line})", timeout=60)
            ignored = [x for x in b.err().splitlines() if "ignoring the heat carried" in x]
            assert len(ignored) == 1 and line in ignored[0], f"{line}: {b.err()}"
            assert "arrived with the heat carried" not in b.err(), f"{line}: {b.err()}"
        finally:
            b.stop()


@pytest.mark.timeout(300)
def test_a_domain_that_does_not_carry_is_left_untouched(domains, tmp_path):  # noqa: F811
    img = data_image(tmp_path / "a.raw", 64 * MiB)
    dom = domains.define([disk_xml("vda", img)], tag="carryoff")
    conf = tmp_path / "host.toml"
    conf.write_text(f"[domain.{dom}]\ncarry_heat = false\n")
    (tmp_path / "a").mkdir()
    a = host(tmp_path, "a", "--interval", "1", "--carry-interval", "1", "--config", str(conf))
    try:
        off, length = ZONE["vda"]
        a.wait_status(lambda s: held_share(s, img, ZONE["vda"]) >= 0.9, "the zone held",
                      timeout=60, drive=lambda: qemu_io(dom, f"read {off} {length}"))
        time.sleep(3)                               # three more cycles: still nothing
        assert summary(dom) == {}
        assert "<metadata" not in virsh("dumpxml", dom)
    finally:
        a.stop()
