"""Test helpers for a real libvirt: the daemons, throw-away domains, guest-like I/O.

* ``libvirt_daemons`` (session fixture): makes sure ``virtlogd`` and
  ``libvirtd`` answer on qemu:///system. Whatever is already running is used
  and left alone; what it had to start (in the foreground, as its own child
  processes) it stops at the end of the session, by PID. Import the fixture
  into a test module: ``from tests.support.libvirt_env import libvirt_daemons``.
* ``domains`` (fixture): a ``DomainFactory``; every domain it defines is
  destroyed and undefined at the end of the test.
* ``qemu_io``: guest-like I/O through libvirt's own QEMU, with
  ``virsh qemu-monitor-command --hmp 'qemu-io -d <device backend> "..."'``
  (see FIELD-NOTES). No guest OS is needed: domains are started paused.

Needs root (qemu:///system) and the Debian packages of scripts/install-deps.sh;
anything missing fails the test with a message (never a silent skip).
"""

from __future__ import annotations

import grp
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

URI = "qemu:///system"
LIBVIRT_SOCK = "/run/libvirt/libvirt-sock"
VIRTLOGD_SOCK = "/run/libvirt/virtlogd-sock"
PREFIX = "vdt-test-"
KVM = os.access("/dev/kvm", os.R_OK | os.W_OK)

# virtlogd first: libvirtd hands QEMU's stderr to it.
_DAEMONS = (("virtlogd", VIRTLOGD_SOCK), ("libvirtd", LIBVIRT_SOCK))
_started: list[subprocess.Popen] = []
_cleaned = False      # stale vdt-test-* domains removed once per test session


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    assert path, f"{name} is not installed: run `make test` (scripts/install-deps.sh installs it)"
    return path


