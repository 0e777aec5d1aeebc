"""``vmdisktouch adopt --qmp`` on a QEMU that libvirt does not run, as Proxmox VE runs it.

QEMU is started here as qemu-server starts it: each disk a ``-drive`` with an id and
``cache=none``, a QMP socket of its own. The "guest" writes through ``qemu-io`` in the
human monitor. What is checked is what QEMU and the kernel say: the image's
descriptor in the QEMU process (``/proc/PID/fdinfo``, O_DIRECT 040000), QEMU's own
``cache.direct`` of the drive, and the bytes on disk read with O_DIRECT. A host
service serving the image (``run PATH``) judges an adopted drive against the baseline
``adopt`` timed, releases it by itself when it gets slower, and releases it when it stops.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

import pytest

from tests.support.common import require_tool, stop_process
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.faultkit import assert_refused, vmdt
from tests.support.images import direct_read
from tests.support.pagecache import data_image
from tests.support.procfs import o_direct

MiB = 1 << 20
UNTIMED = ("--measure", "0")       # adopt without timing the guest first


def qmp(sock: str, command: str, **arguments):
    """One QMP command on its own connection (the socket serves one client at a time)."""
    return qmp_each(sock, [(command, arguments)])[-1]


def qmp_each(sock: str, commands: list):
    """QMP commands ``(command, arguments)`` on one connection, a number between two a
    pause (s): their returns."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(sock)
    f = s.makefile("rw")
    try:
        f.readline()
        out = []
        for c in (("qmp_capabilities", {}), *commands):
            if not isinstance(c, tuple):
                time.sleep(c)
                continue
            cmd, args = c
            f.write(json.dumps({"execute": cmd, "arguments": args}) + "\n")
            f.flush()
            while "event" in (reply := json.loads(f.readline())):
                pass
            assert "error" not in reply, reply
            out.append(reply["return"])
        return out[1:]
    finally:
        s.close()


def qemu_io(sock: str, drive: str, command: str) -> str:
    out = qmp(sock, "human-monitor-command", **{"command-line": f'qemu-io {drive} "{command}"'})
    assert "error" not in out.lower() and "fail" not in out.lower(), out
    return out


def drive_direct(sock: str, drive: str) -> bool:
    return next(b for b in qmp(sock, "query-block")
                if b["device"] == drive)["inserted"]["cache"]["direct"]


