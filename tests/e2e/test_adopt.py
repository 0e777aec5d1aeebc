"""``vmdisktouch adopt`` and ``release`` on real domains of a private libvirtd.

Each domain's QEMU runs (no guest OS: the "guest" reads and writes through
``qemu-io`` in its monitor) with raw ``cache='none'`` disks. What is checked is what
QEMU and the kernel say, not what the command prints: the image's descriptor in the
QEMU process (``/proc/PID/fdinfo`` flags, O_DIRECT 040000), QEMU's own
``cache.direct`` of the node, the page cache (``mincore``) and the bytes on disk
read with O_DIRECT.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import time
import uuid

import pytest

from tests.support.arrival_env import (STILL_IN_USE, CheckedQemu, QemuLog, checked_domain_xml,
                                       qemu_io_at, vsh)
from tests.support.common import ROOT, free_port, require_tool
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.faultkit import assert_refused, vmdt
from tests.support.libvirt_env import disk_xml, libvirt_daemons  # noqa: F401
from tests.support.images import direct_read
from tests.support.pagecache import data_image, fincore_pages, vmtouch_pages
from tests.support.procfs import o_direct
from tests.support.private_libvirt import PrivateLibvirtd, shared_storage

MiB = 1 << 20
MARK = "http://vmdisktouch.org/xmlns/adopted/1"     # the adopted targets a domain carries
UNTIMED = ("--measure", "0")       # adopt without timing the guest first (the never-slower
#                                    test times it)


@pytest.fixture(scope="module")
def lv(libvirt_daemons, tmp_path_factory):
    d = PrivateLibvirtd(tmp_path_factory.mktemp("adopt"), name="adopt")
    yield d
    d.close()


@pytest.fixture
def env(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    return {**os.environ, "VMDISKTOUCH_RUNTIME_DIR": str(run)}


def running(lv, tmp_path, *disks) -> str:
    name = lv.define(list(disks))
    lv.virsh("resume", name)
    return name


def image(tmp_path, name: str, size: int = 64 * MiB):
    """A data image out of the page cache (``data_image``)."""
    return data_image(tmp_path / name, size)


def node_direct(lv, name: str) -> bool:
    out = lv.virsh("qemu-monitor-command", name,
                   json.dumps({"execute": "query-named-block-nodes",
                               "arguments": {"flat": True}})).stdout
    nodes = [n for n in json.loads(out)["return"] if n["drv"] == "file"]
    assert len(nodes) == 1, nodes
    return nodes[0]["cache"]["direct"]


def test_adopt_then_release_switches_the_descriptor_and_keeps_every_flushed_write(
        lv, tmp_path, env):
    img = image(tmp_path, "a.img")
    name = running(lv, tmp_path, disk_xml("vda", str(img), cache="none", io="threads"))
    pid = lv.qemu_pid(name)
    assert o_direct(pid, img) and node_direct(lv, name)
    for cycle in range(20):
        r = vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, env=env)
        assert r.returncode == 0, r.stderr
        assert f"{name}/vda: adopted" in r.stdout
        assert not o_direct(pid, img) and not node_direct(lv, name)
        # the guest writes and flushes through the page cache, then reads it back
        pattern = 0x10 + cycle
        offset = (cycle % 8) * MiB
        lv.qemu_io(name, f"write -P {pattern} {offset} 1M")
        lv.qemu_io(name, "flush")
        assert "Pattern verification failed" not in lv.qemu_io(
            name, f"read -P {pattern} {offset} 1M")
        r = vmdt("release", f"{name}/vda", "--uri", lv.uri, env=env)
        assert r.returncode == 0, r.stderr
        assert f"{name}/vda: released" in r.stdout
        assert o_direct(pid, img) and node_direct(lv, name)
        # every flushed write is on the disk, read past the page cache
        assert direct_read(img, offset, MiB) == bytes([pattern]) * MiB, f"cycle {cycle}"
    r = vmdt("release", f"{name}/vda", "--uri", lv.uri, env=env)
    assert r.returncode == 0 and "not adopted" in r.stdout, r.stdout + r.stderr
    assert not list((tmp_path / "run").glob("adopted/*.json"))


def test_adopt_drops_the_image_s_pages_before_qemu_reads_through_them(lv, tmp_path, env):
    img = image(tmp_path, "b.img")
    name = running(lv, tmp_path, disk_xml("vda", str(img), cache="none", io="threads"))
    with open(img, "rb") as f:                   # a buffered reader caches the last 8 MiB
        f.seek(56 * MiB)
        f.read(8 * MiB)
    assert fincore_pages(img) >= 8 * MiB // mmap.PAGESIZE
    r = vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, env=env)
    assert r.returncode == 0, r.stderr
    # all gone (QEMU's reopen reads its first pages again: the planted ones are checked)
    assert vmtouch_pages(img, "56M-64M") == 0
    # through the page cache now: the guest's reads are cached
    lv.qemu_io(name, "read 32M 4M")
    assert vmtouch_pages(img, "32M-36M") == 4 * MiB // mmap.PAGESIZE
    assert vmdt("release", "--all", "--uri", lv.uri, env=env).returncode == 0
    assert o_direct(lv.qemu_pid(name), img)
    assert fincore_pages(img) == 0


def test_a_page_that_will_not_leave_the_page_cache_refuses_the_adoption(lv, tmp_path, env):
    img = image(tmp_path, "c.img")
    name = running(lv, tmp_path, disk_xml("vda", str(img), cache="none", io="threads"))
    # vmtouch maps and mlocks the image's first MiB: no drop can take those pages
    locker = subprocess.Popen([require_tool("vmtouch"), "-l", "-q", "-p", "0-1M", str(img)])
    try:
        deadline = time.monotonic() + 30
        while fincore_pages(img) < MiB // mmap.PAGESIZE:
            assert locker.poll() is None and time.monotonic() < deadline, "vmtouch -l"
            time.sleep(0.1)
        r = vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, env=env)
        last = assert_refused(r, 78, "stay in this host's page cache")
        assert f"{locker.pid} (vmtouch)" in last, last
        assert o_direct(lv.qemu_pid(name), img) and node_direct(lv, name)
    finally:
        locker.kill()
        locker.wait()
    assert vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, env=env).returncode == 0
    assert vmdt("release", f"{name}/vda", "--uri", lv.uri, env=env).returncode == 0


def test_refusals_leave_qemu_as_it_was(lv, tmp_path, env):
    a, b = image(tmp_path, "d.img"), image(tmp_path, "e.img")
    name = running(lv, tmp_path, disk_xml("vda", str(a), cache="none", io="threads"),
                   disk_xml("vdb", str(b), cache="none", io="native"))
    pid = lv.qemu_pid(name)
    assert_refused(vmdt("adopt", f"{name}/vdb", "--uri", lv.uri, *UNTIMED, env=env), 78,
                   "io=native")
    assert_refused(vmdt("adopt", f"{name}/vdz", "--uri", lv.uri, *UNTIMED, env=env), 78,
                   "no such disk")
    assert_refused(vmdt("adopt", "no-such-domain/vda", "--uri", lv.uri, *UNTIMED, env=env), 78,
                   "no-such-domain")
    lv.virsh("suspend", name)
    assert_refused(vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, env=env), 75, "paused")
    lv.virsh("resume", name)
    advice = tmp_path / "advise.json"
    advice.write_text(json.dumps({
        "when": time.time(), "duration_seconds": 60, "disks": [{
            "domain": name, "target": "vda", "path": str(a), "advice": {
                "verdict": "no_gain",
                "reason": "each write would wait about 100 µs more"}}]}))
    r = vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, "--advice", advice, env=env)
    assert_refused(r, 78, "advise said no gain")
    assert o_direct(pid, a) and o_direct(pid, b)
    r = vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, "--advice", advice, "--force",
             env=env)
    assert r.returncode == 0, r.stderr
    assert not o_direct(pid, a) and o_direct(pid, b)
    r = vmdt("release", "--all", "--uri", lv.uri, env=env)
    assert r.returncode == 0 and f"{name}/vda: released" in r.stdout, r.stdout + r.stderr
    assert o_direct(pid, a)


def served_paths(status: dict) -> set[str]:
    return {d["path"] for d in status["host"]["disks"]}


def test_the_host_service_serves_an_adopted_disk_and_releases_it_when_it_stops(
        lv, tmp_path, env):
    img = image(tmp_path, "f.img")
    name = running(lv, tmp_path, disk_xml("vda", str(img), cache="none", io="threads"))
    pid = lv.qemu_pid(name)
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", lv.uri, "--min-free", "0",
                   "--interval", "1", "--host-png", tmp_path / "host.png", max_hold="32M",
                   status="status.json",
                   env={**env_without_systemd(), "VMDISKTOUCH_RUNTIME_DIR": env[
                       "VMDISKTOUCH_RUNTIME_DIR"]})
    try:
        s = d.wait_status(lambda s: any(u["domain"] == name for u in s["host"].get(
            "skipped") or ()), "the disk left out", timeout=60)
        assert str(img) not in served_paths(s)
        assert [u["code"] for u in s["host"]["skipped"] if u["domain"] == name] == \
            ["o_direct"], s["host"]
        r = vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, env=env)
        assert r.returncode == 0, r.stderr
        d.wait_status(lambda s: str(img) in served_paths(s), "the adopted disk served",
                      timeout=30)
        for _ in range(3):                                # the guest reads its zone: held
            lv.qemu_io(name, "read 0 16M")
        s = d.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold", timeout=30)
        assert d.vmlck() > 0
        assert not o_direct(pid, img)
        disk = next(x for x in s["disks"] if x["path"] == str(img))
        assert time.time() - 120 < disk["adopted_since"] <= time.time(), disk
        r = vmdt("status", "--dir", tmp_path, env=env)
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"  {name}/vda"))
        assert ", adopted 20" in line, r.stdout
        assert d.stop() == 0
        out = d.output()
        assert f"{name}/vda: released" in out, out[-3000:]
        assert o_direct(pid, img) and node_direct(lv, name)
        assert not list((tmp_path / "run").glob("adopted/*.json"))
    finally:
        d.stop()


def test_after_a_sigkill_the_restarted_service_takes_its_adopted_disks_back_then_releases_them(
        lv, tmp_path, env):
    a, b = image(tmp_path, "g.img"), image(tmp_path, "h.img")
    name = running(lv, tmp_path, disk_xml("vda", str(a), cache="none", io="threads"),
                   disk_xml("vdb", str(b), cache="none", io="threads"))
    pid = lv.qemu_pid(name)
    run_env = {**env_without_systemd(), "VMDISKTOUCH_RUNTIME_DIR": env["VMDISKTOUCH_RUNTIME_DIR"]}

    def service(log: str) -> DaemonProc:
        return DaemonProc(tmp_path, [], "--libvirt", "--uri", lv.uri, "--min-free", "0",
                          "--interval", "1", max_hold="32M", status="status.json",
                          log=log, env=run_env)

    r = vmdt("adopt", f"{name}/vda", f"{name}/vdb", "--uri", lv.uri, *UNTIMED, env=env)
    assert r.returncode == 0 and r.stdout.count(": adopted:") == 2, r.stdout + r.stderr
    first = service("first.log")
    try:
        first.wait_status(lambda s: {str(a), str(b)} <= served_paths(s), "both served",
                          timeout=60)
        first.kill()                                    # SIGKILL: nothing released
    finally:
        first.kill()
    assert not o_direct(pid, a) and not o_direct(pid, b)
    (tmp_path / "status.json").unlink()
    second = service("second.log")
    try:
        second.wait_status(lambda s: {str(a), str(b)} <= served_paths(s), "both served again",
                           timeout=60)
        out = second.output()
        for target in ("vda", "vdb"):
            assert out.count(f"serving {name} {target} (") == 1, out[-3000:]
        assert out.count(", adopted: through the page cache") == 2, out[-3000:]
        assert second.stop() == 0
        out = second.output()
        for target in ("vda", "vdb"):
            assert out.count(f"{name}/{target}: released") == 1, out[-3000:]
    finally:
        second.stop()
    assert o_direct(pid, a) and o_direct(pid, b)


@pytest.fixture
def two_hosts(libvirt_daemons, tmp_path):
    """Two libvirtds as two hosts on shared storage, a page cache each
    (``private_libvirt.shared_storage``), and a QEMU wrapper that fills a domain's RAM so
    that its migration lasts seconds."""
    qemu = CheckedQemu()
    try:
        with shared_storage(tmp_path, qemu.dir) as hosts:
            yield (*hosts, qemu)
    finally:
        qemu.remove()


@pytest.mark.timeout(400)
def test_an_adopted_disk_migrates_the_destination_reads_its_unflushed_writes_and_adopts_it(
        tmp_path, two_hosts, env):
    """Adopted on the source, whose page cache holds the guest's writes unflushed; the
    guest rewrites a zone while the migration runs (never flushing). QEMU flushes the
    source's disk when it hands the domain over, so the destination, which opens the
    image with O_DIRECT as libvirt says (its XML still says cache='none', the mode its
    migration check takes as safe), reads the new bytes. adopt during the migration is
    refused (75). ``--unsafe`` only because libvirt does not know the bindfs mount
    for shared storage (it refuses any disk on it: "Migration without shared storage").

    Both QEMUs run with ``x-check-cache-dropped`` (``CheckedQemu``), and the destination's
    log has no "page cache still in use". QEMU skips its drop and its check for a node
    opened with O_DIRECT (``raw_co_invalidate_cache``), as the destination's is: what
    makes the destination's later adoption safe is the service's own drop and check.
    So a stale copy of the zone is planted in the destination's page cache before the
    migration, and the guest there must read the new bytes through the page cache once
    its service has adopted the disk again."""
    src, dst, store, shared, qemu = two_hosts
    data_image(store / "a.raw", 64 * MiB)
    img = str(shared / "a.raw")
    dom = f"vdt-adopt-mig-{uuid.uuid4().hex[:8]}"
    qemu.fill_ram(dom, 96 * MiB)
    xml = tmp_path / f"{dom}.xml"
    xml.write_text(checked_domain_xml(dom, [disk_xml("vda", img, cache="none", io="threads")],
                                      qemu.path, 160))
    vsh(src.uri, "define", str(xml))
    vsh(src.uri, "start", dom)
    src.names.append(dom)
    at_src = [*src.prefix(), f"--wd={ROOT}"]
    r = vmdt("adopt", f"{dom}/vda", "--uri", src.uri, *UNTIMED, env=env, prefix=at_src)
    assert r.returncode == 0, r.stderr
    assert "cache='none'" in vsh(src.uri, "dumpxml", dom)
    assert MARK in vsh(src.uri, "dumpxml", dom)             # the domain carries it
    qemu_io_at(src.uri, dom, "write -P 0x11 8M 8M")          # in the source's page cache
    # the destination host's page cache: the zone as it was (stale from now on)
    subprocess.run([*dst.prefix(), "dd", f"if={img}", "of=/dev/null", "bs=1M", "skip=8",
                    "count=8", "status=none"], check=True)
    assert fincore_pages(img, dst.prefix()) >= 8 * MiB // mmap.PAGESIZE
    vsh(src.uri, "migrate-setspeed", dom, "16")
    mig = subprocess.Popen(["virsh", "-c", src.uri, "migrate", "--live", "--unsafe", dom, dst.uri,
                            "--migrateuri", f"tcp://127.0.0.1:{free_port()}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while vsh(src.uri, "domjobinfo", dom, check=False).find("Unbounded") < 0 and \
                "Data processed" not in vsh(src.uri, "domjobinfo", dom, check=False):
            assert mig.poll() is None and time.monotonic() < deadline, \
                f"no migration job: {mig.communicate()[1] if mig.poll() is not None else ''}"
            time.sleep(0.1)
        r = vmdt("adopt", f"{dom}/vda", "--uri", src.uri, *UNTIMED, env=env, prefix=at_src)
        assert_refused(r, 75, "a job runs on the domain")
        qemu_io_at(src.uri, dom, "write -P 0x5a 8M 8M")       # unflushed, during it
        assert mig.poll() is None, "the migration ended before the guest's write"
        _, err = mig.communicate(timeout=300)
    finally:
        if mig.poll() is None:
            mig.kill()
            mig.wait()
    assert mig.returncode == 0, f"virsh migrate: {err.strip()}"
    src.names.remove(dom)
    dst.names.append(dom)
    assert vsh(dst.uri, "domstate", dom).strip() == "running"
    log = QemuLog(dom, dst.qemu_log(dom))
    qemu_io_at(dst.uri, dom, "read -P 0x5a 8M 8M")
    deadline = time.monotonic() + 10                           # qemu-io prints into its log
    while "read 8388608/8388608 bytes" not in log.new():
        assert time.monotonic() < deadline, f"qemu-io said nothing: {log.new()[-500:]}"
        time.sleep(0.1)
    assert "verification failed" not in log.new(), "the destination read stale bytes"
    assert '"x-check-cache-dropped":true' in open(f"/proc/{dst.qemu_pid(dom)}/cmdline").read()
    with open(dst.qemu_log(dom)) as f:                         # the incoming's lines too
        assert STILL_IN_USE not in f.read()
    # the stale copy is still there (most of it: on a loaded machine some of it went, 67
    # pages of 2,048 once), for the service's drop to matter
    assert fincore_pages(img, dst.prefix()) > 0
    # the destination opens it as libvirt says: O_DIRECT; nothing adopted there yet
    assert o_direct(dst.qemu_pid(dom), img)
    assert MARK in vsh(dst.uri, "dumpxml", dom)
    # its host service adopts it again, now that the domain runs there: its own drop
    # and check, and its own timing of the guest
    run_dst = tmp_path / "run-dst"
    run_dst.mkdir()
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", dst.uri, "--min-free", "0",
                   "--interval", "1", max_hold="32M", status="dst-status.json",
                   log="dst.log", prefix=[*dst.prefix(), f"--wd={ROOT}"],
                   env={**env_without_systemd(), "VMDISKTOUCH_RUNTIME_DIR": str(run_dst)})
    try:
        d.wait_output(f"{dom}/vda: adopted again, as where its domain ran before",
                      "the adoption at the destination", timeout=90)
        assert not o_direct(dst.qemu_pid(dom), img)
        adopted_log = QemuLog(dom, dst.qemu_log(dom))    # now through the page cache
        qemu_io_at(dst.uri, dom, "read -P 0x5a 8M 8M")
        deadline = time.monotonic() + 10
        while "read 8388608/8388608 bytes" not in adopted_log.new():
            assert time.monotonic() < deadline, f"qemu-io said nothing: {adopted_log.new()}"
            time.sleep(0.1)
        assert "verification failed" not in adopted_log.new(), \
            "the stale page reached the guest"
        d.wait_status(lambda s: img in served_paths(s), "served at the destination",
                      timeout=30)
        assert d.stop() == 0
        assert f"{dom}/vda: released" in d.output()
    finally:
        d.stop()
    assert o_direct(dst.qemu_pid(dom), img) and MARK not in vsh(dst.uri, "dumpxml", dom)


def adopting_service(lv, tmp_path, env, name: str) -> DaemonProc:
    """The host service, its ``[adopt]`` naming the domain ``name``."""
    config = tmp_path / "host.toml"
    config.write_text(f'[adopt]\ninclude = ["{name}"]\n')
    return DaemonProc(tmp_path, [], "--libvirt", "--uri", lv.uri, "--min-free", "0",
                      "--interval", "1", "--config", config, "--host-png",
                      tmp_path / "host.png", max_hold="32M",
                      status="status.json", env={**env_without_systemd(),
                                                 "VMDISKTOUCH_RUNTIME_DIR": env[
                                                     "VMDISKTOUCH_RUNTIME_DIR"]})


def test_the_service_adopts_what_adopt_names_and_leaves_what_the_operator_released(
        lv, tmp_path, env):
    img, other = image(tmp_path, "k.img"), image(tmp_path, "l.img")
    name = running(lv, tmp_path, disk_xml("vda", str(img), cache="none", io="threads"))
    left = running(lv, tmp_path, disk_xml("vda", str(other), cache="none", io="threads"))
    pid = lv.qemu_pid(name)
    d = adopting_service(lv, tmp_path, env, name)
    try:
        d.wait_status(lambda s: str(img) in served_paths(s), "adopted by [adopt], served",
                      timeout=90)                    # its guest timed 30 s first
        assert not o_direct(pid, img)
        assert o_direct(lv.qemu_pid(left), other)            # not named: left alone
        assert f"{name}/vda: adopted by [adopt]" in d.output()
        r = vmdt("release", f"{name}/vda", "--uri", lv.uri, env=env)
        assert r.returncode == 0 and "released" in r.stdout, r.stdout + r.stderr
        d.wait_output(f"{name}/vda: released by the operator", "the refusal, said once",
                      timeout=30)
        cycle = d.read_status()["host"]["cycle"]
        d.wait_status(lambda s: s["host"]["cycle"] >= cycle + 3, "three cycles", timeout=30)
        assert o_direct(pid, img) and str(img) not in served_paths(d.read_status())
        assert d.output().count("released by the operator") == 1, d.output()[-3000:]
        r = vmdt("adopt", f"{name}/vda", "--uri", lv.uri, *UNTIMED, env=env)   # the operator asks
        assert r.returncode == 0, r.stderr
        d.wait_status(lambda s: str(img) in served_paths(s), "served again", timeout=30)
        assert d.stop() == 0
        assert f"{name}/vda: released" in d.output().split("received SIGTERM")[-1]
        assert o_direct(pid, img)
    finally:
        d.stop()


class Guest:
    """A guest that reads 4 KiB at a time, one in flight, through the disk's device as long
    as it runs: ``aio_read`` then ``aio_flush`` of qemu-io in the monitor, which QEMU
    accounts as the device's own I/O (its block statistics)."""

    def __init__(self, lv, name: str, span: int):
        import threading
        import libvirt
        import libvirt_qemu
        self.conn = libvirt.open(lv.uri)
        self.dom, self.qemu = self.conn.lookupByName(name), libvirt_qemu
        self.span, self.done = span, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def hmp(self, command: str) -> None:
        self.qemu.qemuMonitorCommand(
            self.dom, f'qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend '
                      f'"{command}"', self.qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)

    def run(self) -> None:
        import random
        rng = random.Random(7)
        while not self.done.is_set():
            self.hmp(f"aio_read -q {rng.randrange(self.span >> 12) << 12} 4k")
            self.hmp("aio_flush")

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)
        self.conn.close()


