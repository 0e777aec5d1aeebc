"""The unit's sandbox does not break the daemon: a real ``vmdisktouch run`` under the
kernel mechanisms systemd would apply for systemd/vmdisktouch@.service.

systemd is not PID 1 here, so the unit cannot be started. tests/support/sandbox_exec.py
applies the same mechanisms, with the settings read from the unit file, and
execs the daemon (see its docstring and docs/unit.md):

(a) MemoryDenyWriteExecute=yes: prctl(PR_SET_MDWE) as systemd >= 254 does, and
    the seccomp filter systemd 252 (Debian 12) installs instead;
(b) SystemCallFilter= (the unit's deny-list, expanded by `systemd-analyze
    syscall-filter`), SystemCallErrorNumber=, SystemCallArchitectures=native,
    as a seccomp filter (python3-seccomp);
(c) DevicePolicy=closed + DeviceAllow=block-* r (+ ProtectClock's char-rtc r)
    as a cgroup v1 devices group, with the daemon serving a loop device;

and all of them at once with CapabilityBoundingSet=, on a loop device and on
the disk of a libvirt domain whose lifecycle the daemon follows through
libvirt's Unix socket. Each run checks that the daemon cycles, holds (mlock) a
range the test keeps reading, and exits 0 on SIGTERM. The same filter with
systemd's default action (kill) shows why the unit sets SystemCallErrorNumber=.
Anything missing (python3-seccomp, systemd-analyze, losetup, the devices
controller, libvirt) fails the test; nothing is skipped.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from tests.support import sandbox_exec as sx
from tests.support.libvirt_env import URI as LIBVIRT_URI
from tests.support.libvirt_env import disk_xml, domains, libvirt_daemons, qemu_io, virsh  # noqa: F401
from tests.support.common import require_tool
from tests.support.pagecache import data_image, read_range
from tests.support.cgroup import remove_group
from tests.support.daemon_proc import DaemonProc
from tests.support.procfs import status_fields as proc_status

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "tests" / "support" / "sandbox_exec.py"
MiB = 1 << 20
HOT = (16 * MiB, 16 * MiB)          # the range the test keeps reading
UNIT = sx.read_unit()
CYCLES = 5                          # cycles the daemon must complete after it holds

# What the daemon calls (docs/unit.md: strace of a run) and must keep.
NEEDED = {"mmap", "munmap", "mprotect", "mlock", "mlock2", "munlock", "mincore", "cachestat",
          "madvise", "fadvise64", "lseek", "ioctl", "pread64", "preadv2", "openat", "read",
          "write", "close", "fstat", "newfstatat", "fstatfs", "fcntl", "renameat", "fchmod",
          "unlinkat", "getdents64", "pipe2", "pselect6", "epoll_create1", "futex",
          "rt_sigaction", "rt_sigprocmask", "clone3", "vfork", "execve", "wait4",
          "getrandom", "sysinfo", "prlimit64", "sched_getaffinity", "socket", "connect",
          "sendmsg", "recvmsg", "exit_group", "bpf", "perf_event_open"}


def require_seccomp():
    try:
        import seccomp  # noqa: F401
    except ImportError:
        pytest.fail("python3-seccomp is not installed: run scripts/install-deps.sh "
                    "(Debian package python3-seccomp)")


class SandboxedDaemon(DaemonProc):
    """``sandbox_exec.py FLAGS -- python -m vmdisktouch run IMG ...``: the launcher execs
    the daemon, so ``pid`` is the daemon's. The arguments are the unit's ExecStart
    outputs (status, block map, heat map) with a short interval and a small budget."""

    def __init__(self, tmp_path, path, flags, *extra, uri=""):
        self.report = tmp_path / "sandbox.json"
        super().__init__(tmp_path, path, "--uri", uri, "--min-free", "0",
                         "--map-png", tmp_path / "map.png", "--heat-png", tmp_path / "heat.png",
                         *extra, max_hold="32M", interval=0.3,
                         prefix=(sys.executable, LAUNCHER, *flags, "--report", self.report, "--"))

    def sandbox_report(self) -> dict:
        return json.loads(self.report.read_text())


@pytest.fixture
def daemons():
    started: list[SandboxedDaemon] = []

    def start(*args, **kw) -> SandboxedDaemon:
        d = SandboxedDaemon(*args, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def serve_and_stop(d: SandboxedDaemon, image, checks=None) -> dict:
    """The daemon cycles, holds the hot range, cycles on, and exits 0 on SIGTERM.

    ``checks(status)`` runs while the daemon holds; returns the last status.
    """
    st = d.wait_status(lambda s: s["held_bytes"] > 0, "a hold of the hot range",
                       timeout=60, drive=lambda: read_range(image, *HOT))
    first = st["cycle"]
    st = d.wait_status(lambda s: s["cycle"] >= first + CYCLES and s["held_bytes"] > 0,
                       f"{CYCLES} more cycles with a hold", timeout=60,
                       drive=lambda: read_range(image, *HOT))
    assert 0 < st["held_bytes"] <= 32 * MiB, st
    status = proc_status(d.pid)
    assert int(status["VmLck"].split()[0]) > 0, status["VmLck"]
    for png in ("map.png", "heat.png"):
        assert (d.status_path.parent / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if checks:
        checks(status)
    rc = d.stop()
    out = d.output()
    assert rc == 0, out[-3000:]
    assert "Traceback" not in out and "released all holds" in out, out[-3000:]
    return st


def run_probe(flags, code: str, *args, timeout=60) -> dict:
    """``python -c CODE ARGS`` through the launcher; CODE prints one JSON line."""
    r = subprocess.run([sys.executable, str(LAUNCHER), *flags, "--", sys.executable, "-c", code,
                        *map(str, args)],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def image(tmp_path):
    path = pathlib.Path(data_image(tmp_path / "disk.img", 128 * MiB))
    yield path
    path.unlink(missing_ok=True)


# -- (a) MemoryDenyWriteExecute= ------------------------------------------------------------

MDWE_PROBE = """
import json
from tests.support import sandbox_exec as s
print(json.dumps({"PR_GET_MDWE": s._libc.prctl(s.PR_GET_MDWE, 0, 0, 0, 0),
                  "mprotect_exec": s.mprotect_exec_errno()}))
