"""Fault table, round 3: a domain's libvirt metadata, hostile (issue 40, part 5).

Each row runs a real host service (``run --libvirt``) against the real
libvirtd with throw-away domains started paused (no guest OS), puts in a
domain's live metadata what libvirt accepts but no daemon writes, and checks
that it costs that domain's summary at most: carried heat out of range is
refused or bounded, metadata that does not parse or cannot be read never
hides the other domains, and ``discover`` lists them all. See
``tests/support/faultkit.py`` and ``docs/faults.md``.
"""

from __future__ import annotations

import json
import math
import os
import time
import xml.etree.ElementTree as ET

import pytest

from tests.support.faultkit import assert_clean, fault, rows_of, vmdt
from tests.support.libvirt_env import URI, disk_xml, domains, libvirt_daemons, virsh  # noqa: F401
from tests.support.images import evict
from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc
from vmdisktouch.adapters.libvirt import domain_heat as dh

MiB = 1 << 20
BUDGET = 256 * MiB     # other tests' domains on this libvirtd are served too
CASE = "40 round 3"
ZONE = (8 * MiB, 6 * MiB)            # blocks 8..13 of a 1 MiB block size
THRESHOLD, DECAY = 0.05, 0.1         # the defaults the rows rely on


def host(tmp_path, *args) -> DaemonProc:
    """A host service at 1 s cycles with an empty state directory, its status in
    ``tmp_path/host/host.json``."""
    work = tmp_path / "host"
    work.mkdir()
    return DaemonProc(work, [], "--libvirt", "--uri", URI, "--min-free", "0", "--interval", "1",
                      "--state-dir", str(tmp_path / "state"), *args, max_hold=str(BUDGET),
                      status="host.json")


def served(st: dict | None) -> dict:
    """Image path -> its status, of the disks a host status serves."""
    return {d["path"]: d for d in (st or {}).get("disks", [])}


def held(st: dict | None, path: str) -> int:
    """The bytes of ``ZONE`` held of ``path`` (QEMU's own reads at start heat block 0)."""
    off, length = ZONE
    return sum(max(0, min(o + n, off + length) - max(o, off))
               for o, n in served(st).get(path, {}).get("regions", []))


class Image:
    """What ``domain_heat.fingerprint`` reads of an image: its size and an open fd."""

    def __init__(self, path):
        self.size = os.path.getsize(path)
        self.fd = os.open(path, os.O_RDONLY)


