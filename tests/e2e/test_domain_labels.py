"""Domain and target labels with real libvirtd (issue 32, "domains everywhere"): a disk
libvirt knows is named by its domain and target in every output, whichever way it came
to be served.

* ``run --libvirt``, two running domains (one named with a double quote and a
  backslash, as libvirt allows): the host status file's per-disk entries and
  its ``host.disks`` lines carry ``domain`` and ``target``, and
  ``domain_active`` is true; each disk's cycle lines on stderr start with
  ``DOMAIN/TARGET PATH: ``; the metrics file's series carry ``domain=`` and
  ``target=`` (escaped, read back intact by prometheus_client's parser) beside
  ``disk=``, and agree with the status; each disk's block map PNG (a
  ``{disk}`` path) is written. Its header text (``report.DiskReport.title``) is not
  read back from the picture: the status it is drawn from is checked instead.
* ``run IMG --uri``: one path given, whose owning domain libvirt knows, gets
  its domain and target in its status, its log lines and its metrics too.

Real QEMU (no guest OS, started paused) on real files with cache=writethrough;
guest-like reads through libvirt's own QEMU (``qemu_io``).
"""

from __future__ import annotations

import time
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.libvirt_env import (PREFIX, URI, disk_xml, domain_xml, domains,  # noqa: F401
                               libvirt_daemons, qemu_io, virsh)
from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc
from vmdisktouch.unitname import escape_path

MiB = 1 << 20
FAST = ("--interval", "0.5", "--decay", "0.5", "--min-free", "0")
PNG = b"\x89PNG\r\n\x1a\n"


def define_odd(factory, disks: list[str], tmp_path) -> str:
    """A running (paused) domain whose name has a double quote and a backslash; the
    factory destroys and undefines it with the others."""
    name = f'{PREFIX}q"b\\s-{uuid.uuid4().hex[:8]}'
    xml = tmp_path / "odd.xml"
    xml.write_text(domain_xml(name, disks))
    factory.names.append(name)
    virsh("define", str(xml))
    virsh("start", name, "--paused")
    return name