"""


def assert_mdwe_status_line(status: dict[str, str]) -> None:
    """A /proc/PID/status line about MDWE, where the kernel has one (6.18 has none)."""
    for key, value in status.items():
        if "mdwe" in key.lower():
            assert value not in ("0", "no"), (key, value)


def test_mdwe_is_inherited_through_exec():
    """The launcher's prctl outlives execve: a fresh Python cannot gain PROT_EXEC."""
    assert UNIT["MemoryDenyWriteExecute"] == ["yes"]
    plain = run_probe([], MDWE_PROBE)
    assert plain == {"PR_GET_MDWE": 0, "mprotect_exec": 0}        # the probe can tell
    assert run_probe(["--mdwe"], MDWE_PROBE) == {"PR_GET_MDWE": 1,
                                                  "mprotect_exec": errno.EACCES}
    require_seccomp()
    got = run_probe(["--mdwe-seccomp"], MDWE_PROBE)
    assert got == {"PR_GET_MDWE": 0, "mprotect_exec": errno.EPERM}


@pytest.mark.timeout(180)
def test_daemon_under_memory_deny_write_execute_prctl(tmp_path, image, daemons):
    d = daemons(tmp_path, image, ["--mdwe"])
    serve_and_stop(d, image, checks=assert_mdwe_status_line)
    assert d.sandbox_report()["mdwe_prctl"] == {"PR_GET_MDWE": 1, "mprotect_exec": "EACCES"}


@pytest.mark.timeout(180)
def test_daemon_under_memory_deny_write_execute_seccomp_as_systemd_252(tmp_path, image,
                                                                       daemons):
    require_seccomp()
    d = daemons(tmp_path, image, ["--mdwe-seccomp"])
    serve_and_stop(d, image, checks=lambda s: assert_seccomp(s, filters=1))
    assert d.sandbox_report()["mdwe_seccomp"] == {"mprotect_exec": "EPERM"}


# -- (b) SystemCallFilter= ------------------------------------------------------------------

def assert_seccomp(status: dict[str, str], filters: int) -> None:
    assert status["Seccomp"] == "2", status["Seccomp"]          # SECCOMP_MODE_FILTER
    assert int(status["Seccomp_filters"]) >= filters, status["Seccomp_filters"]
    assert status["NoNewPrivs"] == "1"                           # NoNewPrivileges=yes


def test_the_deny_list_is_the_units_groups_expanded():
    require_seccomp()
    groups = sx.syscall_groups()
    line = UNIT["SystemCallFilter"][0]
    assert {"@privileged", "@resources"} <= set(line[1:].split())
    denied = sx.denied_syscalls(UNIT, groups)
    # nested groups are expanded: @privileged holds @chown, @clock, @swap...
    assert {"chown", "fchownat", "setuid", "capset", "clock_settime", "swapon", "acct",
            "setrlimit", "sched_setaffinity", "mbind", "ioprio_set", "reboot",
            "init_module", "mount", "ptrace", "iopl"} <= denied
    # nothing the daemon calls, except mbind (OpenBLAS's hint, which tolerates EPERM)
    assert NEEDED & denied == set()
    assert sx.error_number(UNIT) == errno.EPERM
    assert UNIT["SystemCallArchitectures"] == ["native"]