@pytest.mark.timeout(400)
def test_an_adopted_disk_that_gets_slower_is_released_by_itself_and_not_adopted_again(
        lv, tmp_path, env):
    img = image(tmp_path, "s.img")
    name = running(lv, tmp_path, disk_xml("vda", str(img), cache="none", io="threads"))
    pid = lv.qemu_pid(name)
    guest = Guest(lv, name, 16 * MiB)
    d = adopting_service(lv, tmp_path, env, name)
    try:
        # [adopt] times the guest first (its baseline in the record), then adopts
        d.wait_status(lambda s: str(img) in served_paths(s), "adopted by [adopt], served",
                      timeout=120)
        rec = json.loads(next((tmp_path / "run").glob("adopted/*.json")).read_text())
        assert len(rec["baseline"]) == 3 and all(sum(w["ops"]) > 50 for w in rec["baseline"])
        # its I/O measured since the switch, beside the baseline: the gain in status
        s = d.wait_status(lambda s: any(x.get("adopted_gain") for x in s["disks"]),
                          "a gain measured", timeout=90)
        disk = next(x for x in s["disks"] if x["path"] == str(img))
        assert disk["adopted_gain"] > 0.5, disk
        r = vmdt("status", "--dir", tmp_path, env=env)
        assert "as fast as before" in r.stdout, r.stdout
        # the device gets slow: QEMU's throttle, 20 reads a second
        lv.virsh("blkdeviotune", name, "vda", "--read-iops-sec", "20", "--live")
        d.wait_output(f"{name}/vda: released by itself: the guest's I/O took", "a release",
                      timeout=90)
        assert o_direct(pid, img) and node_direct(lv, name)
        lv.virsh("blkdeviotune", name, "vda", "--read-iops-sec", "0", "--live")
        # not adopted again by [adopt]: said once, held back
        d.wait_output(f"{name}/vda: released by vmdisktouch, slower", "the refusal",
                      timeout=60)
        s = d.wait_status(lambda s: any(u["domain"] == name for u in s["host"].get(
            "skipped") or ()), "the disk left out", timeout=30)
        why = next(u for u in s["host"]["skipped"] if u["domain"] == name)
        assert why["code"] == "adopt_slower", why
        assert "released from adoption by itself" in json.dumps(why), why
        time.sleep(5)
        assert o_direct(pid, img) and str(img) not in served_paths(d.read_status())
        assert d.output().count("released by itself") == 1, d.output()[-3000:]
        assert d.stop() == 0
    finally:
        guest.stop()
        d.stop()
