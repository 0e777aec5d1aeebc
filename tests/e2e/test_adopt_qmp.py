"""``vmdisktouch adopt --qmp`` on a QEMU that libvirt does not run, as Proxmox VE runs it.

QEMU is started here as qemu-server starts it: each disk a ``-drive`` with an id and
``cache=none``, a QMP socket of its own. The "guest" writes through ``qemu-io`` in the
human monitor. What is checked is what QEMU and the kernel say: the image's
descriptor in the QEMU process (``/proc/PID/fdinfo``, O_DIRECT 040000), QEMU's own
``cache.direct`` of the drive, and the bytes on disk read with O_DIRECT.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from tests.support.common import require_tool, stop_process
from tests.support.faultkit import assert_refused, vmdt
from tests.support.images import direct_read
from tests.support.pagecache import data_image
from tests.support.procfs import o_direct

MiB = 1 << 20


def qmp(sock: str, command: str, **arguments):
    """One QMP command on its own connection (the socket serves one client at a time)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(sock)
    f = s.makefile("rw")
    try:
        f.readline()
        for cmd, args in (("qmp_capabilities", {}), (command, arguments)):
            f.write(json.dumps({"execute": cmd, "arguments": args}) + "\n")
            f.flush()
            while "event" in (reply := json.loads(f.readline())):
                pass
        assert "error" not in reply, reply
        return reply["return"]
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
        r = vmdt("adopt", "--qmp", sock, "drive-scsi0", env=env)
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
    assert vmdt("adopt", "--qmp", sock, "drive-scsi0", env=env).returncode == 0
    r = vmdt("release", "--all", env=env)                  # no libvirt asked: none recorded
    assert r.returncode == 0 and f"{sock} drive-scsi0: released" in r.stdout, \
        r.stdout + r.stderr
    assert o_direct(pid, a)
    r = vmdt("release", "--all", env=env)
    assert r.returncode == 0 and "no disk is adopted" in r.stdout, r.stdout + r.stderr