@pytest.fixture
def vm(tmp_path):
    """A QEMU as qemu-server starts one: two ``cache=none`` drives (``aio=threads`` and
    ``aio=native``), a QMP socket; stopped by its PID."""
    a, b = data_image(tmp_path / "a.raw", 32 * MiB), data_image(tmp_path / "b.raw", 32 * MiB)
    sock = str(tmp_path / "100.qmp")
    p = subprocess.Popen([
        require_tool("qemu-system-x86_64"), "-M", "none", "-nodefaults", "-display", "none",
        "-drive", f"file={a},if=none,id=drive-scsi0,cache=none,aio=threads,format=raw,"
                  f"detect-zeroes=on",
        "-drive", f"file={b},if=none,id=drive-scsi1,cache=none,aio=native,format=raw",
        "-qmp", f"unix:{sock},server=on,wait=off"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        assert p.poll() is None, p.stderr.read().decode()
        assert time.monotonic() < deadline, "no QMP socket"
        time.sleep(0.05)
    yield p.pid, sock, a, b
    stop_process(p)


@pytest.fixture
def env(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    return {**os.environ, "VMDISKTOUCH_RUNTIME_DIR": str(run)}


def test_adopt_through_a_qmp_socket_switches_the_drive_and_keeps_every_flushed_write(
        vm, env):
    pid, sock, a, b = vm
    assert o_direct(pid, a)
    for cycle in range(5):
        r = vmdt("adopt", "--qmp", sock, "drive-scsi0", *UNTIMED, env=env)
        assert r.returncode == 0 and "drive-scsi0: adopted:" in r.stdout, r.stdout + r.stderr
        assert not o_direct(pid, a) and not drive_direct(sock, "drive-scsi0")
        pattern = 0x21 + cycle
        qemu_io(sock, "drive-scsi0", f"write -P {pattern} 4M 1M")
        qemu_io(sock, "drive-scsi0", "flush")
        r = vmdt("release", "--qmp", sock, "drive-scsi0", env=env)
        assert r.returncode == 0 and "released" in r.stdout, r.stdout + r.stderr
        assert o_direct(pid, a) and drive_direct(sock, "drive-scsi0")
        assert direct_read(a, 4 * MiB, MiB) == bytes([pattern]) * MiB, cycle
    assert o_direct(pid, b)                                   # the other drive untouched


def test_refusals_through_a_qmp_socket_leave_qemu_as_it_was(vm, env, tmp_path):
    pid, sock, a, b = vm
    assert_refused(vmdt("adopt", "--qmp", sock, "drive-scsi1", env=env), 78, "io=native")
    assert_refused(vmdt("adopt", "--qmp", sock, "drive-nope", env=env), 78, "no such drive")
    assert_refused(vmdt("adopt", "--qmp", str(tmp_path / "none.qmp"), "drive-scsi0",
                        env=env), 78, "none.qmp")
    qmp(sock, "stop")
    assert_refused(vmdt("adopt", "--qmp", sock, "drive-scsi0", env=env), 75, "not running")
    qmp(sock, "cont")
    assert o_direct(pid, a) and o_direct(pid, b)


def test_release_all_finds_the_drives_adopted_through_a_socket(vm, env):
    pid, sock, a, _ = vm
    assert vmdt("adopt", "--qmp", sock, "drive-scsi0", *UNTIMED, env=env).returncode == 0
    r = vmdt("release", "--all", env=env)                  # no libvirt asked: none recorded
    assert r.returncode == 0 and f"{sock} drive-scsi0: released" in r.stdout, \
        r.stdout + r.stderr
    assert o_direct(pid, a)
    r = vmdt("release", "--all", env=env)
    assert r.returncode == 0 and "no disk is adopted" in r.stdout, r.stdout + r.stderr


def service(tmp_path, env, image) -> DaemonProc:
    """``vmdisktouch run IMAGE`` (no libvirt), its runtime directory the test's."""
    return DaemonProc(tmp_path, image, "--uri", "", "--min-free", "0", "--interval", "1",
                      max_hold="16M", status="status.json",
                      env={**env_without_systemd(),
                           "VMDISKTOUCH_RUNTIME_DIR": env["VMDISKTOUCH_RUNTIME_DIR"]})


def disk_of(status: dict, image) -> dict:
    return next(x for x in status["disks"] if x["path"] == str(image))


def test_the_service_serving_an_adopted_drive_s_image_releases_the_drive_when_it_stops(
        vm, env, tmp_path):
    pid, sock, a, b = vm
    key = f"{os.path.realpath(sock)} drive-scsi0"
    r = vmdt("adopt", "--qmp", sock, "drive-scsi0", *UNTIMED, env=env)
    assert r.returncode == 0 and "drive-scsi0: adopted:" in r.stdout, r.stdout + r.stderr
    d = service(tmp_path, env, a)
    try:
        s = d.wait_status(lambda s: disk_of(s, a).get("adopted_since"), "served adopted",
                          timeout=30)
        assert time.time() - 120 < disk_of(s, a)["adopted_since"] <= time.time()
        for _ in range(3):                             # the guest reads its zone: held
            qemu_io(sock, "drive-scsi0", "read 0 8M")
        d.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold", timeout=30)
        assert not o_direct(pid, a) and not drive_direct(sock, "drive-scsi0")
        r = vmdt("status", "--dir", tmp_path, env=env)
        assert ", adopted 20" in r.stdout and "tainted" not in r.stdout, r.stdout + r.stderr
        assert d.stop() == 0
        out = d.output().split("received SIGTERM")[-1]
        assert out.count(f"{key}: released: {a} with O_DIRECT again") == 1, out[-3000:]
        assert out.count("released:") == 1, out[-3000:]
    finally:
        d.stop()
    assert o_direct(pid, a) and drive_direct(sock, "drive-scsi0")
    assert not list((tmp_path / "run").glob("adopted-qmp/*.json"))
    assert o_direct(pid, b)                                   # the other drive untouched


class Guest:
    """A guest that reads 4 KiB at a time, one in flight, through the drive as long as it
    runs: ``aio_read``, ``PAUSE_S``, then ``aio_flush`` of qemu-io in the human monitor,
    which QEMU accounts as the drive's own I/O (``query-blockstats``). The flush drains
    the drive, and a drain lets a read QEMU's throttle holds go at once: the pause lets a
    throttled read wait. A connection for each read: the socket serves one client at a
    time, and the service's must get through."""

    PAUSE_S = 0.005

    def __init__(self, sock: str, drive: str, span: int):
        self.sock, self.drive, self.span = sock, drive, span
        self.done, self.reads = threading.Event(), 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        import random
        rng = random.Random(7)
        while not self.done.is_set():
            off = rng.randrange(self.span >> 12) << 12
            try:
                qmp_each(self.sock, [self.hmp(f"aio_read -q {off} 4k"), self.PAUSE_S,
                                     self.hmp("aio_flush")])
            except OSError:
                continue                               # the socket busy for long: again
            self.reads += 1

    def hmp(self, command: str) -> tuple:
        return "human-monitor-command", {"command-line": f'qemu-io {self.drive} "{command}"'}

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


def throttle(sock: str, drive: str, iops_rd: int) -> None:
    """QEMU's own throttle of the drive's reads (0: none): the device gets slow."""
    qmp(sock, "block_set_io_throttle", device=drive, bps=0, bps_rd=0, bps_wr=0, iops=0,
        iops_rd=iops_rd, iops_wr=0)


@pytest.mark.timeout(400)
def test_an_adopted_drive_that_gets_slower_is_released_by_the_service_by_itself(
        vm, env, tmp_path):
    pid, sock, a, _ = vm
    key = f"{os.path.realpath(sock)} drive-scsi0"
    guest = Guest(sock, "drive-scsi0", 16 * MiB)
    d = None
    try:
        # adopt times the guest first (30 s), its baseline in the drive's record
        r = vmdt("adopt", "--qmp", sock, "drive-scsi0", env=env, timeout=120)
        assert r.returncode == 0 and "drive-scsi0: adopted:" in r.stdout, r.stdout + r.stderr
        rec = json.loads(next((tmp_path / "run").glob("adopted-qmp/*.json")).read_text())
        assert len(rec["baseline"]) == 3 and all(sum(w["ops"]) > 50 for w in rec["baseline"]), \
            rec
        d = service(tmp_path, env, a)
        # its I/O measured since the switch, beside the baseline: the gain in status
        s = d.wait_status(lambda s: disk_of(s, a).get("adopted_gain"), "a gain measured",
                          timeout=90)
        assert disk_of(s, a)["adopted_gain"] > 0.5, disk_of(s, a)
        throttle(sock, "drive-scsi0", 20)                  # the drive gets slow
        d.wait_output(f"{key}: released by itself: the guest's I/O took", "a release",
                      timeout=90)
        assert o_direct(pid, a) and drive_direct(sock, "drive-scsi0")
        throttle(sock, "drive-scsi0", 0)
        s = d.wait_status(lambda s: any(u["code"] == "adopt_slower"
                                        for u in s["host"].get("skipped") or ()),
                          "the reason in status", timeout=30)
        why = next(u for u in s["host"]["skipped"] if u["code"] == "adopt_slower")
        assert (why["domain"], why["target"]) == (os.path.realpath(sock), "drive-scsi0"), why
        assert "released from adoption by itself: the guest's I/O took" in why["reason"], why
        assert not disk_of(s, a).get("adopted_since")
        r = vmdt("status", "--dir", tmp_path, env=env)
        assert f"  {key}: skipped (adopt_slower): released from adoption by itself" in \
            r.stdout, r.stdout + r.stderr
        assert not list((tmp_path / "run").glob("adopted-qmp/*.json"))
        time.sleep(3)
        assert o_direct(pid, a) and d.output().count("released by itself") == 1
        assert d.stop() == 0
        assert "the service stopped" not in d.output()          # nothing left to release
    finally:
        guest.stop()
        if d is not None:
            d.stop()