SYSCALL_PROBE = """
import ctypes, errno, json, os, tempfile
libc = ctypes.CDLL(None, use_errno=True)
def err(f):
    try:
        f()
        return 0
    except OSError as e:
        return e.errno
def mbind():
    buf = ctypes.create_string_buffer(4096 * 2)
    addr = (ctypes.addressof(buf) + 4095) & ~4095
    if libc.syscall(237, ctypes.c_void_p(addr), ctypes.c_ulong(4096), 0, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "mbind")
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
print(json.dumps({
    "setuid": err(lambda: os.setuid(0)),                          # @privileged
    "chown": err(lambda: os.chown(tempfile.mkstemp()[1], 0, 0)),  # @privileged (@chown)
    "sched_setaffinity": err(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
    "setpriority": err(lambda: os.setpriority(os.PRIO_PROCESS, 0, 0)),   # @resources
    "mbind": err(mbind),                                          # @resources
    "getpid": err(os.getpid),
    "seccomp": status["Seccomp"].strip(),
}))
"""


def test_the_filter_refuses_the_groups_with_eperm():
    require_seccomp()
    got = run_probe(["--seccomp"], SYSCALL_PROBE)
    assert got == {"setuid": errno.EPERM, "chown": errno.EPERM,
                   "sched_setaffinity": errno.EPERM, "setpriority": errno.EPERM,
                   "mbind": errno.EPERM, "getpid": 0, "seccomp": "2"}
    assert run_probe([], SYSCALL_PROBE)["setuid"] == 0          # as root, unfiltered: allowed


@pytest.mark.timeout(180)
def test_daemon_under_the_syscall_filter(tmp_path, image, daemons):
    require_seccomp()
    d = daemons(tmp_path, image, ["--seccomp"])
    serve_and_stop(d, image, checks=lambda s: assert_seccomp(s, filters=1))
    rep = d.sandbox_report()["seccomp"]
    assert rep["errno"] == errno.EPERM
    assert set(rep["denied"]) == sx.denied_syscalls(UNIT)
    assert "mbind" in rep["installed"] and "setuid" in rep["installed"]


# The only denied calls the daemon makes (seen as kills, audit syscall= 237 and 238, under
# the killing filter): numpy's OpenBLAS calls mbind() when numpy is imported, and
# libnuma, loaded with libvirt's library, probes set_mempolicy(); both ignore EPERM.
RESOURCE_HINTS = ("mbind", "set_mempolicy")


def unit_allowing(tmp_path, *calls) -> pathlib.Path:
    """A copy of the unit whose deny-list lets ``calls`` through (a later
    SystemCallFilter= line without '~' takes them out, as in systemd)."""
    unit = tmp_path / "allowing.service"
    text = sx.UNIT_PATH.read_text()
    assert "\nSystemCallErrorNumber=EPERM\n" in text
    unit.write_text(text.replace("\nSystemCallErrorNumber=EPERM\n",
                                 f"\nSystemCallFilter={' '.join(calls)}\n"
                                 "SystemCallErrorNumber=EPERM\n"))
    return unit


KILL = ["--seccomp", "--seccomp-action", "kill"]


def probe_rc(flags, code: str) -> int:
    return subprocess.run([sys.executable, str(LAUNCHER), *flags, "--", sys.executable, "-c",
                           code], cwd=ROOT, capture_output=True, timeout=60).returncode


