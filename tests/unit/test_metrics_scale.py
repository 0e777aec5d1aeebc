"""A scrape of a hundred disks: each disk adds at most ``SERIES_A_DISK`` series, whatever it
reports (docs/metrics.md#the-size-of-a-scrape)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from tests.support.full_reports import full_disk, full_host
from vmdisktouch.adapters.metrics.metrics import SERIES_A_DISK, Collector


def series_by_disk(collector: Collector) -> Counter:
    """The samples of each disk (its ``disk`` label) in a collection."""
    return Counter(s.labels["disk"] for family in collector.collect()
                   for s in family.samples if "disk" in s.labels)


def test_a_disk_with_every_figure_has_exactly_the_stated_series():
    c = Collector()
    c.update(full_host(100))
    per = series_by_disk(c)
    assert len(per) == 100 and set(per.values()) == {SERIES_A_DISK}


def test_a_disk_with_fewer_figures_has_fewer_series():
    c = Collector()
    bare = replace(full_disk(0), curve=None, gain=None, mrc={}, miss_cost=None,
                   adopted_since=None, adopted_gain=None, advised_gain=None, trace=None,
                   limited_by=None)
    host = full_host(2)
    c.update(replace(host, disks=[bare, host.disks[1]]))
    per = series_by_disk(c)
    assert per[bare.path] < per[host.disks[1].path] == SERIES_A_DISK


def test_the_host_series_do_not_grow_with_the_disks():
    def others(n):
        c = Collector()
        c.update(full_host(n))
        return sum(1 for family in c.collect() for s in family.samples
                   if "disk" not in s.labels)
    assert others(100) == others(3)
