"""The metrics collector over the cycle's report (``report.HostReport``): gauges of the
last cycle, summed counters, fields of a section (``spill.read_bytes``), info labels that
never change; the textfile removed at close, and only a file vmdisktouch writes."""

from __future__ import annotations

import os
from dataclasses import replace

from vmdisktouch.adapters.metrics.metrics import Collector
from vmdisktouch.report import DiskLine, DiskReport, HostReport


def disk(path: str = "/img", **over) -> DiskReport:
    """A disk's report with plain figures; ``over``: the fields a test sets."""
    base = dict(path=path, domain=None, target=None, pid=1, version="0", interval_seconds=5.0,
                cycle=1, cycle_seconds=0.01, size_bytes=1 << 30, block_size=1 << 20,
                budget_bytes=64, host_budget_bytes=256, wanted_bytes=None, held_bytes=8,
                resident_bytes=8, regions=[], rewritten_blocks=0, rewritten_ranges=[],
                mem_available_bytes=1 << 30, min_free_bytes=0, loaded_bytes=0,
                loaded_from_disk_bytes=0, released_bytes=0, skipped_bytes=0,
                not_held_reason=None, limited_by=None, domain_active=None, warmed_from=None,
                holding=True, lock_cap_bytes=None, charges={}, access_source="trace",
                events_lost=0, output_errors={}, time=0.0)
    return DiskReport(**{**base, **over})


def host(disks: list[DiskReport], lines: int | None = None, **over) -> HostReport:
    """The host's report of ``disks``, with ``lines`` disks served (default: as many)."""
    base = dict(pid=1, version="0", interval_seconds=5.0, time=0.0, budget_bytes=256,
                held_bytes=80, mem_available_bytes=1000, min_free_bytes=300,
                above_floor_bytes=700, cycle=1, cycle_seconds=0.01)
    served = [DiskLine(f"/line{k}", None, None, 0, None, None, None, None, 0.0, None, 1.0)
              for k in range(len(disks) if lines is None else lines)]
    return HostReport(**{**base, **over}, disks=list(disks), lines=served)


def values(collector: Collector) -> dict:
    return {(s.name, s.labels.get("disk")): s.value
            for family in collector.collect() for s in family.samples}


def status(spill_read: int, spill_target: int, loaded: int = 0) -> DiskReport:
    return disk(held_bytes=8, loaded_bytes=loaded, regions=[[0, 8]], events_lost=3,
                spill={"target_bytes": spill_target, "read_bytes": spill_read,
                       "stopped": None})


def test_spill_fields_are_a_gauge_and_a_summed_counter():
    c = Collector()
    c.update(host([status(100, 400, loaded=5)]))
    c.update(host([status(30, 300, loaded=7)]))
    v = values(c)
    assert v[("vmdisktouch_spill_bytes", "/img")] == 300          # the last cycle's
    assert v[("vmdisktouch_spill_read_bytes_total", "/img")] == 130
    assert v[("vmdisktouch_loaded_bytes_total", "/img")] == 12
    assert v[("vmdisktouch_events_lost_total", "/img")] == 3       # taken as it is
    assert v[("vmdisktouch_regions", "/img")] == 1


def test_a_status_without_spill_counts_zero():
    c = Collector()
    c.update(host([replace(status(0, 0), spill={})]))
    v = values(c)
    assert v[("vmdisktouch_spill_bytes", "/img")] == 0
    assert v[("vmdisktouch_spill_read_bytes_total", "/img")] == 0


# -- labels, the share, the reason, the host (issue 32) ----------------------

def disk_status(path: str, domain: str | None = None, target: str | None = None, *,
                share: int = 64, wanted: int | None = 100, held: int = 40,
                limited_by: str | None = "budget") -> DiskReport:
    """A disk's report with these figures."""
    return disk(path, domain=domain, target=target, budget_bytes=share, wanted_bytes=wanted,
                held_bytes=held, limited_by=limited_by)


def by_labels(collector: Collector) -> dict:
    """(name, disk, domain, target, reason) -> value."""
    return {(s.name, s.labels.get("disk"), s.labels.get("domain"), s.labels.get("target"),
             s.labels.get("reason")): s.value
            for family in collector.collect() for s in family.samples}


def test_every_disk_series_carries_domain_and_target_empty_when_libvirt_does_not_know():
    c = Collector()
    c.update(host([disk_status("/a", "web", "vda"), disk_status("/b")]))
    families = list(c.collect())
    per_disk = [s for f in families for s in f.samples if "disk" in s.labels]
    assert per_disk and all({"disk", "domain", "target"} <= set(s.labels) for s in per_disk)
    names = {f.name for f in families if any("disk" in s.labels for s in f.samples)}
    assert {"vmdisktouch_held_bytes", "vmdisktouch_cycles", "vmdisktouch_limited",
            "vmdisktouch_disk_info", "vmdisktouch_events_lost"} <= names
    for s in per_disk:
        want = ("web", "vda") if s.labels["disk"] == "/a" else ("", "")
        assert (s.labels["domain"], s.labels["target"]) == want, s


