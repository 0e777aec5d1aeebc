"""Debian's own node_exporter (prometheus-node-exporter 1.5.0) serves a real daemon's
``--metrics-file``: started with only its textfile collector, scraped over HTTP, its
answer parsed with prometheus_client's parser. The daemon's series carry the values of
its status file (read around the scrape, from the same cycle), the collector reports no
error, and after the daemon's SIGTERM the next scrape has none of its series.

The directory is a temporary one given with ``--collector.textfile.directory``, and,
for the documented default, the one the binary reads without that flag on Debian,
/var/lib/prometheus/node-exporter, with one file per daemon as the per-disk units
need. node_exporter is stopped by its PID; nothing is skipped.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.e2e.test_metrics import (agreeing_scrape, assert_the_status_values, free_port,
                                    labelled, read_range, samples)
from tests.support.common import require_tool
from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from vmdisktouch.unitname import escape_path

MiB = 1 << 20
DEBIAN_DIR = pathlib.Path("/var/lib/prometheus/node-exporter")


def node_exporter_exe() -> str:
    return require_tool("prometheus-node-exporter")     # make test installs it


class NodeExporter:
    """``prometheus-node-exporter`` with only the textfile collector, on a free loopback
    port; ``directory`` None: the binary's default directory. Stopped by its PID."""

    def __init__(self, workdir: pathlib.Path, directory: pathlib.Path | None):
        self.port = free_port()
        argv = [node_exporter_exe(), "--collector.disable-defaults", "--collector.textfile",
                f"--web.listen-address=127.0.0.1:{self.port}"]
        if directory is not None:
            argv.append(f"--collector.textfile.directory={directory}")
        self.log = workdir / "node_exporter.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.scrape()
                return
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"node_exporter did not answer: {self.output()}")
                time.sleep(0.1)

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def node_exporter(tmp_path):
    started: list[NodeExporter] = []

    def start(directory: pathlib.Path | None) -> NodeExporter:
        started.append(NodeExporter(tmp_path, directory))
        return started[-1]

    yield start
    for n in started:
        n.stop()


def assert_no_textfile_error(text: str) -> None:
    [error] = labelled(text, "node_textfile_scrape_error")
    assert error.value == 0, text[-3000:]


def daemon(workdir, img, prom, max_hold="16M") -> DaemonProc:
    return DaemonProc(workdir, img, "--uri", "", "--min-free", "0", "--metrics-file", str(prom),
                      max_hold=max_hold, interval=0.5, env=env_without_systemd())


def test_node_exporter_serves_the_textfile_with_the_status_values(tmp_path, node_exporter):
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    img = data_image(tmp_path / "disk.raw", 32 * MiB)
    prom = textfiles / "vmdisktouch.prom"
    d = daemon(tmp_path, img, prom)
    try:
        ne = node_exporter(textfiles)
        d.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=30,
                      drive=lambda: read_range(img, 16 * MiB))
        status, m, text = agreeing_scrape(d, ne.scrape, img)
        assert_the_status_values(status, m, img)
        assert_no_textfile_error(text)
        [mtime] = labelled(text, "node_textfile_mtime_seconds")
        assert mtime.labels["file"].endswith("vmdisktouch.prom")
        assert abs(mtime.value - prom.stat().st_mtime) < 2
        [held] = labelled(text, "vmdisktouch_held_bytes")
        assert held.labels == {"disk": img, "domain": "", "target": ""}
        rc, _ = d.terminate(timeout=20)
        assert rc == 0, d.output()[-2000:]
        text = ne.scrape()                       # the file went with the daemon
        assert not [name for name, _ in samples(text) if name.startswith("vmdisktouch_")]
        assert labelled(text, "node_textfile_mtime_seconds") == []
        assert_no_textfile_error(text)
    finally:
        d.stop()


def test_per_disk_daemons_in_debian_s_directory_one_file_each(tmp_path, node_exporter):
    """Debian's default directory, as node_exporter reads it without the flag; a file per
    per-disk daemon named after its instance (docs/metrics.md): stopping one removes its
    series only."""
    assert DEBIAN_DIR.is_dir(), f"{DEBIAN_DIR} missing: install prometheus-node-exporter"
    imgs = [data_image(tmp_path / f"vm{i}.raw", 16 * MiB) for i in (1, 2)]
    proms = [DEBIAN_DIR / f"vmdisktouch@{escape_path(img)}.prom" for img in imgs]
    assert not any(p.exists() for p in proms), proms
    ds = []
    try:
        for i, (img, prom) in enumerate(zip(imgs, proms)):
            (tmp_path / f"d{i}").mkdir()
            ds.append(daemon(tmp_path / f"d{i}", img, prom, max_hold="8M"))
        ne = node_exporter(None)
        for d, img in zip(ds, imgs):
            d.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=30,
                          drive=lambda img=img: read_range(img, 8 * MiB))
        for d, img in zip(ds, imgs):
            status, m, text = agreeing_scrape(d, ne.scrape, img)
            assert_the_status_values(status, m, img)
            assert_no_textfile_error(text)
        files = {s.labels["file"] for s in labelled(text, "node_textfile_mtime_seconds")}
        assert {os.path.basename(f) for f in files} >= {p.name for p in proms}, files
        rc, _ = ds[0].terminate(timeout=20)
        assert rc == 0, ds[0].output()[-2000:]
        m = samples(ne.scrape())
        assert ("vmdisktouch_held_bytes", imgs[0]) not in m
        assert m[("vmdisktouch_held_bytes", imgs[1])] > 0
        assert not proms[0].exists()
    finally:
        for d in ds:
            d.stop()
        for p in proms:                      # only if a daemon died before removing it
            p.unlink(missing_ok=True)
    assert not any(p.exists() for p in proms)
