"""The heat summary a domain carries (``adapters.libvirt.domain_heat``) and its writer's rules
(``daemon.carry``): regions, size, parsing, identity, arrival heat, when to write."""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from vmdisktouch.adapters.libvirt import domain_heat as dh
from vmdisktouch.daemon import carry
from vmdisktouch.errors import VmdtError

MiB = 1 << 20


class FakeImage:
    """An image of ``size`` bytes, "head" at its start and "tail" at its end (the
    fingerprint's pages), open read-only as ``fd``."""

    def __init__(self, path, size: int):
        self.path, self.size = str(path), size
        path.write_bytes(b"")
        with open(path, "r+b") as f:
            f.truncate(size)
            f.write(b"head")
            f.seek(size - 4)
            f.write(b"tail")
        self.fd = os.open(path, os.O_RDONLY)


@pytest.fixture
def image(tmp_path):
    img = FakeImage(tmp_path / "a.raw", 64 * MiB)
    yield img
    os.close(img.fd)


def element(xml: str) -> ET.Element:
    """The summary as libvirt returns it: inside the domain's metadata, namespaced."""
    inner = xml.replace("<heat ", f'<v:heat xmlns:v="{dh.NS}" ', 1).replace("</heat>",
                                                                            "</v:heat>")
    dom = ET.fromstring(f"<domain><metadata>{inner}</metadata></domain>")
    return dh.find(dom)


def test_round_trip_keeps_the_densest_regions_in_a_few_kib(image):
    heat = np.zeros(64, dtype=np.float32)
    heat[4:10] = 0.9                      # dense
    heat[20:40] = 0.1                     # wide, lukewarm
    heat[50] = 0.02                       # below the threshold: not carried
    s = dh.summarize(heat, 0.05, "vda", image, MiB, 1000.0)
    assert [(a, n) for a, n, _ in s.regions] == [(4, 6), (20, 20)]
    back = dh.parse(element(dh.to_xml([s])))["vda"]
    assert back == s
    many = np.tile(np.array([0, 1], dtype=np.float32), 4096)   # 4096 one-block regions
    many[::2] = 0
    s = dh.summarize(many * np.linspace(0.1, 1, many.size, dtype=np.float32), 0.05, "vdb",
                     image, MiB, 1000.0)
    assert len(s.regions) == dh.MAX_REGIONS
    assert min(h for _, _, h in s.regions) > 0.9        # the densest 64 of them
    assert len(dh.to_xml([s]).encode()) < 4096


@pytest.mark.parametrize("change, why", [
    (('version="1"', 'version="7"'), None),
    (('blocks="6"', 'blocks="600"'), "outside the disk"),
    (('heat="0.9"', 'heat="nan"'), "outside the disk"),
    (('size="', 'size="x'), "corrupt"),
])
def test_a_corrupt_or_foreign_summary_is_refused(image, change, why):
    heat = np.zeros(64, dtype=np.float32)
    heat[4:10] = 0.9
    xml = dh.to_xml([dh.summarize(heat, 0.05, "vda", image, MiB, 1000.0)])
    bad = element(xml.replace(*change))
    if why is None:
        with pytest.raises(dh.Foreign):
            dh.parse(bad)
    else:
        got = dh.parse(bad)["vda"]
        assert isinstance(got, str) and "corrupt" in got and (why == "corrupt" or why in got)


def test_the_identity_is_the_size_and_the_first_and_last_pages(image, tmp_path):
    heat = np.zeros(64, dtype=np.float32)
    heat[4:10] = 0.9
    s = dh.summarize(heat, 0.05, "vda", image, MiB, 1000.0)
    assert dh.check(s, image, 1000.0) is None
    other = FakeImage(tmp_path / "b.raw", 64 * MiB)
    with open(tmp_path / "b.raw", "r+b") as f:       # another last page
        f.seek(64 * MiB - 4)
        f.write(b"TAIL")
    bigger = FakeImage(tmp_path / "c.raw", 65 * MiB)
    try:
        assert "fingerprint" in dh.check(s, other, 1000.0)
        assert "bytes" in dh.check(s, bigger, 1000.0)
        assert "future" in dh.check(s, image, 1000.0 - 3600)
    finally:
        os.close(other.fd)
        os.close(bigger.fd)


