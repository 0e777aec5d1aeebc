"""Carried heat out of range (issue 40): every value of a summary is bounded at parse,
its arrival at most ``ARRIVAL_MAX`` x the threshold, and what is written (the summary, the
status JSON) is finite."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from vmdisktouch.adapters.libvirt import domain_heat as dh
from vmdisktouch.core.policy import HOLD_FRACTION
from vmdisktouch.daemon.emit import status_bytes

MiB = 1 << 20
GOOD = ('<v:heat xmlns:v="{ns}" version="1"><v:disk target="vda" size="{size}" '
        'block-size="{bs}" fingerprint="f" saved-at="{saved}">{regions}</v:disk></v:heat>')


def parsed(size=64 * MiB, bs=MiB, saved="1000.0", regions='<v:region start="4" blocks="6" '
           'heat="{heat}"/>', heat="0.8"):
    """The summary of ``vda`` as the parser reads it: a DiskHeat, or why not (a str)."""
    text = GOOD.format(ns=dh.NS, size=size, bs=bs, saved=saved,
                       regions=regions.format(heat=heat))
    return dh.parse(ET.fromstring(text))["vda"]


@pytest.mark.parametrize("heat", ["1e300", "1e39", "inf", "-inf", "nan", "-0.5", "2000001"])
def test_a_heat_out_of_range_makes_the_summary_corrupt(heat):
    got = parsed(heat=heat)
    assert isinstance(got, str) and "corrupt" in got and "heat 0 to 2e+06" in got, got


def test_the_largest_heat_a_map_can_hold_is_accepted():
    got = parsed(heat=repr(float(dh.MAX_HEAT)))
    assert got.regions == ((4, 6, dh.MAX_HEAT),)


@pytest.mark.parametrize("size, bs", [(1 << 63, MiB), (64 * MiB, 128 * MiB), (64 * MiB, 0)])
def test_sizes_beyond_a_file_or_a_block_beyond_the_disk_are_corrupt(size, bs):
    got = parsed(size=size, bs=bs)
    assert isinstance(got, str) and "out of range" in got, got


def test_more_regions_than_written_are_refused_as_they_are_read():
    many = "".join(f'<v:region start="{i}" blocks="1" heat="0.5"/>' for i in range(65))
    got = parsed(regions=many)
    assert isinstance(got, str) and f"more than {dh.MAX_REGIONS} regions" in got


@pytest.mark.parametrize("hottest", [2.0, 1e6, dh.MAX_HEAT])
def test_arrival_is_at_most_arrival_max_times_the_threshold_and_keeps_the_order(hottest):
    s = dh.DiskHeat("vda", 64 * MiB, MiB, "f", 1000.0, ((4, 6, hottest), (20, 4, hottest / 4)))
    heat = dh.arrival(s, 64, MiB, 0.1, 0.05, 1000.0)
    assert np.isfinite(heat).all()
    assert heat.max() == pytest.approx(dh.ARRIVAL_MAX * 0.05)
    assert heat[20] == pytest.approx(heat[4] / 4)
    # unread, it cools to the hold floor within the read-only lease (core/heat.py: 37 s)
    lease = math.log(dh.ARRIVAL_MAX / HOLD_FRACTION) / 0.1
    assert lease < 40


def test_a_summary_under_the_ceiling_arrives_as_it_was():
    s = dh.DiskHeat("vda", 64 * MiB, MiB, "f", 1000.0, ((4, 6, 0.8),))
    assert dh.arrival(s, 64, MiB, 0.1, 0.05, 1000.0)[4] == pytest.approx(0.8)


def test_what_is_written_is_finite():
    heat = np.zeros(64, dtype=np.float32)
    heat[4:10] = np.inf
    regions = dh.densest(heat, 0.05)
    assert regions == ((4, 6, dh.MAX_HEAT),)
    xml = dh.to_xml([dh.DiskHeat("vda", 64 * MiB, MiB, "f", 1000.0, regions)])
    assert "inf" not in xml and "nan" not in xml
    line = status_bytes({"host": {"heat": float("inf"), "disks": [{"heat": float("nan")}]},
                         "disks": [(1, 2.5)]})
    assert json.loads(line, parse_constant=pytest.fail) == {
        "host": {"heat": None, "disks": [{"heat": None}]}, "disks": [[1, 2.5]]}
