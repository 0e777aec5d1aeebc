"""The metrics collector over status objects: gauges of the last cycle, summed counters,
nested status fields (``spill.read_bytes``)."""

from __future__ import annotations

from vmdisktouch.adapters.metrics import Collector


def values(collector: Collector) -> dict:
    return {(s.name, s.labels.get("disk")): s.value
            for family in collector.collect() for s in family.samples}


def status(spill_read: int, spill_target: int, loaded: int = 0) -> dict:
    return {"path": "/img", "held_bytes": 8, "loaded_bytes": loaded, "regions": [[0, 8]],
            "events_lost": 3, "access_source": "trace",
            "spill": {"target_bytes": spill_target, "read_bytes": spill_read, "stopped": None}}


def test_spill_fields_are_a_gauge_and_a_summed_counter():
    c = Collector()
    c.update([status(100, 400, loaded=5)])
    c.update([status(30, 300, loaded=7)])
    v = values(c)
    assert v[("vmdisktouch_spill_bytes", "/img")] == 300          # the last cycle's
    assert v[("vmdisktouch_spill_read_bytes_total", "/img")] == 130
    assert v[("vmdisktouch_loaded_bytes_total", "/img")] == 12
    assert v[("vmdisktouch_events_lost_total", "/img")] == 3       # taken as it is
    assert v[("vmdisktouch_regions", "/img")] == 1


def test_a_status_without_spill_counts_zero():
    c = Collector()
    st = status(0, 0)
    del st["spill"]
    c.update([st])
    v = values(c)
    assert v[("vmdisktouch_spill_bytes", "/img")] == 0
    assert v[("vmdisktouch_spill_read_bytes_total", "/img")] == 0
