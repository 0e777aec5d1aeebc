"""Prometheus metrics of a real daemon: the loopback endpoint scraped over HTTP and the
textfile, both parsed with prometheus_client's own parser and checked against the status;
the textfile removed at a clean stop, left (its mtime frozen) by a SIGKILL."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support.pagecache import data_image
from tests.support.common import free_port
from tests.support.daemon_proc import ROOT, DaemonProc, env_without_systemd

MiB = 1 << 20




def samples(text: str) -> dict:
    """(name, disk label or None) -> value, for every sample of the exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("disk"))] = s.value
    return out


def labelled(text: str, name: str) -> list:
    """The samples named ``name``, each with its labels."""
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name]


def read_range(path, length):
    with open(path, "rb") as f:
        while length > 0:
            length -= len(f.read(min(length, MiB)) or b"x" * length)


# status key -> metric: equal when the scrape and the status are of one cycle (agreeing_scrape)
SAME_AS_STATUS = {"held_bytes": "vmdisktouch_held_bytes",
                  "budget_bytes": "vmdisktouch_budget_bytes",
                  "wanted_bytes": "vmdisktouch_wanted_bytes",
                  "resident_bytes": "vmdisktouch_resident_bytes",
                  "size_bytes": "vmdisktouch_size_bytes",
                  "mem_available_bytes": "vmdisktouch_mem_available_bytes",
                  "cycle_seconds": "vmdisktouch_cycle_seconds",
                  "cycle": "vmdisktouch_cycles_total"}


def agreeing_scrape(d: DaemonProc, scrape, disk: str, timeout: float = 30.0):
    """(status, samples, text) of a scrape taken between two reads of the status file
    that show the same cycle, its ``cycles_total`` that cycle: all from one cycle."""
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        before = d.read_status()
        text = scrape()
        after = d.read_status()
        m = samples(text)
        if before and after and before["cycle"] == after["cycle"] == \
                m.get(("vmdisktouch_cycles_total", disk)):
            return after, m, text
        time.sleep(0.05)
    raise AssertionError(f"no scrape agreed with the status file; last:\n{text[-3000:]}")


def assert_the_status_values(status: dict, m: dict, disk: str) -> None:
    for key, metric in SAME_AS_STATUS.items():
        assert m[(metric, disk)] == status[key], (key, m[(metric, disk)], status[key])
    assert m[("vmdisktouch_regions", disk)] == len(status["regions"])
    assert 0 < status["held_bytes"] <= status["budget_bytes"]


def test_endpoint_and_textfile_agree_with_the_status(tmp_path):
    img = data_image(tmp_path / "disk.raw", 32 * MiB)
    port = free_port()
    prom = tmp_path / "vmdisktouch.prom"
    d = DaemonProc(tmp_path, img, "--uri", "", "--min-free", "0", "--metrics-listen",
                   f"127.0.0.1:{port}", "--metrics-file", str(prom), max_hold="16M",
                   interval=1.0, env=env_without_systemd())
    try:
        st = d.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=30,
                           drive=lambda: read_range(img, 16 * MiB))
        st = d.wait_status(lambda s: s["cycle"] > st["cycle"] + 1, "two more cycles")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        http = samples(body.decode())
        assert http[("vmdisktouch_budget_bytes", img)] == 16 * MiB
        assert 0 < http[("vmdisktouch_held_bytes", img)] <= 16 * MiB
        assert http[("vmdisktouch_loaded_bytes_total", img)] >= http[("vmdisktouch_held_bytes",
                                                                        img)]
        assert http[("vmdisktouch_cycles_total", img)] >= 3
        assert ("vmdisktouch_events_lost_total", img) in http
        assert ("vmdisktouch_disk_info", img) in http
        assert http[("vmdisktouch_wanted_bytes", img)] >= 0
        [held] = labelled(body.decode(), "vmdisktouch_held_bytes")
        assert held.labels == {"disk": img, "domain": "", "target": ""}   # no libvirt
        limited = labelled(body.decode(), "vmdisktouch_limited")
        assert {s.labels["reason"] for s in limited} >= {"budget", "no_evidence", "floor"}
        assert sum(s.value for s in limited) <= 1
        assert not any(name.startswith("python_") or name.startswith("process_")
                       for name, _ in http)                # our registry only
        text = samples(prom.read_text())
        last = d.read_status()
        assert text[("vmdisktouch_cycles_total", img)] in (last["cycle"], last["cycle"] - 1)
        assert text[("vmdisktouch_held_bytes", img)] <= 16 * MiB
    finally:
        assert d.stop() == 0, d.output()[-2000:]
    with socket.socket() as s:                            # the endpoint went with the daemon
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_several_disks_and_the_host_budget(tmp_path):
    a, b = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in "ab")
    prom = tmp_path / "host.prom"
    d = DaemonProc(tmp_path, [a, b], "--uri", "", "--min-free", "0", "--metrics-file",
                   str(prom), max_hold="8M", interval=1.0, env=env_without_systemd())
    try:
        d.wait_status(lambda s: s["host"]["cycle"] >= 2, "two cycles")
        m = samples(prom.read_text())
        assert m[("vmdisktouch_host_budget_bytes", None)] == 8 * MiB
        assert ("vmdisktouch_held_bytes", a) in m and ("vmdisktouch_held_bytes", b) in m
        assert m[("vmdisktouch_host_disks", None)] == 2
        assert m[("vmdisktouch_host_above_floor_bytes", None)] > 0      # --min-free 0
        for path in (a, b):                          # each share within the host budget
            assert 0 <= m[("vmdisktouch_budget_bytes", path)] <= 8 * MiB
        for s in labelled(prom.read_text(), "vmdisktouch_limited"):
            assert (s.labels["domain"], s.labels["target"]) == ("", "")
    finally:
        assert d.stop() == 0, d.output()[-2000:]


def test_a_non_loopback_address_is_refused_with_one_line(tmp_path):
    img = data_image(tmp_path / "disk.raw", 4 * MiB)
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "run", img, "--max-hold", "1M",
                        "--uri", "", "--metrics-listen", "0.0.0.0:9105"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 78 and "not a loopback address" in r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


# -- issue 34: holding a gauge of its own; a stopped daemon leaves no textfile ----------

def test_a_clean_stop_removes_the_textfile_and_holding_is_a_gauge(tmp_path):
    img = data_image(tmp_path / "disk.raw", 32 * MiB)
    prom = tmp_path / "vmdisktouch.prom"
    d = DaemonProc(tmp_path, img, "--uri", "", "--min-free", "0", "--metrics-file", str(prom),
                   max_hold="16M", interval=0.5, env=env_without_systemd())
    try:
        d.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=30,
                      drive=lambda: read_range(img, 16 * MiB))
        d.wait_status(lambda s: prom.exists() and samples(prom.read_text()).get(
            ("vmdisktouch_held_bytes", img), 0) > 0, "the textfile to say it holds")
        text = prom.read_text()
        [info] = labelled(text, "vmdisktouch_disk_info")
        assert info.labels == {"disk": img, "domain": "", "target": "",
                               "access_source": d.read_status()["access_source"]}
        [holding] = labelled(text, "vmdisktouch_holding")
        assert holding.labels == {"disk": img, "domain": "", "target": ""}
        assert holding.value == 1
        rc, _ = d.terminate(timeout=20)
        assert rc == 0, d.output()[-2000:]
        assert not prom.exists(), prom.read_text()    # nothing held: no series left
        assert "released all holds" in d.output()
    finally:
        d.stop()
    assert [p.name for p in tmp_path.iterdir() if "prom" in p.name] == []   # no temp file


def test_a_killed_daemon_leaves_its_textfile_to_age(tmp_path):
    """SIGKILL runs no code: the file stays, its mtime (node_textfile_mtime_seconds) frozen,
    as docs/metrics.md says."""
    img = data_image(tmp_path / "disk.raw", 8 * MiB)
    prom = tmp_path / "vmdisktouch.prom"
    d = DaemonProc(tmp_path, img, "--uri", "", "--min-free", "0", "--metrics-file", str(prom),
                   max_hold="4M", interval=0.5, env=env_without_systemd())
    try:
        d.wait_status(lambda s: s["cycle"] >= 1 and prom.exists(), "the textfile")
    finally:
        d.kill()
    mtime = prom.stat().st_mtime
    assert "vmdisktouch_held_bytes" in prom.read_text()
    time.sleep(1.2)
    assert prom.stat().st_mtime == mtime