def test_the_budget_gauge_is_the_disk_s_share_and_wanted_is_all_it_would_hold():
    c = Collector()
    c.update(host([disk_status("/a", "web", "vda", share=64, wanted=100),
              disk_status("/b", share=192, wanted=None)]))
    v = by_labels(c)
    assert v[("vmdisktouch_budget_bytes", "/a", "web", "vda", None)] == 64
    assert v[("vmdisktouch_budget_bytes", "/b", "", "", None)] == 192
    assert v[("vmdisktouch_wanted_bytes", "/a", "web", "vda", None)] == 100
    assert ("vmdisktouch_wanted_bytes", "/b", "", "", None) not in v   # no selection yet
    help_text = {f.name: f.documentation for f in c.collect()}
    assert "share" in help_text["vmdisktouch_budget_bytes"]


def test_the_reason_is_a_state_set_of_every_code_one_at_1():
    from vmdisktouch.report import CODES
    c = Collector()
    c.update(host([disk_status("/a", "web", "vda", limited_by="cap"),
              disk_status("/b", limited_by=None)]))
    v = by_labels(c)
    a = {k[4]: x for k, x in v.items() if k[0] == "vmdisktouch_limited" and k[1] == "/a"}
    b = {k[4]: x for k, x in v.items() if k[0] == "vmdisktouch_limited" and k[1] == "/b"}
    assert set(a) == set(b) == set(CODES)
    assert a["cap"] == 1 and sum(a.values()) == 1
    assert sum(b.values()) == 0                       # it holds all it wants
    [fam] = [f for f in c.collect() if f.name == "vmdisktouch_limited"]
    assert fam.type == "gauge"


def test_a_reason_code_unknown_to_the_metrics_still_shows():
    c = Collector()                                   # a code unknown to it still shows
    c.update(host([disk_status("/a", limited_by="new_code")]))
    assert by_labels(c)[("vmdisktouch_limited", "/a", "", "", "new_code")] == 1


def test_the_host_gauges():
    c = Collector()
    disks = [disk_status("/a", "web", "vda"), disk_status("/b")]
    c.update(host(disks, lines=3))                          # the third: no report yet
    v = values(c)
    assert v[("vmdisktouch_host_budget_bytes", None)] == 256
    assert v[("vmdisktouch_host_held_bytes", None)] == 80
    assert v[("vmdisktouch_host_above_floor_bytes", None)] == 700
    assert v[("vmdisktouch_host_disks", None)] == 3
    c.update(host(disks, above_floor_bytes=None))           # MemAvailable not read yet
    assert ("vmdisktouch_host_above_floor_bytes", None) not in values(c)
    c.update(host([disk_status("/a")]))                     # one disk: the host's too
    assert values(c)[("vmdisktouch_host_disks", None)] == 1


def test_odd_label_values_are_escaped_and_read_back_intact():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    domain = 'we"b\\1\nx {a="b"}, é \u2603'
    path = '/var/lib/im"g\\s/a b\n.qcow2'
    c = Collector()
    c.update(host([disk_status(path, domain, "vda")]))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(c)
    text = generate_latest(reg).decode()
    assert '\\"' in text and "\\\\" in text and "\\n" in text
    held = [line for line in text.splitlines() if line.startswith("vmdisktouch_held_bytes{")]
    assert len(held) == 1                             # the newlines escaped: one line
    seen = {(s.name, s.labels["disk"], s.labels["domain"], s.labels["target"])
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "vmdisktouch_held_bytes"}
    assert seen == {("vmdisktouch_held_bytes", path, domain, "vda")}


def test_every_metric_is_in_docs_metrics_md():
    import pathlib
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    c = Collector()
    c.update(host([disk_status("/a", "web", "vda")], skipped=[
        {"domain": "web", "target": "hdc", "code": "read_only", "reason": "read-only"}]))
    names = {s.name for f in c.collect() for s in f.samples}
    assert len(names) > 20 and "vmdisktouch_disk_unserved" in names
    for name in names:
        assert f"`{name}`" in doc, name
    from vmdisktouch.report import UNSERVED
    for code in UNSERVED:
        assert f"| `{code}` |" in doc, code


# -- an info metric's labels never change; a stopped daemon leaves no file (issue 34) ----