@pytest.mark.timeout(180)
def test_without_syscall_error_number_the_daemon_is_killed(tmp_path, image, daemons):
    """Why SystemCallErrorNumber=EPERM: without it systemd kills (SIGSYS) on a denied
    call, and the daemon's libraries make two of them, which fail harmlessly with EPERM."""
    require_seccomp()
    d = daemons(tmp_path, image, KILL)
    d.proc.wait(timeout=60)
    assert d.proc.returncode == -signal.SIGSYS, (d.proc.returncode, d.output()[-2000:])
    assert not d.status_path.exists() and d.output() == ""        # dead before its first log line
    # one library at a time, killing filter against the unit's EPERM
    assert probe_rc(KILL, "import numpy") == -signal.SIGSYS                   # mbind
    mbind_ok = ["--unit", str(unit_allowing(tmp_path, "mbind"))]
    assert probe_rc(mbind_ok + KILL, "import numpy") == 0
    assert probe_rc(mbind_ok + KILL, "import libvirt") == -signal.SIGSYS      # set_mempolicy
    assert probe_rc(["--unit", str(unit_allowing(tmp_path, *RESOURCE_HINTS))] + KILL,
                    "import numpy, libvirt") == 0
    assert probe_rc(["--seccomp"], "import numpy, libvirt") == 0              # the unit: EPERM
    # nothing else: with mbind let through, the daemon serves under the killing filter
    (tmp_path / "served").mkdir()
    d = daemons(tmp_path / "served", image, mbind_ok + KILL)
    serve_and_stop(d, image, checks=lambda s: assert_seccomp(s, filters=1))
    assert "mbind" not in d.sandbox_report()["seccomp"]["denied"]


# -- (c) DevicePolicy=closed, DeviceAllow=block-* r ---------------------------------------------

_cgroups = itertools.count()


@pytest.fixture
def devices_cgroup():
    """A cgroup v1 devices group with the unit's rules; removed after its processes exit."""
    assert os.path.isdir(sx.DEVICES_CGROUP), \
        f"{sx.DEVICES_CGROUP}: no cgroup v1 devices controller on this machine"
    assert UNIT["DevicePolicy"] == ["closed"] and UNIT["DeviceAllow"] == ["block-* r"]
    name = f"vdt-test-{os.getpid()}-{next(_cgroups)}"
    path = sx.make_devices_cgroup(name, sx.device_rules(UNIT))
    try:
        with open(os.path.join(path, "devices.list")) as f:
            listed = f.read().split("\n")
        assert "b *:* r" in listed and "a *:* rwm" not in listed, listed
        yield name
    finally:
        remove_group(path, kill_all)