def summary_xml(images: dict[str, str], heats: dict[str, float]) -> str:
    """A summary of each target's image, as the daemon writes it, the zone at ``heats``."""
    out = []
    for target, path in images.items():
        img = Image(path)
        try:
            out.append(dh.DiskHeat(target, img.size, MiB, dh.fingerprint(img), time.time(),
                                   ((ZONE[0] // MiB, ZONE[1] // MiB, heats[target]),)))
        finally:
            os.close(img.fd)
    return dh.to_xml(out)


def set_metadata(dom: str, xml: str, ns: str = dh.NS, key: str = dh.KEY) -> None:
    """Set live metadata through the python binding (virsh's argv cannot carry MiB)."""
    import libvirt
    conn = libvirt.open(URI)
    try:
        conn.lookupByName(dom).setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, key, ns,
                                           libvirt.VIR_DOMAIN_AFFECT_LIVE)
    finally:
        conn.close()


def discover(*args) -> tuple[int, str, str]:
    r = vmdt("discover", "--uri", URI, *args, timeout=60)
    assert_clean(r.stderr)
    return r.returncode, r.stdout, r.stderr


@fault("carried-heat-out-of-range",
       "a domain's summary carries `heat=\"1e+300\"` for vda's zone (past float64's use, "
       "float32's range) and `heat=\"100000\"` (legal, far above any default map) for vdb's",
       "out-of-range heat is refused at parse (one line), legal heat arrives at most 20 x "
       "the threshold, so a zone nobody reads is released as a lease is; the status stays "
       "JSON and `vmdisktouch status` exits 0; the summary written back is finite",
       "one `ignoring ... corrupt` line for vda, vda never held; vdb held at arrival and "
       "released unread within 15 s at a decay of 0.5/s; `status` exits 0; every heat in the "
       "metadata written back finite and <= 1.0", case=CASE)
def check_heat_out_of_range(tmp_path, domains):  # noqa: F811
    imgs = {t: data_image(tmp_path / f"{t}.raw", 64 * MiB) for t in ("vda", "vdb")}
    dom = domains.define([disk_xml(t, p) for t, p in imgs.items()], tag="heat1e300")
    virsh("metadata", dom, dh.NS, "--key", dh.KEY, "--live", "--set",
          summary_xml(imgs, {"vda": 1e300, "vdb": 1e5}))
    for p in imgs.values():
        evict(p)
    # At once (other tests' daemons write too); a decay of 0.5/s: a lease of ln(20 / 0.5) /
    # 0.5 = 7.4 s for heat capped at 20 x the threshold, 30 s for the 1e5 uncapped.
    d = host(tmp_path, "--carry-interval", "1", "--decay", "0.5")
    try:
        st = d.wait_status(lambda s: held(s, imgs["vdb"]) >= ZONE[1], "vdb held on arrival",
                           timeout=60)
        t0 = time.monotonic()
        assert held(st, imgs["vda"]) == 0, st
        r = vmdt("status", "--dir", tmp_path / "host", timeout=30)
        assert r.returncode == 0 and "Infinity" not in (tmp_path / "host/host.json").read_text(), \
            f"status exit {r.returncode}: {r.stdout[-800:]}{r.stderr[-800:]}"
        d.wait_status(lambda s: held(s, imgs["vdb"]) == 0 and held(s, imgs["vda"]) == 0,
                      "vdb's zone released, unread", timeout=60)
        lease = time.monotonic() - t0
        assert lease <= 15, lease          # 7.4 s, plus a few cycles
        ignored = [x for x in d.err().splitlines() if "ignoring the heat carried" in x]
        assert len(ignored) == 1 and "corrupt" in ignored[0] and "vda" in ignored[0], d.err()
        written = virsh("metadata", dom, dh.NS)
        heats = [float(h) for h in
                 (e.get("heat") for e in ET.fromstring(written).iter() if e.get("heat"))]
        assert "inf" not in written and all(math.isfinite(h) and h <= 1.0 for h in heats), \
            written
    finally:
        d.stop()


@fault("metadata-undeclared-prefix",
       "one domain's heat element holds `<foo:bar/>` (libvirt 9.0 accepts it; its live XML "
       "then does not parse), beside a good domain",
       "one domain's bad metadata costs that domain's summary, never the view of the others "
       "nor its own disks",
       "both domains' disks served; one WARNING naming the bad domain, once; `discover "
       "--json` exits 0 and lists both, the bad one's disk with its problem; the good domain, "
       "destroyed, is no longer served within 5 s", case=CASE)
def check_undeclared_prefix(tmp_path, domains):  # noqa: F811
    good_img = data_image(tmp_path / "good.raw", 16 * MiB)
    bad_img = data_image(tmp_path / "bad.raw", 16 * MiB)
    good = domains.define([disk_xml("vda", good_img)], tag="metagood")
    bad = domains.define([disk_xml("vda", bad_img)], tag="metabad")
    set_metadata(bad, '<heat version="1"><foo:bar/></heat>')
    assert "foo:bar" in virsh("dumpxml", bad)
    d = host(tmp_path)
    try:
        d.wait_status(lambda s: {good_img, bad_img} <= set(served(s)) and
                      s["host"]["cycle"] >= 3, "both domains served", timeout=60)
        said = [x for x in d.err().splitlines() if f"libvirt: {bad}: its metadata is not" in x]
        assert len(said) == 1 and "WARNING" in said[0], d.err()
        code, out, _ = discover("--json")
        listed = {(o["domain"], o["target"]): o for o in json.loads(out)}
        assert code == 0 and (good, "vda") in listed and (bad, "vda") in listed
        assert "not well-formed" in listed[bad, "vda"]["problem"]
        assert listed[good, "vda"]["problem"] is None
        virsh("destroy", good)
        t0 = time.monotonic()
        d.wait_status(lambda s: good_img not in served(s), "the destroyed domain let go",
                      timeout=30)
        assert time.monotonic() - t0 <= 5
    finally:
        d.stop()


@fault("metadata-over-4mib",
       "one domain's live metadata is a 4.19 MB foreign element (libvirt accepts it; its "
       "XMLDesc then fails: \"Unable to encode message payload\")",
       "the domain is not dropped silently: said once, its last known disks kept, and "
       "`discover` lists it with the reason",
       "one WARNING naming the domain and the reason over 5 cycles; its disk still served; "
       "`discover` exits 1 and lists it with the reason, on its row and on stderr", case=CASE)
def check_over_4mib(tmp_path, domains):  # noqa: F811
    img = data_image(tmp_path / "big.raw", 16 * MiB)
    other = data_image(tmp_path / "other.raw", 16 * MiB)
    dom = domains.define([disk_xml("vda", img)], tag="metabig")
    fine = domains.define([disk_xml("vda", other)], tag="metafine")
    d = host(tmp_path)
    try:
        d.wait_status(lambda s: {img, other} <= set(served(s)), "both served", timeout=60)
        set_metadata(dom, f'<big a="{"a" * 4_193_000}"/>', "http://example.org/big", "big")
        c0 = d.read_status()["host"]["cycle"]
        st = d.wait_status(lambda s: s["host"]["cycle"] >= c0 + 5, "5 more cycles", timeout=30)
        assert {img, other} <= set(served(st)), st
        said = [x for x in d.err().splitlines() if f"libvirt: {dom}: cannot read its XML" in x]
        assert len(said) == 1 and "WARNING" in said[0], d.err()
        code, out, err = discover()
        assert code == 1, (code, out, err)
        row = [x for x in out.splitlines() if x.startswith(dom)]
        assert len(row) == 1 and fine in out, out
        assert "Unable to encode message payload" in out.split(row[0], 1)[1].splitlines()[1]
        assert f"{dom}: cannot read its XML: Unable to encode message payload" in err
    finally:
        d.stop()


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_metadata_fault(row, tmp_path, domains):  # noqa: F811
    row.check(tmp_path, domains)