def info_and_holding(collector: Collector) -> tuple[list, dict]:
    """The label sets of ``vmdisktouch_disk_info``, and disk -> ``vmdisktouch_holding``."""
    info, holding = [], {}
    for family in collector.collect():
        for s in family.samples:
            if s.name == "vmdisktouch_disk_info":
                info.append(s.labels)
            elif s.name == "vmdisktouch_holding":
                holding[s.labels["disk"]] = s.value
    return info, holding


def test_holding_is_a_gauge_and_the_info_labels_never_change():
    c = Collector()
    on = disk_status("/a", "web", "vda")
    c.update(host([on]))
    info_on, holding_on = info_and_holding(c)
    off = replace(on, holding=False, held_bytes=0, limited_by="domain_off", budget_bytes=0,
                  wanted_bytes=0, regions=[], cycle_seconds=0.2, mem_available_bytes=7)
    c.update(host([off]))
    info_off, holding_off = info_and_holding(c)
    assert (holding_on, holding_off) == ({"/a": 1}, {"/a": 0})
    assert info_on == info_off == [{"disk": "/a", "domain": "web", "target": "vda",
                                    "access_source": "trace"}]   # one series for ever
    [fam] = [f for f in c.collect() if f.name == "vmdisktouch_holding"]
    assert fam.type == "gauge" and [s.labels for s in fam.samples] == [
        {"disk": "/a", "domain": "web", "target": "vda"}]


def metrics_of(path):
    """``Metrics`` writing the textfile ``path`` (no endpoint), through real ``Outputs``."""
    import types
    from vmdisktouch.adapters.metrics.metrics import Metrics
    from vmdisktouch.adapters.outputs import Outputs
    config = types.SimpleNamespace(metrics_file=str(path), metrics_listen=None)
    return Metrics(config, Outputs([]))


def test_close_removes_the_metrics_file_it_wrote(tmp_path):
    prom = tmp_path / "vmdisktouch.prom"
    m = metrics_of(prom)
    m.publish(host([disk_status("/a", held=16 << 20)]))
    assert "vmdisktouch_held_bytes" in prom.read_text()
    m.close()
    assert not prom.exists()          # node_exporter drops the series: nothing held
    m.close()                         # twice: nothing to do, no error
    assert list(tmp_path.iterdir()) == []


def test_close_removes_a_stale_metrics_file_and_nothing_else(tmp_path):
    prom = tmp_path / "vmdisktouch.prom"
    prom.write_text("# HELP vmdisktouch_held_bytes ...\nvmdisktouch_held_bytes 1\n")
    metrics_of(prom).close()          # a killed daemon's file, never rewritten: removed
    assert not prom.exists()
    prom.write_text("not metrics\n")  # not a file vmdisktouch writes: left alone
    metrics_of(prom).close()
    assert prom.read_text() == "not metrics\n"
    prom.unlink()
    (tmp_path / "target").write_text("# HELP x\n")
    prom.symlink_to(tmp_path / "target")
    metrics_of(prom).close()          # never a link, never what it names
    assert prom.is_symlink() and (tmp_path / "target").read_text() == "# HELP x\n"
    prom.unlink()
    os.mkfifo(prom)                   # never opened (it would not be ours anyway)
    metrics_of(prom).close()
    assert prom.is_fifo()


def test_close_never_removes_a_protected_file(tmp_path):
    from vmdisktouch.adapters.outputs import Protected, remove
    image = tmp_path / "disk.raw"
    image.write_text("# HELP an image whose first bytes look like metrics\n")
    prom = tmp_path / "vmdisktouch.prom"
    os.link(image, prom)              # the metrics path a hard link to the image served
    assert not remove(str(prom), "metrics_file",
                      [Protected.of_path(str(image), "the disk image")])
    assert prom.exists() and image.exists()
    assert remove(str(prom), "metrics_file", [])            # unprotected, it would go
    assert not remove(str(tmp_path / "gone" / "x.prom"), "metrics_file", [])   # no directory


