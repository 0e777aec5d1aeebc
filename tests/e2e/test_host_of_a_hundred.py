"""A host of a hundred VMs: the host service (``run --libvirt``) over 100 running QEMU
domains of the real libvirtd, each with its own 64 GiB sparse raw disk (``cache=writethrough``),
10 of them busy (real reads through the domain's own block layer, ``qemu_io``), 90 idle,
under one small budget; while it runs, 20 domains more are started, 20 destroyed and disks
hot-plugged and unplugged on a few, one change at a time: each is followed before the next.
(A change made while another domain is being destroyed is seen only once that destroy
returns: libvirt holds the destroyed domain's lock until QEMU is reaped, and every listing
of domains waits for it; here, where PID 1 reaps orphans 1.3-1.5 s late, a destroy takes
1.6-2 s, so such a change was followed in 2.0-3.0 s.)

Checked: every disk served, by its domain and target; every lifecycle change (start,
destroy, hot-plug, unplug) followed within the issue's 2 s, from the return of the libvirt
call to the status file that shows it (``host.time``, the moment it was written; the file is
read every ``POLL`` s, a twentieth of the interval, so no cycle's file is missed); the
budget never exceeded at any status file read nor in the daemon's ``VmLck``, while the busy
disks want more than it; ``vmdisktouch status --json`` and its lines, and the metrics
endpoint, complete for every disk.

Domains are started paused (``-S``, as the support does: they cost memory, not CPU). The
service's ``[scope]`` includes only this test's domains (``vdt-test-h100-*``): other
sessions' tests start ``vdt-test-*`` domains on the same libvirtd, and a domain of theirs
coming or going must not count here. Each phase's time is printed (``pytest -s``) and
written to ``timings.json`` in the test's directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import pytest
from PIL import Image as PILImage
from prometheus_client.parser import text_string_to_metric_families

from tests.support.common import GiB, MiB, ROOT, free_port
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.images import make_image
from vmdisktouch.adapters.pictures import host_render
from tests.support.libvirt_env import (URI, VmLck, destroy_undefine, disk_xml,  # noqa: F401
                                       domains, libvirt_daemons, qemu_io, virsh)

N_DOMAINS = 100          # running when the service starts
N_BUSY = 10              # of them, read by their guest all along
N_MORE = 20              # started while it runs
N_GONE = 20              # destroyed while it runs (idle ones)
N_PLUGGED = 4            # domains that get a disk hot-plugged, then unplugged
IMAGE_SIZE = 64 * GiB    # every disk: sparse, raw
ZONE = 48 * MiB          # a busy guest's data, read over and over: 10 x 48M wants > MAX_HOLD
MAX_HOLD = 256 * MiB
INTERVAL = 1.0
POLL = INTERVAL / 20     # the status file and the log are read this often
FOLLOWED_WITHIN = 2.0    # the bound on following a lifecycle change
HANG_GUARD = 10          # a wait that is not a measurement gives up after this many bounds
CREATE_THREADS = 4       # threads calling libvirt to define and start the domains
TAG = "h100"             # the domains' names: vdt-test-h100-XXXXXXXX


# -- what the status file said, every cycle --------------------------------------------


@dataclass(frozen=True)
class Sample:
    read_at: float          # wall time the test read it
    written_at: float       # host.time: when the daemon wrote it
    cycle: int
    cycle_seconds: float
    held: int               # host.held_bytes
    disks_held: int         # the sum of host.disks[].held_bytes
    wanted: int             # the sum of host.disks[].wanted_bytes
    budget: int
    served: frozenset       # host.disks[].path
    entries: frozenset      # disks[].path (the full figures)
    failed: tuple


class StatusSampler(threading.Thread):
    """Reads the status file every ``every`` s; keeps one ``Sample`` per file written
    (a new file is a new inode: the daemon replaces it atomically)."""

    def __init__(self, path, every: float):
        super().__init__(daemon=True)
        self.path, self.every = path, every
        self.samples: list[Sample] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        last = None
        try:
            while not self.stop.wait(self.every):
                try:
                    st = os.stat(self.path)
                    key = (st.st_ino, st.st_mtime_ns)
                    if key == last:
                        continue
                    doc = json.loads(self.path.read_bytes())
                except (FileNotFoundError, ValueError):
                    continue
                last = key
                h = doc["host"]
                self.samples.append(Sample(
                    time.time(), h["time"], h["cycle"], h["cycle_seconds"] or 0.0, h["held_bytes"],
                    sum(x["held_bytes"] for x in h["disks"]),
                    sum(x["wanted_bytes"] or 0 for x in h["disks"]), h["budget_bytes"],
                    frozenset(x["path"] for x in h["disks"]),
                    frozenset(x["path"] for x in doc["disks"]),
                    tuple(x["path"] for x in h["failed"])))
        except BaseException as exc:  # noqa: BLE001 - said by the test
            self.error = exc

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def wait_for(self, pred, what: str, timeout: float, d: DaemonProc) -> Sample:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert d.alive(), f"daemon exited before {what}: {d.output()[-3000:]}"
            assert self.error is None, self.error
            s = self.latest()
            if s is not None and pred(s):
                return s
            time.sleep(self.every)
        s = self.latest()
        raise AssertionError(f"timed out ({timeout:.0f} s) waiting for {what}; last cycle "
                             f"{s and s.cycle}, {s and len(s.served)} disks served; log:\n"
                             f"{d.output()[-3000:]}")


# -- the guests' I/O ---------------------------------------------------------------------


class BusyGuest(threading.Thread):
    """Reads its whole zone through its domain's QEMU once every ``every`` s: one
    ``qemu_io`` (a ``virsh`` process, 13 ms of CPU here) a guest and cycle, so ten guests
    cost the 2 cores a few percent, not the daemon's share."""

    def __init__(self, name: str, stop: threading.Event, every: float):
        super().__init__(daemon=True)
        self.name_, self.stop, self.every = name, stop, every
        self.reads, self.error = 0, None

    def run(self):
        try:
            while not self.stop.is_set():
                t = time.monotonic()
                qemu_io(self.name_, f"read 0 {ZONE}")
                self.reads += 1
                self.stop.wait(max(0.0, self.every - (time.monotonic() - t)))
        except BaseException as exc:  # noqa: BLE001 - said by the test
            self.error = exc


# -- the daemon's log --------------------------------------------------------------------

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (.*)$", re.M)


def log_times(text: str) -> list[tuple[float, str, str]]:
    """(wall time, level, message) of each log line (asctime: local time, milliseconds)."""
    return [(datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp(), lvl, msg)
            for t, lvl, msg in LOG_LINE.findall(text)]


def first_logged(lines, text: str) -> float | None:
    return next((t for t, _, msg in lines if text in msg), None)


# -- the commands ------------------------------------------------------------------------


def vmdisktouch(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmdisktouch", *argv], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()


def series(text: str, name: str) -> list:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name]


@pytest.fixture
def fleet(domains, tmp_path):  # noqa: F811
    """The ``domains`` factory, its domains destroyed and undefined in parallel at the end
    (120 one after the other take a minute), the images removed; none of them left."""
    images = tmp_path / "images"
    images.mkdir()
    yield domains, images
    names, domains.names[:] = list(domains.names), []
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(destroy_undefine, names))
    print(f"\n[h100] teardown: {len(names)} domains destroyed and undefined in "
          f"{time.monotonic() - t0:.1f} s")
    shutil.rmtree(images)
    left = set(virsh("list", "--all", "--name").split()) & set(names)
    assert not left, f"domains left behind: {sorted(left)}"


@pytest.mark.timeout(300)
def test_a_host_of_a_hundred_vms(fleet, tmp_path):
    domains, images = fleet
    t_test = time.monotonic()
    timings: dict[str, float] = {}

    def phase(name: str, since: float) -> float:
        now = time.monotonic()
        timings[name] = round(now - since, 2)
        print(f"[h100] {name}: {now - since:.1f} s")
        return now

    # -- 100 domains, 10 busy ---------------------------------------------------------
    def image(name: str, data: bool = False) -> str:
        return make_image(images / f"{name}.raw", IMAGE_SIZE,
                          data=[(0, ZONE)] if data else ())

    def define(i: int, data: bool = False, start: bool = True) -> tuple[str, str]:
        img = image(f"d{i:03d}", data)
        return domains.define([disk_xml("vda", img)], start=start, tag=TAG), img

    t = time.monotonic()
    with ThreadPoolExecutor(CREATE_THREADS) as ex:
        first = list(ex.map(lambda i: define(i, data=i < N_BUSY), range(N_DOMAINS)))
    t = phase(f"define and start {N_DOMAINS} domains ({CREATE_THREADS} threads)", t)
    more = [define(N_DOMAINS + i, start=False) for i in range(N_MORE)]     # started later
    plugs = [image(f"plug{i}") for i in range(N_PLUGGED)]
    busy = first[:N_BUSY]
    gone = first[N_BUSY:N_BUSY + N_GONE]
    plugged = first[N_BUSY + N_GONE:N_BUSY + N_GONE + N_PLUGGED]
    qemu_rss = []
    for pid in subprocess.run(["pgrep", "-f", f"guest={domains.names[0][:-8]}"],
                              capture_output=True, text=True).stdout.split():
        try:
            qemu_rss.append(int(open(f"/proc/{pid}/statm").read().split()[1]) * 4096)
        except OSError:
            pass
    print(f"[h100] QEMU RSS: {len(qemu_rss)} processes, mean "
          f"{sum(qemu_rss) / max(1, len(qemu_rss)) / MiB:.0f} MiB")

    conf = tmp_path / "host.toml"
    conf.write_text(f'[scope]\ninclude = ["vdt-test-{TAG}-*"]\n')
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    port = free_port()
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0",
                   "--interval", str(INTERVAL), "--config", conf,
                   "--metrics-listen", f"127.0.0.1:{port}", "--host-png", str(run / "host.png"),
                   max_hold=MAX_HOLD,
                   status="run/host.json", env=env_without_systemd())
    sampler = StatusSampler(d.status_path, POLL)
    sampler.start()
    lck = VmLck(d)
    stop_io = threading.Event()
    guests = [BusyGuest(name, stop_io, every=INTERVAL) for name, _ in busy]
    expected = {img: (name, "vda") for name, img in first}
    events = []          # (kind, path, domain, target, wall time the libvirt call returned)
    try:
        # -- every disk served -----------------------------------------------------------
        t = time.monotonic()
        s = sampler.wait_for(lambda s: set(expected) <= s.served,
                             f"the {N_DOMAINS} disks served", 120, d)
        t = phase(f"the service serves the {N_DOMAINS} disks", t)
        assert s.served == set(expected) and not s.failed, s
        for g in guests:
            g.start()
        s = sampler.wait_for(lambda s: s.held > MAX_HOLD // 2 and s.wanted > MAX_HOLD,
                             "the busy disks wanting more than the budget, and holds",
                             60, d)
        t = phase("the busy disks hold", t)

        # -- the churn: 20 started, 20 destroyed, 4 plugged and unplugged, one at a time ------
        def followed(kind: str, path: str, name: str, target: str) -> None:
            """The change is done (the libvirt call returned): noted, and waited for in the
            status file before the next one (a bound of its own, the hang guard of
            ``HANG_GUARD`` follow bounds; the 2 s are checked on the samples below)."""
            at = time.time()
            events.append((kind, path, name, target, at))
            present = kind in ("start", "hot-plug")
            sampler.wait_for(lambda s: s.written_at >= at and (path in s.served) == present,
                             f"{kind} of {name}/{target} followed",
                             HANG_GUARD * FOLLOWED_WITHIN, d)

        for i in range(N_MORE):
            name, img = more[i]
            virsh("start", name, "--paused")
            expected[img] = (name, "vda")
            followed("start", img, name, "vda")
            name, img = gone[i]
            virsh("destroy", name)
            del expected[img]
            followed("destroy", img, name, "vda")
            if i < N_PLUGGED:
                name, img = plugged[i][0], plugs[i]
                virsh("attach-disk", name, img, "sdb", "--targetbus", "usb", "--driver",
                      "qemu", "--subdriver", "raw", "--cache", "writethrough", "--live")
                expected[img] = (name, "sdb")
                followed("hot-plug", img, name, "sdb")
            elif i < 2 * N_PLUGGED:
                name, img = plugged[i - N_PLUGGED][0], plugs[i - N_PLUGGED]
                virsh("detach-disk", name, "sdb", "--live")
                del expected[img]
                followed("unplug", img, name, "sdb")
        t_churn = time.monotonic() - t
        t = phase(f"the churn: {len(events)} libvirt calls, each followed", t)
        s = sampler.wait_for(lambda s: s.served == set(expected) and s.entries == set(expected)
                             and s.written_at > events[-1][4], "every disk's full entry",
                             HANG_GUARD * INTERVAL, d)
        t = phase("the last change followed", t)

        # -- status: --json and the lines, complete ---------------------------------------
        r = vmdisktouch("status", "--dir", str(run), "--json")
        assert r.returncode == 0, r.stderr
        [doc] = json.loads(r.stdout)
        assert doc["stale"] is False and doc["host"]["pid"] == d.pid
        assert doc["host"]["failed"] == [] and doc["host"]["budget_bytes"] == MAX_HOLD
        lines = {x["path"]: (x["domain"], x["target"]) for x in doc["host"]["disks"]}
        assert lines == expected, set(lines) ^ set(expected)
        entries = {x["path"]: (x["domain"], x["target"]) for x in doc["disks"]}
        assert entries == expected, set(entries) ^ set(expected)
        assert not {(x["domain"], x["target"]) for x in doc["host"]["skipped"]} \
            & set(expected.values())
        r = vmdisktouch("status", "--dir", str(run), "--all")
        assert r.returncode == 0, r.stderr
        out = r.stdout.splitlines()
        assert re.match(rf"host \(pid {d.pid}, v[^)]+\): held \S+ of 256M budget, .*"
                        rf"\b{len(expected)} disks served, \d+ skipped, 0 failed, ", out[0]), \
            out[0]
        shown = [x for x in out[1:] if ": held " in x]
        assert len(shown) == len(expected), r.stdout
        for path, (name, target) in expected.items():
            assert sum(x.startswith(f"  {name}/{target} ({path}): held ") for x in shown) == 1, \
                (name, target, path)

        # -- the host PNG: the picture of a hundred, its height bounded -------------------------
        with PILImage.open(run / "host.png") as png:
            png.load()
            assert png.height <= host_render.picture_height(len(expected), N_DOMAINS,
                                                            curves=True), png.size
        keep = os.environ.get("VMDISKTOUCH_EXAMPLE_DIR")     # the docs' 100-disk example
        if keep:
            shutil.copy(run / "host.png", os.path.join(keep, "host-100.png"))
            r = vmdisktouch("status", "--dir", str(run))
            with open(os.path.join(keep, "status-100.txt"), "w") as f:
                f.write(r.stdout)

        # -- metrics: one series per disk ---------------------------------------------------
        text = scrape(port)
        for metric in ("vmdisktouch_held_bytes", "vmdisktouch_budget_bytes",
                       "vmdisktouch_disk_info", "vmdisktouch_holding"):
            got = [x.labels["disk"] for x in series(text, metric)]
            assert sorted(got) == sorted(expected), (metric, set(got) ^ set(expected))
        for x in series(text, "vmdisktouch_held_bytes"):
            assert (x.labels["domain"], x.labels["target"]) == expected[x.labels["disk"]]
            assert 0 <= x.value <= MAX_HOLD
        [n] = series(text, "vmdisktouch_host_disks")
        assert n.value == len(expected)
        [held] = series(text, "vmdisktouch_host_held_bytes")
        assert held.value <= MAX_HOLD
        t = phase("status and metrics checked", t)
    finally:
        stop_io.set()
        for g in guests:
            g.join(30)
        lck.stop.set()
        rc = d.stop()
        sampler.stop.set()
        sampler.join(10)
        log = d.output()
        (tmp_path / "timings.json").write_text(json.dumps(timings, indent=1))
    assert rc == 0, log[-3000:]
    assert sampler.error is None, sampler.error
    assert all(g.error is None for g in guests), [g.error for g in guests if g.error]
    assert all(g.reads > 0 for g in guests)

    # -- every lifecycle change followed within 2 s ------------------------------------
    samples = sampler.samples
    lines = log_times(log)
    table, late = [], []
    for kind, path, name, target, at in events:
        present = kind in ("start", "hot-plug")
        shown = next((x for x in samples if x.written_at >= at and (path in x.served) == present),
                     None)
        logged = first_logged(lines, f"libvirt: serving {name} {target} ({path})" if present
                              else f"{path}: no running domain uses it any more")
        row = (kind, f"{name}/{target}", None if shown is None else shown.written_at - at,
               None if logged is None else logged - at,
               None if shown is None else shown.read_at - at)
        table.append(row)
        if shown is None or shown.written_at - at > FOLLOWED_WITHIN:
            late.append(row)
    worst = {k: max((r[2] or 0.0) for r in table if r[0] == k) for k in
             ("start", "destroy", "hot-plug", "unplug")}
    worst_log = {k: max((r[3] or 0.0) for r in table if r[0] == k) for k in worst}
    cycles = [x.cycle_seconds for x in samples]
    print(f"[h100] followed (status file written - libvirt call returned), worst: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in worst.items()))
    print(f"[h100] logged, worst: " + ", ".join(f"{k} {v:.2f} s" for k, v in worst_log.items()))
    print(f"[h100] host cycle: median {sorted(cycles)[len(cycles) // 2]:.2f} s, "
          f"max {max(cycles):.2f} s over {len(samples)} status files "
          f"(cycles {samples[0].cycle}..{samples[-1].cycle}); churn {t_churn:.1f} s")
    timings.update({f"worst {k}": round(v, 3) for k, v in worst.items()})
    timings["events (kind, disk, status s, log s, read s)"] = table
    (tmp_path / "timings.json").write_text(json.dumps(timings, indent=1))
    assert not late, "followed later than 2 s (kind, disk, status s, log s, read s):\n" + \
        "\n".join(map(str, late))

    # -- the budget: never exceeded, and it bound --------------------------------------
    over = [x for x in samples if max(x.held, x.disks_held) > MAX_HOLD]
    assert not over, over[:3]
    assert max(x.held for x in samples) > MAX_HOLD // 2
    assert max(x.wanted for x in samples) > MAX_HOLD       # the budget was contested
    assert 0 < lck.worst <= MAX_HOLD, lck.worst
    # the status file was read at every cycle but a few (a cycle missed is a sample missed)
    seen = len({x.cycle for x in samples})
    assert seen >= 0.9 * (samples[-1].cycle - samples[0].cycle + 1), seen
    assert not [x for x in samples if x.failed], [x.failed for x in samples if x.failed][:3]
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    print(f"[h100] the test: {time.monotonic() - t_test:.1f} s (teardown not included)")