def test_arrival_decays_but_the_hottest_stays_a_candidate():
    s = dh.DiskHeat("vda", 64 * MiB, MiB, "f", 1000.0, ((4, 6, 0.8), (20, 4, 0.2)))
    fresh = dh.arrival(s, 64, MiB, 0.1, 0.05, 1000.0)
    assert fresh[4:10].tolist() == pytest.approx([0.8] * 6) and fresh[20] == pytest.approx(0.2)
    old = dh.arrival(s, 64, MiB, 0.1, 0.05, 1000.0 + 600)      # e^-60: floored
    assert old[4] == pytest.approx(dh.ARRIVAL_HEAT * 0.05)
    assert old[20] == pytest.approx(old[4] / 4)                # the order is kept
    a_little = dh.arrival(s, 64, MiB, 0.1, 0.05, 1000.0 + 5)
    assert a_little[4] == pytest.approx(0.8 * math.exp(-0.5), rel=1e-5)
    # another block size: the same bytes
    small = dh.arrival(s, 256, 256 << 10, 0.1, 0.05, 1000.0)
    assert np.flatnonzero(small).tolist() == list(range(16, 40)) + list(range(80, 96))


class Watch:
    def __init__(self, fail=None):
        self.calls, self.fail, self.busy = [], fail, False

    def set_metadata(self, domain, xml):
        if self.fail:
            raise VmdtError(self.fail)
        if self.busy:
            return False
        self.calls.append((domain, xml))
        return True


class Policy:
    def __init__(self, heat):
        self.state = type("S", (), {"total": heat})()
        self.nblocks = heat.size


class W:
    def __init__(self, image, heat, domain="vm1", target="vda", active=True):
        self.image, self.block_size = image, MiB
        self.config = type("C", (), {"threshold": 0.05})()
        self.policy = Policy(heat)
        self.domain, self.target, self.domain_active = domain, target, active
        self.hold_enabled = bool(active)


def test_the_writer_writes_first_heat_then_only_material_moves_after_the_interval(image):
    now = [0.0]
    watch = Watch()
    c = carry.Carrier(watch, 30.0, clock=lambda: now[0], wall=lambda: 1e9 + now[0])
    heat = np.zeros(64, dtype=np.float32)
    w = W(image, heat)
    c.maybe_write([w], lambda _w: True)
    assert watch.calls == []                      # nothing hot yet: nothing to carry
    heat[4:20] = 0.5
    watch.busy = True                             # a migration or a save runs on it
    c.maybe_write([w], lambda _w: True)
    watch.busy = False
    c.maybe_write([w], lambda _w: True)           # not written then: tried again now
    assert [d for d, _ in watch.calls] == ["vm1"]    # the first heat: at once
    heat[20:40] = 0.5                             # moved by more than an eighth...
    now[0] = 10.0
    c.maybe_write([w], lambda _w: True)
    assert len(watch.calls) == 1                  # ...but within the interval
    now[0] = 31.0
    c.maybe_write([w], lambda _w: True)
    assert len(watch.calls) == 2
    heat[40] = 0.5                                # 1 block of 37: not material
    now[0] = 62.0
    c.maybe_write([w], lambda _w: True)
    assert len(watch.calls) == 2
    heat[4:41] *= 1.2                             # the heat grew by a fifth: material
    c.maybe_write([w], lambda _w: True)
    assert len(watch.calls) == 3
    now[0] = 93.0
    c.maybe_write([w, W(image, heat, "vm2", active=False)], lambda _w: True)
    c.maybe_write([W(image, heat, "vm3")], lambda _w: False)
    arriving = W(image, heat, "vm4")
    arriving.hold_enabled = False                 # its domain arriving (daemon.arrival)
    c.maybe_write([arriving], lambda _w: True)
    assert len(watch.calls) == 3      # shut off, not carried, or arriving: untouched


def test_a_failing_write_is_one_line_and_the_daemon_goes_on(image, caplog):
    heat = np.zeros(64, dtype=np.float32)
    heat[4:20] = 0.5
    c = carry.Carrier(Watch(fail="Domain not found"), 1.0, clock=iter(range(100)).__next__)
    for _ in range(3):
        c.maybe_write([W(image, heat)], lambda _w: True)
    lines = [r for r in caplog.records if "cannot write the heat" in r.getMessage()]
    assert len(lines) == 1 and "Domain not found" in lines[0].getMessage()