def test_the_curve_is_a_gauge_by_size_and_the_gain_gauges_follow_the_status():
    g = {"pages_read_per_second": 5000.0, "cache_hit_ratio": 0.84, "held_read_share": None,
         "held_reads_per_second": 900.0, "wants_bytes": 400 << 20,
         "next_gib": {"bytes": 1 << 30, "hit_ratio": 0.6, "more_reads_per_second": 350.0},
         "read_seconds_saved_per_second": 0.11}
    c = Collector()
    c.update(host([disk("/t", curve=[[1 << 20, 0.25], [1 << 30, 0.9]], gain=g,
                        miss_cost={"seconds": 0.000122, "probes": 64},
                        mrc={"reads": 5000, "re_reads": 4000, "window_seconds": 130.0,
                             "enough_reads": True}),
                   disk("/m", access_source="mincore")]))
    samples = [s for f in c.collect() for s in f.samples]
    curve = {(s.labels["disk"], s.labels["size_bytes"]): s.value for s in samples
             if s.name == "vmdisktouch_curve_hit_ratio"}
    assert curve == {("/t", str(1 << 20)): 0.25, ("/t", str(1 << 30)): 0.9}
    v = values(c)
    assert v[("vmdisktouch_cache_hit_ratio", "/t")] == 0.84
    assert v[("vmdisktouch_next_gib_reads_per_second", "/t")] == 350.0
    # the share of reads from memory, one definition (report.reads_from_memory): the
    # measured share, and with a GiB more that plus the curve's increment (350 / 5000)
    assert v[("vmdisktouch_reads_from_memory_ratio", "/t")] == 0.84
    assert v[("vmdisktouch_reads_from_memory_next_gib_ratio", "/t")] == 0.91
    assert [v[(f"vmdisktouch_curve_{k}", "/t")] for k in (
        "reads", "re_reads", "window_seconds", "enough_reads")] == [5000, 4000, 130.0, 1.0]
    host_v = {s.name: s.value for f in c.collect() for s in f.samples if not s.labels}
    assert host_v["vmdisktouch_host_reads_from_memory_ratio"] == 0.84
    assert host_v["vmdisktouch_host_reads_from_memory_next_gib_ratio"] == 0.91
    assert v[("vmdisktouch_curve_wants_bytes", "/t")] == 400 << 20
    assert ("vmdisktouch_held_read_share", "/t") not in v          # null: no sample
    from vmdisktouch.adapters.metrics.metrics import CURVE_GAUGES
    gains = {f"vmdisktouch_{name}" for name, _, _ in CURVE_GAUGES}
    assert v[("vmdisktouch_miss_cost_seconds", "/t")] == 0.000122
    assert v[("vmdisktouch_read_seconds_saved_per_second", "/t")] == 0.11
    assert len(gains) == 13 and not any(d == "/m" for (n, d) in v if n in gains)


# -- the build (issue 45, part 3) -------------------------------------------------------------

def test_build_info_is_one_gauge_at_1_labelled_with_the_version_and_python():
    import platform
    from vmdisktouch import __version__
    c = Collector()
    for report in (None, host([disk_status("/a", "web", "vda")])):   # before a cycle, too
        if report is not None:
            c.update(report)
        [fam] = [f for f in c.collect() if f.name == "vmdisktouch_build_info"]
        assert fam.type == "gauge" and [(s.labels, s.value) for s in fam.samples] == [
            ({"version": __version__, "python": platform.python_version()}, 1.0)]


# -- lost trace events: the total and when (issue 45, part 3) --------------------------------

def test_lost_events_are_a_counter_of_the_total_and_the_time_of_the_last_loss():
    c = Collector()
    never = disk("/never", events_lost=0, trace={"lost": 0, "lost_at": None})
    once = disk("/once", events_lost=149130, trace={"lost": 0, "lost_at": 1.7e9})
    c.update(host([never, once]))
    v = values(c)
    assert v[("vmdisktouch_events_lost_total", "/once")] == 149130
    assert v[("vmdisktouch_events_lost_total", "/never")] == 0
    assert v[("vmdisktouch_events_lost_timestamp_seconds", "/once")] == 1.7e9
    assert ("vmdisktouch_events_lost_timestamp_seconds", "/never") not in v   # never: none
    [fam] = [f for f in c.collect() if f.name == "vmdisktouch_events_lost_timestamp_seconds"]
    assert fam.type == "gauge"


def test_each_disk_not_served_is_a_series_with_its_reason_code():
    """Issue 45, part 3: skipped, ineligible and out-of-scope disks are in the metrics,
    their reason a code of a small set (``report.UNSERVED``), so the series stay few."""
    skipped = [{"domain": "web", "target": "hdc", "code": "read_only", "reason": "read-only"},
               {"domain": "test-1", "target": "vda", "code": "excluded", "reason": "glob"},
               {"domain": "odd", "target": "vdz", "code": "made-up", "reason": "?"}]
    c = Collector()
    c.update(host([disk()], skipped=skipped))
    got = {(s.labels["domain"], s.labels["target"], s.labels["reason"]): s.value
           for f in c.collect() for s in f.samples if s.name == "vmdisktouch_disk_unserved"}
    assert got == {("web", "hdc", "read_only"): 1, ("test-1", "vda", "excluded"): 1,
                   ("odd", "vdz", "other"): 1}
    c.update(host([disk()], skipped=[]))
    assert not [s for f in c.collect() for s in f.samples
                if s.name == "vmdisktouch_disk_unserved"]