def _answers(sock: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _wait_for(sock: str, proc: subprocess.Popen, name: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _answers(sock):
            return
        assert proc.poll() is None, f"{name} exited with status {proc.returncode} at start-up"
        time.sleep(0.1)
    raise AssertionError(f"{name} did not answer on {sock} within {timeout:g}s")


_kvm_restore: tuple[int, int] | None = None   # /dev/kvm's (mode, gid) before we changed it


def _let_libvirt_qemu_use_kvm() -> None:
    """Give /dev/kvm Debian's udev permissions (root:kvm 0660) where it is root-only.

    libvirt runs QEMU as libvirt-qemu:kvm. Where that user cannot open
    /dev/kvm (these sandboxes have no udev: /dev/kvm is root:root 0600),
    libvirtd judges its cached QEMU capabilities stale on every lookup and
    probes QEMU again: 35 s for every `virsh define` here, against 0.02 s
    with the permissions udev would set. The old mode is put back by
    ``stop_daemons``.
    """
    global _kvm_restore
    try:
        st = os.stat("/dev/kvm")
        gid = grp.getgrnam("kvm").gr_gid
    except (FileNotFoundError, KeyError):
        return
    if st.st_gid == gid and st.st_mode & 0o060 == 0o060:
        return
    if _kvm_restore is None:
        _kvm_restore = (stat.S_IMODE(st.st_mode), st.st_gid)
    os.chown("/dev/kvm", -1, gid)
    os.chmod("/dev/kvm", stat.S_IMODE(st.st_mode) | 0o060)


def _restore_kvm() -> None:
    global _kvm_restore
    if _kvm_restore is not None:
        mode, gid = _kvm_restore
        os.chown("/dev/kvm", -1, gid)
        os.chmod("/dev/kvm", mode)
        _kvm_restore = None


def ensure_daemons(log_dir: str | os.PathLike = "/tmp") -> None:
    """Start virtlogd and libvirtd unless they already answer. Idempotent."""
    assert os.geteuid() == 0, "the libvirt tests need root (qemu:///system)"
    _let_libvirt_qemu_use_kvm()
    for name, sock in _DAEMONS:
        if _answers(sock):
            continue
        log = open(Path(log_dir) / f"vdt-test-{name}.log", "ab")
        proc = subprocess.Popen([_tool(name)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        _started.append(proc)
        _wait_for(sock, proc, name)
    # libvirtd answers on its socket before the QEMU driver is ready: ask it.
    deadline = time.monotonic() + 30
    while True:
        r = subprocess.run([_tool("virsh"), "-c", URI, "list", "--all"], capture_output=True,
                           text=True)
        if r.returncode == 0:
            break
        assert time.monotonic() < deadline, f"virsh -c {URI} list fails: {r.stderr.strip()}"
        time.sleep(0.2)
    global _cleaned
    if not _cleaned:
        cleanup_stale_domains()
        _cleaned = True


def stop_daemons() -> None:
    """Stop (SIGTERM, by PID) the daemons ensure_daemons started; libvirtd first. Put
    /dev/kvm's permissions back."""
    _restore_kvm()
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def started_libvirtd() -> subprocess.Popen | None:
    """The libvirtd process these tests started (None if one was already running)."""
    for proc in _started:
        if os.path.basename(str(proc.args[0])) == "libvirtd" and proc.poll() is None:
            return proc
    return None


def restart_libvirtd(log_dir: str | os.PathLike = "/tmp") -> None:
    """Stop the libvirtd these tests started and start a new one (domains keep running)."""
    proc = started_libvirtd()
    assert proc is not None, "restart_libvirtd: this session did not start libvirtd"
    proc.terminate()
    proc.wait(timeout=20)
    _started.remove(proc)
    ensure_daemons(log_dir)


@pytest.fixture(scope="session")
def libvirt_daemons(tmp_path_factory):
    ensure_daemons(tmp_path_factory.getbasetemp())
    yield URI
    stop_daemons()


# ---------------------------------------------------------------------------
# virsh


def virsh(*args: str, check: bool = True) -> str:
    r = subprocess.run([_tool("virsh"), "-q", "-c", URI, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"virsh {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def domain_state(name: str) -> str:
    return virsh("domstate", name).strip()


def _other_pytest_running() -> bool:
    """Another pytest process runs on this machine (its domains are not stale)."""
    me = {os.getpid(), os.getppid()}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(pid) not in me and any(b"pytest" in a for a in argv[:3]):
            return True
    return False


def cleanup_stale_domains() -> None:
    """Remove vdt-test-* domains a killed earlier run left behind (none while another
    pytest runs: they may be its own)."""
    if _other_pytest_running():
        return
    for name in virsh("list", "--all", "--name").split():
        if name.startswith(PREFIX):
            destroy_undefine(name)


def destroy_undefine(name: str) -> None:
    virsh("destroy", name, check=False)
    virsh("undefine", name, "--nvram", "--managed-save", check=False)
    if virsh("domstate", name, check=False):
        virsh("undefine", name, check=False)


def disk_xml(target: str, source: str | None, *, cache: str | None = "writethrough",
             io: str | None = "threads", fmt: str = "raw", dtype: str = "file",
             device: str = "disk", readonly: bool = False) -> str:
    attrs = f"name='qemu' type='{fmt}'"
    if cache is not None:
        attrs += f" cache='{cache}'"
    if io is not None:
        attrs += f" io='{io}'"
    if dtype == "network":
        src = "<source protocol='nbd' name='x'><host name='127.0.0.1' port='10809'/></source>"
    elif source is None:
        src = ""
    else:
        src = f"<source {'dev' if dtype == 'block' else 'file'}='{source}'/>"
    bus = "sata" if device == "cdrom" else "virtio"
    return (f"<disk type='{dtype}' device='{device}'><driver {attrs}/>{src}"
            f"<target dev='{target}' bus='{bus}'/>{'<readonly/>' if readonly else ''}</disk>")


def domain_xml(name: str, disks: list[str]) -> str:
    # QEMU runs as root with no relabelling (static DAC label): the images live
    # under pytest's root-only tmp directory and must keep their ownership.
    return f"""<domain type='{'kvm' if KVM else 'qemu'}'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <on_crash>destroy</on_crash>
  <seclabel type='static' model='dac' relabel='no'><label>+0:+0</label></seclabel>
  <devices>
    <emulator>{_tool('qemu-system-x86_64')}</emulator>
    {''.join(disks)}
  </devices>
</domain>
"""


class DomainFactory:
    """Defines throw-away domains; ``cleanup()`` destroys and undefines them all."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.names: list[str] = []

    def define(self, disks: list[str], *, start: bool = True, tag: str = "") -> str:
        name = f"{PREFIX}{tag + '-' if tag else ''}{uuid.uuid4().hex[:8]}"
        xml = self.workdir / f"{name}.xml"
        xml.write_text(domain_xml(name, disks))
        self.names.append(name)
        virsh("define", str(xml))
        if start:
            virsh("start", name, "--paused")
        return name

    def cleanup(self) -> None:
        while self.names:
            destroy_undefine(self.names.pop())


@pytest.fixture
def domains(libvirt_daemons, tmp_path):
    factory = DomainFactory(tmp_path)
    yield factory
    factory.cleanup()


def qemu_io(name: str, command: str, alias: str = "virtio-disk0") -> str:
    """Run a qemu-io command (e.g. ``read 0 4M``) on a disk of a running or paused domain.

    The I/O goes through QEMU's block layer exactly like a guest's virtio-blk
    request (``-d`` + the device's backend: the device holds the node's write lock).
    """
    out = virsh("qemu-monitor-command", name, "--hmp",
                f'qemu-io -d /machine/peripheral/{alias}/virtio-backend "{command}"')
    assert "error" not in out.lower() and "failed" not in out.lower(), \
        f"qemu-io {command!r} on {name}/{alias}: {out.strip()}"
    return out


class VmLck:
    """Samples a daemon's VmLck every 0.2 s in a thread; ``worst`` is the largest seen
    (``stop.set()`` ends it)."""

    def __init__(self, d):
        self.d, self.worst, self.stop = d, 0, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.wait(0.2):
            try:
                self.worst = max(self.worst, self.d.vmlck())
            except (OSError, ValueError):
                pass                 # the daemon is gone: nothing locked
