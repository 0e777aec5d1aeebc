"""The parts of ``adopt`` that need no libvirt: the disk's name on the command line, its
node's options on QEMU's command line, the live XML's source index, an adopted disk's
eligibility and its record's run, and the page-cache drop on a real file."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from vmdisktouch.adapters.libvirt import adopt, libvirt_disks
from vmdisktouch.errors import UsageError
from vmdisktouch.system.hold import drop
from vmdisktouch.system.image import open_image


@pytest.mark.parametrize("key,want", [("web1/vda", ("web1", "vda")),
                                      ("a.b-c/sdb", ("a.b-c", "sdb"))])
def test_a_disk_is_domain_slash_target(key, want):
    assert adopt.parse_key(key) == want


@pytest.mark.parametrize("key", ["web1", "/vda", "web1/", ""])
def test_anything_else_is_a_usage_error(key):
    with pytest.raises(UsageError, match="expected DOMAIN/TARGET"):
        adopt.parse_key(key)


def test_the_node_s_options_come_from_qemu_s_own_command_line():
    storage = {"driver": "file", "filename": "/images/a.img", "aio": "threads",
               "node-name": "libvirt-1-storage", "cache": {"direct": True, "no-flush": False},
               "auto-read-only": True, "discard": "unmap"}
    fmt = {"node-name": "libvirt-1-format", "driver": "raw", "file": "libvirt-1-storage"}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                          "-blockdev", json.dumps(storage), "-blockdev", json.dumps(fmt),
                          "-blockdev", "driver=file,node-name=libvirt-2-storage,filename=/b"])
    try:
        deadline = time.monotonic() + 10               # until it has exec'd
        while b"-blockdev" not in open(f"/proc/{p.pid}/cmdline", "rb").read():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert adopt.creation_options(p.pid, "libvirt-1-storage") == storage
        assert adopt.creation_options(p.pid, "libvirt-1-format") == fmt
        assert adopt.creation_options(p.pid, "libvirt-2-storage") is None   # not JSON
        assert adopt.creation_options(p.pid, "libvirt-9-storage") is None
    finally:
        p.kill()
        p.wait()


XML = """<domain><name>d</name><uuid>u-1</uuid><devices>
<disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='threads'/>
<source file='/images/a.img' index='3'/><target dev='vda' bus='virtio'/></disk>
<disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='native'/>
<source file='/images/b.img' index='2'/><target dev='vdb' bus='virtio'/></disk>
<disk type='file' device='disk'><driver name='qemu' type='raw'/>
<source file='/images/c.img'/><target dev='vdc' bus='virtio'/></disk>
</devices></domain>"""


def test_the_source_index_names_the_node():
    assert adopt._source_index(XML, "vda") == 3
    assert adopt._source_index(XML, "vdb") == 2
    assert adopt._source_index(XML, "vdc") is None        # an inactive domain's XML
    assert adopt._source_index(XML, "vdz") is None


class Dom:
    def __init__(self, id_):
        self.id_ = id_

    def ID(self):
        return self.id_


def disks(active=True):
    return {d.target: replace(d, active=active)
            for d in libvirt_disks.parse_domain_xml(XML, with_units=False)}


def test_a_record_of_this_run_makes_a_cache_none_disk_eligible():
    d = disks()["vda"]
    assert not d.eligible and d.code == "o_direct"
    records = {("u-1", "vda"): {"domain_id": 7, "since": 1000.0}}
    got = libvirt_disks._adopted(d, records, Dom(7))
    assert got.eligible and got.adopted == 1000.0 and "adopted" in got.reason, got
    assert "cache=none" in got.reason


@pytest.mark.parametrize("why", ["another run", "not running", "io=native", "no record"])
def test_nothing_else_is_taken_for_adopted(why):
    d = disks(active=why != "not running")["vdb" if why == "io=native" else "vda"]
    records = {("u-1", d.target): {"domain_id": 7, "since": 1000.0}}
    if why == "no record":
        records = {}
    got = libvirt_disks._adopted(d, records, Dom(8 if why == "another run" else 7))
    assert not got.eligible and got.code == "o_direct", got


def test_drop_empties_a_file_s_page_cache_and_names_who_maps_it(tmp_path):
    path = tmp_path / "img"
    path.write_bytes(os.urandom(4 << 20))
    with open(path, "rb") as f:
        f.read()                                     # cached
    with open_image(str(path)) as image:
        assert drop.resident_pages(image) > 0
        assert drop.drop(image) == 0
        assert drop.resident_pages(image) == 0
        assert drop.mappers(str(path)) == []
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[:1]                             # a page mapped by this process
            assert drop.mappers(str(path)) == [f"{os.getpid()} ({open('/proc/self/comm').read().strip()})"]


def rules(adopt_table, scope=None):
    from vmdisktouch.config import overrides
    return overrides.Rules({}, overrides.parse_scope(scope, "host.toml"),
                           overrides.parse_scope(adopt_table, "host.toml", None, "adopt"))


def test_adopt_is_off_unless_an_include_names_the_domain():
    assert not rules(None).adopts("web1", "vda", ())
    assert not rules({}).adopts("web1", "vda", ())
    assert not rules({"exclude": ["db*"]}).adopts("web1", "vda", ())
    assert rules({"include": ["web*"]}).adopts("web1", "vda", ())
    assert rules({"include_labels": ["adopt"]}).adopts("x", "vda", ("tenant", "adopt"))
    assert not rules({"include_labels": ["adopt"]}).adopts("x", "vda", ("tenant",))


def test_an_exclude_or_the_scope_wins_over_an_adopt_include():
    assert not rules({"include": ["*"], "exclude": ["web1"]}).adopts("web1", "vda", ())
    assert not rules({"include": ["*"], "exclude_labels": ["no"]}).adopts("w", "vda", ("no",))
    assert not rules({"include": ["*"]}, {"exclude": ["web*"]}).adopts("web1", "vda", ())


def test_a_bad_adopt_table_names_itself():
    from vmdisktouch.config import overrides
    from vmdisktouch.errors import ConfigError
    with pytest.raises(ConfigError, match=r"host.toml: \[adopt\]: include must be a list"):
        overrides.parse_scope({"include": "web*"}, "host.toml", None, "adopt")


def test_the_adopter_tries_a_candidate_once_and_a_not_now_again_later():
    from vmdisktouch.daemon import adoption
    now = [0.0]
    a = adoption.Adopter("qemu:///nowhere", clock=lambda: now[0])
    a._thread = object()                       # no worker: the queue is read here
    a.want(["d/vda", "e/vda"])
    got = [a._queue.get_nowait(), a._queue.get_nowait()]
    assert got == ["d/vda", "e/vda"] and a._queue.empty()
    a._tried.update({"d/vda": ("later", 0.0), "e/vda": ("refused", 0.0)})
    a.want(["d/vda", "e/vda"])
    assert a._queue.empty()                    # too soon, and refused
    now[0] = adoption.RETRY_S
    a.want(["d/vda", "e/vda"])
    assert a._queue.get_nowait() == "d/vda" and a._queue.empty()
    a.want([])                                 # no longer candidates (pending stays)
    assert set(a._tried) == {"d/vda"}
    a._tried["d/vda"] = ("refused", now[0])
    a.want(["d/vda"])
    assert a._queue.empty()
    a.forget_refusals()                        # a reload
    a.want(["d/vda"])
    assert a._queue.get_nowait() == "d/vda"


class FakeLibvirt:
    """What adopt asks of libvirt-python's module, without it (the Python 3.9 tier has
    none)."""

    class libvirtError(Exception):
        def get_error_message(self):
            return str(self)

    VIR_DOMAIN_JOB_NONE = 0
    VIR_DOMAIN_METADATA_ELEMENT = 2
    VIR_DOMAIN_AFFECT_LIVE = 1


@pytest.fixture
def fake_libvirt(monkeypatch):
    fake = FakeLibvirt()
    monkeypatch.setattr(adopt, "import_libvirt", lambda: fake)
    return fake


class StatsDom:
    """A domain whose block statistics grow as a guest that reads ``per_tick`` 4 KiB at
    ``us`` each, between readings."""

    def __init__(self, per_tick: int, us: float):
        self.per_tick, self.us, self.n = per_tick, us, 0

    def name(self):
        return "d"

    def blockStatsFlags(self, target, flags):
        assert target == "vda" and flags == 0
        ops = self.n * self.per_tick
        self.n += 1
        return {"rd_operations": ops, "rd_total_times": int(ops * self.us * 1000),
                "wr_operations": 0, "wr_total_times": 0}


class StatsConn:
    def __init__(self, dom):
        self.dom = dom

    def lookupByName(self, name):
        return self.dom


def test_measure_times_the_guest_in_three_windows_and_0_s_times_nothing(fake_libvirt):
    slept = []
    got = adopt.measure(StatsConn(StatsDom(200, 150.0)), ["d/vda"], 30, sleep=slept.append)
    assert slept == [10.0, 10.0, 10.0]
    assert [w.ops[0] for w in got["d/vda"]] == [200, 200, 200]
    assert abs(got["d/vda"][0].mean(0) - 150e-6) < 1e-9
    assert adopt.measure(StatsConn(StatsDom(1, 1)), ["d/vda"], 0) == {}


def test_the_record_keeps_the_baseline_and_the_advised_gain_and_a_release_s_reason(
        tmp_path, monkeypatch):
    from vmdisktouch.adapters.libvirt import adopted
    from vmdisktouch.core.never_slower import Window
    monkeypatch.setenv("VMDISKTOUCH_RUNTIME_DIR", str(tmp_path))
    node = adopt.Node("d", "u-1", "vda", "/images/a.img", "none", "libvirt-3-storage", {}, 7)
    base = [Window(10.0, (100, 5, 5), (1_000_000, 50_000, 20_000))] * 3
    adopted.record(node, base, 1.8)
    adopted.record(node)                              # again, the same run: both kept
    rec = adopted.by_disk()[("u-1", "vda")]
    assert adopted.baseline_of(rec) == base and rec["advised_gain"] == 1.8
    assert adopted.baseline_of({"baseline": [{"seconds": 1}]}) is None   # damaged
    assert adopted.held_back(node) is None
    adopted.hold_back(node, "by vmdisktouch, slower: 2x")
    assert adopted.held_back(node) == "by vmdisktouch, slower: 2x"
    assert adopted.held_back(replace(node, domain_id=8)) is None        # another run
    adopted.hold_back(node)
    assert adopted.held_back(node) == "by the operator"


def test_the_advised_gain_is_advise_s_mean_io_time_now_over_then():
    a = {"now": {"mean_io_time_us": 300.0}, "then": {"mean_io_time_us": 120.0}}
    assert adopt.advised_gain(a) == 2.5
    assert adopt.advised_gain({"now": None, "then": None}) is None
    assert adopt.advised_gain(None) is None


def test_status_shows_the_gain_measured_beside_the_gain_advised():
    from vmdisktouch.commands.status import adopted_gain_part
    from vmdisktouch.report import DiskReport
    d = DiskReport.__new__(DiskReport)
    d.adopted_gain, d.advised_gain, d.domain = 1.623, 1.8, "web1"
    assert adopted_gain_part(d) == (" (I/O 1.62x as fast as before, 1.80x advised; libvirt: "
                                    "tainted, custom-monitor)")
    d.adopted_gain, d.advised_gain = None, float("nan")
    assert adopted_gain_part(d).startswith(" (I/O since not measured yet; ")
    d.domain = None                      # adopted through its QEMU's QMP socket: no libvirt
    assert adopted_gain_part(d) == " (I/O since not measured yet)"


def test_adopt_weighs_advise_s_forecast_of_adopting_over_its_writethrough_one(tmp_path):
    node = adopt.Node("d", "u-1", "vda", "/images/a.img", "none", "libvirt-3-storage", {}, 7)
    report = tmp_path / "advise.json"

    def save(advice):
        report.write_text(json.dumps({"when": time.time(), "duration_seconds": 60,
                                      "disks": [{"domain": "d", "target": "vda",
                                                 "path": node.path, "advice": advice}]}))
    save({"verdict": "no_gain", "now": {"mean_io_time_us": 100.0},
          "adopted": {"verdict": "hold", "now": {"mean_io_time_us": 100.0},
                      "then": {"mean_io_time_us": 40.0}}})
    a = adopt._advice(node, str(report))
    assert a["verdict"] == "hold" and adopt.advised_gain(a) == 2.5
    save({"verdict": "no_gain", "reason": "writes"})          # a report from before
    assert adopt._advice(node, str(report))["verdict"] == "no_gain"
    assert adopt._advice(node, str(tmp_path / "none.json")) is None


MARKED = XML.replace("<devices>", "<metadata><va:adopted xmlns:va='"
                     "http://vmdisktouch.org/xmlns/adopted/1'><va:disk target='vda'/>"
                     "</va:adopted></metadata><devices>")


def test_the_domain_carries_its_adopted_targets_and_the_service_adopts_them_again():
    from vmdisktouch.adapters.libvirt import libvirt_watch
    listed = libvirt_disks.parse_domain_xml(MARKED, state=1, active=True, with_units=False)
    assert {d.target: d.adopt_marked for d in listed} == {"vda": True, "vdb": False,
                                                          "vdc": False}
    w = libvirt_watch.wanted(listed)
    assert w.readopt == {("d", "vda")} and ("d", "vda") in w.adoptable
    plain = libvirt_disks.parse_domain_xml(XML, state=1, active=True, with_units=False)
    assert libvirt_watch.wanted(plain).readopt == frozenset()


class MarkDom:
    """A running domain whose live metadata ``setMetadata`` changes."""

    def __init__(self, xml, job=0):
        self.xml, self.job, self.calls = xml, job, []

    def XMLDesc(self, flags):
        return self.xml

    def jobInfo(self):
        return [self.job]

    def name(self):
        return "d"

    def setMetadata(self, kind, xml, key, uri, flags):
        self.calls.append((xml, key, uri))
        body = "" if xml is None else xml.replace("<adopted>", f"<va:adopted xmlns:va='{uri}'>") \
            .replace("<disk", "<va:disk").replace("</adopted>", "</va:adopted>")
        self.xml = XML.replace("<devices>", f"<metadata>{body}</metadata><devices>")


def test_adopting_marks_the_target_and_releasing_removes_it_not_during_a_job(
        caplog, fake_libvirt):
    from vmdisktouch.adapters.libvirt import adopted
    import xml.etree.ElementTree as ET
    dom = MarkDom(XML)
    adopt.mark(dom, "vda", True)
    adopt.mark(dom, "vdb", True)
    assert adopted.marked(ET.fromstring(dom.xml)) == {"vda", "vdb"}
    adopt.mark(dom, "vda", True)                         # already: no call
    assert len(dom.calls) == 2
    adopt.mark(dom, "vda", False)
    adopt.mark(dom, "vdb", False)
    assert dom.calls[-1] == (None, None, adopted.MARK_NS)   # the last one: the element goes
    assert adopted.marked(ET.fromstring(dom.xml)) == frozenset()
    busy = MarkDom(MARKED, job=2)
    adopt.mark(busy, "vda", False)
    assert busy.calls == [] and "a job runs" in caplog.text


def test_a_drive_s_options_come_from_qemu_s_command_line_commas_doubled_in_values():
    from vmdisktouch.adapters import qemu_socket
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                          "-drive", "file=/images/a,,b.raw,if=none,id=drive-scsi0,cache=none,"
                                    "aio=io_uring,format=raw",
                          "-drive", "file=/images/c.raw,if=none,id=drive-scsi1"])
    try:
        deadline = time.monotonic() + 10
        while b"-drive" not in open(f"/proc/{p.pid}/cmdline", "rb").read():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        got = qemu_socket.drive_options(p.pid, "drive-scsi0")
        assert got["file"] == "/images/a,b.raw" and got["aio"] == "io_uring", got
        assert "aio" not in qemu_socket.drive_options(p.pid, "drive-scsi1")
        assert qemu_socket.drive_options(p.pid, "drive-virtio9") is None
    finally:
        p.kill()
        p.wait()
