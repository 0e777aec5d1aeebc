"""``vmdisktouch discover`` against a real libvirtd, human and JSON output.

Two throw-away domains:

* ``cachemodes`` (started paused, no guest OS): one raw file per cache mode
  (writethrough, writeback, none, directsync, unsafe, and no cache attribute
  at all), plus cache=none with io=native;
* ``offline`` (defined, never started): io=native with cache=directsync
  (libvirt refuses io=native with a buffered cache mode), a loop block
  device, and a network disk.

Other domains on the host are ignored. The CLI runs in a subprocess.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.support.libvirt_env import (URI, DomainFactory, disk_xml, libvirt_daemons,  # noqa: F401
                               virsh)
from vmdisktouch.unitname import unit_name

CACHE_DISKS = [  # target, cache, io, eligible
    ("vda", "writethrough", "threads", True),
    ("vdb", "writeback", "threads", True),
    ("vdc", "none", "threads", False),
    ("vdd", "directsync", "threads", False),
    ("vde", "unsafe", "threads", True),
    ("vdf", None, None, True),             # QEMU's defaults: writeback, threads
    ("vdg", "none", "native", False),
]


def discover(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "discover", *args],
                       capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def discover_json(names):
    objs = json.loads(discover("--json").stdout)
    assert isinstance(objs, list)
    return {(o["domain"], o["target"]): o for o in objs if o["domain"] in names}


@pytest.fixture(scope="module")
def setup(libvirt_daemons, tmp_path_factory):  # noqa: F811
    work = tmp_path_factory.mktemp("discover")
    factory = DomainFactory(work)
    loop = None
    try:
        images = {}
        disks = []
        for target, cache, io, _ in CACHE_DISKS:
            images[target] = work / f"cache-{cache or 'default'}-{io or 'default'}.raw"
            images[target].write_bytes(b"")
            with open(images[target], "r+b") as f:
                f.truncate(16 << 20)
            disks.append(disk_xml(target, str(images[target]), cache=cache, io=io))
        disks.append(disk_xml("sda", None, device="cdrom", readonly=True))   # no medium
        running = factory.define(disks, tag="cachemodes")

        native = work / "native-directsync.raw"
        with open(native, "wb") as f:
            f.truncate(16 << 20)
        backing = work / "loop-backing.raw"
        with open(backing, "wb") as f:
            f.truncate(16 << 20)
        loop = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True,
                              capture_output=True, text=True).stdout.strip()
        offline = factory.define([
            disk_xml("vda", str(native), cache="directsync", io="native"),
            disk_xml("vdb", loop, cache="writethrough", io="threads", dtype="block"),
            disk_xml("vdc", None, cache="writeback", dtype="network"),
        ], start=False, tag="offline")
        yield {"running": running, "offline": offline, "images": images, "native": native,
               "loop": loop}
    finally:
        factory.cleanup()
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False)


def test_json_lists_every_cache_mode_with_eligibility_and_unit(setup):
    got = discover_json({setup["running"], setup["offline"]})
    for target, cache, io, eligible in CACHE_DISKS:
        o = got[(setup["running"], target)]
        src = str(setup["images"][target])
        assert o["state"] == "paused" and o["active"] is True
        assert (o["source"], o["type"], o["format"]) == (src, "file", "raw")
        assert o["cache"] == (cache or "writeback")
        assert o["io"] == (io or "threads")
        assert o["cache_default"] is (cache is None)
        assert o["eligible"] is eligible, o
        assert o["unit"] == unit_name(src)
        if eligible:
            assert f"cache={o['cache']}" in o["reason"]
        else:
            assert "O_DIRECT" in o["reason"] and "bypasses the host page cache" in o["reason"]
            for word in ([f"cache={cache}"] if cache in ("none", "directsync") else []) + \
                    (["io=native"] if io == "native" else []):
                assert word in o["reason"]


def test_json_shut_off_domain_native_io_block_and_network(setup):
    got = discover_json({setup["offline"]})
    assert len(got) == 3
    native, block, net = (got[(setup["offline"], t)] for t in ("vda", "vdb", "vdc"))
    for o in (native, block, net):
        assert o["state"] == "shutoff" and o["active"] is False
    assert (native["cache"], native["io"], native["eligible"]) == ("directsync", "native", False)
    assert "cache=directsync and io=native use O_DIRECT" in native["reason"]
    assert (block["type"], block["source"], block["eligible"]) == ("block", setup["loop"], True)
    assert block["unit"] == unit_name(setup["loop"])
    assert (net["type"], net["source"], net["unit"], net["eligible"]) == ("network", None, None,
                                                                          False)
    assert net["reason"] == "not a local file or block device (type=network)"


def test_human_table(setup, tmp_path):
    out = discover("--advice", tmp_path / "none.json").stdout     # no advise report
    lines = out.splitlines()
    assert lines[0].startswith(("recommended: ", "host service vmdisktouch.service: "))
    assert "vmdisktouch.service" in lines[0]          # the host service first (issue 34)
    header = next(ln for ln in lines if ln.startswith("DOMAIN"))
    assert header.split() == ["DOMAIN", "STATE", "TARGET", "TYPE", "FORMAT", "CACHE", "IO",
                              "ELIGIBLE", "ADVICE", "SOURCE"]
    for target, cache, io, eligible in CACHE_DISKS:
        src = str(setup["images"][target])
        (i,) = [i for i, ln in enumerate(lines) if ln.endswith(src)]
        row = lines[i].split()
        assert row[:3] == [setup["running"], "paused", target]
        assert row[3:5] == ["file", "raw"]
        assert row[5] == (cache or "writeback*") and row[6] == (io or "threads*")
        assert row[7] == ("yes" if eligible else "no") and row[8] == "-"
        if eligible:
            assert lines[i + 1].strip().startswith("why: ")
            assert lines[i + 2].strip().startswith(f"per-disk unit: {unit_name(src)}")
        else:
            assert lines[i + 1].strip().startswith("why not: ")
            assert "O_DIRECT" in lines[i + 1]
            assert "per-disk unit:" not in lines[i + 2]
    assert "* not set in the domain XML: QEMU's default (cache=writeback, io=threads)" in out
    (net,) = [ln for ln in lines if ln.startswith(setup["offline"]) and " network " in ln]
    assert net.split()[1] == "shutoff" and net.split()[-3:] == ["no", "-", "-"]
    assert "ADVICE: none yet: run vmdisktouch advise --libvirt" in out
    assert not any(" sda " in ln and ln.startswith(setup["running"]) for ln in lines)
    assert re.search(r"^\d+ empty removable drives? \(no medium\) not listed$", out, re.M)
    assert not any(ln.split()[:1] == [setup["running"]] and "cdrom" in ln for ln in lines)


def test_eligible_lists_only_the_disks_it_can_help(setup):
    out = discover("--eligible").stdout
    srcs = {str(p) for p in setup["images"].values()}
    listed = {ln.split()[-1] for ln in out.splitlines() if ln.split()[-1:] and
              ln.split()[-1] in srcs}
    assert listed == {str(setup["images"][t]) for t, _, _, ok in CACHE_DISKS if ok}
    assert "why not:" not in out and " no " not in out.splitlines()[1]
    objs = json.loads(discover("--eligible", "--json").stdout)
    assert objs and all(o["eligible"] for o in objs)
    assert all("unit_enabled" in o and "unit_active" in o for o in objs)
    assert not any(o["device"] == "cdrom" and o["source"] is None for o in objs)


def test_state_changes_are_shown(setup):
    name = setup["running"]
    key = (name, "vda")
    virsh("destroy", name)
    try:
        o = discover_json({name})[key]
        assert (o["state"], o["active"]) == ("shutoff", False)
        (row,) = [ln for ln in discover().stdout.splitlines()
                  if ln.endswith(str(setup["images"]["vda"]))]
        assert row.split()[:2] == [name, "shutoff"]
    finally:
        virsh("start", name, "--paused")
    o = discover_json({name})[key]
    assert (o["state"], o["active"]) == ("paused", True)


def test_default_uri_is_qemu_system_and_bad_uri_is_one_line_error(setup):
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "discover", "--help"],
                       capture_output=True, text=True)
    assert URI in r.stdout
    assert setup["running"] in discover("--uri", URI).stdout
    r = discover("--uri", "qemu:///nonexistent", check=False)
    assert r.returncode == 1
    assert r.stderr.startswith("vmdisktouch: cannot connect to qemu:///nonexistent: ")
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr
