"""The host service's verdicts against a real libvirtd (issue 45, part 3): one verdict per
disk, a scope by glob and by label, and every disk not served in the status, the metrics
and the host PNG, each with its reason.

* A domain with a writable disk and a read-only one: ``discover`` and the host
  service say the same of the read-only disk (not eligible, the same reason and
  code), and a per-disk daemon on it (``run IMG --uri``) is refused by that verdict.
* Four domains and a ``[scope]`` that includes ``vdt-test-scope*``, excludes
  ``vdt-test-scopeglob-*`` and the label ``keep-out``: the one matching the glob
  and the one outside the includes are skipped (``excluded``, ``not_included``)
  and ``discover --config`` says why; a label set with ``virsh metadata --live``
  on a running, served domain releases it within a few seconds (libvirt's
  metadata-change event wakes the loop), and removing it serves it again. The
  skipped disks are in ``vmdisktouch status`` (a line each, code and reason), in
  the metric ``vmdisktouch_disk_unserved`` and as a row each of the host PNG.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon_proc import DaemonProc
from tests.support.libvirt_env import URI, disk_xml, domains, libvirt_daemons, virsh  # noqa: F401
from tests.support.pagecache import data_image
from vmdisktouch.adapters.pictures.host_render import BG, LINE, PAD, band_top
from vmdisktouch.config.overrides import LABEL_NS

pytestmark = [pytest.mark.qemu, pytest.mark.root]

MiB = 1 << 20
INTERVAL = 1.0


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmdisktouch", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def discovered(names, *args) -> dict:
    r = cli("discover", "--json", "--uri", URI, *args)
    assert r.returncode == 0, r.stderr
    return {(o["domain"], o["target"]): o for o in json.loads(r.stdout) if o["domain"] in names}


def served(st) -> set[str]:
    return {d["path"] for d in st["host"]["disks"]}


def skipped(st) -> dict:
    return {(x["domain"], x["target"]): x for x in st["host"]["skipped"]}


@pytest.mark.timeout(240)
def test_discover_the_host_service_and_a_per_disk_daemon_give_one_verdict(domains, tmp_path):  # noqa: F811
    rw, ro = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in ("rw", "ro"))
    name = domains.define([disk_xml("vda", rw), disk_xml("vdb", ro, readonly=True)],
                          tag="verdict")
    found = discovered({name})
    assert found[(name, "vda")]["eligible"] is True
    said = found[(name, "vdb")]
    assert said["eligible"] is False and said["code"] == "read_only", said
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0",
                   "--interval", str(INTERVAL), max_hold="8M", status="host.json")
    try:
        st = d.wait_status(lambda s: rw in served(s) and (name, "vdb") in skipped(s),
                           "vda served, vdb skipped", timeout=60)
        assert ro not in served(st)
        theirs = skipped(st)[(name, "vdb")]
        assert (theirs["code"], theirs["reason"]) == (said["code"], said["reason"])
    finally:
        assert d.stop() == 0, d.output()[-3000:]
    one = DaemonProc(tmp_path, ro, "--uri", URI, max_hold="8M", status="one.json",
                     log="one.log")
    one.proc.wait(60)
    assert one.returncode() == 78, one.output()[-2000:]
    assert said["reason"] in one.output() and "--force" in one.output(), one.output()[-2000:]


def png_rows(png, served_n: int, rows: int) -> list[bool]:
    """Whether each of the title line and ``rows`` lines below the bands has any text."""
    with Image.open(png) as im:
        img = np.asarray(im.convert("RGB"))
    top = band_top(served_n)
    return [bool((img[top + k * LINE:top + (k + 1) * LINE, PAD:PAD + 300] != BG).any(axis=2)
                 .any()) for k in range(rows + 1)]


@pytest.mark.timeout(300)
def test_scope_by_glob_and_label_is_followed_and_every_skipped_disk_is_shown(  # noqa: F811
        domains, tmp_path):
    imgs = {n: data_image(tmp_path / f"{n}.raw", 8 * MiB) for n in ("a", "g", "l", "o")}
    a = domains.define([disk_xml("vda", imgs["a"])], tag="scopein")
    g = domains.define([disk_xml("vda", imgs["g"])], tag="scopeglob")
    lab = domains.define([disk_xml("vda", imgs["l"])], tag="scopelabel")
    o = domains.define([disk_xml("vda", imgs["o"])], tag="outside")
    conf = tmp_path / "host.toml"
    conf.write_text('max_hold = "16M"\n[scope]\ninclude = ["vdt-test-scope*"]\n'
                    'exclude = ["vdt-test-scopeglob-*"]\nexclude_labels = ["keep-out"]\n')
    found = discovered({a, g, lab, o}, "--config", conf)
    assert found[(a, "vda")]["out_of_scope"] is None
    assert "exclude 'vdt-test-scopeglob-*'" in found[(g, "vda")]["out_of_scope"]
    assert "not in [scope] include" in found[(o, "vda")]["out_of_scope"]
    prom, png = tmp_path / "m.prom", tmp_path / "host.png"
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0", "--interval",
                   str(INTERVAL), "--config", conf, "--metrics-file", prom, "--host-png", png,
                   status="host.json")
    try:
        st = d.wait_status(lambda s: {imgs["a"], imgs["l"]} <= served(s)
                           and {(g, "vda"), (o, "vda")} <= set(skipped(s)),
                           "a and the label's domain served, the others skipped", timeout=60)
        assert not served(st) & {imgs["g"], imgs["o"]}
        assert skipped(st)[(g, "vda")]["code"] == "excluded"
        assert skipped(st)[(o, "vda")]["code"] == "not_included"

        t0 = time.monotonic()
        virsh("metadata", lab, LABEL_NS, "--key", "vmdt", "--set", "<label>keep-out</label>",
              "--live")
        st = d.wait_status(lambda s: imgs["l"] not in served(s)
                           and (lab, "vda") in skipped(s), "the labelled domain left", timeout=30)
        assert time.monotonic() - t0 <= INTERVAL + 3
        assert "exclude_labels 'keep-out'" in skipped(st)[(lab, "vda")]["reason"]
        assert "exclude_labels 'keep-out'" in discovered({lab}, "--config", conf)[
            (lab, "vda")]["out_of_scope"]

        time.sleep(2 * INTERVAL)                          # a status, a PNG and metrics after it
        st = d.read_status()
        text = prom.read_text()
        rows = png_rows(png, len(st["host"]["disks"]), len(st["host"]["skipped"]))
        r = cli("status", "--dir", tmp_path)
        assert r.returncode == 0, r.stderr

        virsh("metadata", lab, LABEL_NS, "--key", "vmdt", "--remove", "--live")
        d.wait_status(lambda s: imgs["l"] in served(s), "the label removed: served", timeout=30)
    finally:
        assert d.stop() == 0, d.output()[-3000:]
    unserved = {(s.labels["domain"], s.labels["target"]): s.labels["reason"]
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "vmdisktouch_disk_unserved"}
    assert {k: unserved.get(k) for k in ((g, "vda"), (o, "vda"), (lab, "vda"))} == {
        (g, "vda"): "excluded", (o, "vda"): "not_included", (lab, "vda"): "excluded"}
    assert len(unserved) == len(st["host"]["skipped"])
    assert all(rows), rows                                # a title, then a row each
    lines = r.stdout.splitlines()
    for key, x in skipped(st).items():
        assert f"  {key[0]}/{key[1]}: skipped ({x['code']}): {x['reason']}" in lines, r.stdout