def kill_all(pids) -> None:
    """SIGKILL ``pids``: only ever our own processes (the group is ours)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def loop_device(tmp_path):
    """A read-write loop device over a data image (so EPERM below is the cgroup's doing)."""
    losetup = require_tool("losetup")
    backing = data_image(tmp_path / "loop.img", 128 * MiB)
    dev = subprocess.run([losetup, "-f", "--show", backing], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        assert dev.startswith("/dev/loop"), dev
        yield pathlib.Path(dev)
    finally:
        subprocess.run([losetup, "-d", dev], check=True)


DEVICE_PROBE = """
import json, os, socket, sys
def opens(path, flags):
    try:
        os.close(os.open(path, flags))
        return "ok"
    except OSError as e:
        return os.strerror(e.errno)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[2])
print(json.dumps({
    "block_read": opens(sys.argv[1], os.O_RDONLY),
    "block_write": opens(sys.argv[1], os.O_WRONLY),
    "null_rw": opens("/dev/null", os.O_RDWR),
    "urandom": opens("/dev/urandom", os.O_RDONLY),
    "kvm": opens("/dev/kvm", os.O_RDWR),
    "unix_socket": "ok",
    "cgroup": [l.strip() for l in open("/proc/self/cgroup") if ":devices:" in l],
}))
"""


def device_probe(flags, dev, tmp_path) -> dict:
    """DEVICE_PROBE through the launcher, connecting to a Unix socket the test listens on."""
    sock_path = str(tmp_path / "probe.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(1)
    try:
        return run_probe(flags, DEVICE_PROBE, dev, sock_path)
    finally:
        srv.close()
        os.unlink(sock_path)


def test_device_rules_are_what_systemd_252_writes():
    rules = sx.device_rules(UNIT)
    null = os.stat("/dev/null").st_rdev
    assert f"c {os.major(null)}:{os.minor(null)} rwm" in rules
    assert "b *:* r" in rules                       # block-* r: the glob "*" is every major
    assert not any(r.startswith("b") and r.endswith(("w", "wm")) and r != "b 0:0 rwm"
                   for r in rules)                  # no block device writable
    assert not any(r.startswith("a") or r.startswith("c *") for r in rules)


@pytest.mark.timeout(60)
def test_in_the_device_group_block_devices_are_read_only(tmp_path, devices_cgroup,
                                                          loop_device):
    got = device_probe(["--devices-cgroup", devices_cgroup], loop_device, tmp_path)
    assert got == {"block_read": "ok", "block_write": os.strerror(errno.EPERM),
                   "null_rw": "ok", "urandom": "ok", "kvm": os.strerror(errno.EPERM),
                   "unix_socket": "ok", "cgroup": [got["cgroup"][0]]}
    assert got["cgroup"][0].endswith(f":devices:/{devices_cgroup}")
    # outside the group the same opens succeed: the EPERM is the group's
    outside = device_probe([], loop_device, tmp_path)
    assert outside["block_write"] == "ok" and outside["kvm"] == "ok", outside


def assert_holds_from(dev: pathlib.Path, pid: int) -> None:
    with open(f"/proc/{pid}/maps") as f:
        maps = [line for line in f if line.rstrip().endswith(" " + str(dev))]
    assert maps, f"no mapping of {dev} in /proc/{pid}/maps"


@pytest.mark.timeout(180)
def test_daemon_serves_a_block_device_in_the_device_group(tmp_path, devices_cgroup,
                                                          loop_device, daemons):
    d = daemons(tmp_path, loop_device, ["--devices-cgroup", devices_cgroup])
    st = serve_and_stop(d, loop_device,
                        checks=lambda s: assert_holds_from(loop_device, d.pid))
    assert st["path"] == str(loop_device)
    assert d.sandbox_report()["cgroup"] == f"/{devices_cgroup}"


# -- all at once ----------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_daemon_under_the_whole_sandbox(tmp_path, devices_cgroup, loop_device, daemons):
    """MDWE (prctl and systemd 252's seccomp form), the syscall filter, the device group
    and CapabilityBoundingSet=, on a block device."""
    require_seccomp()
    flags = ["--mdwe", "--mdwe-seccomp", "--seccomp", "--caps",
             "--devices-cgroup", devices_cgroup]
    d = daemons(tmp_path, loop_device, flags)
    caps = sx.capability_mask(UNIT)

    def checks(status):
        assert_seccomp(status, filters=2)
        assert_mdwe_status_line(status)
        assert int(status["CapBnd"], 16) == caps and int(status["CapEff"], 16) == caps, status
        assert_holds_from(loop_device, d.pid)

    st = serve_and_stop(d, loop_device, checks)
    # the unit grants the read counter (bpf, perf_event_open, CAP_BPF, CAP_PERFMON)
    assert st["access_source"] == "trace" and st["trace"]["reads_counted_in_kernel"], st
    rep = d.sandbox_report()
    assert rep["mdwe_prctl"] == {"PR_GET_MDWE": 1, "mprotect_exec": "EACCES"}
    assert rep["mdwe_seccomp"] == {"mprotect_exec": "EPERM"}
    assert rep["seccomp"]["errno"] == errno.EPERM
    assert rep["cgroup"] == f"/{devices_cgroup}"
    # the same sandbox, a fresh process: writes to the device refused, the rest as above
    got = device_probe(flags, loop_device, tmp_path)
    assert got["block_read"] == "ok" and got["block_write"] == os.strerror(errno.EPERM), got
    got = run_probe(flags, MDWE_PROBE)
    assert got == {"PR_GET_MDWE": 1, "mprotect_exec": errno.EPERM}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("errors", ["unit", "kill"])
def test_daemon_follows_libvirt_under_the_whole_sandbox(tmp_path, devices_cgroup,  # noqa: F811
                                                        domains, daemons, errors):
    """libvirt's socket is a Unix socket, not a device: under the whole sandbox the
    daemon asks libvirt about the disk and follows its domain's lifecycle events.

    ``kill``: the killing filter with only RESOURCE_HINTS let through, so no other
    denied call hides behind EPERM on the libvirt path either."""
    require_seccomp()
    img = data_image(tmp_path / "vm.raw", 128 * MiB)
    name = domains.define([disk_xml("vda", img, cache="writethrough")], tag="sandbox")
    flags = ["--mdwe", "--mdwe-seccomp", "--seccomp", "--caps",
             "--devices-cgroup", devices_cgroup]
    if errors == "kill":
        flags += ["--seccomp-action", "kill",
                  "--unit", str(unit_allowing(tmp_path, *RESOURCE_HINTS))]
    d = daemons(tmp_path, img, flags, uri=LIBVIRT_URI)

    def guest_reads():
        qemu_io(name, f"read {HOT[0]} {HOT[1]}")

    d.wait_status(lambda s: s["held_bytes"] > 0 and s["domain_active"] is True,
                  "a hold while the domain runs", timeout=90, drive=guest_reads)
    assert_seccomp(proc_status(d.pid), filters=2)
    virsh("destroy", name)
    d.wait_status(lambda s: s["held_bytes"] == 0 and s["domain_active"] is False,
                  "the holds released after virsh destroy", timeout=30)
    assert d.stop() == 0, d.output()[-3000:]
    assert "Traceback" not in d.output()