def series(text: str, name: str) -> dict:
    """disk path -> labels and value of the samples named ``name`` (one per disk)."""
    return {s.labels["disk"]: (s.labels, s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


def cycle_of(status: dict | None):
    return (status or {}).get("host", status or {}).get("cycle")


def agreeing(d: DaemonProc, prom, timeout: float = 20.0) -> tuple[dict, str]:
    """A status and a metrics file of the same cycle: the status unchanged across the
    read of the metrics, and every disk's held bytes the same in both (a cycle writes
    its metrics a moment after its status)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = d.read_status()
        text = prom.read_text() if prom.exists() else ""
        after = d.read_status()
        if text and before and cycle_of(before) == cycle_of(after):
            held = {p: v for p, (_, v) in series(text, "vmdisktouch_held_bytes").items()}
            if held == {x["path"]: x["held_bytes"] for x in after.get("disks", [after])}:
                return after, text
        time.sleep(0.1)
    raise AssertionError("no status and metrics file of the same cycle")


@pytest.mark.timeout(240)
def test_domain_and_target_labels_with_real_libvirtd(domains, tmp_path):  # noqa: F811
    a1, a2, b1 = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in ("a1", "a2", "b1"))
    dom_a = domains.define([disk_xml("vda", a1), disk_xml("vdb", a2)], tag="labels")
    dom_b = define_odd(domains, [disk_xml("vda", b1)], tmp_path)
    names = {a1: (dom_a, "vda"), a2: (dom_a, "vdb"), b1: (dom_b, "vda")}
    prom = tmp_path / "host.prom"
    pngs = tmp_path / "png"
    pngs.mkdir()
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, *FAST, "--metrics-file", prom,
                   "--map-png", pngs / "{disk}.png", max_hold="24M", status="host.json",
                   log="daemon.out", err_log="daemon.err")

    def reads():
        qemu_io(dom_a, "read 0 4M")
        qemu_io(dom_a, "read 0 4M", alias="virtio-disk1")
        qemu_io(dom_b, "read 0 4M")

    def ready(s):
        per = {x["path"]: x for x in s.get("disks", [])}
        return set(per) == set(names) and all(x["held_bytes"] > 0 for x in per.values())

    try:
        d.wait_status(ready, "the three disks held", timeout=90, drive=reads)
        st, text = agreeing(d, prom)

        for x in st["disks"]:                              # each disk's own status
            assert (x["domain"], x["target"]) == names[x["path"]], x
            assert x["domain_active"] is True, x           # null in an earlier version
            assert x["holding"] is True
        for x in st["host"]["disks"]:                      # the host's lines
            assert (x["domain"], x["target"]) == names[x["path"]], x

        for metric in ("vmdisktouch_held_bytes", "vmdisktouch_budget_bytes",
                       "vmdisktouch_cycles_total", "vmdisktouch_disk_info"):
            got = series(text, metric)
            assert set(got) == set(names), (metric, got)
            for path, (labels, _) in got.items():
                assert (labels["domain"], labels["target"]) == names[path], (metric, labels)
        held, share = series(text, "vmdisktouch_held_bytes"), \
            series(text, "vmdisktouch_budget_bytes")
        for x in st["disks"]:
            assert held[x["path"]][1] == x["held_bytes"]
            assert share[x["path"]][1] == x["budget_bytes"] <= 24 * MiB   # the share
            assert x["host_budget_bytes"] == 24 * MiB
        assert 'domain="' + dom_b.replace("\\", "\\\\").replace('"', '\\"') + '"' in text
        limited = [s for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "vmdisktouch_limited"]
        for x in st["disks"]:
            mine = {s.labels["reason"]: s.value for s in limited
                    if s.labels["disk"] == x["path"]}
            assert all(s.labels["domain"] == x["domain"] for s in limited
                       if s.labels["disk"] == x["path"])
            assert sum(mine.values()) == (x["limited_by"] is not None)
            if x["limited_by"]:
                assert mine[x["limited_by"]] == 1
        m = {s.name: s.value for fam in text_string_to_metric_families(text)
             for s in fam.samples if s.name.startswith("vmdisktouch_host_")}
        assert m["vmdisktouch_host_disks"] == 3 and m["vmdisktouch_host_budget_bytes"] == 24 * MiB

        for path, (dom, target) in names.items():          # each disk's lines, by name
            d.wait_output(f"{dom}/{target} {path}: cycle ", f"{dom}/{target}'s cycle line",
                          timeout=20)
            png = pngs / f"{escape_path(path)}.png"
            assert png.read_bytes()[:8] == PNG, png
        assert f"{dom_a}/vda {a1}: cycle " in d.err()      # the log lines are on stderr
    finally:
        assert d.stop() == 0, d.output()[-3000:]


@pytest.mark.timeout(180)
def test_a_path_given_gets_its_owning_domain_and_target(domains, tmp_path):  # noqa: F811
    img = data_image(tmp_path / "given.raw", 16 * MiB)
    name = domains.define([disk_xml("vda", img)], tag="given")
    prom = tmp_path / "one.prom"
    d = DaemonProc(tmp_path, img, "--uri", URI, *FAST, "--metrics-file", prom,
                   "--map-png", tmp_path / "map.png", max_hold="8M",
                   log="daemon.out", err_log="daemon.err")
    try:
        d.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=60,
                      drive=lambda: qemu_io(name, "read 0 4M"))
        st, text = agreeing(d, prom)
        assert (st["domain"], st["target"]) == (name, "vda")
        assert st["domain_active"] is True and st["holding"] is True
        labels, value = series(text, "vmdisktouch_held_bytes")[img]
        assert labels == {"disk": img, "domain": name, "target": "vda"}
        assert value == st["held_bytes"]
        d.wait_output(f"{name}/vda: cycle ", "the cycle line named by domain", timeout=20)
        assert (tmp_path / "map.png").read_bytes()[:8] == PNG
    finally:
        assert d.stop() == 0, d.output()[-3000:]
